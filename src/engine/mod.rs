//! The transport-agnostic core: look a key up, and decide who rebuilds it.
//!
//! A lookup walks the tiers in order and stops at the first that can answer:
//!
//! 1. **L1**: a fresh entry answers at once. A stale entry inside its
//!    stale-while-revalidate window answers at once too, and the first such
//!    request in this process also gets the right to refresh it.
//! 2. **Flight**: otherwise the request joins the key's flight. The first one
//!    in leads (rebuilds); the rest follow (wait for its outcome).
//!
//! The engine never calls the origin itself: it hands the caller a [`Leader`]
//! and the caller rebuilds, then reports back with [`Engine::finish`]. That is
//! what lets the HTTP layer keep the leader's own response (with its streaming
//! body and headers) while the generic cache works on plain values.

pub(crate) mod flight;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flight::{Flights, Joined};
pub(crate) use flight::{Follower, Leader, Outcome, SharedError};

use crate::entry::{Entry, Freshness};
use crate::key::Key;
use crate::store::local::{LocalTier, Slot};

/// What a lookup found, and what the caller must do next.
pub(crate) enum Lookup {
    /// Serve this entry.
    Fresh(Arc<Entry>),
    /// Serve this stale entry now; if `refresh` is given, rebuild in the
    /// background and finish it.
    Stale {
        entry: Arc<Entry>,
        refresh: Option<Leader>,
    },
    /// Rebuild, then finish. `stale` may be served if the rebuild fails.
    Lead {
        leader: Leader,
        stale: Option<Arc<Entry>>,
    },
    /// Wait for the leader. `stale` may be served if it fails.
    Follow {
        follower: Follower,
        stale: Option<Arc<Entry>>,
    },
    /// The key's answers are not shareable right now (hit-for-miss): go to the
    /// origin without coalescing.
    Bypass,
}

/// What a leader reports when its rebuild is over.
pub(crate) enum Finish {
    /// Cache the entry and hand it to the waiters.
    Store(Arc<Entry>),
    /// Hand the entry to the waiters but do not cache it (a shareable answer
    /// that must not be kept, such as a 5xx).
    Share(Arc<Entry>),
    /// The rebuild failed; everyone gets this stale entry instead.
    ServeStale(Arc<Entry>),
    /// The answer must not be shared; remember that for `hit_for_miss`.
    Pass { hit_for_miss: Duration },
    /// The rebuild failed with no stale entry to fall back on.
    Failed(Option<SharedError>),
}

/// L1 and flights for one backend.
pub(crate) struct Engine {
    l1: LocalTier,
    flights: Arc<Flights>,
}

impl Engine {
    pub(crate) fn new(l1_max_bytes: u64) -> Self {
        Engine {
            l1: LocalTier::new(l1_max_bytes),
            flights: Arc::new(Flights::new()),
        }
    }

    pub(crate) fn l1(&self) -> &LocalTier {
        &self.l1
    }

    /// Looks `key` up. Never waits: the hit path costs one L1 read.
    pub(crate) fn lookup(&self, key: Key, now: Instant) -> Lookup {
        let mut stale = None;
        match self.l1.get(&key) {
            Some(Slot::Value(entry)) => match entry.freshness(now) {
                Freshness::Fresh => return Lookup::Fresh(entry),
                Freshness::Revalidate => {
                    let refresh = self.flights.try_lead(key);
                    return Lookup::Stale { entry, refresh };
                }
                Freshness::IfError => stale = Some(entry),
                Freshness::Expired => {}
            },
            Some(Slot::HitForMiss(until)) if now < until => return Lookup::Bypass,
            _ => {}
        }
        match self.flights.join(key) {
            Joined::Follow(follower) => Lookup::Follow { follower, stale },
            Joined::Lead(leader) => {
                // The previous flight may have finished between our L1 read and
                // the join: read again, or its value would be rebuilt at once.
                match self.l1.get(&key) {
                    Some(Slot::Value(entry)) if entry.freshness(now) == Freshness::Fresh => {
                        leader.finish(Outcome::Value {
                            entry: entry.clone(),
                            stale: false,
                        });
                        Lookup::Fresh(entry)
                    }
                    Some(Slot::HitForMiss(until)) if now < until => {
                        leader.finish(Outcome::Pass);
                        Lookup::Bypass
                    }
                    _ => Lookup::Lead { leader, stale },
                }
            }
        }
    }

