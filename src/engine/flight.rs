//! In-process single flight: one task per key does the work, the others wait.
//!
//! A flight is a `watch` channel: late joiners still see the final state, so
//! there is no window in which a result can be missed. The flight's task holds
//! the [`Leader`] guard; if that guard is dropped without an outcome (the
//! runtime is shutting down) the waiters are told the flight was abandoned and
//! one of them takes over. Nobody is stranded.
//!
//! Invalidation *detaches* a key's flight: it leaves the map at once, so a
//! request that arrives afterwards starts a new flight instead of joining one
//! that began from old data, and the detached flight may still answer the
//! waiters it already had but may no longer store anything.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::entry::Entry;
use super::{Failure, FlightPolicy};
use crate::key::Key;

/// How a flight ended, as its waiters see it.
#[derive(Clone)]
pub(crate) enum Outcome {
    /// A value every waiter may use. `stale` marks a stale entry (served
    /// while revalidating, or because the rebuild failed).
    Value { entry: Arc<Entry>, stale: bool },
    /// The answer was for the request that caused it alone (it sets a
    /// cookie, it is private): each waiter goes to the origin itself.
    Unshared,
    /// The answer was for the request that caused it alone and says nothing
    /// about the key (a refusal): a waiter leads again, the others follow.
    Relead,
    /// The rebuild failed and nothing may stand in for it.
    Failed(Failure),
    /// The flight ended without an outcome; a waiter takes over.
    Abandoned,
}

#[derive(Clone)]
enum State {
    Running,
    /// The waiters have an answer (a stale entry) while the leader works on.
    Interim(Outcome),
    Done(Outcome),
}

struct Flight {
    tx: watch::Sender<State>,
    /// Set, under the shard's lock, when an invalidation detached the flight.
    detached: std::sync::atomic::AtomicBool,
}

const SHARDS: usize = 16;

type Shard = HashMap<Key, Arc<Flight>>;

/// Flights in progress, sharded so unrelated keys do not contend on one lock.
pub(crate) struct Flights {
    shards: Box<[Mutex<Shard>]>,
}

/// What joining a key's flight gave.
pub(crate) enum Joined {
    Lead(Leader),
    Follow(Follower),
}

