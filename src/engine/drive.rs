//! The driver: one path for every miss, from the flight to the settle.
//!
//! [`Engine::resolve`] is the waiter's side: join the key's flight or start
//! it, then wait for what it gives. [`Engine::fly`] is the flight's side, on
//! its own task: shared tier, lease, rebuild, settle. A flight ends in exactly
//! one place ([`Engine::settle`]) whatever happened, and its waiters share
//! that outcome:
//!
//! | the rebuild gave | waiters get | the request that started it gets |
//! |---|---|---|
//! | a value | the value (stored if storable) | the value, and its private extras |
//! | an answer for one client: a refusal (403, 429…) | one of them leads again, the others wait on it | that answer |
//! | an answer for one client: per-client content (a cookie, `private`) | the origin, each on its own (hit-for-miss) | that answer |
//! | an error, a panic, a timeout | stale-if-error, else the shared failure | stale-if-error, else its own error or panic |
//!
//! No failure sends the waiters to the origin: a failing origin is called
//! once per flight, not once per waiter. Nor does the end of a wait: failing
//! closed, a waiter whose budget runs out is answered by the layer; failing
//! open, it keeps waiting on its own process's flight, which is bounded.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::Instrument;

use super::answer::{
    Answer, Built, Failure, FailureKind, Miss, Overtaken, Rebuild, Served, Status,
};
use super::entry::{Entry, Freshness, Held};
use super::flight::{wait_deadline, Joined, Leader, Outcome};
use super::shared::{Lease, Plan, Start};
use super::{Engine, FlightPolicy, Refresh};
use crate::metrics::{self as m, count, count_hit, Labels};
use crate::store::local::Slot;

/// Where the flight sends the answer of the request that started it. Gone
/// when that request gave up; the flight goes on without it.
struct Starter<R: Rebuild>(Option<oneshot::Sender<Answer<R>>>);

impl<R: Rebuild> Starter<R> {
    fn send(&mut self, answer: impl FnOnce() -> Answer<R>) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(answer());
        }
    }
}

/// How a rebuild ended when it gave nothing.
enum Ended {
    Panicked(Box<dyn Any + Send>),
    TimedOut,
    /// Its task was cancelled: the runtime is shutting down.
    Cancelled,
}

impl Engine {
    /// Step 2 onwards, for a caller that missed in the L1: the flight, and
    /// what it gives.
    pub(crate) async fn resolve<R: Rebuild>(
        self: &Arc<Self>,
        miss: Miss,
        policy: FlightPolicy,
        rebuild: R,
    ) -> Answer<R> {
        let labels = policy.labels;
        let Some(key) = miss.key else {
            return alone(rebuild, labels);
        };
        if miss.hit_for_miss {
            let leader = self.flights.try_lead(key);
            return self.uncoalesced(key, leader, rebuild, labels).await;
        }
        let began = Instant::now();
        let stale = miss.stale;
        let deadline = wait_deadline(&policy, Instant::now());
        let mut releading = false;
        loop {
            let follower = match self.flights.join(key) {
                Joined::Follow(follower) => follower,
                Joined::Lead(mut leader) => {
                    if releading {
                        leader.mark_relead();
                    }
                    // The previous flight may have ended between the L1 read
                    // and the join: read again, or its value is rebuilt at once.
                    // (Only while the L1 is still trusted, as on the hit path.)
                    let now = Instant::now();
                    self.confirm_l1(now);
                    match self.l1.get(&key) {
                        Some(Slot::Value(entry))
                            if entry.freshness(now) == Freshness::Fresh
                                && self.tags.admits(entry.stamp()) =>
                        {
                            if let Some(held) = Held::new(entry.clone()) {
                                leader.finish(
                                    Outcome::Value {
                                        entry,
                                        stale: false,
                                    },
                                    || {},
                                );
                                count_hit(labels);
                                return served(held, Status::Hit);
                            }
                        }
                        Some(Slot::HitForMiss(until)) if now < until => {
                            return self.uncoalesced(key, Some(leader), rebuild, labels).await;
                        }
                        _ => {}
                    }
                    let (tx, rx) = oneshot::channel();
                    self.spawn_flight(leader, rebuild, stale, policy, Start::Miss, Some(tx));
                    let answer = rx.await.unwrap_or(Answer::Failed(
                        Failure::new(FailureKind::Error),
                        Status::Miss,
                    ));
                    tally(&answer, Status::Miss, labels, began);
                    return answer;
                }
            };
            let budget = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            let span = tracing::debug_span!("stampede_guard.wait", key = %key);
            let outcome = follower.wait(budget).instrument(span).await;
            let answer = match outcome {
                Some(Outcome::Value { entry, stale }) => match Held::new(entry) {
                    Some(held) if stale => served(held, Status::Stale),
                    Some(held) => served(held, Status::Coalesced),
                    None => return alone(rebuild, labels),
                },
                Some(Outcome::Unshared) => {
                    let leader = self.flights.try_lead(key);
                    return self.uncoalesced(key, leader, rebuild, labels).await;
                }
                Some(Outcome::Failed(failure)) => {
                    stale_or(&stale, Answer::Failed(failure, Status::Coalesced))
                }
                // The flight ended without an outcome: look again, perhaps lead.
                Some(Outcome::Abandoned) => continue,
                // Its answer was for its starter alone: the same, and a
                // flight this request leads is a re-lead.
                Some(Outcome::Relead) => {
                    releading = true;
                    continue;
                }
                None => {
                    count(m::WAIT_TIMEOUTS, labels);
                    tracing::debug!(key = %key, budget = ?policy.wait_budget, "wait budget ran out");
                    stale_or(
                        &stale,
                        Answer::Failed(Failure::new(FailureKind::WaitTimeout), Status::Coalesced),
                    )
                }
            };
            tally(&answer, Status::Coalesced, labels, began);
            return answer;
        }
    }

