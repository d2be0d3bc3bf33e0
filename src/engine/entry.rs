//! A cached value and the clock that says how long it may be used.
//!
//! The engine knows nothing of HTTP: an [`Entry`] holds any value behind an
//! `Arc<dyn Any>` together with its lifetime, because the tower layer's
//! responses and the generic [`Cache`](crate::Cache)'s values share one
//! byte-bounded L1 (so every value reports its weight). The type is checked
//! once, where an entry leaves the engine: [`Held`] is an entry known to hold
//! a `V`.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tags::Stamp;
use crate::store::local::{Stored, SLOT_OVERHEAD as ENTRY_OVERHEAD};

pub use super::value::CacheValue;

/// The longest any lifetime or age may be: 2^31 seconds (RFC 9111 §1.2.2:
/// a larger delta-seconds, or one a calculation would overflow, counts as
/// this). Numbers from origins and from Redis are clamped to it, so no
/// arithmetic on instants can overflow.
pub(crate) const MAX_DELTA: Duration = Duration::from_secs(1 << 31);

/// `at + by`, with `by` clamped to [`MAX_DELTA`]; an instant past what the
/// clock can hold saturates at `at` (the value is then simply not fresh:
/// failing safe).
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by.min(MAX_DELTA)).unwrap_or(at)
}

/// How long a freshly built value may be used, counted from when it was stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lifetime {
    /// Served as fresh for this long.
    pub ttl: Duration,
    /// After `ttl`, served at once while one refresh runs in the background.
    pub stale_while_revalidate: Duration,
    /// After `ttl`, served when a rebuild fails.
    pub stale_if_error: Duration,
    /// After `ttl`, kept but never served: the base of the next rebuild,
    /// which may ask the origin whether it still holds (a conditional
    /// request) and renew it rather than fetch it again. Zero for a value
    /// that cannot be validated.
    pub revalidation: Duration,
}

/// An entry's metadata, as the shared tier writes it beside the value (see
/// [`super::codec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub lifetime: Lifetime,
    pub initial_age: Duration,
    pub rebuild_cost: Duration,
}

impl Envelope {
    /// The stale windows (stale-while-revalidate, stale-if-error) left to
    /// the value: counted, like its freshness, from when the origin made it
    /// (older than ttl plus a window: past that window on arrival). An age
    /// at the ceiling (2^31 s, which is also what an unreadable `Age`
    /// becomes) is past every window: ttl and windows are each clamped to
    /// that ceiling, so their sum could otherwise outlast it.
    pub(crate) fn windows(&self) -> (Duration, Duration) {
        if self.initial_age >= MAX_DELTA {
            return (Duration::ZERO, Duration::ZERO);
        }
        let overdue = self.initial_age.saturating_sub(self.lifetime.ttl);
        (
            self.lifetime.stale_while_revalidate.saturating_sub(overdue),
            self.lifetime.stale_if_error.saturating_sub(overdue),
        )
    }

    /// The revalidation window left to the value, counted like the stale
    /// windows from when the origin made it.
    pub(crate) fn revalidation(&self) -> Duration {
        if self.initial_age >= MAX_DELTA {
            return Duration::ZERO;
        }
        let overdue = self.initial_age.saturating_sub(self.lifetime.ttl);
        self.lifetime.revalidation.saturating_sub(overdue)
    }
}

/// Where an entry stands at a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    Fresh,
    /// Past its ttl but inside stale-while-revalidate: serve and refresh.
    Revalidate,
    /// Past its ttl and stale-while-revalidate, but inside stale-if-error:
    /// usable only when a rebuild fails.
    IfError,
    /// Past every window that lets it be served, but inside its
    /// revalidation window: never served, only the base of a conditional
    /// request.
    Validate,
    /// Past every window; only waiting for the L1 to drop it.
    Expired,
}

