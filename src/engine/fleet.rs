//! Step 3: the seam to the shared tier. The engine asks it once per step
//! and gets one answer back: before the rebuild, a [`Plan`] (the entry
//! another instance built, the key's rebuild lease, or a wait for the
//! holder's publish, which may carry the entry); after it, a commit under
//! the lease's fence or the lease given up; for an invalidation, the fleet's
//! half of it; for the tag table, whether it may be trusted and what Redis
//! holds.
//!
//! [`Fleet`] works in one of two ways: embedded (no shared tier, because the
//! crate was built without Redis or the backend has none: the plan is always
//! "rebuild", and the in-process flight is the only protection), or with the
//! Redis tier attached once it connected. A backend whose Redis could not be
//! reached at start-up works without it until its tier connects in the
//! background, and a backend shut down works without it from then on: in
//! both it is outside the fleet, and is treated as an instance in an
//! outage. No invalidation made elsewhere waits for it, so it trusts its
//! in-process tier by the outage rule with no subscription lease to count
//! from (see [`Fleet::l1_trust`]), and its own invalidations fail as they
//! do while Redis is down (kept, before the join, until Redis has them).
//!
//! This is the one file of the engine that knows whether the crate was built
//! with Redis, and the one that knows the tier's types; everything else in
//! the engine calls the methods below.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::entry::{CacheValue, Entry, Held};
use super::{Engine, FailureKind, LocalTier};
use crate::key::Key;
use crate::metrics::Labels;
use crate::store::generations::Field;

#[cfg(feature = "redis")]
mod outlived;

#[cfg(feature = "redis")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(feature = "redis")]
use std::sync::OnceLock;

#[cfg(feature = "redis")]
use bytes::Bytes;

#[cfg(feature = "redis")]
use super::apply_to;
#[cfg(feature = "redis")]
use super::codec;
#[cfg(feature = "redis")]
use super::entry::{later, Envelope, Freshness};
#[cfg(feature = "redis")]
use crate::metrics::{self as m, count};
#[cfg(feature = "redis")]
use crate::store::redis::carried::Holder;
#[cfg(feature = "redis")]
use crate::store::redis::liveness::Liveness;
#[cfg(feature = "redis")]
use crate::store::redis::notify::{Event, Registration};
#[cfg(feature = "redis")]
pub(crate) use crate::store::redis::Lease;
#[cfg(feature = "redis")]
use crate::store::redis::{Fetched, Invalidated, Pending, Purged, RedisTier, Remote, TierConfig};
#[cfg(feature = "redis")]
use outlived::Outlived;

/// A rebuild lease: the fleet-wide right to rebuild a key. On the embedded
/// backend there is no such thing, and the type is empty.
#[cfg(not(feature = "redis"))]
pub(crate) enum Lease {}

/// Why a flight was started.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start {
    /// A request missed: it waits for the answer.
    Miss,
    /// A stale entry is being served: refresh it, nobody waits.
    Refresh,
    /// An early refresh of an entry with this much freshness left: refresh
    /// it unless another instance already did or is doing so (only the
    /// shared tier can tell).
    Early(#[cfg_attr(not(feature = "redis"), allow(dead_code))] Duration),
}

/// What a flight tells the fleet when it asks for its plan.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Ask {
    pub start: Start,
    /// The lease to take, if the flight takes one.
    pub lease: Duration,
    /// How long to wait for another instance's rebuild.
    pub patience: Duration,
    /// The labels of the counters the plan moves.
    pub labels: Labels,
}

/// What the flight does next, after asking the shared tier. Without the
/// shared tier it is always `Rebuild`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Plan {
    /// A fresh entry from Redis. `waited`: another instance's rebuild was
    /// waited for to get it.
    Hit { entry: Arc<Entry>, waited: bool },
    /// Rebuild now, with this lease (`None`: no shared tier, or it is down).
    Rebuild {
        lease: Option<Lease>,
        stale: Option<Arc<Entry>>,
    },
    /// Serve this stale entry at once (stale-while-revalidate) and refresh
    /// it in the background, with the lease if one was taken.
    StaleNow {
        entry: Arc<Entry>,
        lease: Option<Lease>,
    },
    /// Waited the whole budget for another instance's rebuild.
    TimedOut { stale: Option<Arc<Entry>> },
    /// The instance that held the lease failed to rebuild, while this one
    /// waited for it, or the key's failure backoff runs: share its failure
    /// rather than call the origin again.
    Failed {
        kind: FailureKind,
        stale: Option<Arc<Entry>>,
        /// The origin's own answer to that failure, as the fleet kept it.
        answer: Option<Arc<Entry>>,
    },
}

/// The shared tier behind one engine, if any.
pub(crate) struct Fleet {
    /// Set once, right after the tier connects: its invalidation messages
    /// call back into the engine, so the engine exists first.
    #[cfg(feature = "redis")]
    tier: OnceLock<Arc<RedisTier>>,
    /// Whether the tag table was reloaded since a message may have been
    /// missed.
    #[cfg(feature = "redis")]
    reloads: Arc<Reloads>,
    /// What the in-process tier held when the subscription came back after
    /// a gap, and until when it may still be served (see [`outlived`]).
    #[cfg(feature = "redis")]
    outlived: Arc<Outlived>,
    /// Set when the backend is to join a fleet through Redis (whether or
    /// not it has connected yet).
    #[cfg(feature = "redis")]
    wants_redis: AtomicBool,
    /// The task connecting in the background when Redis could not be
    /// reached at start-up: it ends once connected, or with the fleet.
    #[cfg(feature = "redis")]
    joining: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// Where a shutdown stands: [`OPEN`], [`DRAINING`] or [`SHUT`].
    #[cfg(feature = "redis")]
    shutdown: std::sync::atomic::AtomicU8,
    /// The outage rule while the backend is outside the fleet (not joined
    /// yet, or shut down): a subscription lease of zero, since no
    /// invalidation waits for an instance that is no member, and the
    /// backend's outage grace. Set when the backend is to join a fleet.
    #[cfg(feature = "redis")]
    outside: OnceLock<Liveness>,
    /// Invalidations of a key's group made before the tier connected: kept
    /// as an outage keeps them, and handed to the tier when it connects.
    #[cfg(feature = "redis")]
    pending: Pending,
    /// Tag and whole-namespace invalidations made before the tier
    /// connected: made in Redis once it connects.
    #[cfg(feature = "redis")]
    pending_fields: std::sync::Mutex<std::collections::HashMap<Field, Purged>>,
    /// What is known of the tier from construction on, before it connects
    /// (set when the backend is to join a fleet).
    #[cfg(feature = "redis")]
    start: OnceLock<crate::store::redis::Start>,
}