    /// Starts a background refresh with the right a lookup handed out.
    pub(crate) fn refresh<R: Rebuild>(
        self: &Arc<Self>,
        refresh: Refresh,
        policy: FlightPolicy,
        rebuild: R,
    ) {
        let start = match refresh.early {
            Some(left) => Start::Early(left),
            None => Start::Refresh,
        };
        self.spawn_flight(refresh.leader, rebuild, refresh.stale, policy, start, None);
    }

    fn spawn_flight<R: Rebuild>(
        self: &Arc<Self>,
        leader: Leader,
        rebuild: R,
        stale: Option<Arc<Entry>>,
        policy: FlightPolicy,
        start: Start,
        starter: Option<oneshot::Sender<Answer<R>>>,
    ) {
        // Without a runtime nobody can run the flight; dropping the leader
        // abandons it, and the next request tries again.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !matches!(start, Start::Miss) {
            count(m::REFRESHES, policy.labels);
        }
        let span = tracing::debug_span!("stampede_guard.flight", key = %leader.key());
        let engine = self.clone();
        runtime.spawn(
            async move {
                engine
                    .fly(leader, rebuild, stale, policy, start, Starter(starter))
                    .await
            }
            .instrument(span),
        );
    }

    /// The flight's task: the shared tier, then the rebuild if it is ours.
    async fn fly<R: Rebuild>(
        self: Arc<Self>,
        leader: Leader,
        rebuild: R,
        stale: Option<Arc<Entry>>,
        policy: FlightPolicy,
        start: Start,
        mut starter: Starter<R>,
    ) {
        let key = leader.key();
        let (lease, stale) = match self.plan::<R::Value>(key, stale, &policy, start).await {
            Plan::Hit { entry, waited } => {
                let held = Held::new(entry.clone());
                let stored = entry.clone();
                leader.finish(
                    Outcome::Value {
                        entry,
                        stale: false,
                    },
                    || {
                        self.l1.insert(key, Slot::Value(stored));
                    },
                );
                if let Some(held) = held {
                    let status = if waited {
                        Status::Coalesced
                    } else {
                        Status::Hit
                    };
                    starter.send(|| served(held, status));
                }
                return;
            }
            Plan::StaleNow { entry, lease } => {
                // Everyone in this process gets the stale entry now, while
                // the refresh goes on in the background.
                let stored = entry.clone();
                leader.answer_meanwhile(
                    Outcome::Value {
                        entry: entry.clone(),
                        stale: true,
                    },
                    || self.l1.insert_unless_newer(key, stored),
                );
                if let Some(held) = Held::new(entry.clone()) {
                    starter.send(|| served(held, Status::Stale));
                }
                count(m::REFRESHES, policy.labels);
                match lease {
                    Some(lease) => (Some(lease), Some(entry)),
                    // Another instance refreshes it: wait for its commit.
                    None => match self
                        .plan::<R::Value>(key, Some(entry), &policy, Start::Refresh)
                        .await
                    {
                        Plan::Hit { entry, .. } => {
                            self.settle(
                                leader,
                                Outcome::Value {
                                    entry,
                                    stale: false,
                                },
                                true,
                            );
                            return;
                        }
                        Plan::Rebuild { lease, stale } => (lease, stale),
                        _ => {
                            self.settle(
                                leader,
                                Outcome::Failed(Failure::new(FailureKind::WaitTimeout)),
                                false,
                            );
                            return;
                        }
                    },
                }
            }
            Plan::Rebuild { lease, stale } => (lease, stale),
            Plan::Failed { kind, stale } => {
                let failure = Failure::new(kind);
                match start {
                    Start::Miss => {
                        let answer = self.fail(leader, failure, stale.as_ref());
                        starter.send(|| answer);
                    }
                    Start::Refresh | Start::Early(_) => {
                        self.settle(leader, Outcome::Failed(failure), false);
                    }
                }
                return;
            }
            Plan::TimedOut { stale } => {
                count(m::WAIT_TIMEOUTS, policy.labels);
                match start {
                    // Nobody else's rebuild came in time: rebuild here, for
                    // this process, without the lease.
                    Start::Miss if policy.fail_open => (None, stale),
                    Start::Miss => {
                        let failure = Failure::new(FailureKind::WaitTimeout);
                        let answer = self.fail(leader, failure, stale.as_ref());
                        starter.send(|| answer);
                        return;
                    }
                    // A refresh nobody waits for: the entry stays as it is.
                    Start::Refresh | Start::Early(_) => {
                        let failure = Failure::new(FailureKind::WaitTimeout);
                        self.settle(leader, Outcome::Failed(failure), false);
                        return;
                    }
                }
            }
        };
        self.rebuild(leader, rebuild, stale, lease, policy, starter)
            .await;
    }

    /// Runs the rebuild on its own task, bounded by the rebuild timeout, and
    /// settles the flight with what it gave.
    async fn rebuild<R: Rebuild>(
        &self,
        leader: Leader,
        rebuild: R,
        stale: Option<Arc<Entry>>,
        lease: Option<Lease>,
        policy: FlightPolicy,
        mut starter: Starter<R>,
    ) {
        count(m::ORIGIN_CALLS, policy.labels);
        let started = Instant::now();
        // Before the origin is asked: an invalidation from now on keeps
        // what it answers out of the tiers.
        let since = self.tags.start();
        // Its own task, so that a panic is caught as an outcome and a timeout
        // can abandon it.
        let overtaken = Overtaken::new(self.tags.clone(), since, Some(leader.watch()));
        let mut task = tokio::spawn(rebuild.rebuild(stale.clone().and_then(Held::new), overtaken));
        let built = match tokio::time::timeout(policy.rebuild_timeout, &mut task).await {
            Ok(Ok(built)) => Ok(built),
            Ok(Err(e)) if e.is_panic() => Err(Ended::Panicked(e.into_panic())),
            Ok(Err(_)) => Err(Ended::Cancelled),
            Err(_) => {
                task.abort();
                tracing::warn!(key = %leader.key(), timeout = ?policy.rebuild_timeout, "rebuild timed out");
                Err(Ended::TimedOut)
            }
        };
        m::record(m::REBUILD_DURATION, policy.labels, started.elapsed());
        let key = leader.key();
        match built {
            Ok(Built::Value {
                value,
                lifetime,
                initial_age,
                store,
                failure,
                private,
                tags,
            }) => {
                if failure && usable_on_error(stale.as_ref()).is_some() {
                    tracing::debug!(key = %key, "rebuild answered with an error; serving stale");
                    let answer =
                        self.fail(leader, Failure::new(FailureKind::Error), stale.as_ref());
                    self.give_up(lease, Some(FailureKind::Error)).await;
                    starter.send(|| answer);
                    return;
                }
                let entry = Entry::new(
                    value,
                    lifetime,
                    initial_age,
                    started.elapsed(),
                    Instant::now(),
                );
                #[cfg(feature = "redis")]
                if store {
                    self.learn_epoch().await;
                }
                let (entry, store) = self.stamped(entry, &tags, since, store);
                let held = Held::new(entry.clone());
                let (stored, kept) = self.settle(
                    leader,
                    Outcome::Value {
                        entry: entry.clone(),
                        stale: false,
                    },
                    store,
                );
                // The local waiters have it; the starter is answered once the
                // fleet has it too, so that what its client saw is what any
                // instance serves next.
                // A server error shared with the waiters but not stored is
                // still a failed rebuild for the fleet: its lease leaves the
                // failure marker, so that the other instances back off
                // rather than each try the failing origin (a refresh ahead
                // of expiry has no stale entry to take this path above).
                // Stored where: the L1, or Redis under the lease (an entry
                // heavier than the L1's bound is in Redis alone).
                let kept = kept || lease.is_some();
                match (stored, &held) {
                    (true, Some(held)) => self.commit(lease, held, policy.labels).await,
                    _ => {
                        let failed = failure.then_some(FailureKind::Error);
                        self.give_up(lease, failed).await
                    }
                }
                if let Some(held) = held {
                    starter.send(|| {
                        Answer::Served(Served {
                            held,
                            status: Status::Miss,
                            stored: stored && kept,
                            private,
                        })
                    });
                }
            }
            Ok(Built::Unshared { private, waiters }) => {
                self.end_unshared(leader, waiters);
                self.give_up(lease, None).await;
                starter.send(|| Answer::Private(private));
            }
            Ok(Built::Failed { shared, private }) => {
                let failure = Failure {
                    kind: FailureKind::Error,
                    error: shared,
                };
                let answer = self.fail(leader, failure, stale.as_ref());
                self.give_up(lease, Some(FailureKind::Error)).await;
                starter.send(|| match (answer, private) {
                    (Answer::Failed(..), Some(private)) => Answer::Private(private),
                    (answer, _) => answer,
                });
            }
            Err(ended) => {
                let (kind, panic) = match ended {
                    Ended::Panicked(payload) => (FailureKind::Panic, Some(payload)),
                    Ended::TimedOut => (FailureKind::Timeout, None),
                    Ended::Cancelled => (FailureKind::Error, None),
                };
                if kind == FailureKind::Panic {
                    tracing::error!(key = %key, "rebuild panicked");
                }
                let answer = self.fail(leader, Failure::new(kind), stale.as_ref());
                self.give_up(lease, Some(kind)).await;
                starter.send(|| match (answer, panic) {
                    (Answer::Failed(..), Some(payload)) => Answer::Panicked(payload),
                    (answer, _) => answer,
                });
            }
        }
    }

    /// Ends a failed flight: stale-if-error for everyone if the entry allows
    /// it, else the failure. Returns what the starter gets.
    fn fail<R: Rebuild>(
        &self,
        leader: Leader,
        failure: Failure,
        stale: Option<&Arc<Entry>>,
    ) -> Answer<R> {
        match usable_on_error(stale) {
            Some(entry) => {
                let held = Held::new(entry.clone());
                self.settle(leader, Outcome::Value { entry, stale: true }, false);
                match held {
                    Some(held) => served(held, Status::Stale),
                    None => Answer::Failed(failure, Status::Miss),
                }
            }
            None => {
                self.settle(leader, Outcome::Failed(failure.clone()), false);
                Answer::Failed(failure, Status::Miss)
            }
        }
    }

    /// The one place a flight ends: the L1 (if `store` and no invalidation
    /// detached the flight), then the waiters. Returns whether it is to be
    /// stored (in the L1, and in Redis by the caller), and whether the L1
    /// kept it (not an entry heavier than its whole bound).
    pub(super) fn settle(&self, leader: Leader, outcome: Outcome, store: bool) -> (bool, bool) {
        let key = leader.key();
        let entry = match (&outcome, store) {
            (
                Outcome::Value {
                    entry,
                    stale: false,
                },
                true,
            ) => Some(entry.clone()),
            _ => None,
        };
        let stored = entry.is_some();
        let mut kept = false;
        let attached = leader.finish(outcome, || {
            if let Some(entry) = entry {
                kept = self.l1.insert(key, Slot::Value(entry));
            }
        });
        (stored && attached, stored && attached && kept)
    }
}

