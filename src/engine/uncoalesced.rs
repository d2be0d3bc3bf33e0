//! Misses that do not coalesce, and the end of flights whose answer was for
//! one client.
//!
//! A refusal (a 403 or 429 for one caller) says nothing about the key: the
//! waiters of its flight lead again (a second refusal in a row is taken for
//! the key's own answer, as below). A per-client answer (a cookie,
//! `private`) opens a hit-for-miss window in which requests go to the origin
//! side by side; the first shareable answer in the window is stored and
//! closes it, so the key is coalesced and hit again.

use std::sync::Arc;
use std::time::Instant;

use super::answer::{
    Answer, Built, Failure, FailureKind, Overtaken, Rebuild, Served, Status, Waiters,
};
use super::entry::{Entry, Held};
use super::flight::{Leader, Outcome};
use super::Engine;
use crate::key::Key;
use crate::metrics::{self as m, count, Labels};
use crate::store::local::Slot;

impl Engine {
    /// A miss in a hit-for-miss window: this request goes to the origin on
    /// its own, without waiting for anyone (Varnish's hit-for-miss, not its
    /// hit-for-pass). If it holds the key's flight (`leader`: the first such
    /// request), a shareable answer it gets is stored in the L1, ending the
    /// window, and given to any request that joined meanwhile; an answer for
    /// it alone renews the window. The shared tier is not written here: the
    /// next flight of the key does that, under its lease.
    pub(super) async fn uncoalesced<R: Rebuild>(
        self: &Arc<Self>,
        key: Key,
        leader: Option<Leader>,
        rebuild: R,
        labels: Labels,
    ) -> Answer<R> {
        m::count_bypass("hit-for-miss", labels);
        count(m::ORIGIN_CALLS, labels);
        tracing::debug!(key = %key, leads = leader.is_some(), "hit-for-miss: not coalesced");
        let started = Instant::now();
        let since = self.tags.start();
        // A panic unwinds to this request, as without the layer, and drops
        // the leader: whoever joined it takes over.
        let overtaken =
            Overtaken::new(self.tags.clone(), since, leader.as_ref().map(Leader::watch));
        match rebuild.rebuild(None, overtaken).await {
            Built::Value {
                value,
                lifetime,
                initial_age,
                store,
                failure,
                private,
                tags,
            } => {
                let entry = Entry::new(
                    value,
                    lifetime,
                    initial_age,
                    started.elapsed(),
                    Instant::now(),
                );
                let (entry, store) = self.stamped(entry, &tags, since, store);
                let held = Held::new(entry.clone());
                let stored = leader.is_some_and(|leader| {
                    let outcome = Outcome::Value {
                        entry,
                        stale: false,
                    };
                    // No lease, no commit: stored only if the L1 kept it.
                    self.settle(leader, outcome, store && !failure).1
                });
                match held {
                    Some(held) => Answer::Served(Served {
                        held,
                        status: Status::Miss,
                        stored,
                        private,
                    }),
                    None => Answer::Failed(Failure::new(FailureKind::Error), Status::Miss),
                }
            }
            Built::Unshared { private, waiters } => {
                if let Some(leader) = leader {
                    self.end_unshared(leader, waiters);
                }
                Answer::Private(private)
            }
            Built::Failed { shared, private } => {
                let failure = Failure {
                    kind: FailureKind::Error,
                    error: shared,
                };
                if let Some(leader) = leader {
                    self.settle(leader, Outcome::Failed(failure.clone()), false);
                }
                match private {
                    Some(private) => Answer::Private(private),
                    None => Answer::Failed(failure, Status::Miss),
                }
            }
        }
    }

    /// Ends a flight whose answer was for its starter alone.
    pub(super) fn end_unshared(&self, leader: Leader, waiters: Waiters) {
        let key = leader.key();
        match waiters {
            // A refusal says nothing about the key: no marker, and whatever
            // the L1 holds for it (a stale-if-error copy) stays.
            Waiters::Relead(_) if !leader.is_relead() => {
                leader.finish(Outcome::Relead, || {});
            }
            // A second in a row: the key's answers are not shareable.
            Waiters::Relead(window) | Waiters::HitForMiss(window) => {
                let marker = Some(window)
                    .filter(|w| !w.is_zero())
                    .and_then(|w| Instant::now().checked_add(w));
                leader.finish(Outcome::Unshared, || match marker {
                    Some(until) => {
                        self.l1.insert(key, Slot::HitForMiss(until));
                    }
                    None => self.l1.remove(&key),
                });
            }
        }
    }
}
