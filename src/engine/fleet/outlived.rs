//! What the in-process tier held when the subscription came back after a
//! gap, with an outage grace set: entries that may have missed an
//! invalidation sent during the gap.
//!
//! They are kept, not dropped, but only as long as the outage rule would
//! have served them had the gap gone on (its next drop: the lease and the
//! grace counted from the last confirmed keepalive, or a period after the
//! last drop; see [`Liveness::next_drop`]), and only while one of these
//! holds:
//!
//! - the table read after the rejoin is not in yet and the subscription is
//!   not confirmed live again (still the outage's view); or
//! - that read found a new epoch: Redis lost its data since the rejoin's
//!   epoch (restarted empty, restored from an older copy), and with it
//!   every invalidation made before the loss and every entry those
//!   invalidations purged. Nothing in Redis can say what was missed.
//!
//! When the read finds the epoch the process knew, Redis kept its data, and
//! what an invalidation made during the gap purged is gone from it while
//! the copy here is not: the entries are dropped then, at once. Every
//! invalidation heard after the rejoin reaches them as it reaches any entry
//! (a key's group, a tag, everything; a tag's generation moved on a new
//! table rejects them too, see [`TagTable::admits_outlived`]).
//!
//! So an entry that may have missed an invalidation is never served past
//! the instant the outage rule would have dropped it.
//!
//! [`Liveness::next_drop`]: crate::store::redis::liveness::Liveness::next_drop
//! [`TagTable::admits_outlived`]: crate::engine::tags::TagTable::admits_outlived

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// No entry is held from a gap.
const NONE: u8 = 0;
/// The table read after the rejoin is not in yet.
const PENDING: u8 = 1;
/// It found a new epoch: the entries are kept until their instant.
const KEPT: u8 = 2;

/// The entries stored at or before the last rejoin, and until when they may
/// be served.
pub(crate) struct Outlived {
    base: Instant,
    /// Milliseconds since `base`, plus one (zero: nothing held from a gap),
    /// of the last rejoin: entries stored then or before lived through it.
    cutoff: AtomicU64,
    /// Milliseconds since `base` from which they are served no more.
    until: AtomicU64,
    /// [`NONE`], [`PENDING`] or [`KEPT`].
    verdict: AtomicU8,
    /// The table's epoch at the first rejoin still pending.
    epoch: AtomicU64,
    /// Held by whoever changes the fields above; a read takes none.
    writing: Mutex<()>,
}

impl Default for Outlived {
    fn default() -> Self {
        Outlived {
            base: Instant::now(),
            cutoff: AtomicU64::new(0),
            until: AtomicU64::new(0),
            verdict: AtomicU8::new(NONE),
            epoch: AtomicU64::new(0),
            writing: Mutex::new(()),
        }
    }
}