/// Whether the in-process tier may answer now (see [`Fleet::l1_trust`]).
/// Without Redis it always may.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum L1Trust {
    /// It may.
    Trusted,
    /// Drop everything in it first; then what is built from now on may.
    Drop,
    /// It may not: requests are coalesced in the process, and nothing it
    /// holds is answered.
    Untrusted,
}

/// No shutdown asked.
#[cfg(feature = "redis")]
const OPEN: u8 = 0;
/// A shutdown runs: no new lease is taken, the rebuilds holding one finish.
#[cfg(feature = "redis")]
const DRAINING: u8 = 1;
/// Shut down: the tier is no longer called.
#[cfg(feature = "redis")]
const SHUT: u8 = 2;

/// What a shutdown found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shutdown {
    /// Rebuilds still holding their lease when the deadline came.
    pub unfinished: u64,
    /// Rebuild leases handed back (their waiters told to retry).
    pub handed_back: u64,
    /// Lock holds handed back.
    pub locks_handed_back: u64,
    /// Leases or locks that could not be handed back: they lapse.
    pub not_handed_back: u64,
}

#[cfg(feature = "redis")]
impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_joining();
    }
}

/// Ends a shutdown, however its future ends.
#[cfg(feature = "redis")]
struct ShutOnDrop<'a>(&'a Fleet);

#[cfg(feature = "redis")]
impl Drop for ShutOnDrop<'_> {
    fn drop(&mut self) {
        // Outside the fleet from now on: what the in-process tier holds is
        // trusted for the outage grace from here, no longer (see
        // `Fleet::l1_trust`).
        if let Some(outside) = self.0.outside.get() {
            outside.confirm(Instant::now());
        }
        self.0.shutdown.store(SHUT, Ordering::Release);
        if let Some(tier) = self.0.tier.get() {
            tier.close_soon();
        }
    }
}

/// Where a backend stands with the shared tier, for its readiness answer.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Standing {
    /// No shared tier configured.
    Embedded,
    /// Configured, not connected yet: connecting in the background.
    Connecting,
    /// Connected: whether every circuit is closed, whether the subscription
    /// is confirmed live, how many circuits are open.
    Connected {
        reachable: bool,
        subscription_live: bool,
        open_circuits: u64,
    },
}

impl Fleet {
    pub(crate) fn new() -> Self {
        Fleet {
            #[cfg(feature = "redis")]
            tier: OnceLock::new(),
            #[cfg(feature = "redis")]
            reloads: Arc::new(Reloads::default()),
            #[cfg(feature = "redis")]
            outlived: Arc::default(),
            #[cfg(feature = "redis")]
            wants_redis: AtomicBool::new(false),
            #[cfg(feature = "redis")]
            joining: std::sync::Mutex::new(None),
            #[cfg(feature = "redis")]
            shutdown: std::sync::atomic::AtomicU8::new(OPEN),
            #[cfg(feature = "redis")]
            outside: OnceLock::new(),
            #[cfg(feature = "redis")]
            pending: Pending::default(),
            #[cfg(feature = "redis")]
            pending_fields: std::sync::Mutex::new(std::collections::HashMap::new()),
            #[cfg(feature = "redis")]
            start: OnceLock::new(),
        }
    }

    /// Whether the backend is to work through Redis but has no tier to
    /// call: not connected yet (it started without it, and connects in the
    /// background), or shut down.
    #[cfg(feature = "redis")]
    pub(crate) fn is_connecting(&self) -> bool {
        self.live().is_none() && self.wants_redis.load(Ordering::Acquire)
    }

    /// Where the backend stands with the shared tier now.
    pub(crate) fn standing(&self) -> Standing {
        #[cfg(feature = "redis")]
        {
            if self.is_shut() {
                return Standing::Embedded;
            }
            if let Some(tier) = self.tier.get() {
                let reading = tier.reading();
                return Standing::Connected {
                    reachable: reading.reachable,
                    subscription_live: reading.subscription_live,
                    open_circuits: reading.open_circuits,
                };
            }
            if self.wants_redis.load(Ordering::Acquire) {
                return Standing::Connecting;
            }
        }
        Standing::Embedded
    }

    /// What is known of the tier before it connected (see
    /// [`Start`](crate::store::redis::Start)): `None` on the embedded backend.
    #[cfg(feature = "redis")]
    pub(crate) fn start(&self) -> Option<&crate::store::redis::Start> {
        self.start.get()
    }

    /// The Redis tier, for the parts of the crate that call it directly
    /// (locks, counters).
    #[cfg(feature = "redis")]
    pub(crate) fn tier(&self) -> Option<&Arc<RedisTier>> {
        self.live()
    }

    /// The tier, unless the backend was shut down.
    #[cfg(feature = "redis")]
    fn live(&self) -> Option<&Arc<RedisTier>> {
        self.tier.get().filter(|_| !self.is_shut())
    }

    /// The tier, if new flights may still take leases: not once a shutdown
    /// began.
    #[cfg(feature = "redis")]
    fn admitting(&self) -> Option<&Arc<RedisTier>> {
        self.tier
            .get()
            .filter(|_| self.shutdown.load(Ordering::Acquire) == OPEN)
    }

    #[cfg(feature = "redis")]
    pub(crate) fn is_shut(&self) -> bool {
        self.shutdown.load(Ordering::Acquire) == SHUT
    }

