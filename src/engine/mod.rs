//! The one machine that owns a miss. It knows no HTTP.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`Engine`] and all its steps: `lookup` (1), `resolve` and `fly` (2), the one call down to the fleet (3), `rebuild` and `settle` (4); invalidation by key, tag and everything |
//! | `early.rs` | step 1's early refresh: XFetch and refresh-ahead |
//! | `flight.rs` | step 2: in-process single flight (`Flights`, `Leader`, `Follower`, `Outcome`) |
//! | `fleet.rs` | step 3: the seam to the shared tier (`Fleet`, `Plan`, `Lease`); the one file that knows Redis |
//! | `rebuild.rs` | step 4's contract with the adapters (`Rebuild`, `Built`, `Waiters`, `Overtaken`) |
//! | `outcome.rs` | what a caller gets (`Miss`, `Answer`, `Served`, `Status`, `Failure`) |
//! | `entry.rs` | a cached value and its clock (`Entry`, `Envelope`, `Lifetime`, `Held`) |
//! | `value.rs` | what the cache can hold (`CacheValue`) |
//! | `codec.rs` | the versioned binary form of entries in the shared tier |
//! | `tags.rs` | invalidation by tag: generations checked on read (`TagTable`, `Stamp`) |
//! | `flight_stress.rs` | tests: the real flight map under real scheduling, leaders finishing, panicking or cancelled at random |
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
//! 3. **Fleet** (with Redis): the flight asks the shared tier once, and
//!    Redis, in one round trip, gives the entry or the key's rebuild lease;
//!    the flight gets an entry another instance built, or the lease, or
//!    waits for the holder's publish. After the rebuild, one call commits
//!    under the lease or gives it up.
//! 4. **Rebuild and settle**: the flight runs the adapter's [`Rebuild`] once,
//!    then ends in one place whatever happened (a value, an answer that may
//!    not be shared, an error, a panic, a timeout): its waiters share that
//!    outcome, or stale-if-error stands in for a failure.
//!
//! [`Engine::resolve`] is the waiter's side: join the key's flight or start
//! it, then wait for what it gives. `Engine::fly` is the flight's side, on
//! its own task: shared tier, lease, rebuild, settle. A flight ends in
//! exactly one place (`Engine::settle`) whatever happened, and its waiters
//! share that outcome:
//!
//! | the rebuild gave | waiters get | the request that started it gets |
//! |---|---|---|
//! | a value | the value (stored if storable) | the value, and its private extras |
//! | an answer for one client: a refusal (403, 429…) | one of them leads again, the others wait on it | that answer |
//! | an answer for one client: per-client content (a cookie, `private`) | the origin at once, each on its own | that answer |
//! | an error, a panic, a timeout | stale-if-error, else the shared failure | stale-if-error, else its own error or panic |
//!
//! No failure sends the waiters to the origin: a failing origin is called
//! once per flight, not once per waiter. Nor does the end of a wait: failing
//! closed, a waiter whose budget runs out is answered by the layer; failing
//! open, it keeps waiting on its own process's flight, which is bounded.
//!
//! A refusal (a 403 or 429 for one caller) says nothing about the key: the
//! waiters of its flight lead again (a second refusal in a row is taken for
//! the key's own answer). A per-client answer (a cookie, `private`), or a
//! second refusal in a row, releases the waiters at once and marks the key
//! for a window. The mark lets no request skip the wait: requests keep
//! coalescing behind one flight, whose shareable answer is stored and
//! clears the mark, so one client's answer never turns coalescing off for
//! the others. During the mark a flight whose answer is again for one
//! client releases its waiters at once (a key whose every answer is per
//! client costs a request that arrives during a flight the wait for that
//! flight's response head, then its own call). An entry still servable (fresh,
//! or stale within its stale-while-revalidate window) is kept, not replaced
//! by the mark. An answer too large to store (over the size cap) is the one
//! kind that lets requests skip coalescing for a while (hit-for-miss).
//!
//! Invalidation by key drops the key's group here and in the fleet;
//! invalidation by tag and of everything moves a generation (see [`tags`]),
//! here and, with Redis, in the fleet, whose moves this engine hears and
//! whose table it reloads when some may have gone unheard.
//!
//! The HTTP layer and [`Cache`](crate::Cache) are thin adapters over this:
//! they say how to rebuild and how to present what comes back, and every
//! counter is kept here, so the two agree by construction.