impl Outlived {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    fn write(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The subscription came back at `now`; what is held may be served
    /// until `until` at most. `epoch`: the table's epoch as known now.
    /// Entries held from an earlier rejoin keep the earlier instant (the
    /// earliest of the two counts for all).
    pub(crate) fn rejoined(&self, now: Instant, until: Instant, epoch: u64) {
        let _w = self.write();
        let until = self.ms(until);
        if self.cutoff.load(Ordering::Acquire) == 0 {
            self.until.store(until, Ordering::Release);
        } else {
            self.until.fetch_min(until, Ordering::AcqRel);
        }
        if self.verdict.load(Ordering::Acquire) != PENDING {
            self.epoch.store(epoch, Ordering::Release);
        }
        self.verdict.store(PENDING, Ordering::Release);
        self.cutoff
            .fetch_max(self.ms(now).saturating_add(1), Ordering::AcqRel);
    }

    /// Whether an entry stored at `stored_at` lived through a gap.
    pub(crate) fn covers(&self, stored_at: Instant) -> bool {
        let cutoff = self.cutoff.load(Ordering::Acquire);
        cutoff != 0 && self.ms(stored_at) < cutoff
    }

    /// Whether an entry it covers may be served at `now`. `live`: whether
    /// the subscription is confirmed live.
    pub(crate) fn serves(&self, now: Instant, live: bool) -> bool {
        let verdict = self.verdict.load(Ordering::Acquire);
        self.ms(now) < self.until.load(Ordering::Acquire)
            && (verdict == KEPT || (verdict == PENDING && !live))
    }

    /// The table was read after the rejoin, and its epoch is `epoch`.
    /// Returns the cutoff of the entries to drop now, if Redis kept its
    /// data (the epoch did not move since the rejoin).
    pub(crate) fn table_read(&self, epoch: u64) -> Option<u64> {
        let _w = self.write();
        if self.verdict.load(Ordering::Acquire) != PENDING {
            return None;
        }
        if epoch > self.epoch.load(Ordering::Acquire) {
            self.verdict.store(KEPT, Ordering::Release);
            return None;
        }
        Some(self.cutoff.load(Ordering::Acquire)).filter(|&c| c != 0)
    }

    /// The cutoff of the entries to drop at `now`, if their instant came.
    pub(crate) fn due(&self, now: Instant) -> Option<u64> {
        let cutoff = self.cutoff.load(Ordering::Acquire);
        (cutoff != 0 && self.ms(now) >= self.until.load(Ordering::Acquire)).then_some(cutoff)
    }

    /// Whether an entry stored at `stored_at` is one of those `cutoff`
    /// names.
    pub(crate) fn before(&self, stored_at: Instant, cutoff: u64) -> bool {
        self.ms(stored_at) < cutoff
    }

    /// The entries up to `cutoff` were dropped: forgotten, unless a later
    /// rejoin moved the cutoff meanwhile.
    pub(crate) fn dropped(&self, cutoff: u64) {
        let _w = self.write();
        if self.cutoff.load(Ordering::Acquire) == cutoff {
            self.cutoff.store(0, Ordering::Release);
            self.verdict.store(NONE, Ordering::Release);
        }
    }

    /// Whether anything is held from a gap.
    pub(crate) fn any(&self) -> bool {
        self.cutoff.load(Ordering::Acquire) != 0
    }

    /// The instant, in milliseconds since `base`, for tests.
    #[cfg(test)]
    fn until(&self) -> u64 {
        self.until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn kept_past_the_rejoin_only_on_a_new_epoch_and_never_past_its_instant() {
        let o = Outlived::default();
        let t0 = o.base;
        let at = |ms| t0 + Duration::from_millis(ms);
        let before = at(10);
        o.rejoined(at(100), at(1_000), 5);
        assert!(o.covers(before));
        assert!(!o.covers(at(200)), "built after the rejoin");
        assert!(o.serves(at(150), false), "the outage's view");
        assert!(!o.serves(at(150), true), "live, and no verdict yet");
        assert_eq!(o.table_read(6), None, "a new epoch keeps them");
        assert!(o.serves(at(900), true));
        assert!(!o.serves(at(1_000), true), "never past its instant");
        assert_eq!(o.due(at(999)), None);
        let cutoff = o.due(at(1_000)).expect("due");
        assert!(o.before(before, cutoff));
        o.dropped(cutoff);
        assert!(!o.any());
        assert!(!o.covers(before));
    }

    #[test]
    fn the_same_epoch_drops_them_and_a_second_rejoin_keeps_the_earlier_instant() {
        let o = Outlived::default();
        let t0 = o.base;
        let at = |ms| t0 + Duration::from_millis(ms);
        o.rejoined(at(100), at(1_000), 5);
        o.rejoined(at(300), at(5_000), 5);
        assert_eq!(o.until(), 1_000);
        assert!(o.covers(at(250)));
        let cutoff = o.table_read(5).expect("Redis kept its data: dropped");
        o.dropped(cutoff);
        assert!(!o.any());
        o.rejoined(at(2_000), at(3_000), 5);
        assert_eq!(o.until(), 3_000, "a new record");
    }
}
