//! The in-process tier: a `moka` cache bounded in bytes.
//!
//! A slot is either a value or a *hit-for-miss* marker. The marker remembers,
//! for a short while, that this key's answers cannot be shared (a private
//! response, a `Set-Cookie`), so that requests for it go to the origin side by
//! side instead of queueing behind one another for an answer they could never
//! use (the "waiting list serialisation" trap of request-coalescing caches).
//!
//! The tier does not know what it stores beyond [`Stored`]: its weight and
//! how long it may still be used.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use moka::ops::compute::Op;
use moka::sync::Cache as Moka;
use moka::Expiry;

use crate::key::Key;
use crate::metrics::{GaugeShare, L1_BYTES};

/// Fixed bytes charged per slot on top of its value, for the key, the
/// value's own fields and the cache's bookkeeping. It keeps a flood of tiny
/// entries from escaping the byte bound.
pub(crate) const SLOT_OVERHEAD: usize = 160;

/// What the tier needs to know of a value it holds.
pub(crate) trait Stored: Send + Sync + 'static {
    /// Bytes charged against the bound (overhead included).
    fn weight(&self) -> u32;
    /// The last instant at which the value may be served at all.
    fn last_use(&self) -> Instant;
    /// When the value stops being fresh.
    fn fresh_until(&self) -> Instant;
}

/// What the L1 holds for one key.
pub(crate) enum Slot<T> {
    Value(Arc<T>),
    /// Until this instant, requests for the key bypass coalescing.
    HitForMiss(Instant),
    /// Until this instant, the key's last answer was for one client: its
    /// requests still coalesce, but a flight whose answer is again for one
    /// client releases its waiters at once.
    Unshared(Instant),
}

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        match self {
            Slot::Value(value) => Slot::Value(value.clone()),
            Slot::HitForMiss(until) => Slot::HitForMiss(*until),
            Slot::Unshared(until) => Slot::Unshared(*until),
        }
    }
}

/// Each slot leaves the L1 when its last window closes, so memory is not held
/// by entries nobody may serve.
struct SlotExpiry;

impl SlotExpiry {
    fn remaining<T: Stored>(slot: &Slot<T>, now: Instant) -> Option<Duration> {
        let until = match slot {
            Slot::Value(value) => value.last_use(),
            Slot::HitForMiss(until) | Slot::Unshared(until) => *until,
        };
        Some(until.saturating_duration_since(now))
    }
}

impl<T: Stored> Expiry<Key, Slot<T>> for SlotExpiry {
    fn expire_after_create(&self, _: &Key, slot: &Slot<T>, now: Instant) -> Option<Duration> {
        Self::remaining(slot, now)
    }

    fn expire_after_update(
        &self,
        _: &Key,
        slot: &Slot<T>,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Self::remaining(slot, now)
    }
}

/// How the L1 hashes its keys. A key is already a BLAKE3 digest, so
/// SipHash's strength buys nothing here; a randomly seeded fast hash keeps
/// the table's layout unknowable from outside all the same.
type KeyHash = rapidhash::fast::RandomState;

/// The byte-bounded L1.
pub(crate) struct LocalTier<T> {
    cache: Moka<Key, Slot<T>, KeyHash>,
    max_bytes: u64,
    /// Set once a key that is not its own group (a variant of a URL) was
    /// stored: only then must dropping a group look past the group's key.
    variants: Arc<AtomicBool>,
    gauge: Arc<L1Gauge>,
}

/// This tier's share of the process-wide L1 bytes gauge; gone with the
/// tier's last clone.
#[derive(Default)]
struct L1Gauge(GaugeShare);

impl Drop for L1Gauge {
    fn drop(&mut self) {
        self.0.set(L1_BYTES, 0);
    }
}

impl<T> Clone for LocalTier<T> {
    fn clone(&self) -> Self {
        LocalTier {
            cache: self.cache.clone(),
            max_bytes: self.max_bytes,
            variants: self.variants.clone(),
            gauge: self.gauge.clone(),
        }
    }
}

