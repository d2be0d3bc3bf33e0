//! The one machine that owns a miss. It knows no HTTP.
//!
//! A request for a key goes down the tiers once and comes back up once:
//!
//! 1. **L1** ([`Engine::lookup`], synchronous): a fresh entry answers at once
//!    (`Hit`). A stale one inside its stale-while-revalidate window answers at
//!    once too (`Stale`), and the first such request starts one background
//!    refresh. Probabilistic early refresh may do the same for a fresh entry.
//! 2. **Flight** ([`Engine::resolve`]): otherwise the request joins the key's
//!    flight, or starts one. A flight runs on its own task, owned by the
//!    engine, not by the request that started it: that request is only its
//!    first waiter, and the rebuild finishes (bounded by the rebuild timeout)
//!    and fills the tiers even if every waiter has gone.
//! 3. **Shared tier** (with Redis): the flight asks Redis, in one round trip,
//!    for the entry or the key's rebuild lease; it gets an entry another
//!    instance built, or the lease, or waits for the holder's publish.
//! 4. **Rebuild and settle**: the flight runs the adapter's [`Rebuild`] once,
//!    then ends in one place whatever happened (a value, an answer that may
//!    not be shared, an error, a panic, a timeout): its waiters share that
//!    outcome, or stale-if-error stands in for a failure.
//!
//! The HTTP layer and [`Cache`](crate::Cache) are thin adapters over this:
//! they say how to rebuild and how to present what comes back, and every
//! counter is kept here, so the two agree by construction.

mod answer;
pub(crate) mod codec;
mod drive;
pub(crate) mod early;
pub(crate) mod entry;
pub(crate) mod flight;
#[cfg(test)]
mod flight_stress;
mod purge;
mod shared;
pub(crate) mod tags;
mod uncoalesced;
mod value;

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use answer::{
    Answer, Built, Failure, FailureKind, Miss, Overtaken, Rebuild, Status, Waiters,
};
pub(crate) use early::RefreshAhead;
pub use entry::CacheValue;
pub(crate) use entry::{Held, Lifetime, MAX_DELTA};
pub(crate) use tags::TagSet;

use entry::Freshness;
use flight::{Flights, Leader};

use crate::key::Key;
use crate::metrics::{self as m, count, count_hit, Labels};
use crate::store::local;

/// The L1 as the engine uses it.
pub(crate) type LocalTier = local::LocalTier<Entry>;
type Slot = local::Slot<Entry>;
#[cfg(feature = "redis")]
use crate::store::redis::RedisTier;

/// An error shared with every waiter of a failed flight (the generic cache's
/// `Arc<E>`), downcast back by the adapter that knows its type.
pub(crate) type SharedError = Arc<dyn Any + Send + Sync>;

/// How one route or cache runs its misses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlightPolicy {
    /// Lease time in the shared tier; renewed every third of it while the
    /// rebuild runs.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub lease: Duration,
    /// The longest a request waits for a rebuild it did not start (and the
    /// longest a flight waits for another instance's rebuild).
    pub wait_budget: Duration,
    /// When the budget runs out: keep going (wait for this process's own
    /// flight; rebuild here rather than wait on another instance), or fail.
    pub fail_open: bool,
    /// The longest a rebuild may run; then it is abandoned as failed.
    pub rebuild_timeout: Duration,
    /// Probabilistic early refresh (XFetch) with this beta.
    pub early_refresh: Option<f64>,
    /// The labels of the metrics this route's requests update.
    pub labels: Labels,
    /// Deterministic refresh-ahead; when set, it is used instead of XFetch.
    pub refresh_ahead: Option<early::RefreshAhead>,
}

/// Allowance for the instants of this process and Redis's clock to differ
/// when an early refresh asks whether Redis still holds the entry it judged
/// due.
pub(crate) const EARLY_SLACK: Duration = Duration::from_millis(50);

/// L1, flights and (optionally) the shared tier of one backend.
pub(crate) struct Engine {
    l1: LocalTier,
    flights: Arc<Flights>,
    /// The generations of tags and of everything, checked on every read.
    tags: Arc<tags::TagTable>,
    /// Set once, right after the tier connects: its invalidation messages
    /// call back into this engine, so the engine exists first.
    #[cfg(feature = "redis")]
    shared: std::sync::OnceLock<Arc<RedisTier>>,
}

/// What the L1 says about a key.
pub(crate) enum Looked<V> {
    /// Serve this entry now. If `refresh` is given, hand it a rebuild
    /// ([`Engine::refresh`]) to refresh the entry in the background.
    Hit {
        held: Held<V>,
        status: Status,
        refresh: Option<Refresh>,
    },
    /// Go on with [`Engine::resolve`].
    Miss(Miss),
}

/// The right to refresh an entry in the background: a flight nobody waits on
/// yet. Dropping it gives the right up.
pub(crate) struct Refresh {
    leader: Leader,
    stale: Option<Arc<Entry>>,
    /// For an early refresh, the freshness the entry had left.
    early: Option<Duration>,
}

