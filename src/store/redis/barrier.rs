//! What makes an invalidation a fleet barrier: acknowledgements, and the
//! subscription lease that bounds how long an instance that cannot hear the
//! channel keeps trusting its in-process tier.
//!
//! **Acknowledgements.** An invalidation message carries its sender and a
//! nonce. Every instance that receives it first drops its copies (detaches
//! the group's flights, removes the group from its L1), then publishes an
//! acknowledgement on the sender's own channel, `{channel}:ack:<instance>`.
//! The sender acknowledges its own echo locally. `PUBLISH` says how many
//! subscribers received the message; the sender waits for that many, and
//! for one from every member of the fleet (see [`super::members`]): an
//! acknowledgement names its sender, `a:<nonce>:<instance>`.
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

use std::collections::{HashMap, HashSet};
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

/// The acknowledgements of one invalidation so far: how many, and from
/// which instances (those that named themselves).
#[derive(Clone, Debug, Default)]
pub(crate) struct Acked {
    pub count: u64,
    pub by: HashSet<String>,
}

/// The most acknowledging instances remembered per invalidation: past it,
/// acknowledgements are only counted.
const ACKERS_MAX: usize = 10_000;

impl Acked {
    /// Whether `want` acknowledgements came, among them one from every
    /// instance of `members`.
    pub(crate) fn covers(&self, want: u64, members: &[String]) -> bool {
        self.count >= want && members.iter().all(|m| self.by.contains(m))
    }
}

/// Invalidations of this process waiting for their acknowledgements.
#[derive(Default)]
pub(crate) struct Acks {
    waiting: Mutex<HashMap<u64, watch::Sender<Acked>>>,
}

impl Acks {
    /// Starts counting acknowledgements of `nonce`.
    pub(crate) fn expect(&self, nonce: u64) -> watch::Receiver<Acked> {
        let (tx, rx) = watch::channel(Acked::default());
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

    /// One acknowledgement of `nonce` arrived, from `by` if it said.
    pub(crate) fn acked(&self, nonce: u64, by: Option<&str>) {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = waiting.get(&nonce) {
            tx.send_modify(|acked| {
                acked.count = acked.count.saturating_add(1);
                if let Some(by) = by
                    && is_instance(by)
                    && acked.by.len() < ACKERS_MAX
                {
                    acked.by.insert(by.to_owned());
                }
            });
        }
    }
}

/// Whether `name` looks like an instance's signature (16 hex digits).
pub(crate) fn is_instance(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit())
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

/// Waits until `want` acknowledgements were counted on `rx`, one of them
/// from every instance of `members`, at most until `until`. Returns whether
/// they all came.
pub(crate) async fn all_acked(
    rx: &mut watch::Receiver<Acked>,
    want: u64,
    members: &[String],
    until: tokio::time::Instant,
) -> bool {
    matches!(
        tokio::time::timeout_at(until, rx.wait_for(|a| a.covers(want, members))).await,
        Ok(Ok(_))
    )
}

/// An acknowledgement to send: the invalidator, its nonce, and what the
/// message that was handled invalidated (see [`super::acks`]).
pub(crate) type AckDue = (String, u64, String);

/// What an invalidation of `group` invalidated, as its acknowledgement
/// records it.
pub(crate) fn key_subject(group: &Key) -> String {
    group.to_string()
}

/// What a generation message invalidated, as its acknowledgement records
/// it: the field and its new generation.
pub(crate) fn generation_subject(field: &str, generation: u64) -> String {
    format!("{field}:{generation}")
}

/// The channel on which `instance` hears acknowledgements.
pub(crate) fn ack_channel(channel: &str, instance: &str) -> String {
    format!("{channel}:ack:{instance}")
}

/// The acknowledgement of the invalidation `nonce`, signed by `instance`.
pub(crate) fn ack_message(nonce: u64, instance: &str) -> String {
    format!("a:{nonce}:{instance}")
}

pub(crate) fn parse_nonce(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// An acknowledgement (after its `a:`): its nonce and, if signed, the
/// instance that sent it.
pub(crate) fn parse_ack(bytes: &[u8]) -> Option<(u64, Option<&str>)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (nonce, by) = match text.split_once(':') {
        Some((nonce, by)) => (nonce, Some(by)),
        None => (text, None),
    };
    Some((nonce.parse().ok()?, by))
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

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(10)
    }

    #[tokio::test]
    async fn acks_are_counted_per_nonce() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        acks.acked(7, None);
        acks.acked(8, None);
        assert!(!all_acked(&mut rx, 2, &[], soon()).await);
        acks.acked(7, None);
        assert!(all_acked(&mut rx, 2, &[], soon()).await);
        acks.forget(7);
    }

    #[tokio::test]
    async fn every_member_must_acknowledge_whatever_the_count() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        let (a, b) = ("0123456789abcdef".to_owned(), "fedcba9876543210".to_owned());
        let members = [a.clone(), b.clone()];
        // Enough acknowledgements, but anonymous or from strangers.
        acks.acked(7, None);
        acks.acked(7, Some("not an instance"));
        acks.acked(7, Some(&a));
        acks.acked(7, Some(&a));
        assert!(!all_acked(&mut rx, 1, &members, soon()).await);
        acks.acked(7, Some(&b));
        assert!(all_acked(&mut rx, 1, &members, soon()).await);
        assert!(!rx.borrow().covers(6, &members), "and the count too");
    }

    #[test]
    fn acknowledgements_parse_signed_or_not() {
        assert_eq!(parse_ack(b"9"), Some((9, None)));
        assert_eq!(
            parse_ack(&ack_message(9, "0123456789abcdef").as_bytes()[2..]),
            Some((9, Some("0123456789abcdef")))
        );
        for foreign in [&b""[..], b"x", b"-1", b"\xff:1", b"99999999999999999999999"] {
            assert_eq!(parse_ack(foreign), None, "{foreign:?}");
        }
    }
}