/// One cached value with its lifetime.
pub(crate) struct Entry {
    value: Arc<dyn Any + Send + Sync>,
    weight: u32,
    /// Its lifetime, the age the value had when stored (an origin's `Age`
    /// header) and how long the rebuild took (the delta of probabilistic
    /// early refresh): what the shared tier writes beside the value.
    envelope: Envelope,
    stored_at: Instant,
    fresh_until: Instant,
    revalidate_until: Instant,
    if_error_until: Instant,
    validate_until: Instant,
    /// When this process last drew for an early refresh of this entry, in
    /// milliseconds after `stored_at` (plus one; 0: never).
    last_draw: AtomicU64,
    /// The generations it was built under (see [`super::tags`]).
    stamp: Stamp,
}

impl Entry {
    pub(crate) fn new<V: CacheValue>(
        value: V,
        lifetime: Lifetime,
        initial_age: Duration,
        rebuild_cost: Duration,
        now: Instant,
    ) -> Self {
        let initial_age = initial_age.min(MAX_DELTA);
        let fresh_until = later(now, lifetime.ttl.saturating_sub(initial_age));
        let envelope = Envelope {
            lifetime,
            initial_age,
            rebuild_cost,
        };
        Self::placed(value, envelope, now, fresh_until)
    }

    /// An entry stored at `stored_at` and fresh until `fresh_until`; its
    /// stale windows follow from the envelope. A freshly built entry is
    /// placed from this process's clock ([`new`](Self::new)); one read from
    /// the shared tier, from what Redis's clock says is left.
    pub(crate) fn placed<V: CacheValue>(
        value: V,
        envelope: Envelope,
        stored_at: Instant,
        fresh_until: Instant,
    ) -> Self {
        let weight = value.weight().saturating_add(ENTRY_OVERHEAD);
        let (revalidate, if_error) = envelope.windows();
        Entry {
            value: Arc::new(value),
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
            envelope,
            stored_at,
            fresh_until,
            revalidate_until: later(fresh_until, revalidate),
            if_error_until: later(fresh_until, if_error),
            validate_until: later(fresh_until, envelope.revalidation()),
            last_draw: AtomicU64::new(0),
            stamp: Stamp::default(),
        }
    }

    /// The entry, built under these generations.
    pub(crate) fn with_stamp(mut self, stamp: Stamp) -> Self {
        self.stamp = stamp;
        self
    }

    /// The generations it was built under.
    pub(crate) fn stamp(&self) -> &Stamp {
        &self.stamp
    }

    /// Its lifetime, initial age and rebuild cost.
    pub(crate) fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Freshness left at `now`.
    pub(crate) fn fresh_for(&self, now: Instant) -> Duration {
        self.fresh_until.saturating_duration_since(now)
    }

    /// Whether a stale-while-revalidate window covers `now` (fresh counts too).
    pub(crate) fn servable_while_revalidating(&self, now: Instant) -> bool {
        now < self.revalidate_until
    }

    /// Its whole freshness lifetime (RFC 9111 §4.2.1), counted from the
    /// origin's answer, however old the value was when stored here.
    pub(crate) fn freshness_lifetime(&self) -> Duration {
        self.envelope
            .initial_age
            .saturating_add(self.fresh_until.saturating_duration_since(self.stored_at))
    }

    /// When it was stored (for an entry read from Redis: when the
    /// instance that built it stored it, as far as its freshness tells).
    pub(crate) fn stored_at(&self) -> Instant {
        self.stored_at
    }

    /// When freshness ends.
    pub(crate) fn fresh_until(&self) -> Instant {
        self.fresh_until
    }