    /// The entry for `key` if it is fresh; never joins a flight.
    pub(crate) fn lookup_fresh(&self, key: &Key, now: Instant) -> Option<Arc<Entry>> {
        match self.l1.get(key) {
            Some(Slot::Value(entry)) if entry.freshness(now) == Freshness::Fresh => Some(entry),
            _ => None,
        }
    }

    /// Records a leader's result in the L1, then releases its waiters.
    pub(crate) fn finish(&self, leader: Leader, finish: Finish) {
        let key = leader.key();
        let outcome = match finish {
            Finish::Store(entry) => {
                self.l1.insert(key, Slot::Value(entry.clone()));
                Outcome::Value {
                    entry,
                    stale: false,
                }
            }
            Finish::Share(entry) => Outcome::Value {
                entry,
                stale: false,
            },
            Finish::ServeStale(entry) => Outcome::Value { entry, stale: true },
            Finish::Pass { hit_for_miss } => {
                if !hit_for_miss.is_zero() {
                    self.l1
                        .insert(key, Slot::HitForMiss(Instant::now() + hit_for_miss));
                } else {
                    self.l1.remove(&key);
                }
                Outcome::Pass
            }
            Finish::Failed(error) => Outcome::Failed(error),
        };
        leader.finish(outcome);
    }

    /// Drops the key from the L1.
    pub(crate) fn invalidate(&self, key: &Key) {
        self.l1.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Lifetime;
    use bytes::Bytes;

    fn entry(ttl_ms: u64, swr_ms: u64, sie_ms: u64, now: Instant) -> Arc<Entry> {
        Arc::new(Entry::new(
            Bytes::from_static(b"v"),
            Lifetime {
                ttl: Duration::from_millis(ttl_ms),
                stale_while_revalidate: Duration::from_millis(swr_ms),
                stale_if_error: Duration::from_millis(sie_ms),
            },
            Duration::ZERO,
            Duration::ZERO,
            now,
        ))
    }

    #[test]
    fn cold_key_leads_then_hits_after_store() {
        let engine = Engine::new(1 << 20);
        let key = Key::for_value("t", b"k");
        let now = Instant::now();
        let Lookup::Lead { leader, stale } = engine.lookup(key, now) else {
            panic!("cold key must lead")
        };
        assert!(stale.is_none());
        assert!(matches!(engine.lookup(key, now), Lookup::Follow { .. }));
        engine.finish(leader, Finish::Store(entry(60_000, 0, 0, now)));
        assert!(matches!(engine.lookup(key, now), Lookup::Fresh(_)));
    }

    #[test]
    fn only_the_first_stale_reader_refreshes() {
        let engine = Engine::new(1 << 20);
        let key = Key::for_value("t", b"k");
        let t0 = Instant::now();
        let Lookup::Lead { leader, .. } = engine.lookup(key, t0) else {
            panic!()
        };
        engine.finish(leader, Finish::Store(entry(10, 60_000, 0, t0)));
        let later = t0 + Duration::from_millis(20);
        let Lookup::Stale {
            refresh: Some(_refresh),
            ..
        } = engine.lookup(key, later)
        else {
            panic!("first stale reader must get the refresh")
        };
        assert!(matches!(
            engine.lookup(key, later),
            Lookup::Stale { refresh: None, .. }
        ));
    }

    #[test]
    fn hit_for_miss_bypasses_until_it_lapses() {
        let engine = Engine::new(1 << 20);
        let key = Key::for_value("t", b"k");
        let Lookup::Lead { leader, .. } = engine.lookup(key, Instant::now()) else {
            panic!()
        };
        engine.finish(
            leader,
            Finish::Pass {
                hit_for_miss: Duration::from_secs(60),
            },
        );
        assert!(matches!(engine.lookup(key, Instant::now()), Lookup::Bypass));
        let after = Instant::now() + Duration::from_secs(61);
        assert!(matches!(engine.lookup(key, after), Lookup::Lead { .. }));
    }

    #[test]
    fn entry_past_revalidate_is_offered_only_for_errors() {
        let engine = Engine::new(1 << 20);
        let key = Key::for_value("t", b"k");
        let t0 = Instant::now();
        let Lookup::Lead { leader, .. } = engine.lookup(key, t0) else {
            panic!()
        };
        engine.finish(leader, Finish::Store(entry(10, 0, 60_000, t0)));
        let later = t0 + Duration::from_millis(20);
        let Lookup::Lead { stale, .. } = engine.lookup(key, later) else {
            panic!("an entry only usable on error must not be served as a hit")
        };
        assert!(stale.is_some());
    }
}