pub(crate) mod codec;
pub(crate) mod early;
pub(crate) mod entry;
pub(crate) mod fleet;
pub(crate) mod flight;
mod outcome;
mod rebuild;
pub(crate) mod tags;
mod value;

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::Instrument;

pub(crate) use early::RefreshAhead;
pub use entry::CacheValue;
pub(crate) use entry::{Held, Lifetime, MAX_DELTA};
pub(crate) use outcome::{Answer, Failure, FailureKind, Miss, Status};
pub(crate) use rebuild::{Built, Overtaken, Rebuild, Waiters};
pub(crate) use tags::TagSet;

use entry::Freshness;
use fleet::{Ask, Fleet, L1Trust, Lease, Plan, Start};
use flight::{wait_deadline, Flights, Joined, Leader, Outcome};
use outcome::Served;

use crate::key::Key;
use crate::metrics::{self as m, count, count_hit, Labels};
use crate::store::generations::{Field, Scope};
use crate::store::local;

/// The L1 as the engine uses it.
pub(crate) type LocalTier = local::LocalTier<Entry>;
type Slot = local::Slot<Entry>;

/// An error shared with every waiter of a failed flight (the generic cache's
/// `Arc<E>`), downcast back by the adapter that knows its type.
pub(crate) type SharedError = Arc<dyn Any + Send + Sync>;