    /// The value, if it is a `V` (an entry written under the same key by a
    /// different type is a miss, never a panic).
    pub(crate) fn value<V: 'static>(&self) -> Option<&V> {
        self.value.downcast_ref()
    }

    /// Whether the entry holds a `V`.
    pub(crate) fn holds<V: 'static>(&self) -> bool {
        self.value.is::<V>()
    }

    pub(crate) fn freshness(&self, now: Instant) -> Freshness {
        if now < self.fresh_until {
            Freshness::Fresh
        } else if now < self.revalidate_until {
            Freshness::Revalidate
        } else if now < self.if_error_until {
            Freshness::IfError
        } else if now < self.validate_until {
            Freshness::Validate
        } else {
            Freshness::Expired
        }
    }

    /// Whether a failed rebuild may fall back to this entry.
    pub(crate) fn usable_on_error(&self, now: Instant) -> bool {
        now < self.fresh_until || now < self.if_error_until
    }

    /// How old the value is, for the `Age` header.
    pub(crate) fn age(&self, now: Instant) -> Duration {
        self.envelope
            .initial_age
            .saturating_add(now.saturating_duration_since(self.stored_at))
    }

    /// Claims the right to draw for an early refresh at `now`: granted at
    /// most once per `gap`. XFetch draws once per request; at tens of
    /// thousands of hits per second that makes a refresh all but certain
    /// long before expiry. A fixed number of draws per rebuild time instead
    /// makes how early a key is refreshed independent of how hot it is.
    pub(crate) fn claim_draw(&self, now: Instant, gap: Duration) -> bool {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let at = millis(now.saturating_duration_since(self.stored_at)).saturating_add(1);
        let gap = millis(gap).max(1);
        let last = self.last_draw.load(Ordering::Relaxed);
        if last != 0 && at < last.saturating_add(gap) {
            return false;
        }
        self.last_draw
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

impl Stored for Entry {
    fn weight(&self) -> u32 {
        self.weight
    }

    /// The latest instant at which any window still allows serving the
    /// entry, or renewing it with a conditional request.
    fn last_use(&self) -> Instant {
        self.revalidate_until
            .max(self.if_error_until)
            .max(self.validate_until)
    }

    fn fresh_until(&self) -> Instant {
        self.fresh_until
    }
}

/// An entry known to hold a `V`: what the engine hands its adapters.
pub(crate) struct Held<V> {
    entry: Arc<Entry>,
    _value: PhantomData<fn() -> V>,
}

impl<V> Clone for Held<V> {
    fn clone(&self) -> Self {
        Held {
            entry: self.entry.clone(),
            _value: PhantomData,
        }
    }
}

impl<V: CacheValue> Held<V> {
    /// `None` if the entry holds another type: a miss for this caller.
    pub(crate) fn new(entry: Arc<Entry>) -> Option<Self> {
        entry.holds::<V>().then_some(Held {
            entry,
            _value: PhantomData,
        })
    }

    pub(crate) fn value(&self) -> &V {
        match self.entry.value::<V>() {
            Some(value) => value,
            // `new` checked the type, and an entry's value never changes.
            None => unreachable!("a held entry holds its type"),
        }
    }

    pub(crate) fn entry(&self) -> &Arc<Entry> {
        &self.entry
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn lifetime(ttl: u64, swr: u64, sie: u64) -> Lifetime {
        Lifetime {
            ttl: Duration::from_secs(ttl),
            stale_while_revalidate: Duration::from_secs(swr),
            stale_if_error: Duration::from_secs(sie),
            revalidation: Duration::ZERO,
        }
    }

    #[test]
    fn freshness_moves_through_its_windows_in_order() {
        let t0 = Instant::now();
        let e = Entry::new(
            Bytes::from_static(b"x"),
            lifetime(10, 5, 20),
            Duration::ZERO,
            Duration::ZERO,
            t0,
        );
        assert_eq!(e.freshness(t0), Freshness::Fresh);
        assert_eq!(
            e.freshness(t0 + Duration::from_secs(12)),
            Freshness::Revalidate
        );
        assert_eq!(
            e.freshness(t0 + Duration::from_secs(16)),
            Freshness::IfError
        );
        assert!(e.usable_on_error(t0 + Duration::from_secs(29)));
        assert_eq!(
            e.freshness(t0 + Duration::from_secs(31)),
            Freshness::Expired
        );
        assert_eq!(e.last_use(), t0 + Duration::from_secs(30));
    }

    #[test]
    fn a_revalidation_window_keeps_the_entry_but_never_serves_it() {
        let (t0, secs) = (Instant::now(), Duration::from_secs);
        let mut kept = lifetime(10, 0, 5);
        kept.revalidation = secs(60);
        let e = Entry::new(Bytes::new(), kept, secs(0), secs(0), t0);
        assert_eq!(e.freshness(t0 + secs(12)), Freshness::IfError);
        assert_eq!(e.freshness(t0 + secs(20)), Freshness::Validate);
        assert!(!e.usable_on_error(t0 + secs(20)));
        assert!(!e.servable_while_revalidating(t0 + secs(20)));
        assert_eq!(e.freshness(t0 + secs(71)), Freshness::Expired);
        assert_eq!(e.last_use(), t0 + secs(70));
        // Counted from the origin's answer, like the stale windows.
        let aged = Entry::new(Bytes::new(), kept, secs(40), secs(0), t0);
        assert_eq!(aged.last_use(), t0 + secs(30));
        assert_eq!(aged.envelope().revalidation(), secs(30));
    }

    #[test]
    fn initial_age_shortens_freshness_and_counts_in_age() {
        let t0 = Instant::now();
        let e = Entry::new(
            Bytes::new(),
            lifetime(10, 0, 0),
            Duration::from_secs(4),
            Duration::ZERO,
            t0,
        );
        assert_eq!(e.freshness(t0 + Duration::from_secs(5)), Freshness::Fresh);
        assert_eq!(e.freshness(t0 + Duration::from_secs(6)), Freshness::Expired);
        assert_eq!(e.age(t0 + Duration::from_secs(1)), Duration::from_secs(5));
    }

    #[test]
    fn stale_windows_count_from_the_origins_answer() {
        let (t0, secs) = (Instant::now(), Duration::from_secs);
        let aged = |age| Entry::new(Bytes::new(), lifetime(10, 5, 20), secs(age), secs(0), t0);
        // 3 s past its ttl: 2 s of stale-while-revalidate, 17 of stale-if-error.
        let e = aged(13);
        assert_eq!(e.freshness(t0), Freshness::Revalidate);
        assert_eq!(e.freshness(t0 + secs(3)), Freshness::IfError);
        assert_eq!(e.last_use(), t0 + secs(17));
        // Older than its ttl plus every window: never served, even on error.
        let e = aged(1000);
        assert_eq!(
            (e.freshness(t0), e.usable_on_error(t0)),
            (Freshness::Expired, false)
        );
    }

    #[test]
    fn early_refresh_draws_are_rationed_per_rebuild_time() {
        let t0 = Instant::now();
        let e = Entry::new(
            Bytes::new(),
            lifetime(10, 0, 0),
            Duration::ZERO,
            Duration::from_millis(100),
            t0,
        );
        let gap = Duration::from_millis(100);
        assert!(e.claim_draw(t0, gap));
        assert!(!e.claim_draw(t0 + Duration::from_millis(50), gap));
        assert!(!e.claim_draw(t0 + Duration::from_millis(99), gap));
        assert!(e.claim_draw(t0 + Duration::from_millis(101), gap));
        assert!(!e.claim_draw(t0 + Duration::from_millis(150), gap));
        // A gap too long to count in milliseconds saturates: one claim.
        let once = Entry::new(
            Bytes::new(),
            lifetime(10, 0, 0),
            Duration::ZERO,
            Duration::ZERO,
            t0,
        );
        assert!(once.claim_draw(t0, Duration::MAX));
        assert!(!once.claim_draw(t0 + Duration::from_secs(5), Duration::MAX));
    }

    #[test]
    fn the_freshness_lifetime_counts_the_age_it_was_stored_at() {
        let t0 = Instant::now();
        let e = Entry::new(
            Bytes::new(),
            lifetime(10, 0, 0),
            Duration::from_secs(4),
            Duration::ZERO,
            t0,
        );
        assert_eq!(e.freshness_lifetime(), Duration::from_secs(10));
    }

    #[test]
    fn a_value_of_another_type_reads_as_absent() {
        let e = Entry::new(
            String::from("s"),
            lifetime(1, 0, 0),
            Duration::ZERO,
            Duration::ZERO,
            Instant::now(),
        );
        assert!(e.value::<Bytes>().is_none());
        assert_eq!(e.value::<String>().map(String::as_str), Some("s"));
    }
}
