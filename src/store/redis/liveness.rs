//! The subscription lease: how long an instance that cannot hear the
//! channel keeps trusting its in-process tier.
//!
//! Every [`KEEPALIVE`](super::supervisor::KEEPALIVE) the supervisor pings
//! the subscriber connection. A PONG arrives after every message published
//! before its PING was served, so once it is in, every invalidation
//! published before the PING was sent has been handled. The in-process tier
//! is trusted for [`Liveness::lease`] after the PING was sent. Once that has
//! run out (a frozen link, a dead connection), the L1 is dropped and flights
//! detached, and from then on an entry is kept at most one lease: a value is
//! only served if it was built after the last drop. So an instance that did
//! not acknowledge an invalidation within one lease of its publish has
//! either handled the message or serves nothing read before it.
//!
//! **The outage grace.** Dropping the in-process tier at once costs the
//! origin one call per key per instance per lease for as long as Redis is
//! gone, while during an outage of Redis itself no invalidation can return
//! at all (it cannot reach Redis). So an instance keeps trusting its
//! in-process tier for a grace beyond the lease ([`Liveness::grace`],
//! configurable, zero for the strict rule above), and then drops it once
//! per `max(lease, grace)`. The cost is an instance cut off from Redis while
//! the others are not: an invalidation made elsewhere returns once this
//! instance's membership lapsed, and this instance may serve what it held
//! before that invalidation for at most `lease + grace` after its publish.
//! When the subscription is back, the gap it leaves drops the in-process
//! tier once under the strict rule (see [`super::notify`]). With a grace,
//! its owner is told until when the outage rule would have kept what it
//! holds ([`Liveness::next_drop`]), and the subscription counts as live
//! again only once the owner caught up (the invalidation table read again):
//! what it held is dropped then if Redis kept its data, and kept no longer
//! than that instant if Redis lost it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The subscription lease: how long after a confirmed PING the in-process
/// tier is trusted.
pub(crate) struct Liveness {
    base: Instant,
    lease: Duration,
    /// How long past the lease the in-process tier is still trusted.
    grace: Duration,
    /// Milliseconds since `base` until which the subscription is confirmed.
    until: AtomicU64,
    /// Milliseconds since `base` (plus one; zero: never) of the last drop of
    /// the in-process tier for want of a live subscription.
    dropped: AtomicU64,
}

impl Liveness {
    /// The strict rule: no grace past the lease.
    #[cfg(test)]
    pub(crate) fn new(lease: Duration) -> Self {
        Self::with_grace(lease, Duration::ZERO)
    }

