//! The acknowledgements of this process's invalidations, counted as they
//! arrive on its acknowledgement channel.
//!
//! `PUBLISH` says how many subscribers received an invalidation; its sender
//! waits for that many acknowledgements, and for one from every member of
//! the fleet (see [`super::barrier`]). An acknowledgement names the
//! instance that sent it, so the members can be told apart from strangers.
//!
//! Under a burst of invalidations the work around them is batched, so that
//! its cost does not grow with the burst: an instance acknowledges every
//! invalidation it has handled and not yet acknowledged in one call (one
//! message naming them all), and the reads a sender makes for its waiting
//! invalidations (the membership, the recorded acknowledgements) are
//! gathered in [`Batches`], one round trip for all of them.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::{oneshot, watch};

use super::messages::is_instance;

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

/// Forgets an invalidation's acknowledgements when dropped (see
/// [`Acks::forget_when_dropped`]).
pub(crate) struct Forget<'a> {
    acks: &'a Acks,
    nonce: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.acks.forget(self.nonce);
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

    /// Stops counting acknowledgements of `nonce` when the returned guard
    /// goes, however the invalidation waiting for them ends (its caller may
    /// drop it half way).
    pub(crate) fn forget_when_dropped(&self, nonce: u64) -> Forget<'_> {
        Forget { acks: self, nonce }
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
        self.acked_all(&[nonce], by);
    }

    /// An acknowledgement of each of `nonces` arrived, from `by` if it
    /// said. An instance that names itself is counted once per
    /// invalidation, however often its acknowledgement is heard (one it
    /// sent again, or one a client copied): a repeat does not stand in for
    /// another receiver's.
    pub(crate) fn acked_all(&self, nonces: &[u64], by: Option<&str>) {
        let by = by.filter(|by| is_instance(by));
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        for nonce in nonces {
            let Some(tx) = waiting.get(nonce) else {
                continue;
            };
            tx.send_if_modified(|acked| match by {
                Some(by) if acked.by.contains(by) => false,
                Some(by) => {
                    acked.count = acked.count.saturating_add(1);
                    if acked.by.len() < ACKERS_MAX {
                        acked.by.insert(by.to_owned());
                    }
                    true
                }
                None => {
                    acked.count = acked.count.saturating_add(1);
                    true
                }
            });
        }
    }
}

/// Requests served together, a batch at a time. A request queued while a
/// batch is under way waits for the next one, which begins only after it
/// was queued: whatever a batch reads from Redis, it reads after every one
/// of its requests was made. The caller that finds no batch running starts
/// the runner (see [`Batches::queue`]), which takes batches until none is
/// left.
pub(crate) struct Batches<Q, A> {
    state: Mutex<Queued<Q, A>>,
}

struct Queued<Q, A> {
    requests: Vec<(Q, oneshot::Sender<A>)>,
    running: bool,
}

impl<Q, A> Default for Batches<Q, A> {
    fn default() -> Self {
        Batches {
            state: Mutex::new(Queued {
                requests: Vec::new(),
                running: false,
            }),
        }
    }
}

impl<Q, A> Batches<Q, A> {
    /// Queues `request`: the receiver of its answer, and whether the caller
    /// must start a runner (none was running).
    pub(crate) fn queue(&self, request: Q) -> (oneshot::Receiver<A>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests.push((request, tx));
        let start = !state.running;
        state.running = true;
        (rx, start)
    }

    /// The next batch, at most `most` requests, oldest first. Empty when
    /// none is queued: the runner then ends, and the next request starts
    /// another.
    pub(crate) fn take(&self, most: usize) -> Vec<(Q, oneshot::Sender<A>)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.requests.is_empty() {
            state.running = false;
            return Vec::new();
        }
        let most = most.min(state.requests.len());
        let rest = state.requests.split_off(most);
        std::mem::replace(&mut state.requests, rest)
    }

    /// A runner ended before its time (a panic): what is queued is
    /// answered with nothing (its receivers see the sender dropped), and
    /// the next request starts a runner.
    pub(crate) fn abandon(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests.clear();
        state.running = false;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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

    #[tokio::test]
    async fn a_repeated_acknowledgement_counts_once() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        let a = "0123456789abcdef".to_owned();
        acks.acked_all(&[7, 8], Some(&a));
        acks.acked_all(&[7], Some(&a));
        assert_eq!(rx.borrow().count, 1);
        acks.acked(7, None);
        assert!(all_acked(&mut rx, 2, &[a], soon()).await);
    }

    #[test]
    fn a_batch_serves_what_was_queued_before_it_began() {
        let batches = Batches::<u32, u32>::default();
        let (_first, start) = batches.queue(1);
        assert!(start, "the first request starts the runner");
        let (_second, start) = batches.queue(2);
        assert!(!start, "one runner at a time");
        let batch = batches.take(10);
        assert_eq!(batch.iter().map(|b| b.0).collect::<Vec<_>>(), [1, 2]);
        let (_third, start) = batches.queue(3);
        assert!(!start, "the running runner takes it next");
        assert_eq!(batches.take(10).len(), 1);
        assert!(batches.take(10).is_empty(), "none left: the runner ends");
        let (_fourth, start) = batches.queue(4);
        assert!(start, "and the next request starts another");
        for i in 5..10 {
            let _ = batches.queue(i);
        }
        assert_eq!(batches.take(4).len(), 4, "at most what a batch holds");
        assert_eq!(batches.take(4).len(), 2);
    }
}