use entry::Entry;

impl Engine {
    pub(crate) fn new(l1: LocalTier) -> Self {
        Engine {
            l1,
            flights: Arc::new(Flights::new()),
            tags: Arc::default(),
            #[cfg(feature = "redis")]
            shared: std::sync::OnceLock::new(),
        }
    }

    /// Puts the shared tier behind this engine (once).
    #[cfg(feature = "redis")]
    pub(crate) fn attach(&self, shared: Arc<RedisTier>) {
        let _ = self.shared.set(shared);
    }

    #[cfg(feature = "redis")]
    pub(crate) fn shared(&self) -> Option<&Arc<RedisTier>> {
        self.shared.get()
    }

    pub(crate) fn l1(&self) -> &LocalTier {
        &self.l1
    }

    /// The most an entry may weigh to be kept, when the in-process tier is
    /// the only one that keeps entries (no Redis); `None` with Redis.
    pub(crate) fn keep_bound(&self) -> Option<u64> {
        #[cfg(feature = "redis")]
        if self.shared().is_some() {
            return None;
        }
        Some(self.l1.max_bytes())
    }

    /// Step 1: the L1. Never waits; a hit costs one L1 read. An entry of
    /// another type than `V` is a miss.
    pub(crate) fn lookup<V: CacheValue>(
        &self,
        key: Key,
        policy: &FlightPolicy,
        now: Instant,
    ) -> Looked<V> {
        self.confirm_l1(now);
        let mut stale = None;
        match self.l1.get(&key) {
            // An entry whose tags were invalidated is gone.
            Some(Slot::Value(entry)) if self.tags.admits(entry.stamp()) => {
                if let Some(held) = Held::<V>::new(entry) {
                    let entry = held.entry();
                    match entry.freshness(now) {
                        Freshness::Fresh => {
                            count_hit(policy.labels);
                            let refresh = match policy.refresh_ahead {
                                Some(ahead) => {
                                    self.refresh_ahead(key, entry, ahead, now, policy.labels)
                                }
                                None => policy.early_refresh.and_then(|beta| {
                                    self.early_refresh(key, entry, beta, now, policy.labels)
                                }),
                            };
                            return Looked::Hit {
                                held,
                                status: Status::Hit,
                                refresh,
                            };
                        }
                        Freshness::Revalidate => {
                            count(m::STALE, policy.labels);
                            let refresh = self.flights.try_lead(key).map(|leader| Refresh {
                                leader,
                                stale: Some(entry.clone()),
                                early: None,
                            });
                            return Looked::Hit {
                                held,
                                status: Status::Stale,
                                refresh,
                            };
                        }
                        Freshness::IfError => stale = Some(entry.clone()),
                        Freshness::Expired => {}
                    }
                }
            }
            Some(Slot::HitForMiss(until)) if now < until => {
                return Looked::Miss(Miss::hit_for_miss(key));
            }
            _ => {}
        }
        Looked::Miss(Miss::new(key, stale))
    }

    /// Starts a background refresh of a fresh entry if probabilistic early
    /// refresh says it is due and no flight runs for the key.
    fn early_refresh(
        &self,
        key: Key,
        entry: &Arc<Entry>,
        beta: f64,
        now: Instant,
        labels: Labels,
    ) -> Option<Refresh> {
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
        count(m::EARLY_REFRESHES, labels);
        Some(Refresh {
            leader,
            stale: None,
            early: Some(entry.fresh_for(now) + EARLY_SLACK),
        })
    }

    /// Starts a background refresh of a fresh entry once its freshness left
    /// is within the refresh-ahead margin, if no flight runs for the key.
    /// In the fleet, the early start asks Redis first: an instance whose
    /// copy another instance already refreshed loads that one instead.
    fn refresh_ahead(
        &self,
        key: Key,
        entry: &Arc<Entry>,
        ahead: early::RefreshAhead,
        now: Instant,
        labels: Labels,
    ) -> Option<Refresh> {
        let left = entry.fresh_for(now);
        // Never more than half the entry's freshness lifetime: a margin as long as
        // the ttl (a huge multiple or floor, or a first fill far slower than
        // the rebuilds after it) would refresh each new entry at its first
        // hit, that is on nearly every request.
        let margin = ahead
            .margin(entry.rebuild_cost())
            .min(entry.freshness_lifetime() / 2);
        if left > margin {
            return None;
        }
        // One try per half margin per entry here: a refresh that failed is
        // not tried again by every request that follows it.
        if !entry.claim_draw(now, margin / 2) {
            return None;
        }
        let leader = self.flights.try_lead(key)?;
        count(m::EARLY_REFRESHES, labels);
        Some(Refresh {
            leader,
            stale: None,
            early: Some(left.saturating_add(EARLY_SLACK)),
        })
    }