impl<T: Stored> LocalTier<T> {
    pub(crate) fn new(max_bytes: u64) -> Self {
        let cache = Moka::builder()
            .max_capacity(max_bytes)
            .weigher(|_: &Key, slot: &Slot<T>| match slot {
                Slot::Value(value) => value.weight(),
                Slot::HitForMiss(_) | Slot::Unshared(_) => SLOT_OVERHEAD as u32,
            })
            .expire_after(SlotExpiry)
            .support_invalidation_closures()
            .build_with_hasher(KeyHash::default());
        LocalTier {
            cache,
            max_bytes,
            variants: Arc::default(),
            gauge: Arc::default(),
        }
    }

    pub(crate) fn get(&self, key: &Key) -> Option<Slot<T>> {
        self.cache.get(key)
    }

    /// Stores `slot`, unless it alone outweighs the whole bound: moka would
    /// admit it and evict it only at its next housekeeping, letting one huge
    /// value push out every hot entry in the meantime. Returns whether it
    /// was stored.
    pub(crate) fn insert(&self, key: Key, slot: Slot<T>) -> bool {
        if !key.is_group() && !self.variants.load(Ordering::Relaxed) {
            self.variants.store(true, Ordering::Relaxed);
        }
        if let Slot::Value(value) = &slot
            && u64::from(value.weight()) > self.max_bytes
        {
            self.cache.invalidate(&key);
            return false;
        }
        self.cache.insert(key, slot);
        self.report();
        true
    }

    /// Tells the gauge the bytes held as moka has counted them so far (its
    /// pending maintenance may lag a little; [`Self::weighted_size`] is
    /// exact).
    fn report(&self) {
        self.gauge.0.set(L1_BYTES, self.cache.weighted_size());
    }

    /// Stores a stale value found in the shared tier, unless this process
    /// already holds one that is fresher.
    pub(crate) fn insert_unless_newer(&self, key: Key, value: Arc<T>) {
        let newer_here = matches!(
            self.get(&key),
            Some(Slot::Value(current)) if current.fresh_until() >= value.fresh_until()
        );
        if !newer_here {
            self.insert(key, Slot::Value(value));
        }
    }

    /// Drops every slot.
    pub(crate) fn clear(&self) {
        self.cache.invalidate_all();
        self.report();
    }

    pub(crate) fn remove(&self, key: &Key) {
        self.cache.invalidate(key);
        self.report();
    }

    /// Drops every slot of `group`: the group's own key and, once variants
    /// were stored, every key of the group. Once this returns, no slot of
    /// the group stored before it is returned again (moka checks the
    /// predicate on reads until its sweep has removed them).
    pub(crate) fn remove_group(&self, group: &Key) {
        let group = group.group();
        self.cache.invalidate(&group);
        if self.variants.load(Ordering::Relaxed) {
            let predicate = self
                .cache
                .invalidate_entries_if(move |key, _| key.in_group(&group));
            if predicate.is_err() {
                // Closures are enabled above; should that ever change, drop
                // everything rather than keep a variant.
                self.cache.invalidate_all();
            }
        }
        self.report();
    }

    /// Drops every value for which `pred` holds. Once this returns, none of
    /// them is returned again (moka checks the predicate on reads until its
    /// sweep has removed them).
    pub(crate) fn remove_values_if(&self, pred: impl Fn(&T) -> bool + Send + Sync + 'static) {
        let predicate = self
            .cache
            .invalidate_entries_if(move |_, slot| matches!(slot, Slot::Value(v) if pred(v)));
        if predicate.is_err() {
            // Closures are enabled in `new`; should that ever change, drop
            // everything rather than keep one of them.
            self.cache.invalidate_all();
        }
        self.report();
    }

    /// Removes the key's value only if it is still `value`: a newer one
    /// stored meanwhile stays.
    #[cfg(feature = "redis")]
    pub(crate) fn remove_if_same(&self, key: &Key, value: &Arc<T>) {
        let _ = self.cache.entry(*key).and_compute_with(|slot| match slot {
            Some(slot) if matches!(slot.value(), Slot::Value(current) if Arc::ptr_eq(current, value)) => {
                Op::Remove
            }
            _ => Op::Nop,
        });
    }

    /// Bytes held, after applying pending evictions.
    pub(crate) fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        let size = self.cache.weighted_size();
        self.gauge.0.set(L1_BYTES, size);
        size
    }

    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}