    /// Leaves the fleet (see [`Backend::shutdown`](crate::Backend::shutdown)):
    /// new flights take no lease from now on; the rebuilds holding one get
    /// until `deadline` to commit; then every lease and lock still held is
    /// handed back, the membership left, the background tasks stopped and
    /// the connections closed. From then on the backend works embedded.
    /// Only the first call does anything.
    pub(crate) async fn shutdown(&self, deadline: Instant) -> Shutdown {
        #[cfg(feature = "redis")]
        {
            if self
                .shutdown
                .compare_exchange(OPEN, DRAINING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Shutdown::default();
            }
            // `wants_redis` stays set: a lock asked for from now on is
            // refused, never taken in this process alone.
            self.stop_joining();
            // Whether this future completes or is dropped half way, the
            // backend ends shut: it leaves the membership and its
            // connections close (leases not handed back yet then lapse by
            // themselves).
            let _shut = ShutOnDrop(self);
            let mut report = Shutdown::default();
            if let Some(tier) = self.tier.get() {
                let (unfinished, handed) = tier.shutdown(deadline).await;
                report = Shutdown {
                    unfinished: unfinished as u64,
                    handed_back: handed.rebuilds,
                    locks_handed_back: handed.locks,
                    not_handed_back: handed.lost,
                };
            }
            tracing::info!(
                unfinished_rebuilds = report.unfinished,
                leases_handed_back = report.handed_back,
                locks_handed_back = report.locks_handed_back,
                not_handed_back = report.not_handed_back,
                "shut down: left the fleet"
            );
            report
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = deadline;
            Shutdown::default()
        }
    }

    /// What dropping the last handle of a backend does: the background
    /// tasks stop (the supervisor leaving the membership on its way out),
    /// while rebuilds still running may commit.
    pub(crate) fn stop_background(&self) {
        #[cfg(feature = "redis")]
        {
            self.stop_joining();
            if let Some(tier) = self.tier.get() {
                tier.stop_background();
            }
        }
    }

    #[cfg(feature = "redis")]
    fn stop_joining(&self) {
        let joining = self
            .joining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = joining {
            task.abort();
        }
        // Never to connect now: its circuit is no longer reported open.
        if let Some(start) = self.start.get() {
            start.ended();
        }
    }

    /// Whether entries are kept in this process alone.
    pub(crate) fn is_embedded(&self) -> bool {
        #[cfg(feature = "redis")]
        if self.live().is_some() {
            return false;
        }
        true
    }

    /// Whether the in-process tier may answer at `now`. With a shared tier
    /// it is trusted only while the subscription to the fleet's
    /// invalidations is confirmed live (the subscription lease), and for
    /// the outage grace past it: once that ran out, everything held in the
    /// process is dropped before anything is served, and again every
    /// `max(lease, grace)` for as long as it is not confirmed.
    ///
    /// A backend outside the fleet (configured for Redis, not joined yet or
    /// shut down) follows the same rule with a lease of zero: no
    /// invalidation made elsewhere waits for it, so nothing is trusted past
    /// the grace. With a grace, the tier is dropped once per grace; with
    /// none (the strict barrier), it answers nothing, and requests are only
    /// coalesced in the process. Embedded, it is always trusted.
    pub(crate) fn l1_trust(&self, now: Instant) -> L1Trust {
        #[cfg(feature = "redis")]
        {
            let drop_if = |must: bool| {
                if must {
                    L1Trust::Drop
                } else {
                    L1Trust::Trusted
                }
            };
            if let Some(tier) = self.live() {
                return drop_if(tier.must_drop_l1(now));
            }
            if let Some(outside) = self.outside.get() {
                if !outside.has_grace() {
                    return L1Trust::Untrusted;
                }
                return drop_if(outside.must_drop(now));
            }
        }
        let _ = now;
        L1Trust::Trusted
    }

    /// Whether `entry`, found in the in-process tier, may be served at
    /// `now`: no invalidation this process knows of rejects it (see
    /// [`super::tags`]), and, if it lived through a gap in the
    /// subscription, the rule of [`outlived`] still keeps it.
    pub(crate) fn serves(&self, tags: &super::tags::TagTable, entry: &Entry, now: Instant) -> bool {
        match self.outlived_kept(entry.stored_at(), now) {
            // Whatever the epoch it was built under (see `outlived`).
            Some(kept) => {
                kept && (tags.admits(entry.stamp()) || tags.admits_outlived(entry.stamp()))
            }
            None => tags.admits(entry.stamp()),
        }
    }

    /// `None` for an entry stored at `stored_at` that did not live through
    /// a gap in the subscription; for one that did, whether the rule of
    /// [`outlived`] still keeps it at `now`.
    fn outlived_kept(&self, stored_at: Instant, now: Instant) -> Option<bool> {
        #[cfg(feature = "redis")]
        if self.outlived.covers(stored_at) {
            let live = self.live().is_some_and(|tier| tier.hears_everything(now));
            return Some(self.outlived.serves(now, live));
        }
        let _ = (stored_at, now);
        None
    }

    /// Drops what the in-process tier held from a gap once the outage rule
    /// would have dropped it (see [`outlived`]).
    pub(crate) fn sweep(&self, l1: &LocalTier, now: Instant) {
        #[cfg(feature = "redis")]
        if let Some(cutoff) = self.outlived.due(now) {
            drop_outlived(l1, &self.outlived, cutoff);
        }
        let _ = (l1, now);
    }