fn served<R: Rebuild>(held: Held<R::Value>, status: Status) -> Answer<R> {
    Answer::Served(Served {
        held,
        status,
        stored: false,
        private: None,
    })
}

/// For a caller that may not coalesce: counted here, run by the adapter.
fn alone<R: Rebuild>(rebuild: R, labels: Labels) -> Answer<R> {
    m::count_bypass("hit-for-miss", labels);
    count(m::ORIGIN_CALLS, labels);
    Answer::Alone(rebuild)
}

fn usable_on_error(stale: Option<&Arc<Entry>>) -> Option<Arc<Entry>> {
    stale.filter(|e| e.usable_on_error(Instant::now())).cloned()
}

fn stale_or<R: Rebuild>(stale: &Option<Arc<Entry>>, otherwise: Answer<R>) -> Answer<R> {
    match usable_on_error(stale.as_ref()).and_then(Held::new) {
        Some(held) => served(held, Status::Stale),
        None => otherwise,
    }
}

/// Counts a caller once, by how it was answered; `unserved` is how a caller
/// that got no entry counts (its rebuild's miss, or a coalesced failure).
/// A caller that waited on a rebuild it did not run (here or on another
/// instance) has its wait since `began` recorded.
fn tally<R: Rebuild>(answer: &Answer<R>, unserved: Status, labels: Labels, began: Instant) {
    let status = match answer {
        Answer::Served(served) => served.status,
        Answer::Failed(_, status) => *status,
        Answer::Private(_) | Answer::Panicked(_) => unserved,
        Answer::Alone(_) => return,
    };
    if unserved == Status::Coalesced || status == Status::Coalesced {
        m::record(m::WAIT_DURATION, labels, began.elapsed());
    }
    let name = match status {
        Status::Hit => m::HITS,
        Status::Stale => m::STALE,
        Status::Miss => m::MISSES,
        Status::Coalesced => m::COALESCED,
    };
    count(name, labels);
}