    pub(crate) fn with_grace(lease: Duration, grace: Duration) -> Self {
        Liveness {
            base: Instant::now(),
            lease,
            grace,
            until: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// How long past the lease the in-process tier is still trusted.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    /// A PING sent at `sent` was answered: every message published before
    /// it has been handled.
    pub(crate) fn confirm(&self, sent: Instant) {
        let until = self.ms(sent).saturating_add(self.ms_lease());
        self.until.fetch_max(until, Ordering::AcqRel);
    }

    /// Whether the subscription is confirmed live at `now`.
    pub(crate) fn is_live(&self, now: Instant) -> bool {
        self.ms(now) < self.until.load(Ordering::Acquire)
    }

    fn ms_lease(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    fn ms_grace(&self) -> u64 {
        u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the in-process tier is served past the subscription lease
    /// (a grace is set): then the first sign of a lost subscription does
    /// not drop it, the grace does.
    pub(crate) fn has_grace(&self) -> bool {
        !self.grace.is_zero()
    }

    /// The in-process tier was dropped at `now` (the subscription was seen
    /// to fail).
    pub(crate) fn dropped(&self, now: Instant) {
        self.dropped
            .fetch_max(self.ms(now).saturating_add(1), Ordering::AcqRel);
    }

    /// When the outage rule would next drop the in-process tier if the
    /// subscription stayed unconfirmed from now on: once the lease and the
    /// grace ran out, or, if it was dropped since, `max(lease, grace)`
    /// after that drop. What the tier holds when a gap ends was either
    /// built after that drop's predecessor or lived through the outage:
    /// this is the last instant the outage rule would have served it.
    pub(crate) fn next_drop(&self) -> Instant {
        let until = self.until.load(Ordering::Acquire);
        let dropped = self.dropped.load(Ordering::Acquire);
        let last = dropped.saturating_sub(1);
        let at = if dropped != 0 && last >= until {
            last.saturating_add(self.ms_lease().max(self.ms_grace()))
        } else {
            until.saturating_add(self.ms_grace())
        };
        // Past what an `Instant` holds (a grace of centuries): the rejoin
        // keeps nothing, as if the grace had run out.
        self.base
            .checked_add(Duration::from_millis(at))
            .unwrap_or(self.base)
    }

    /// Whether the in-process tier must be dropped before it serves at
    /// `now`: the lease and the grace ran out and it was not dropped since,
    /// or it was dropped more than `max(lease, grace)` ago and the
    /// subscription is still not confirmed. True for one caller only; that
    /// caller drops it.
    pub(crate) fn must_drop(&self, now: Instant) -> bool {
        let now = self.ms(now);
        let until = self.until.load(Ordering::Acquire);
        if now < until.saturating_add(self.ms_grace()) {
            return false;
        }
        let dropped = self.dropped.load(Ordering::Acquire);
        let last = dropped.saturating_sub(1);
        let period = self.ms_lease().max(self.ms_grace());
        if dropped != 0 && last >= until && now < last.saturating_add(period) {
            return false;
        }
        self.dropped
            .compare_exchange(
                dropped,
                now.saturating_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapsed_lease_drops_once_per_lease() {
        let live = Liveness::new(Duration::from_millis(100));
        let t0 = live.base;
        live.confirm(t0);
        assert!(!live.must_drop(t0 + Duration::from_millis(50)));
        let lapsed = t0 + Duration::from_millis(150);
        assert!(live.must_drop(lapsed));
        assert!(!live.must_drop(lapsed), "once");
        assert!(!live.must_drop(lapsed + Duration::from_millis(50)));
        assert!(
            live.must_drop(lapsed + Duration::from_millis(120)),
            "again a lease later"
        );
        live.confirm(lapsed + Duration::from_millis(130));
        assert!(!live.must_drop(lapsed + Duration::from_millis(200)));
    }

    #[test]
    fn the_next_drop_is_the_lease_and_grace_or_a_period_after_the_last_drop() {
        let live = Liveness::with_grace(Duration::from_millis(100), Duration::from_millis(1_000));
        let t0 = live.base;
        live.confirm(t0);
        assert_eq!(live.next_drop(), t0 + Duration::from_millis(1_100));
        assert!(live.must_drop(t0 + Duration::from_millis(1_200)));
        assert_eq!(live.next_drop(), t0 + Duration::from_millis(2_200));
        live.confirm(t0 + Duration::from_millis(3_000));
        assert_eq!(live.next_drop(), t0 + Duration::from_millis(4_100));
    }

    #[test]
    fn a_grace_keeps_the_tier_past_the_lease_then_drops_once_per_grace() {
        let live = Liveness::with_grace(Duration::from_millis(100), Duration::from_millis(1_000));
        let t0 = live.base;
        live.confirm(t0);
        let lapsed = t0 + Duration::from_millis(150);
        assert!(!live.must_drop(lapsed), "inside the grace");
        assert!(
            !live.is_live(lapsed),
            "yet not live: the barrier's view is strict"
        );
        assert!(!live.must_drop(t0 + Duration::from_millis(1_050)));
        let graced = t0 + Duration::from_millis(1_100);
        assert!(live.must_drop(graced), "lease and grace over");
        assert!(!live.must_drop(graced), "once");
        assert!(!live.must_drop(graced + Duration::from_millis(900)));
        assert!(
            live.must_drop(graced + Duration::from_millis(1_000)),
            "again a grace later"
        );
    }
}