    /// Whether the in-process tier holds entries from a gap that may still
    /// be served: a new epoch does not drop them all at once.
    pub(crate) fn holds_outlived(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.outlived.any();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Step 3: the entry, the lease, or a wait. Values that cannot travel
    /// (`V::SHARED` false) never reach Redis.
    pub(crate) async fn plan<V: CacheValue>(
        &self,
        engine: &Engine,
        key: Key,
        stale: Option<Arc<Entry>>,
        ask: Ask,
    ) -> Plan {
        #[cfg(feature = "redis")]
        if let Some(tier) = self.admitting().filter(|_| V::SHARED) {
            return plan_shared::<V>(engine, tier, &self.reloads, key, stale, ask).await;
        }
        let _ = (engine, key, ask, V::SHARED);
        Plan::Rebuild { lease: None, stale }
    }

    /// Stores a rebuilt entry in Redis under the lease's fence, and wakes
    /// the fleet; without a lease, nothing.
    pub(crate) async fn commit<V: CacheValue>(
        &self,
        l1: &LocalTier,
        key: Key,
        lease: Option<Lease>,
        held: &Held<V>,
        labels: Labels,
    ) {
        let Some(lease) = lease else { return };
        #[cfg(feature = "redis")]
        {
            let mut lease = lease;
            let Some(tier) = self.tier() else { return };
            let entry = held.entry();
            let fresh = entry.fresh_for(Instant::now());
            match held.value().encode() {
                Some(payload) if !fresh.is_zero() => {
                    let bytes = codec::encode(entry.envelope(), entry.stamp(), &payload);
                    // Kept for its freshness plus the longest window past
                    // it: a stale one, or the one in which it is only the
                    // base of a conditional request.
                    let keep = fresh.saturating_add(kept_past_freshness(entry.envelope()));
                    let committed = tier.commit(&mut lease, bytes, fresh, keep, labels).await;
                    if let Ok(false) = committed {
                        // Fenced off: a newer entry, or an invalidation, came
                        // after this rebuild began. Its copy here is no
                        // better than Redis's: drop it (only if it is still
                        // this one), and the next request reads Redis.
                        l1.remove_if_same(&key, entry);
                    }
                }
                _ => {
                    let _ = tier.release(&mut lease, None, None).await;
                }
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = (l1, key, held, labels);
            match lease {}
        }
    }

    /// Gives the lease up without storing. The instances waiting for it
    /// retry at once, or, when the rebuild `failed`, share that failure.
    pub(crate) async fn give_up(&self, lease: Option<Lease>, failed: Option<FailureKind>) {
        let Some(lease) = lease else { return };
        #[cfg(feature = "redis")]
        {
            let mut lease = lease;
            if let Some(tier) = self.tier() {
                let _ = tier.release(&mut lease, failed.map(code), None).await;
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = failed;
            match lease {}
        }
    }

    /// Gives the lease up after the origin answered with a failure (a 5xx)
    /// that is not stored: the fleet backs off as for any failed rebuild,
    /// and keeps that answer beside its failure marker (within a size
    /// bound), so that a request answered during the backoff, on any
    /// instance, gets the origin's own status, headers and body, never one
    /// the origin did not send.
    pub(crate) async fn give_up_answered<V: CacheValue>(
        &self,
        lease: Option<Lease>,
        answer: Option<&Held<V>>,
    ) {
        let Some(lease) = lease else { return };
        #[cfg(feature = "redis")]
        {
            let mut lease = lease;
            if let Some(tier) = self.tier() {
                let bytes = answer.filter(|_| V::SHARED).and_then(|held| {
                    let payload = held.value().encode()?;
                    let entry = held.entry();
                    Some(codec::encode(entry.envelope(), entry.stamp(), &payload))
                });
                let _ = tier
                    .release(&mut lease, Some(code(FailureKind::Error)), bytes)
                    .await;
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = answer;
            match lease {}
        }
    }

    /// The fleet's half of invalidating a key's group: Redis and every
    /// other instance. Nothing to do without a shared tier. Outside the
    /// fleet it cannot reach the others: an error, as during an outage;
    /// before the join the invalidation is kept, and made in Redis once the
    /// tier connects (see [`Pending`]).
    /// `what` is what the caller purged, for the logs (see
    /// [`crate::key::shown`]). An error says whether the invalidation is
    /// kept, to be made once Redis answers ([`crate::Error::is_queued`]).
    pub(crate) async fn invalidate(&self, key: &Key, what: &str) -> Result<(), crate::Error> {
        #[cfg(feature = "redis")]
        {
            let what = crate::key::shown(what);
            if let Some(tier) = self.live() {
                return tier.invalidate(key, &what).await.map_err(|e| {
                    let e = crate::Error::from(e);
                    if tier.is_pending(key) {
                        e.queued()
                    } else {
                        e
                    }
                });
            }
            if let Some(refused) = self.outside_error() {
                if self.shutdown.load(Ordering::Acquire) != OPEN {
                    return Err(refused);
                }
                if !self.pending.remember(key, &what) {
                    tracing::error!(purged = %what, key = %key,
                        "invalidation made before redis connected, and too many wait for it: not kept");
                    return Err(crate::Error::new(
                        crate::ErrorKind::Unavailable,
                        "redis is not connected yet, and too many invalidations wait for it: \
                         this one is not kept",
                    ));
                }
                tracing::warn!(purged = %what, key = %key,
                    "invalidation made before redis connected: kept, and made once it connects");
                self.hand_pending();
                return Err(refused.queued());
            }
        }
        let _ = (key, what);
        Ok(())
    }

    /// The error an invalidation outside the fleet returns; `None` inside
    /// it, or embedded.
    #[cfg(feature = "redis")]
    fn outside_error(&self) -> Option<crate::Error> {
        if !self.wants_redis.load(Ordering::Acquire) {
            return None;
        }
        let why = if self.shutdown.load(Ordering::Acquire) != OPEN {
            "the backend was shut down: an invalidation no longer reaches the fleet"
        } else {
            "redis is not connected yet: the invalidation is kept and made once it is"
        };
        Some(crate::Error::new(crate::ErrorKind::Unavailable, why))
    }

    /// Hands the invalidations kept before the join to the tier, if it
    /// connected (called again after each is kept, so none made while the
    /// tier attaches is left behind).
    #[cfg(feature = "redis")]
    fn hand_pending(&self) {
        let Some(tier) = self.tier.get() else { return };
        if self.shutdown.load(Ordering::Acquire) != OPEN {
            return;
        }
        tier.keep_pending(self.pending.take_all());
        let fields: Vec<(Field, Purged)> = self
            .pending_fields
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        if fields.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tier = tier.clone();
        runtime.spawn(async move {
            for (field, what) in fields {
                match tier.bump_generation(field, |_| {}).await {
                    Ok(()) => {
                        tracing::info!(purged = %what, "a pending invalidation reached redis");
                    }
                    Err(error) => tracing::warn!(
                        purged = %what,
                        error = %error,
                        "a tag invalidation kept before the join did not reach redis"
                    ),
                }
            }
        });
    }

    /// Moves `field`'s generation in Redis, calling `moved` with the new
    /// one once Redis has it. `None` without a shared tier: the generation
    /// is the process's own.
    /// `what` is what the caller purged (a tag, everything), for the logs.
    pub(crate) async fn move_generation(
        &self,
        field: Field,
        what: &str,
        moved: impl Fn(u64),
    ) -> Option<Result<(), crate::Error>> {
        #[cfg(feature = "redis")]
        {
            if let Some(tier) = self.live() {
                let moved = tier.bump_generation(field, moved).await;
                return Some(moved.map_err(|error| {
                    tracing::warn!(purged = %crate::key::shown(what), error = %error,
                        "invalidation did not reach redis, and is not kept: call it again");
                    crate::Error::from(error)
                }));
            }
            if let Some(refused) = self.outside_error() {
                if self.shutdown.load(Ordering::Acquire) != OPEN {
                    return Some(Err(refused));
                }
                let what = crate::key::shown(what);
                tracing::warn!(purged = %what,
                    "invalidation made before redis connected: kept, and made once it connects");
                self.pending_fields
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(field, what);
                self.hand_pending();
                return Some(Err(refused.queued()));
            }
        }
        let _ = (field, what, moved);
        None
    }

    /// Whether the in-process tag table may be trusted as it stands: it was
    /// reloaded since a message may have been missed, and the subscription
    /// hears everything. Always without a shared tier.
    pub(crate) fn trusts_table(&self, now: Instant) -> bool {
        #[cfg(feature = "redis")]
        if let Some(tier) = self.live() {
            return trusts_table(tier, &self.reloads, now);
        }
        let _ = now;
        true
    }

    /// Reads the table's epoch and the generations of `fields` (all of them
    /// for `None`) from Redis, if there is a shared tier and it answers.
    pub(crate) async fn load_generations(
        &self,
        fields: Option<&[Field]>,
        known_epoch: u64,
    ) -> Option<(u64, Vec<(Field, u64)>)> {
        #[cfg(feature = "redis")]
        if let Some(tier) = self.live() {
            return tier.load_generations(fields, known_epoch).await.ok();
        }
        let _ = (fields, known_epoch);
        None
    }

    /// Messages may have been missed from now on: the tag table is not
    /// trusted until it is read again from Redis (in the background).
    pub(crate) fn table_lost(&self, engine: &Engine) {
        #[cfg(feature = "redis")]
        {
            self.reloads.lost();
            if let Some(tier) = self.live() {
                reload_tags(engine, tier, &self.reloads);
            }
        }
        let _ = engine;
    }
}

/// Connects the Redis tier behind a new engine: the tier's invalidation
/// messages reach the engine, and the tag table is loaded once.
///
/// If Redis cannot be reached for a reason a retry may mend (refused, no
/// answer in time, loading), the engine starts without it unless
/// `require` is set: it serves with in-process protection, and a task
/// connects in the background, with backoff, and attaches the tier once
/// Redis answers. Reasons no retry mends (credentials, permissions, TLS,
/// settings) fail at once either way.
#[cfg(feature = "redis")]
pub(crate) async fn connect(
    l1: LocalTier,
    config: TierConfig,
    require: bool,
) -> Result<Arc<Engine>, redis::RedisError> {
    let engine = Arc::new(Engine::new(l1));
    let _ = engine
        .fleet
        .outside
        .set(Liveness::with_grace(Duration::ZERO, config.outage_grace));
    let start = engine
        .fleet
        .start
        .get_or_init(|| crate::store::redis::Start::new(config.topology.address()));
    engine.fleet.wants_redis.store(true, Ordering::Release);
    let on_invalidate = on_invalidate(&engine);
    match RedisTier::connect(config.clone(), on_invalidate.clone()).await {
        Ok(tier) => {
            attach(&engine, tier).await;
            Ok(engine)
        }
        Err(error) if require || !crate::store::redis::may_mend(&error) => Err(error),
        Err(error) => {
            start.failed();
            tracing::warn!(
                redis = start.address(),
                error = %error,
                "redis cannot be reached at start-up; serving with in-process protection \
                 and connecting in the background"
            );
            let task = tokio::spawn(join_later(Arc::downgrade(&engine), config, on_invalidate));
            *engine
                .fleet
                .joining
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
            Ok(engine)
        }
    }
}

/// The longest pause between two attempts to connect in the background.
#[cfg(feature = "redis")]
const JOIN_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Connects in the background until Redis answers, then attaches the tier.
/// Ends with the engine (the fleet aborts it when dropped).
#[cfg(feature = "redis")]
async fn join_later(
    engine: std::sync::Weak<Engine>,
    config: TierConfig,
    on_invalidate: crate::store::redis::notify::OnInvalidate,
) {
    let mut pause = config.probe_interval.max(Duration::from_millis(10));
    let mut refused = false;
    loop {
        tokio::time::sleep(pause).await;
        pause = pause.saturating_mul(2).min(JOIN_PAUSE_MAX);
        if engine.strong_count() == 0 {
            return;
        }
        match RedisTier::connect(config.clone(), on_invalidate.clone()).await {
            Ok(tier) => {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                // Built while this instance was no member of the fleet, the
                // in-process tier may hold what another instance invalidated
                // meanwhile: it goes, now that the subscription hears
                // everything, and so do the flights running.
                engine.invalidate_everything_here();
                attach(&engine, tier).await;
                tracing::info!(
                    redis = engine.fleet.start.get().map_or("", |s| s.address()),
                    "connected to redis; this instance joined the fleet"
                );
                return;
            }
            Err(error) if !crate::store::redis::may_mend(&error) => {
                failed(&engine);
                // Redis answers, and refuses: an operator must act. Said
                // once, and tried again at the longest pause.
                if !std::mem::replace(&mut refused, true) {
                    tracing::error!(
                        redis = config.topology.address(),
                        error = %error,
                        "redis refuses this instance; it keeps serving with in-process \
                         protection alone"
                    );
                }
                pause = JOIN_PAUSE_MAX;
            }
            Err(error) => {
                failed(&engine);
                tracing::debug!(error = %error, "redis cannot be reached yet");
            }
        }
    }
}

/// Counts an attempt to connect in the background that failed.
#[cfg(feature = "redis")]
fn failed(engine: &std::sync::Weak<Engine>) {
    if let Some(start) = engine.upgrade().as_ref().and_then(|e| e.fleet.start.get()) {
        start.failed();
    }
}

/// Another instance's invalidation is this engine's too: the L1 copy goes,
/// and a flight running for the key may no longer store.
#[cfg(feature = "redis")]
fn on_invalidate(engine: &Arc<Engine>) -> crate::store::redis::notify::OnInvalidate {
    let engine = Arc::downgrade(engine);
    Arc::new(move |what| {
        if let Some(engine) = engine.upgrade() {
            match what {
                Invalidated::Key(key) => engine.invalidate_here(&key),
                Invalidated::Everything => engine.invalidate_everything_here(),
                Invalidated::Rejoined(until) => rejoined(&engine, until),
                Invalidated::Generation(field, generation) => {
                    generation_heard(&engine, field, generation)
                }
            }
        }
    })
}

/// The subscription is back after a gap, with an outage grace: what the
/// in-process tier holds is kept until `until` at most (see [`outlived`]),
/// the flights running (which read or rebuilt during the gap) store
/// nothing, and the table is read again, which tells whether Redis kept
/// its data.
#[cfg(feature = "redis")]
fn rejoined(engine: &Engine, until: Instant) {
    let now = Instant::now();
    if until <= now {
        engine.invalidate_everything_here();
        return;
    }
    engine.flights.detach_all();
    engine
        .fleet
        .outlived
        .rejoined(now, until, engine.tags.table_epoch());
    engine.fleet.table_lost(engine);
}

/// Drops the entries held from a gap, up to `cutoff`.
#[cfg(feature = "redis")]
fn drop_outlived(l1: &LocalTier, outlived: &Arc<Outlived>, cutoff: u64) {
    let held = outlived.clone();
    l1.remove_values_if(move |entry| held.before(entry.stored_at(), cutoff));
    outlived.dropped(cutoff);
}

/// Puts the connected tier behind the engine and loads the tag table once.
#[cfg(feature = "redis")]
async fn attach(engine: &Engine, tier: Arc<RedisTier>) {
    let fleet = &engine.fleet;
    // Its own breakers report the circuit from now on (ended first, so a
    // reader that sees the tier never sees the start's circuit too).
    if let Some(start) = fleet.start.get() {
        start.ended();
    }
    let _ = fleet.tier.set(tier.clone());
    // Invalidations made before the join reach Redis now.
    fleet.hand_pending();
    let mark = fleet.reloads.mark();
    if let Ok((table, loaded)) = tier
        .load_table_joining(engine.tags.table_epoch(), &engine.tags.scopes())
        .await
    {
        engine.apply(table, loaded);
        fleet.reloads.loaded(mark);
    }
}

/// How far ahead of this process's clock, in microseconds, a generation
/// heard on the channel may be (clock skew between hosts, and the few
/// generations a burst of invalidations moves past Redis's clock).
#[cfg(feature = "redis")]
const HEARD_AHEAD_MICROS: u64 = 1_000_000;

/// Another instance's move of a generation, as heard on the channel. A
/// number ahead of this process's clock by more than [`HEARD_AHEAD_MICROS`]
/// is not taken: anyone who may publish on the channel could otherwise
/// raise a generation above the ones Redis's clock hands out, and the real
/// invalidations that follow would not pass it until that clock did. Then
/// nothing held here is trusted and the table is read again from Redis,
/// which has the real number (a table Redis really holds ahead of the clocks
/// costs a reload per message, never a stale answer).
#[cfg(feature = "redis")]
fn generation_heard(engine: &Engine, field: Field, generation: u64) {
    let ceiling = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .saturating_add(HEARD_AHEAD_MICROS);
    if generation > ceiling {
        tracing::warn!(
            field = ?field,
            "a generation from the future on the event channel; reloading the table from redis"
        );
        engine.invalidate_everything_here();
        return;
    }
    engine.generation_moved(field, generation);
}

/// The kind's code in the shared tier's failure notice.
#[cfg(feature = "redis")]
fn code(kind: FailureKind) -> u8 {
    match kind {
        FailureKind::Error => 1,
        FailureKind::Panic => 2,
        FailureKind::Timeout => 3,
        FailureKind::WaitTimeout => 4,
    }
}

/// The kind a notice's code names; `None` for a code this version does not
/// know (the notice then only wakes, as a plain one does).
#[cfg(feature = "redis")]
fn kind(code: u8) -> Option<FailureKind> {
    Some(match code {
        1 => FailureKind::Error,
        2 => FailureKind::Panic,
        3 => FailureKind::Timeout,
        4 => FailureKind::WaitTimeout,
        _ => return None,
    })
}

/// Times the process may have missed a message (each gap, each lapse of the
/// subscription lease), the count a full reload of the tag table last
/// covered, and whether one runs.
#[cfg(feature = "redis")]
struct Reloads {
    lost: AtomicU64,
    loaded: AtomicU64,
    running: AtomicBool,
}

#[cfg(feature = "redis")]
impl Default for Reloads {
    fn default() -> Self {
        Reloads {
            // Not loaded until the first load.
            lost: AtomicU64::new(1),
            loaded: AtomicU64::new(0),
            running: AtomicBool::new(false),
        }
    }
}

#[cfg(feature = "redis")]
impl Reloads {
    /// The process may have missed messages from now on.
    fn lost(&self) -> u64 {
        self.lost.fetch_add(1, Ordering::SeqCst).saturating_add(1)
    }

    /// A full reload that began at `mark` has been applied.
    fn loaded(&self, mark: u64) {
        self.loaded.fetch_max(mark, Ordering::SeqCst);
    }

    /// Whether the whole table was reloaded since the last possible miss.
    fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::SeqCst) >= self.lost.load(Ordering::SeqCst)
    }

    /// Where a reload that begins now stands: pass it to
    /// [`loaded`](Self::loaded).
    fn mark(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }

    /// Takes the right to run the one full reload; `false` if one runs.
    fn begin(&self) -> bool {
        !self.running.swap(true, Ordering::AcqRel)
    }

    fn end(&self) {
        self.running.store(false, Ordering::Release);
    }
}

#[cfg(feature = "redis")]
fn trusts_table(tier: &RedisTier, reloads: &Reloads, now: Instant) -> bool {
    reloads.is_loaded() && tier.hears_everything(now)
}

/// The most reads of the whole table one reload tries (each retried
/// itself until Redis answers or the connect timeout passes).
#[cfg(feature = "redis")]
const RELOAD_TRIES: u32 = 10;

/// Reloads the whole table from Redis in the background (one at a time),
/// unless the subscription is in a gap: then the end of the gap does. Tried
/// again every probe interval until a read that began after the last
/// possible miss is applied, [`RELOAD_TRIES`] times at most (or until a gap
/// opens, or the tier is gone): until then the table is not trusted, and
/// after a gap with an outage grace the subscription does not count as
/// live (the next read of an entry from Redis starts the reload again).
///
/// A read that began after the last gap's end also decides on what the
/// in-process tier held through it (see [`outlived`]), and then tells the
/// tier it caught up.
#[cfg(feature = "redis")]
fn reload_tags(engine: &Engine, tier: &Arc<RedisTier>, reloads: &Arc<Reloads>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !reloads.begin() {
        return;
    }
    let (tags, flights, l1) = (
        engine.tags.clone(),
        engine.flights.clone(),
        engine.l1.clone(),
    );
    let outlived = engine.fleet.outlived.clone();
    let (tier, reloads) = (Arc::downgrade(tier), reloads.clone());
    runtime.spawn(async move {
        let mut tries = 0;
        loop {
            while let Some(shared) = tier.upgrade().filter(|t| !t.in_gap()) {
                tries += 1;
                let mark = reloads.mark();
                let rejoins = shared.rejoins();
                match shared
                    .load_table_joining(tags.table_epoch(), &tags.scopes())
                    .await
                {
                    Ok((table, loaded)) => {
                        apply_to(&tags, &flights, &l1, table, loaded, outlived.any());
                        reloads.loaded(mark);
                        if shared.rejoins() == rejoins {
                            // Redis kept its data: what an invalidation made
                            // during the gap purged is gone from it, and goes
                            // from here too.
                            if let Some(cutoff) = outlived.table_read(tags.table_epoch()) {
                                drop_outlived(&l1, &outlived, cutoff);
                            }
                            shared.caught_up(rejoins);
                        }
                    }
                    Err(error) => {
                        tracing::debug!(error = %error, "could not reload the tag generations");
                    }
                }
                if reloads.is_loaded() || tries >= RELOAD_TRIES {
                    break;
                }
                let pause = shared.probe_interval();
                drop(shared);
                tokio::time::sleep(pause).await;
            }
            reloads.end();
            // A miss recorded after the last check, whose own reload found
            // this one running, is this one's to cover.
            let pending = !reloads.is_loaded()
                && tries < RELOAD_TRIES
                && tier.upgrade().is_some_and(|t| !t.in_gap());
            if !pending || !reloads.begin() {
                break;
            }
        }
    });
}

/// Whether an entry read from Redis may be served: none of the generations
/// it recorded has moved, under the table's current epoch. While the table
/// may have missed a move (a gap, an unconfirmed subscription, not reloaded
/// since), or the entry names another epoch than the one known here (the
/// table was lost and started again since one of the two was read), the
/// entry's generations and the epoch are read from Redis first; failing
/// that it is not served.
#[cfg(feature = "redis")]
async fn admits_remote(
    engine: &Engine,
    tier: &Arc<RedisTier>,
    reloads: &Arc<Reloads>,
    entry: &Entry,
) -> bool {
    let trusted = trusts_table(tier, reloads, Instant::now());
    let stamp = entry.stamp();
    if !trusted || stamp.epoch != engine.tags.table_epoch() {
        // The fields whose generations it recorded.
        let fields: Vec<Field> = [Field::All, Field::Own(stamp.scope)]
            .into_iter()
            .chain(
                stamp
                    .tags
                    .iter()
                    .map(|&(b, _)| Field::Bucket(stamp.scope, b)),
            )
            .collect();
        match tier
            .load_generations(Some(&fields), engine.tags.table_epoch())
            .await
        {
            Ok((epoch, loaded)) => engine.apply(epoch, loaded),
            Err(_) => return false,
        }
        if !trusted {
            reload_tags(engine, tier, reloads);
        }
    }
    engine.tags.admits(entry.stamp())
}

/// Whether an entry read from Redis may be served without asking Redis for
/// its generations (a stale copy that is not worth the round trip).
#[cfg(feature = "redis")]
fn admits_remote_now(engine: &Engine, tier: &RedisTier, reloads: &Reloads, entry: &Entry) -> bool {
    trusts_table(tier, reloads, Instant::now()) && engine.tags.admits(entry.stamp())
}

/// The plan with Redis. `Start::Miss` may hand back a stale entry inside
/// stale-while-revalidate at once instead of waiting; `Start::Early` takes
/// the lease even for a fresh entry, as long as the one in Redis has no more
/// freshness left than the one judged due (if it has more, another instance
/// already refreshed it: that is a hit).
#[cfg(feature = "redis")]
async fn plan_shared<V: CacheValue>(
    engine: &Engine,
    shared: &Arc<RedisTier>,
    reloads: &Arc<Reloads>,
    key: Key,
    mut stale: Option<Arc<Entry>>,
    ask: Ask,
) -> Plan {
    let give_up = Instant::now() + ask.patience;
    let serve_stale = matches!(ask.start, Start::Miss);
    let mut early = match ask.start {
        Start::Early(left) => Some(left),
        _ => None,
    };
    // Set once an unreadable entry was counted, so the same bytes seen again
    // beside our lease are not counted twice.
    let mut corrupt = false;
    let mut waited = false;
    // Set when Redis's fresh entry was built before an invalidation of its
    // tags: take the lease over it, once.
    let mut invalidated = false;
    loop {
        if !shared.is_available_for(&key) {
            return Plan::Rebuild { lease: None, stale };
        }
        // Listen before asking, so a publish between the answer and the wait
        // still wakes us.
        let mut registration = shared.listen(key);
        // Redis's remaining freshness is counted from when the question was
        // sent: the reply may come late, and counting from its arrival would
        // call an entry fresh after Redis's own freshness has ended.
        let now = Instant::now();
        let early_ask = if invalidated {
            Some(Duration::MAX)
        } else {
            early
        };
        let fetched = match shared.fetch_or_lease(&key, ask.lease, early_ask).await {
            Ok(fetched) => fetched,
            Err(_) => return Plan::Rebuild { lease: None, stale },
        };
        let (lease, lease_pttl, old, holder) = match fetched {
            Fetched::Fresh(remote) => match decode::<V>(remote, now) {
                Some(entry) if !admits_remote(engine, shared, reloads, &entry).await => {
                    invalidated = true;
                    continue;
                }
                Some(entry) => {
                    count(m::L2_HITS, ask.labels);
                    return Plan::Hit {
                        entry: Arc::new(entry),
                        waited,
                    };
                }
                None => {
                    shared.count_corrupt(&key);
                    corrupt = true;
                    // Take the lease over the unreadable entry.
                    early = Some(Duration::MAX);
                    continue;
                }
            },
            Fetched::Leased { lease, stale } => (Some(*lease), Duration::ZERO, stale, None),
            Fetched::Held {
                lease_pttl,
                stale,
                holder,
            } => (None, lease_pttl, stale, holder),
            Fetched::Failing {
                code,
                backoff,
                stale: old,
                answer,
            } => {
                // As below: a copy from before a purge of its tags is none.
                let old = old
                    .and_then(|r| decode_or_count::<V>(shared, &key, r, now, corrupt))
                    .filter(|e| admits_remote_now(engine, shared, reloads, e));
                stale = newer(stale, old);
                tracing::debug!(key = %key, ?backoff, "the last rebuild failed: backing off");
                if serve_stale
                    && let Some(entry) = stale
                        .as_ref()
                        .filter(|e| e.servable_while_revalidating(now))
                {
                    return Plan::StaleNow {
                        entry: entry.clone(),
                        lease: None,
                    };
                }
                // A code this version does not know is a plain error.
                let kind = kind(code).unwrap_or(FailureKind::Error);
                let answer = answer.and_then(|bytes| failure_answer::<V>(bytes, now));
                return Plan::Failed {
                    kind,
                    stale,
                    answer,
                };
            }
        };
        // A copy from before an invalidation of its tags is none at all.
        let old = old
            .and_then(|r| decode_or_count::<V>(shared, &key, r, now, corrupt))
            .filter(|e| admits_remote_now(engine, shared, reloads, e));
        stale = newer(stale, old);
        if serve_stale
            && let Some(entry) = stale
                .as_ref()
                .filter(|e| e.servable_while_revalidating(now))
        {
            return Plan::StaleNow {
                entry: entry.clone(),
                lease,
            };
        }
        if let Some(lease) = lease {
            return Plan::Rebuild {
                lease: Some(lease),
                stale,
            };
        }
        // Another instance holds the lease. (An early refresh that finds one
        // already refreshing waits for its commit too, and so loads the new
        // entry before its own copy expires.)
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Plan::TimedOut { stale };
        }
        // Woken by the holder's commit or failure notice; failing that, by
        // the lease running out (its holder died), or the budget.
        let woke = registration
            .wait(left.min(lease_pttl + Duration::from_millis(2)))
            .await;
        // The holder's entry is built after the invalidation.
        invalidated = false;
        if let Some(Event::FailedWith(code)) = woke
            && let Some(kind) = kind(code)
        {
            // The origin's answer to the failure, if the holder kept one:
            // one more round trip, on a failure only.
            let answer = match shared.failure_answer(&key).await {
                Ok(Some(bytes)) => failure_answer::<V>(bytes, Instant::now()),
                _ => None,
            };
            return Plan::Failed {
                kind,
                stale,
                answer,
            };
        }
        waited = true;
        if woke == Some(Event::Committed)
            && let Some(entry) =
                carried::<V>(engine, shared, reloads, &registration, holder, now).await
        {
            shared.count_carried();
            count(m::L2_HITS, ask.labels);
            return Plan::Hit {
                entry: Arc::new(entry),
                waited,
            };
        }
    }
}

/// The entry the holder's commit carried, if it passes every check a
/// fetched entry passes: the commit is of the lease this waiter saw held
/// (its fence and token), nothing was invalidated on the channel since the
/// waiter asked Redis, the codec reads it, and its tags admit it. Its
/// freshness counts from `asked`, before the commit ran. Anything else is
/// a plain wake-up: the caller fetches.
#[cfg(feature = "redis")]
async fn carried<V: CacheValue>(
    engine: &Engine,
    shared: &Arc<RedisTier>,
    reloads: &Arc<Reloads>,
    registration: &Registration,
    holder: Option<Holder>,
    asked: Instant,
) -> Option<Entry> {
    let carried = registration.carried()?;
    if !holder?.proves(carried) {
        tracing::debug!("a commit's wake-up that is not of the lease waited for");
        return None;
    }
    let remote = Remote {
        bytes: carried.entry()?,
        fresh: Some(carried.fresh).filter(|d| !d.is_zero()),
        remaining: Some(carried.keep).filter(|d| !d.is_zero()),
    };
    let entry = decode::<V>(remote, asked)?;
    // Checked again after the tags' possible read: an invalidation heard
    // meanwhile wins.
    (entry.freshness(Instant::now()) == Freshness::Fresh
        && admits_remote(engine, shared, reloads, &entry).await
        && registration.carried().is_some())
    .then_some(entry)
}

/// How long past its freshness a value is kept in the shared tier: the
/// longest of its windows (stale, or the base of a conditional request).
#[cfg(feature = "redis")]
fn kept_past_freshness(envelope: &Envelope) -> Duration {
    let (revalidate, if_error) = envelope.windows();
    revalidate.max(if_error).max(envelope.revalidation())
}

/// An entry read from the shared tier. Redis's clock decides: `remote.fresh`
/// is the freshness Redis says is left (`None`: stale), `remote.remaining`
/// the time until Redis drops the value. Instants are placed so that this
/// instance agrees with every other one, whatever their clocks say.
#[cfg(feature = "redis")]
fn decode<V: CacheValue>(remote: Remote, now: Instant) -> Option<Entry> {
    let (envelope, stamp, payload) = codec::decode(remote.bytes)?;
    let value = V::decode(payload)?;
    let windows = kept_past_freshness(&envelope);
    let fresh_until = match (remote.fresh, remote.remaining) {
        (Some(left), _) => later(now, left),
        // Stale: the value was kept for `windows` past the end of freshness.
        (None, Some(left)) => now
            .checked_sub(windows.saturating_sub(left))
            .unwrap_or(now)
            .min(now),
        (None, None) => now,
    };
    let fresh_span = envelope.lifetime.ttl.saturating_sub(envelope.initial_age);
    let stored_at = fresh_until.checked_sub(fresh_span).unwrap_or(now).min(now);
    Some(Entry::placed(value, envelope, stored_at, fresh_until).with_stamp(stamp))
}

/// The origin's answer to a failed rebuild, as the failure marker keeps
/// it: an entry never served as one (it is past every window), only
/// presented in place of the failure. Bytes that do not decode are none.
#[cfg(feature = "redis")]
fn failure_answer<V: CacheValue>(bytes: Bytes, now: Instant) -> Option<Arc<Entry>> {
    let remote = Remote {
        bytes,
        fresh: None,
        remaining: None,
    };
    decode::<V>(remote, now).map(Arc::new)
}

#[cfg(feature = "redis")]
fn decode_or_count<V: CacheValue>(
    shared: &RedisTier,
    key: &Key,
    remote: Remote,
    now: Instant,
    counted: bool,
) -> Option<Arc<Entry>> {
    let entry = decode::<V>(remote, now);
    if entry.is_none() && !counted {
        shared.count_corrupt(key);
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