    /// The entry for `key` if it is fresh; never joins a flight.
    pub(crate) fn peek<V: CacheValue>(&self, key: &Key, now: Instant) -> Option<Held<V>> {
        self.confirm_l1(now);
        match self.l1.get(key) {
            Some(Slot::Value(entry))
                if entry.freshness(now) == Freshness::Fresh && self.tags.admits(entry.stamp()) =>
            {
                Held::new(entry)
            }
            _ => None,
        }
    }

    /// With a shared tier, the L1 is trusted only while the subscription to
    /// its invalidations is confirmed live (the subscription lease): once
    /// that ran out, everything here is dropped before anything is served,
    /// and again every lease for as long as it is not confirmed. Without
    /// Redis the L1 still protects the origin, with what was built after
    /// the last drop.
    fn confirm_l1(&self, _now: Instant) {
        #[cfg(feature = "redis")]
        if let Some(shared) = self.shared()
            && shared.notifier.liveness.must_drop(_now)
        {
            tracing::info!(
                "the redis subscription is not confirmed live; the in-process tier is dropped"
            );
            self.invalidate_everything_here();
        }
    }

    /// Drops the key's whole group (every variant of a URL; a generic cache
    /// value is its own group) here and, with a shared tier, from Redis and
    /// every other instance. A barrier: a rebuild already running for any
    /// key of the group may still answer the requests that were waiting on
    /// it, but it stores nothing, and a request that starts after this
    /// returns does not join it; it gets a value built afterwards.
    pub(crate) async fn invalidate(&self, key: &Key) -> Result<(), crate::Error> {
        // Redis first: a flight of this process that read the old value from
        // Redis before the purge is detached (or its value removed) by the
        // local half below; one that reads after the purge finds nothing
        // old. The other way round, a flight could fetch the old value after
        // the local half and put it back in the L1.
        #[cfg(feature = "redis")]
        let purged = match self.shared() {
            Some(shared) => shared.invalidate(key).await.map_err(crate::Error::from),
            None => Ok(()),
        };
        #[cfg(not(feature = "redis"))]
        let purged = Ok(());
        self.invalidate_here(key);
        purged
    }

    /// The in-process half of an invalidation: the key's whole group.
    pub(crate) fn invalidate_here(&self, key: &Key) {
        let group = key.group();
        self.flights.detach_group(&group);
        self.l1.remove_group(&group);
    }

    /// Drops everything this process holds, and keeps every running flight
    /// from storing: after a gap in the shared tier's event channel, any of
    /// it may have been invalidated unheard.
    #[cfg(feature = "redis")]
    pub(crate) fn invalidate_everything_here(&self) {
        self.flights.detach_all();
        self.l1.clear();
        // Tag invalidations may have been missed too.
        self.tags.lost();
        self.reload_tags();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn policy() -> FlightPolicy {
        FlightPolicy {
            lease: Duration::from_secs(5),
            wait_budget: Duration::from_secs(5),
            fail_open: true,
            rebuild_timeout: Duration::from_secs(30),
            early_refresh: None,
            labels: Labels::of("test", "test"),
            refresh_ahead: None,
        }
    }

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
    fn only_the_first_stale_reader_refreshes() {
        let engine = Engine::new(LocalTier::new(1 << 20));
        let key = Key::for_value("t", b"k");
        let t0 = Instant::now();
        engine.l1.insert(key, Slot::Value(entry(10, 60_000, 0, t0)));
        let later = t0 + Duration::from_millis(20);
        let Looked::<Bytes>::Hit {
            status: Status::Stale,
            refresh: Some(_refresh),
            ..
        } = engine.lookup(key, &policy(), later)
        else {
            panic!("first stale reader must get the refresh")
        };
        assert!(matches!(
            engine.lookup::<Bytes>(key, &policy(), later),
            Looked::Hit { refresh: None, .. }
        ));
    }

    #[test]
    fn an_entry_past_revalidate_is_offered_only_for_errors() {
        let engine = Engine::new(LocalTier::new(1 << 20));
        let key = Key::for_value("t", b"k");
        let t0 = Instant::now();
        engine.l1.insert(key, Slot::Value(entry(10, 0, 60_000, t0)));
        let later = t0 + Duration::from_millis(20);
        let Looked::<Bytes>::Miss(miss) = engine.lookup(key, &policy(), later) else {
            panic!("an entry only usable on error must not be served as a hit")
        };
        assert!(miss.has_stale());
    }

    #[test]
    fn an_entry_of_another_type_is_a_miss() {
        let engine = Engine::new(LocalTier::new(1 << 20));
        let key = Key::for_value("t", b"k");
        engine
            .l1
            .insert(key, Slot::Value(entry(60_000, 0, 0, Instant::now())));
        assert!(matches!(
            engine.lookup::<String>(key, &policy(), Instant::now()),
            Looked::Miss(_)
        ));
        assert!(engine.peek::<String>(&key, Instant::now()).is_none());
        assert!(engine.peek::<Bytes>(&key, Instant::now()).is_some());
    }
}
