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
//! 3. **Fleet** (with Redis): the flight's leader asks Redis, in one round
//!    trip, for the entry or the key's rebuild lease ([`Engine::plan`]). It
//!    gets a fresh entry another instance built, or the lease, or waits to be
//!    woken by the lease holder's publish.
//!
//! The engine never calls the origin itself: it hands the caller a [`Leader`]
//! and the caller rebuilds, then reports back with [`Engine::finish`]. That is
//! what lets the HTTP layer keep the leader's own response (with its streaming
//! body and headers) while the generic cache works on plain values.

pub(crate) mod early;
pub(crate) mod flight;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flight::{Flights, Joined};
pub(crate) use flight::{Follower, Leader, Outcome, SharedError};

#[cfg(feature = "redis")]
use crate::codec;
use crate::entry::{CacheValue, Entry, Freshness};
use crate::key::Key;
use crate::metrics::{self as m, count};
use crate::store::local::{LocalTier, Slot};
#[cfg(feature = "redis")]
pub(crate) use crate::store::redis::Lease;
#[cfg(feature = "redis")]
use crate::store::redis::{Fetched, RedisTier, Remote};

/// A rebuild lease: the fleet-wide right to rebuild a key. On the embedded
/// backend there is no such thing, and the type is empty.
#[cfg(not(feature = "redis"))]
pub(crate) enum Lease {}

/// Per-route settings for the fleet step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FleetPolicy {
    /// Lease time; renewed every third of it while the rebuild runs.
    pub lease: Duration,
    /// The longest a leader waits for another instance's rebuild.
    pub wait_budget: Duration,
}

/// What the leader of a local flight does next, after asking the fleet.
pub(crate) enum Plan {
    /// A fresh entry from Redis: store it in L1 and serve it. `waited` says
    /// whether this request waited for another instance's rebuild to get it.
    Hit { entry: Arc<Entry>, waited: bool },
    /// Rebuild now and settle with this lease (`None`: no Redis, or Redis
    /// unavailable; the local flight is the only protection).
    Rebuild {
        lease: Option<Lease>,
        stale: Option<Arc<Entry>>,
    },
    /// Serve this stale entry at once (stale-while-revalidate); the key must
    /// still be settled in the background, with the lease if one was taken.
    StaleNow {
        entry: Arc<Entry>,
        lease: Option<Lease>,
    },
    /// Waited the whole budget for another instance's rebuild.
    TimedOut { stale: Option<Arc<Entry>> },
}

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

/// L1, flights and (optionally) the Redis tier of one backend.
pub(crate) struct Engine {
    l1: LocalTier,
    flights: Arc<Flights>,
    #[cfg(feature = "redis")]
    l2: Option<Arc<RedisTier>>,
}

