//! What makes an invalidation a fleet barrier: acknowledgements, and the
//! subscription lease that bounds how long an instance that cannot hear the
//! channel keeps trusting its in-process tier.
//!
//! **Acknowledgements.** An invalidation message carries its sender and a
//! nonce. Every instance that receives it first drops its copies (detaches
//! the group's flights, removes the group from its L1), then publishes an
//! acknowledgement on the sender's own channel, `{channel}:ack:<instance>`.
//! The sender acknowledges its own echo locally. `PUBLISH` says how many
//! subscribers received the message; the sender waits for that many.
//!
//! **The subscription lease.** Every [`KEEPALIVE`](super::supervisor) the
//! supervisor pings the subscriber connection. A PONG arrives after every
//! message published before its PING was served, so once it is in, every
//! invalidation published before the PING was sent has been handled. The
//! in-process tier is trusted for [`Liveness::lease`] after the PING was
//! sent. Once that has run out (a frozen link, a dead connection), the L1 is
//! dropped and flights detached, and from then on an entry is kept at most
//! one lease: a value is only served if it was built after the last drop.
//! So an instance that did not acknowledge within one lease of the publish
//! has either handled the message or serves nothing read before it.
//!
//! **Pending invalidations.** One that did not reach Redis at all is
//! remembered here, per group, and retried until Redis has it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::key::Key;

/// The subscription lease: how long after a confirmed PING the in-process
/// tier is trusted.
pub(crate) struct Liveness {
    base: Instant,
    lease: Duration,
    /// Milliseconds since `base` until which the subscription is confirmed.
    until: AtomicU64,
    /// Milliseconds since `base` (plus one; zero: never) of the last drop of
    /// the in-process tier for want of a live subscription.
    dropped: AtomicU64,
}

impl Liveness {
    pub(crate) fn new(lease: Duration) -> Self {
        Liveness {
            base: Instant::now(),
            lease,
            until: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
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

    /// The in-process tier was dropped at `now` (the subscription was seen
    /// to fail).
    pub(crate) fn dropped(&self, now: Instant) {
        self.dropped
            .fetch_max(self.ms(now).saturating_add(1), Ordering::AcqRel);
    }

    /// Whether the in-process tier must be dropped before it serves at
    /// `now`: the lease ran out and it was not dropped since, or it was
    /// dropped more than one lease ago and the subscription is still not
    /// confirmed. True for one caller only; that caller drops it.
    pub(crate) fn must_drop(&self, now: Instant) -> bool {
        let now = self.ms(now);
        let until = self.until.load(Ordering::Acquire);
        if now < until {
            return false;
        }
        let dropped = self.dropped.load(Ordering::Acquire);
        let last = dropped.saturating_sub(1);
        if dropped != 0 && last >= until && now < last.saturating_add(self.ms_lease()) {
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

/// Invalidations of this process waiting for their acknowledgements.
#[derive(Default)]
pub(crate) struct Acks {
    waiting: Mutex<HashMap<u64, watch::Sender<u64>>>,
}

impl Acks {
    /// Starts counting acknowledgements of `nonce`.
    pub(crate) fn expect(&self, nonce: u64) -> watch::Receiver<u64> {
        let (tx, rx) = watch::channel(0);
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nonce, tx);
        rx
    }

    /// Stops counting acknowledgements of `nonce`.
    pub(crate) fn forget(&self, nonce: u64) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&nonce);
    }

    /// One acknowledgement of `nonce` arrived.
    pub(crate) fn acked(&self, nonce: u64) {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = waiting.get(&nonce) {
            tx.send_modify(|n| *n += 1);
        }
    }
}

/// The most invalidations an instance remembers as not yet in Redis (one per
/// group). Past it, a further failed invalidation is only reported to its
/// caller.
const PENDING_MAX: usize = 10_000;

/// Invalidations that did not reach Redis, by group: the key that was
/// invalidated. While one is pending, the group's values in Redis are the
/// old ones, and this instance does not take them; the supervisor retries
/// until Redis has it.
#[derive(Default)]
pub(crate) struct Pending(Mutex<HashMap<Key, Key>>);

impl Pending {
    pub(crate) fn remember(&self, key: &Key) -> bool {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() >= PENDING_MAX && !pending.contains_key(&key.group()) {
            return false;
        }
        pending.insert(key.group(), *key);
        true
    }

    pub(crate) fn get(&self, group: &Key) -> Option<Key> {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            return None;
        }
        pending.get(group).copied()
    }

    pub(crate) fn forget(&self, key: &Key) {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.get(&key.group()) == Some(key) {
            pending.remove(&key.group());
        }
    }

    pub(crate) fn all(&self) -> Vec<Key> {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pending.values().copied().collect()
    }
}

/// Waits until `want` acknowledgements were counted on `rx`, at most
/// `limit`. Returns whether they all came.
pub(crate) async fn all_acked(rx: &mut watch::Receiver<u64>, want: u64, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, rx.wait_for(|n| *n >= want)).await,
        Ok(Ok(_))
    )
}

/// The channel on which `instance` hears acknowledgements.
pub(crate) fn ack_channel(channel: &str, instance: &str) -> String {
    format!("{channel}:ack:{instance}")
}

/// The acknowledgement of the invalidation `nonce`.
pub(crate) fn ack_message(nonce: u64) -> String {
    format!("a:{nonce}")
}

pub(crate) fn parse_nonce(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_invalidations_are_bounded_and_kept_per_group() {
        let pending = Pending::default();
        let first = Key::for_value("t", b"first");
        assert!(pending.remember(&first));
        assert_eq!(pending.get(&first.group()), Some(first));
        for i in 1..PENDING_MAX {
            assert!(pending.remember(&Key::for_value("t", &i.to_be_bytes())));
        }
        assert!(!pending.remember(&Key::for_value("t", b"one too many")));
        assert!(pending.remember(&first), "a group already pending is kept");
        pending.forget(&first);
        assert_eq!(pending.get(&first.group()), None);
        assert_eq!(pending.all().len(), PENDING_MAX - 1);
    }

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

    #[tokio::test]
    async fn acks_are_counted_per_nonce() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        acks.acked(7);
        acks.acked(8);
        assert!(!all_acked(&mut rx, 2, Duration::from_millis(10)).await);
        acks.acked(7);
        assert!(all_acked(&mut rx, 2, Duration::from_millis(10)).await);
        acks.forget(7);
    }
}