/// How one route or cache runs its misses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlightPolicy {
    /// Lease time in the shared tier; renewed every third of it while the
    /// rebuild runs.
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
    /// The namespace whose generations its entries record (see
    /// [`Engine::scope`]): only an entry of it is served.
    pub scope: Scope,
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
    /// The shared tier, if any: every call to it goes through this seam.
    pub(crate) fleet: Fleet,
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
            fleet: Fleet::new(),
        }
    }

    pub(crate) fn l1(&self) -> &LocalTier {
        &self.l1
    }

    /// The most an entry may weigh to be kept, when the in-process tier is
    /// the only one that keeps entries (no Redis); `None` with Redis.
    pub(crate) fn keep_bound(&self) -> Option<u64> {
        self.fleet.is_embedded().then(|| self.l1.max_bytes())
    }

    /// Step 1: the L1. Never waits; a hit costs one L1 read. An entry of
    /// another type than `V` is a miss.
    pub(crate) fn lookup<V: CacheValue>(
        &self,
        key: Key,
        policy: &FlightPolicy,
        now: Instant,
    ) -> Looked<V> {
        let trusted = self.confirm_l1(now);
        let mut stale = None;
        match self
            .l1
            .get(&key)
            .filter(|s| trusted || !matches!(s, Slot::Value(_)))
        {
            // An entry whose tags were invalidated is gone.
            Some(Slot::Value(entry))
                if entry.stamp().scope == policy.scope
                    && self.fleet.serves(&self.tags, &entry, now) =>
            {
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
                        // Not served now, but what a failed rebuild falls
                        // back on, or what the rebuild asks the origin to
                        // confirm (a conditional request).
                        Freshness::IfError | Freshness::Validate => stale = Some(entry.clone()),
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
        if !entry.claim_draw(now, entry.envelope().rebuild_cost / 8) {
            return None;
        }
        if !early::due(
            now,
            entry.fresh_until(),
            entry.envelope().rebuild_cost,
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
            .margin(entry.envelope().rebuild_cost)
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

    /// The entry for `key` of namespace `scope` if it is fresh; never joins
    /// a flight.
    pub(crate) fn peek<V: CacheValue>(
        &self,
        key: &Key,
        scope: Scope,
        now: Instant,
    ) -> Option<Held<V>> {
        if !self.confirm_l1(now) {
            return None;
        }
        match self.l1.get(key) {
            Some(Slot::Value(entry))
                if entry.freshness(now) == Freshness::Fresh
                    && entry.stamp().scope == scope
                    && self.fleet.serves(&self.tags, &entry, now) =>
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
    ///
    /// Returns whether the L1 may answer at all: not while the backend is
    /// outside the fleet with no outage grace (see
    /// [`Fleet::l1_trust`]).
    fn confirm_l1(&self, now: Instant) -> bool {
        self.fleet.sweep(&self.l1, now);
        match self.fleet.l1_trust(now) {
            L1Trust::Trusted => true,
            L1Trust::Drop => {
                tracing::debug!(
                    "the redis subscription is not confirmed live; the in-process tier is dropped"
                );
                self.invalidate_everything_here();
                true
            }
            L1Trust::Untrusted => false,
        }
    }

    /// Drops the key's whole group (every variant of a URL; a generic cache
    /// value is its own group) here and, with a shared tier, from Redis and
    /// every other instance. A barrier: a rebuild already running for any
    /// key of the group may still answer the requests that were waiting on
    /// it, but it stores nothing, and a request that starts after this
    /// returns does not join it; it gets a value built afterwards. `what`
    /// is what the caller purged (a URL, a cache key), for the logs.
    pub(crate) async fn invalidate(&self, key: &Key, what: &str) -> Result<(), crate::Error> {
        // Redis first: a flight of this process that read the old value from
        // Redis before the purge is detached (or its value removed) by the
        // local half below; one that reads after the purge finds nothing
        // old. The other way round, a flight could fetch the old value after
        // the local half and put it back in the L1.
        let purged = self.fleet.invalidate(key, what).await;
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
    pub(crate) fn invalidate_everything_here(&self) {
        self.flights.detach_all();
        self.l1.clear();
        // Tag invalidations may have been missed too.
        self.fleet.table_lost(self);
    }

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
            return self
                .uncoalesced(key, leader, rebuild, labels, policy.scope)
                .await;
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
                    let trusted = self.confirm_l1(now);
                    match self
                        .l1
                        .get(&key)
                        .filter(|s| trusted || !matches!(s, Slot::Value(_)))
                    {
                        Some(Slot::Value(entry))
                            if entry.freshness(now) == Freshness::Fresh
                                && entry.stamp().scope == policy.scope
                                && self.fleet.serves(&self.tags, &entry, now) =>
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
                            return self
                                .uncoalesced(key, Some(leader), rebuild, labels, policy.scope)
                                .await;
                        }
                        _ => {}
                    }
                    // The key's last answer was for one client: this flight
                    // still gathers the requests that come meanwhile, but if
                    // its answer is again for one client they go to the
                    // origin at once, side by side (they do not queue again
                    // behind another leader). It skips the shared tier, so that an
                    // uncacheable key's requests on other instances do not
                    // queue behind this one's lease.
                    let marked =
                        matches!(self.l1.get(&key), Some(Slot::Unshared(until)) if now < until);
                    if marked {
                        leader.mark_relead();
                    }
                    let (tx, rx) = oneshot::channel();
                    let start = Flight {
                        start: Start::Miss,
                        fleet: !marked,
                    };
                    self.spawn_flight(leader, rebuild, stale, policy, start, Some(tx));
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
                    Some(held) => {
                        let status = match stale {
                            true => Status::Stale,
                            false => Status::Coalesced,
                        };
                        let served = Served {
                            held,
                            status,
                            stored: false,
                            private: None,
                        };
                        Answer::Shared(served, rebuild)
                    }
                    None => return alone(rebuild, labels),
                },
                // Released at once: each goes to the origin on its own.
                // The first holds the key's next flight, so requests that
                // come meanwhile wait for its answer and take it if it can
                // be shared; if it cannot, they are released in turn.
                Some(Outcome::Unshared) => {
                    let leader = self.flights.try_lead(key).map(|mut leader| {
                        leader.mark_relead();
                        leader
                    });
                    return self
                        .uncoalesced(key, leader, rebuild, labels, policy.scope)
                        .await;
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
        let start = Flight { start, fleet: true };
        self.spawn_flight(refresh.leader, rebuild, refresh.stale, policy, start, None);
    }

    fn spawn_flight<R: Rebuild>(
        self: &Arc<Self>,
        leader: Leader,
        rebuild: R,
        stale: Option<Arc<Entry>>,
        policy: FlightPolicy,
        start: Flight,
        starter: Option<oneshot::Sender<Answer<R>>>,
    ) {
        // Without a runtime nobody can run the flight; dropping the leader
        // abandons it, and the next request tries again.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !matches!(start.start, Start::Miss) {
            count(m::REFRESHES, policy.labels);
        }
        // The flight runs on a task of its own, for the key, not inside the
        // request that started it: its span follows from that request's
        // (the span current here), without being its child: it may outlive
        // that request by far. The handler's logs and traces during a
        // rebuild so lead back to a request. At INFO, the level a
        // handler's own logs usually have, so that they keep this context.
        let span = tracing::info_span!(
            parent: None,
            "stampede_guard.flight",
            route = policy.labels.route(),
            namespace = policy.labels.namespace(),
            key = %leader.key(),
        );
        span.follows_from(tracing::Span::current());
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
        flight: Flight,
        mut starter: Starter<R>,
    ) {
        let key = leader.key();
        let start = flight.start;
        if !flight.fleet {
            self.rebuild(leader, rebuild, stale, None, policy, starter)
                .await;
            return;
        }
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
            Plan::Failed {
                kind,
                stale,
                answer,
            } => {
                let failure = Failure {
                    answer,
                    ..Failure::new(kind)
                };
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
        // In the flight's span: a spawned task starts outside any.
        let mut task = tokio::spawn(
            rebuild
                .rebuild(stale.clone().and_then(Held::new), overtaken)
                .in_current_span(),
        );
        // A rebuild that gave nothing failed with a kind, and a panic keeps
        // its payload for the request that started it.
        let built = match tokio::time::timeout(policy.rebuild_timeout, &mut task).await {
            Ok(Ok(built)) => Ok(built),
            Ok(Err(e)) if e.is_panic() => Err((FailureKind::Panic, Some(e.into_panic()))),
            // Its task was cancelled: the runtime is shutting down.
            Ok(Err(_)) => Err((FailureKind::Error, None)),
            Err(_) => {
                task.abort();
                tracing::warn!(key = %leader.key(), timeout = ?policy.rebuild_timeout, "rebuild timed out");
                Err((FailureKind::Timeout, None))
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
                hit_for_miss,
            }) => {
                if failure && usable_on_error(stale.as_ref()).is_some() {
                    tracing::debug!(key = %key, "rebuild answered with an error; serving stale");
                    let answer =
                        self.fail(leader, Failure::new(FailureKind::Error), stale.as_ref());
                    self.fleet.give_up(lease, Some(FailureKind::Error)).await;
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
                if store {
                    self.learn_epoch().await;
                }
                let (entry, store) = self.stamped(entry, policy.scope, &tags, since, store);
                let held = Held::new(entry.clone());
                // Before the flight ends: a request from then on finds the
                // mark, and no later flight's entry can be overwritten by it.
                if let (Some(window), false) = (hit_for_miss, store) {
                    self.mark_hit_for_miss(key, window);
                }
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
                    (true, Some(held)) => {
                        self.fleet
                            .commit(&self.l1, key, lease, held, policy.labels)
                            .await
                    }
                    // The origin's own answer to the failure is kept with
                    // the fleet's failure marker, for the backoff's requests.
                    _ if failure => self.fleet.give_up_answered(lease, held.as_ref()).await,
                    _ => self.fleet.give_up(lease, None).await,
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
                self.fleet.give_up(lease, None).await;
                starter.send(|| Answer::Private(private));
            }
            Ok(Built::Failed {
                shared,
                private,
                answer,
            }) => {
                // What may stand in for the failure: never stored as an
                // entry, only presented to the waiters and, through the
                // fleet's failure marker, during the backoff.
                let answer = answer.map(|value| {
                    let lifetime = Lifetime::default();
                    let now = Instant::now();
                    Arc::new(Entry::new(
                        value,
                        lifetime,
                        Duration::ZERO,
                        Duration::ZERO,
                        now,
                    ))
                });
                let failure = Failure {
                    error: shared,
                    answer: answer.clone(),
                    ..Failure::new(FailureKind::Error)
                };
                let answer = answer.and_then(Held::<R::Value>::new);
                let settled = self.fail(leader, failure, stale.as_ref());
                match answer {
                    Some(held) => self.fleet.give_up_answered(lease, Some(&held)).await,
                    None => self.fleet.give_up(lease, Some(FailureKind::Error)).await,
                }
                let answer = settled;
                starter.send(|| match (answer, private) {
                    (Answer::Failed(..), Some(private)) => Answer::Private(private),
                    (answer, _) => answer,
                });
            }
            Err((kind, panic)) => {
                if kind == FailureKind::Panic {
                    tracing::error!(key = %key, "rebuild panicked");
                }
                let answer = self.fail(leader, Failure::new(kind), stale.as_ref());
                self.fleet.give_up(lease, Some(kind)).await;
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

    /// A miss in a hit-for-miss window (answers too large to store), or a
    /// waiter released by a flight whose answer was for its starter alone:
    /// this request goes to the origin on its own, without waiting for
    /// anyone (Varnish's hit-for-miss, not its hit-for-pass). If it holds the key's flight (`leader`: the first such
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
        scope: Scope,
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
                hit_for_miss,
            } => {
                let entry = Entry::new(
                    value,
                    lifetime,
                    initial_age,
                    started.elapsed(),
                    Instant::now(),
                );
                let (entry, store) = self.stamped(entry, scope, &tags, since, store);
                let held = Held::new(entry.clone());
                // Renewed by every answer that cannot be stored, before the
                // flight (if this request holds it) ends.
                if let (Some(window), false) = (hit_for_miss, store) {
                    self.mark_hit_for_miss(key, window);
                }
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
            Built::Failed {
                shared, private, ..
            } => {
                let failure = Failure {
                    error: shared,
                    ..Failure::new(FailureKind::Error)
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

    /// Marks `key` as not coalesced for `window`: its answers cannot be
    /// stored, so requests for it go to the origin side by side rather than
    /// wait for one another. A zero window marks nothing.
    fn mark_hit_for_miss(&self, key: Key, window: Duration) {
        if let Some(until) = Some(window)
            .filter(|w| !w.is_zero())
            .and_then(|w| Instant::now().checked_add(w))
        {
            self.l1.insert(key, Slot::HitForMiss(until));
        }
    }

    /// Ends a flight whose answer was for its starter alone.
    ///
    /// Its waiters are released at once to go to the origin each on its
    /// own, and the key is marked (`Slot::Unshared`) for the window: the
    /// mark lets no request skip the wait (requests keep coalescing behind
    /// one flight, whose shareable answer is stored and clears it); it only
    /// says that a flight whose answer is again for one client releases its
    /// waiters at once, without another round behind a new leader. An entry
    /// the L1 can still serve (fresh, or stale within its
    /// stale-while-revalidate window) stays: one client's answer says
    /// nothing against it.
    pub(super) fn end_unshared(&self, leader: Leader, waiters: Waiters) {
        let key = leader.key();
        match waiters {
            // A refusal says nothing about the key: no marker, and whatever
            // the L1 holds for it (a stale-if-error copy) stays.
            Waiters::Relead(_) if !leader.is_relead() => {
                leader.finish(Outcome::Relead, || {});
            }
            // A second in a row, or an answer per client: the waiters go
            // side by side, and the key is marked.
            Waiters::Relead(window) | Waiters::HitForMiss(window) => {
                let now = Instant::now();
                let marker = Some(window)
                    .filter(|w| !w.is_zero())
                    .and_then(|w| now.checked_add(w));
                leader.finish(Outcome::Unshared, || {
                    let servable = match self.l1.get(&key) {
                        Some(Slot::Value(entry)) => matches!(
                            entry.freshness(now),
                            Freshness::Fresh | Freshness::Revalidate
                        ),
                        _ => false,
                    };
                    match (servable, marker) {
                        (true, _) => {}
                        (false, Some(until)) => {
                            self.l1.insert(key, Slot::Unshared(until));
                        }
                        (false, None) => self.l1.remove(&key),
                    }
                });
            }
        }
    }

    /// Step 3: one call down to the fleet for the flight's plan.
    async fn plan<V: CacheValue>(
        &self,
        key: Key,
        stale: Option<Arc<Entry>>,
        policy: &FlightPolicy,
        start: Start,
    ) -> Plan {
        // Failing open, a flight waits for another instance's rebuild as long
        // as that rebuild may run (its timeout, plus a lease for its failure
        // notice or its lease to lapse): the holder then commits, shares its
        // failure, or is gone. Giving up sooner would send every instance to
        // an origin that is merely slow. Failing closed, the budget is the
        // route's answer.
        let patience = if policy.fail_open {
            policy
                .wait_budget
                .max(policy.rebuild_timeout.saturating_add(policy.lease))
        } else {
            policy.wait_budget
        };
        let ask = Ask {
            start,
            lease: policy.lease,
            patience,
            labels: policy.labels,
        };
        self.fleet.plan::<V>(self, key, stale, ask).await
    }

    /// Moves `field`'s generation: every entry that recorded an older one is
    /// a miss from now on, here and (with Redis) on every instance. A
    /// barrier like [`Engine::invalidate`]: a rebuild already running stores
    /// nothing, and a request that starts after this returns does not join
    /// it.
    ///
    /// When the fleet's half fails (Redis down, the deadline passed), the
    /// generation still moves here, as it does without a shared tier: this
    /// process serves nothing it held before the call, whatever the other
    /// instances do. The moved generation is at least this host's clock in
    /// microseconds, like the ones Redis hands out; one above Redis's
    /// (a clock ahead of Redis's) makes entries Redis holds for the field
    /// misses here until Redis's generations pass it: more rebuilds, never
    /// a stale answer.
    /// `what` is what the caller purged (a tag, everything), for the logs.
    pub(crate) async fn invalidate_field(
        &self,
        field: Field,
        what: &str,
    ) -> Result<(), crate::Error> {
        let moved = |generation| self.generation_moved(field, generation);
        let failed = match self.fleet.move_generation(field, what, moved).await {
            Some(Ok(())) => return Ok(()),
            Some(Err(error)) => Some(error),
            None => None,
        };
        let generation = self.tags.bump_here(field);
        self.generation_moved(field, generation);
        failed.map_or(Ok(()), Err)
    }

    /// A rebuilt entry with the generations it was built under, and whether
    /// it may be stored: not if any generation moved since its rebuild
    /// began at `since` (it may hold data from before that invalidation),
    /// nor with tags in more buckets than an entry may record.
    pub(super) fn stamped(
        &self,
        entry: Entry,
        scope: Scope,
        tags: &TagSet,
        since: u64,
        store: bool,
    ) -> (Arc<Entry>, bool) {
        let stamp = self.tags.stamp(scope, tags, since);
        let store = store && stamp.is_some() && !tags.overflowed();
        (Arc::new(entry.with_stamp(stamp.unwrap_or_default())), store)
    }

    /// The in-process half of a moved generation. Which flights build
    /// entries with which tags is known only once they end, so every flight
    /// running is detached: it may answer its waiters, and stores nothing.
    pub(crate) fn generation_moved(&self, field: Field, generation: u64) {
        self.tags.raise(field, generation);
        self.flights.detach_all();
        // Nothing it voids can be served any more: free the memory now.
        match field {
            Field::All => self.l1.clear(),
            Field::Own(scope) => self
                .l1
                .remove_values_if(move |entry| entry.stamp().scope == scope),
            Field::Bucket(..) => {}
        }
    }

    /// The namespace `namespace` as the generations name it, known here
    /// from now on: its purges are heard, and a read of the table loads
    /// its generations. With Redis, a namespace new to this process makes
    /// the table untrusted until a whole read covers it (meanwhile an entry
    /// read from Redis has its generations checked there).
    pub(crate) fn scope(&self, namespace: &str) -> Scope {
        let scope = Scope::of(namespace);
        if self.tags.register(scope) {
            self.fleet.table_lost(self);
        }
        scope
    }

    /// Before a rebuilt entry is stamped while the table is not trusted
    /// (Redis may have lost it and started a new epoch unseen here), reads
    /// the epoch from Redis: an entry stamped under an epoch the table no
    /// longer has would be a miss on every instance that knows the new one.
    /// Failing that, the entry is stamped under the epoch known here (at
    /// worst a miss elsewhere). Without a shared tier the table is trusted.
    async fn learn_epoch(&self) {
        if self.fleet.trusts_table(Instant::now()) {
            return;
        }
        if let Some((epoch, _)) = self
            .fleet
            .load_generations(Some(&[]), self.tags.table_epoch())
            .await
        {
            self.apply(epoch, Vec::new());
        }
    }

    /// What a read of the table found: its epoch (a new one makes every
    /// entry of an older one a miss; the L1's are dropped at once) and
    /// generations (a move detaches every flight).
    fn apply(&self, epoch: u64, loaded: Vec<(Field, u64)>) {
        let outlived = self.fleet.holds_outlived();
        apply_to(&self.tags, &self.flights, &self.l1, epoch, loaded, outlived);
    }
}

/// How a flight starts: why, and whether it asks the shared tier first (not
/// while the key is marked for answers per client: see
/// [`Engine::end_unshared`]).
#[derive(Clone, Copy, Debug)]
struct Flight {
    start: Start,
    fleet: bool,
}

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
        Answer::Served(served) | Answer::Shared(served, _) => served.status,
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

/// Applies a read of the tag table (see [`Engine::apply`]) to the parts of
/// an engine, for a reload that runs on its own task.
fn apply_to(
    tags: &tags::TagTable,
    flights: &Flights,
    l1: &LocalTier,
    epoch: u64,
    loaded: Vec<(Field, u64)>,
    outlived: bool,
) {
    // Entries of the old epoch are misses from now on: their memory goes
    // at once, unless some lived through a gap and are still kept (see
    // `fleet::outlived`).
    if tags.adopt(epoch) && !outlived {
        l1.clear();
    }
    for (field, generation) in loaded {
        if tags.raise(field, generation) {
            flights.detach_all();
        }
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
            scope: Scope::ROOT,
        }
    }

    fn entry(ttl_ms: u64, swr_ms: u64, sie_ms: u64, now: Instant) -> Arc<Entry> {
        Arc::new(Entry::new(
            Bytes::from_static(b"v"),
            Lifetime {
                ttl: Duration::from_millis(ttl_ms),
                stale_while_revalidate: Duration::from_millis(swr_ms),
                stale_if_error: Duration::from_millis(sie_ms),
                revalidation: Duration::ZERO,
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
        assert!(engine
            .peek::<String>(&key, Scope::ROOT, Instant::now())
            .is_none());
        assert!(engine
            .peek::<Bytes>(&key, Scope::ROOT, Instant::now())
            .is_some());
    }
}