impl Engine {
    pub(crate) fn new(l1: LocalTier) -> Self {
        Engine {
            l1,
            flights: Arc::new(Flights::new()),
            #[cfg(feature = "redis")]
            l2: None,
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn with_l2(l1: LocalTier, l2: Arc<RedisTier>) -> Self {
        Engine {
            l1,
            flights: Arc::new(Flights::new()),
            l2: Some(l2),
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn l2(&self) -> Option<&Arc<RedisTier>> {
        self.l2.as_ref()
    }

    /// Starts a background refresh of a fresh entry if probabilistic early
    /// refresh says it is due and no flight runs for the key.
    pub(crate) fn early_refresh(
        &self,
        key: Key,
        entry: &Entry,
        beta: f64,
        now: Instant,
    ) -> Option<Leader> {
        // At most eight draws per rebuild time for this entry: enough that a
        // hot key is refreshed about two rebuild times before it expires,
        // however many requests it gets.
        if !entry.claim_draw(now, entry.rebuild_cost() / 8) {
            return None;
        }
        if !early::due(
            now,
            entry.fresh_until(),
            entry.rebuild_cost(),
            beta,
            early::draw(),
        ) {
            return None;
        }
        let leader = self.flights.try_lead(key)?;
        count(m::EARLY_REFRESHES);
        Some(leader)
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

    /// Serves a stale entry found in Redis to everyone in this process while
    /// the leader refreshes it: it goes into the L1 (so newcomers are answered
    /// `STALE` without a flight), and the flight's current waiters get it now.
    pub(crate) fn serve_stale_meanwhile(&self, leader: &Leader, entry: &Arc<Entry>) {
        let key = leader.key();
        let newer_here = matches!(
            self.l1.get(&key),
            Some(Slot::Value(current)) if current.fresh_until() >= entry.fresh_until()
        );
        if !newer_here {
            self.l1.insert(key, Slot::Value(entry.clone()));
        }
        leader.answer_meanwhile(Outcome::Value {
            entry: entry.clone(),
            stale: true,
        });
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

    /// Drops the key from this process, and from Redis and every other
    /// instance when the backend has a Redis tier.
    pub(crate) async fn invalidate(&self, key: &Key) {
        self.l1.remove(key);
        #[cfg(feature = "redis")]
        if let Some(l2) = &self.l2 {
            let _ = l2.invalidate(key).await;
        }
    }

    /// Asks the fleet what a local flight's leader should do. Without Redis
    /// (or with its circuit open) the answer is always "rebuild".
    ///
    /// `serve_stale` lets the plan hand back a stale entry inside
    /// stale-while-revalidate at once instead of waiting. `early` is set for a
    /// probabilistic early refresh: take the lease even for a fresh entry, as
    /// long as the one in Redis has no more freshness left than this (if it
    /// has more, another instance already refreshed it: that is a hit).
    pub(crate) async fn plan<V: CacheValue>(
        &self,
        key: Key,
        stale: Option<Arc<Entry>>,
        fleet: FleetPolicy,
        serve_stale: bool,
        early: Option<Duration>,
    ) -> Plan {
        #[cfg(feature = "redis")]
        if let Some(l2) = self.l2.as_ref().filter(|_| V::SHARED) {
            return self
                .plan_with::<V>(l2, key, stale, fleet, serve_stale, early)
                .await;
        }
        let _ = (key, fleet, serve_stale, early);
        Plan::Rebuild { lease: None, stale }
    }

    #[cfg(feature = "redis")]
    async fn plan_with<V: CacheValue>(
        &self,
        l2: &Arc<RedisTier>,
        key: Key,
        mut stale: Option<Arc<Entry>>,
        fleet: FleetPolicy,
        serve_stale: bool,
        mut early: Option<Duration>,
    ) -> Plan {
        let give_up = Instant::now() + fleet.wait_budget;
        // Set once an unreadable entry was counted, so the same bytes seen
        // again beside our lease are not counted twice.
        let mut corrupt = false;
        let mut waited = false;
        loop {
            if !l2.is_available() {
                return Plan::Rebuild { lease: None, stale };
            }
            // Listen before asking, so a publish between the answer and the
            // wait still wakes us.
            let mut registration = l2.notifier.register(key);
            let fetched = match l2.fetch_or_lease(&key, fleet.lease, early).await {
                Ok(fetched) => fetched,
                Err(_) => return Plan::Rebuild { lease: None, stale },
            };
            let now = Instant::now();
            let (lease, lease_pttl, old) = match fetched {
                Fetched::Fresh(remote) => match decode::<V>(remote, now) {
                    Some(entry) => {
                        count(m::L2_HITS);
                        return Plan::Hit {
                            entry: Arc::new(entry),
                            waited,
                        };
                    }
                    None => {
                        l2.count_corrupt(&key);
                        corrupt = true;
                        // Take the lease over the unreadable entry.
                        early = Some(Duration::MAX);
                        continue;
                    }
                },
                Fetched::Leased { lease, stale } => (Some(lease), Duration::ZERO, stale),
                Fetched::Held { lease_pttl, stale } => (None, lease_pttl, stale),
            };
            stale = newer(
                stale,
                old.and_then(|r| decode_or_count::<V>(l2, &key, r, now, corrupt)),
            );
            if serve_stale {
                if let Some(entry) = stale
                    .as_ref()
                    .filter(|e| e.servable_while_revalidating(now))
                {
                    return Plan::StaleNow {
                        entry: entry.clone(),
                        lease,
                    };
                }
            }
            if let Some(lease) = lease {
                return Plan::Rebuild {
                    lease: Some(lease),
                    stale,
                };
            }
            // Another instance holds the lease. (An early refresh that finds
            // one already refreshing waits for its commit too, and so loads
            // the new entry before its own copy expires.)
            let left = give_up.saturating_duration_since(now);
            if left.is_zero() {
                return Plan::TimedOut { stale };
            }
            // Woken by the holder's commit or failure notice; failing that,
            // by the lease running out (its holder died), or the budget.
            let _ = registration
                .wait(left.min(lease_pttl + Duration::from_millis(2)))
                .await;
            waited = true;
        }
    }

    /// Records a leader's result in the L1, releases its local waiters, then
    /// commits the entry to Redis under the lease (or gives the lease up).
    pub(crate) async fn settle<V: CacheValue>(
        &self,
        leader: Leader,
        finish: Finish,
        lease: Option<Lease>,
    ) {
        let stored = match &finish {
            Finish::Store(entry) => Some(entry.clone()),
            _ => None,
        };
        self.finish(leader, finish);
        let Some(lease) = lease else { return };
        #[cfg(feature = "redis")]
        {
            let mut lease = lease;
            let Some(l2) = &self.l2 else { return };
            let encoded = stored.as_ref().and_then(|entry| {
                let payload = entry.value::<V>()?.encode()?;
                Some((entry, codec::encode(&entry.envelope(), &payload)))
            });
            match encoded {
                Some((entry, bytes)) => {
                    let fresh = entry.fresh_for(Instant::now());
                    if fresh.is_zero() {
                        let _ = l2.release(&mut lease).await;
                    } else {
                        let _ = l2
                            .commit(&mut lease, bytes, fresh, entry.keep_for(fresh))
                            .await;
                    }
                }
                None => {
                    let _ = l2.release(&mut lease).await;
                }
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = stored;
            match lease {}
        }
    }
}

#[cfg(feature = "redis")]
fn decode<V: CacheValue>(remote: Remote, now: Instant) -> Option<Entry> {
    let (envelope, payload) = codec::decode(remote.bytes)?;
    let value = V::decode(payload)?;
    Some(Entry::from_remote(
        value,
        &envelope,
        remote.fresh,
        remote.remaining,
        now,
    ))
}

#[cfg(feature = "redis")]
fn decode_or_count<V: CacheValue>(
    l2: &RedisTier,
    key: &Key,
    remote: Remote,
    now: Instant,
    counted: bool,
) -> Option<Arc<Entry>> {
    let entry = decode::<V>(remote, now);
    if entry.is_none() && !counted {
        l2.count_corrupt(key);
    }
    entry.map(Arc::new)
}

/// The later of two stale entries.
#[cfg(feature = "redis")]
fn newer(a: Option<Arc<Entry>>, b: Option<Arc<Entry>>) -> Option<Arc<Entry>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.fresh_until() >= a.fresh_until() {
            b
        } else {
            a
        }),
        (a, b) => a.or(b),
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
        let engine = Engine::new(LocalTier::new(1 << 20));
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
        let engine = Engine::new(LocalTier::new(1 << 20));
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
        let engine = Engine::new(LocalTier::new(1 << 20));
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
        let engine = Engine::new(LocalTier::new(1 << 20));
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
