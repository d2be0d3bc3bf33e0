//! A global allocator that counts the bytes allocated and not yet freed, for
//! the tests that check memory in real terms. A test binary that wants it
//! declares `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts the bytes allocated and not yet freed in [`LIVE`].
pub struct Counting;

/// Bytes allocated through [`Counting`] and not yet freed.
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The most [`LIVE`] reached since the last [`reset_peak`].
pub static PEAK: AtomicIsize = AtomicIsize::new(0);

/// The bytes allocated and not yet freed, now.
pub fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// The most bytes allocated at once since the last [`reset_peak`].
pub fn peak() -> isize {
    PEAK.load(Ordering::SeqCst)
}

/// Starts counting the peak again from what is allocated now.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::SeqCst);
}

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only a counter is
// updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            let ptr = System.alloc(layout);
            if !ptr.is_null() {
                grew(layout.size() as isize);
            }
            ptr
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe {
            let ptr = System.alloc_zeroed(layout);
            if !ptr.is_null() {
                grew(layout.size() as isize);
            }
            ptr
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe {
            System.dealloc(ptr, layout);
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            let new = System.realloc(ptr, layout, new_size);
            if !new.is_null() {
                grew(new_size as isize - layout.size() as isize);
            }
            new
        }
    }
}