impl Flights {
    pub(crate) fn new() -> Self {
        Flights {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The shard of the key's group: every variant of a URL sits in one
    /// shard, so a group is detached under one lock.
    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let idx = key.group().as_bytes()[0] as usize % SHARDS;
        // No user code runs under this lock, so a poisoned lock still holds a
        // consistent map.
        self.shards[idx]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Follows the key's flight, or starts one and leads it.
    pub(crate) fn join(self: &Arc<Self>, key: Key) -> Joined {
        let mut shard = self.shard(&key);
        if let Some(flight) = shard.get(&key) {
            return Joined::Follow(Follower {
                rx: flight.tx.subscribe(),
            });
        }
        Joined::Lead(self.start(&mut shard, key))
    }

    /// Starts a flight only if none runs for the key (a background refresh
    /// needs no company).
    pub(crate) fn try_lead(self: &Arc<Self>, key: Key) -> Option<Leader> {
        let mut shard = self.shard(&key);
        if shard.contains_key(&key) {
            return None;
        }
        Some(self.start(&mut shard, key))
    }

    fn start(self: &Arc<Self>, shard: &mut HashMap<Key, Arc<Flight>>, key: Key) -> Leader {
        let (tx, _) = watch::channel(State::Running);
        let flight = Arc::new(Flight {
            tx,
            detached: Default::default(),
        });
        shard.insert(key, flight.clone());
        Leader {
            flights: self.clone(),
            key,
            flight,
            finished: false,
            relead: false,
        }
    }

    /// Takes the flight of every key of `group` out of the map, variants no
    /// request has completed yet included: later requests start their own,
    /// and these may no longer store.
    pub(crate) fn detach_group(&self, group: &Key) {
        let group = group.group();
        let mut shard = self.shard(&group);
        shard.retain(|key, flight| {
            let member = key.in_group(&group);
            if member {
                flight.detached.store(true, Ordering::Relaxed);
            }
            !member
        });
    }

    /// Detaches every flight (see [`detach_group`](Self::detach_group)).
    pub(crate) fn detach_all(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (_, flight) in shard.drain() {
                flight.detached.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Number of flights running, for tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// The one task allowed to rebuild a key. Dropping it without calling
/// [`Leader::finish`] abandons the flight, and a waiter takes over.
pub(crate) struct Leader {
    flights: Arc<Flights>,
    key: Key,
    flight: Arc<Flight>,
    finished: bool,
    /// Led by a waiter of a flight whose answer was for its starter alone.
    relead: bool,
}

/// A view of one flight's detachment, for the rebuild it runs.
#[derive(Clone)]
pub(crate) struct Watch(Arc<Flight>);

impl Watch {
    /// Whether an invalidation detached the flight.
    pub(crate) fn detached(&self) -> bool {
        self.0.detached.load(Ordering::Relaxed)
    }
}

impl Leader {
    pub(crate) fn key(&self) -> Key {
        self.key
    }

    /// A view of whether the flight gets detached, for its rebuild.
    pub(crate) fn watch(&self) -> Watch {
        Watch(self.flight.clone())
    }

    /// Marks the flight as a re-lead (see [`Outcome::Relead`]).
    pub(crate) fn mark_relead(&mut self) {
        self.relead = true;
    }

    pub(crate) fn is_relead(&self) -> bool {
        self.relead
    }

    /// Whether an invalidation detached this flight: it must not store.
    pub(crate) fn is_detached(&self) -> bool {
        self.flight.detached.load(Ordering::Relaxed)
    }

    /// Ends the flight. `store` runs first, under the lock that invalidation
    /// takes, and only if the flight was not detached: a request that
    /// arrives after the flight is gone finds the value in the L1, and an
    /// invalidation either comes after the store (and removes it) or
    /// prevents it. Returns false if the flight was detached.
    pub(crate) fn finish(mut self, outcome: Outcome, store: impl FnOnce()) -> bool {
        self.finished = true;
        self.close(outcome, store)
    }

    /// Answers everyone waiting now, and everyone who joins until the flight
    /// ends, with `outcome`, while this leader keeps the flight (a stale entry
    /// served during a refresh that runs on). `store` runs as in `finish`.
    pub(crate) fn answer_meanwhile(&self, outcome: Outcome, store: impl FnOnce()) {
        {
            let _shard = self.flights.shard(&self.key);
            if !self.is_detached() {
                store();
            }
        }
        self.flight.tx.send_replace(State::Interim(outcome));
    }

    fn close(&self, outcome: Outcome, store: impl FnOnce()) -> bool {
        let attached = {
            let mut shard = self.flights.shard(&self.key);
            let attached = !self.is_detached();
            if attached {
                store();
                if shard
                    .get(&self.key)
                    .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
                {
                    shard.remove(&self.key);
                }
            }
            attached
        };
        self.flight.tx.send_replace(State::Done(outcome));
        attached
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if !self.finished {
            tracing::debug!(key = %self.key, "flight abandoned by its leader; a waiter takes over");
            self.close(Outcome::Abandoned, || {});
        }
    }
}

/// A task waiting on another's rebuild.
pub(crate) struct Follower {
    rx: watch::Receiver<State>,
}

impl Follower {
    /// Waits for the flight's outcome, for at most `budget`. `None` means the
    /// budget ran out.
    pub(crate) async fn wait(mut self, budget: Duration) -> Option<Outcome> {
        let waited = tokio::time::timeout(
            budget,
            self.rx.wait_for(|state| !matches!(state, State::Running)),
        )
        .await;
        match waited {
            Ok(Ok(state)) => match &*state {
                State::Done(outcome) | State::Interim(outcome) => Some(outcome.clone()),
                State::Running => Some(Outcome::Abandoned),
            },
            // The sender is owned by the flight, which the leader's drop closes
            // before it goes; treat a vanished sender like an abandoned flight.
            Ok(Err(_)) => Some(Outcome::Abandoned),
            Err(_) => None,
        }
    }
}

/// Until when a request waits for a rebuild it did not start: failing
/// closed, the budget from `now` (counted across re-leads), shortened at
/// random by up to a tenth so that waiters who came together do not all give
/// up at the same instant. Failing open, no limit: it waits for the flight,
/// which is itself bounded (its wait on another instance by the budget, its
/// rebuild by the timeout).
pub(crate) fn wait_deadline(policy: &FlightPolicy, now: Instant) -> Option<Instant> {
    if policy.fail_open {
        return None;
    }
    now.checked_add(spread(policy.wait_budget))
}

/// A wait budget less up to a tenth of it, at random.
fn spread(budget: Duration) -> Duration {
    budget.saturating_sub((budget / 10).mul_f64(crate::random::unit()))
}

#[cfg(test)]
mod stress;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::entry::Lifetime;
    use bytes::Bytes;

    fn key(n: u8) -> Key {
        Key::for_value("t", &[n])
    }

    fn entry() -> Arc<Entry> {
        Arc::new(Entry::new(
            Bytes::from_static(b"v"),
            Lifetime::default(),
            Duration::ZERO,
            Duration::ZERO,
            Instant::now(),
        ))
    }

    #[tokio::test]
    async fn second_joiner_follows_and_sees_the_outcome() {
        let flights = Arc::new(Flights::new());
        let Joined::Lead(leader) = flights.join(key(1)) else {
            panic!("first joiner must lead")
        };
        let Joined::Follow(follower) = flights.join(key(1)) else {
            panic!("second joiner must follow")
        };
        assert!(flights.try_lead(key(1)).is_none());
        assert!(leader.finish(
            Outcome::Value {
                entry: entry(),
                stale: false,
            },
            || {}
        ));
        assert_eq!(flights.len(), 0);
        let outcome = follower.wait(Duration::from_secs(5)).await;
        assert!(matches!(outcome, Some(Outcome::Value { stale: false, .. })));
    }

    #[tokio::test]
    async fn dropped_leader_abandons_the_flight() {
        let flights = Arc::new(Flights::new());
        let Joined::Lead(leader) = flights.join(key(2)) else {
            panic!()
        };
        let Joined::Follow(follower) = flights.join(key(2)) else {
            panic!()
        };
        drop(leader);
        assert!(matches!(
            follower.wait(Duration::from_secs(5)).await,
            Some(Outcome::Abandoned)
        ));
        assert!(matches!(flights.join(key(2)), Joined::Lead(_)));
    }

    #[tokio::test]
    async fn an_interim_answer_releases_waiters_while_the_leader_works_on() {
        let flights = Arc::new(Flights::new());
        let Joined::Lead(leader) = flights.join(key(4)) else {
            panic!()
        };
        let Joined::Follow(early) = flights.join(key(4)) else {
            panic!()
        };
        leader.answer_meanwhile(
            Outcome::Value {
                entry: entry(),
                stale: true,
            },
            || {},
        );
        assert!(matches!(
            early.wait(Duration::from_secs(5)).await,
            Some(Outcome::Value { stale: true, .. })
        ));
        let Joined::Follow(late) = flights.join(key(4)) else {
            panic!("the flight still runs")
        };
        assert!(matches!(
            late.wait(Duration::from_secs(5)).await,
            Some(Outcome::Value { stale: true, .. })
        ));
        leader.finish(Outcome::Unshared, || {});
        assert!(matches!(flights.join(key(4)), Joined::Lead(_)));
    }

    #[tokio::test]
    async fn a_detached_flight_answers_its_waiters_but_does_not_store() {
        let flights = Arc::new(Flights::new());
        let Joined::Lead(leader) = flights.join(key(5)) else {
            panic!()
        };
        let Joined::Follow(before) = flights.join(key(5)) else {
            panic!()
        };
        flights.detach_group(&key(5));
        let Joined::Lead(after) = flights.join(key(5)) else {
            panic!("a request after the invalidation starts its own flight")
        };
        let mut stored = false;
        let attached = leader.finish(
            Outcome::Value {
                entry: entry(),
                stale: false,
            },
            || stored = true,
        );
        assert!(!attached && !stored);
        assert!(matches!(
            before.wait(Duration::from_secs(5)).await,
            Some(Outcome::Value { .. })
        ));
        // The old flight's end does not remove the new one from the map.
        assert!(matches!(flights.join(key(5)), Joined::Follow(_)));
        drop(after);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_is_bounded_by_the_budget() {
        let flights = Arc::new(Flights::new());
        let _leader = flights.join(key(3));
        let Joined::Follow(follower) = flights.join(key(3)) else {
            panic!()
        };
        assert!(follower.wait(Duration::from_millis(50)).await.is_none());
    }

    #[test]
    fn spread_budgets_stay_within_a_tenth_below() {
        let budget = Duration::from_secs(10);
        let spread: Vec<Duration> = (0..200).map(|_| super::spread(budget)).collect();
        assert!(spread
            .iter()
            .all(|b| *b <= budget && *b >= budget - budget / 10));
        assert!(spread.iter().any(|b| *b != spread[0]), "budgets differ");
        assert_eq!(super::spread(Duration::ZERO), Duration::ZERO);
        assert!(super::spread(Duration::MAX) >= Duration::MAX - Duration::MAX / 10);
        let mut policy = FlightPolicy {
            lease: Duration::from_secs(5),
            wait_budget: Duration::MAX,
            fail_open: false,
            rebuild_timeout: Duration::from_secs(30),
            early_refresh: None,
            labels: crate::metrics::Labels::of("test", "test"),
            refresh_ahead: None,
            scope: crate::store::generations::Scope::ROOT,
        };
        let now = Instant::now();
        assert_eq!(wait_deadline(&policy, now), None, "saturates, no panic");
        policy.wait_budget = budget;
        let deadline = wait_deadline(&policy, now).unwrap();
        assert!(deadline <= now + budget && deadline >= now + budget - budget / 10);
        policy.fail_open = true;
        assert_eq!(wait_deadline(&policy, now), None);
    }
}
