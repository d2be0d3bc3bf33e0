//! The shared tier: cached entries, rebuild leases and wake-ups in Redis.
//!
//! Every key of one entry shares a hash tag, `{prefix}:{<group>}:…`, so value,
//! freshness marker, lease, fence and the group's generation sit in one
//! cluster slot and every script touches one slot only. An entry that is its
//! own group (a generic cache value, a response whose route varies on
//! nothing) is `{prefix}:{<key>}:…`; a variant of a URL is
//! `{prefix}:{<url>}:<variant>:…`:
//!
//! | key | holds | expires |
//! |---|---|---|
//! | `{prefix}:{<group>}:g` | the group's generation: an invalidation moves it, and every entry stored under an older one is gone | as long as the longest lease taken and value stored under it, no longer (then reseeded from Redis's clock) |
//! | `…:v` | `<generation>\|` then the encoded entry | when its last stale window closes |
//! | `…:f` | freshness marker | when the entry stops being fresh (Redis's clock) |
//! | `…:l` | rebuild lease: the owner's token | after the lease time, unless renewed |
//! | `…:n` | fence hash: numbers issued and committed | with its lease (renewals included), then with the value that lease stored (then reseeded from Redis's clock) |
//! | `{prefix}:members` | the fleet's membership: each instance with the end of its subscription lease, and `born`, when this life of the set began (its own slot; see `barrier.rs`) | two leases after the last renewal |
//! | `{prefix}:tags` | the invalidation table: a generation above everything, and per namespace one for the namespace and one per tag bucket (its own slot; see `barrier.rs`) | never (a lost one starts again from Redis's clock) |
//!
//! Every call has a deadline, judged by its connection's silence, not by
//! its own wait (a call queued behind a burst, or on a link one network hop
//! away, is not failing; see [`round_trip`]); a burst's calls wait for room
//! on the connection in the process, and a call's time runs from its send. Failures feed a circuit breaker (on Redis
//! Cluster, the one of the primary that serves the key; see [`health`]);
//! while it is open the engine does not call Redis for those keys and
//! protects the process with its in-process tier alone. The tier's one
//! background task, its supervisor, closes the circuit again, repairs the
//! connections, acknowledges other instances' invalidations and retries
//! this one's pending ones; it lives and dies with the tier, or stops at
//! [`RedisTier::shutdown`], which also closes the connections.
//!
//! # Where things are
//!
//! [`RedisTier`] (this file) is a facade: it connects, composes the
//! components below, and is what the engine, the lock and the backend call.
//!
//! | file | holds |
//! |---|---|
//! | `connections.rs` | [`Connections`]: the link, the breakers, the scripts, the cluster's node connections, and the path every call takes (deadline, breaker, retry, redirect) |
//! | `entries.rs` | [`Entries`]: fetch or lease, commit, release, renew: the entry / lease protocol |
//! | `barrier.rs` | [`Barrier`]: invalidations, pending ones, the fleet's membership, recorded acknowledgements, the invalidation table |
//! | `lock.rs` | [`Locks`]: the lease as a distributed lock |
//! | `notify.rs` | [`Notifier`]: the subscriber's pushes, waiters' registrations, what the channel invalidated |
//! | `supervisor.rs` | the one background task, owned by the tier |
//! | `error.rs` | [`TierError`] and what every Redis error means (by kind) |
//! | `keys.rs` | every key and channel name |
//! | `messages.rs` | invalidation, generation and acknowledgement message formats |
//! | `carried.rs` | a commit's wake-up that carries a small entry, and its proof |
//! | `acks.rs`, `liveness.rs` | counting acknowledgements; the subscription lease and the outage grace |
//! | `outage.rs` | what is logged while Redis fails: one WARN, summaries, one INFO |
//! | `start.rs` | what is known before the first connection: errors, the circuit open, the backend-wide series registered |
//! | `lease.rs`, `renew.rs` | a rebuild lease, and the renewer that keeps a lease or a lock |
//! | `held.rs` | every lease and lock hold this process has, for a shutdown to wait for or hand back |
//! | `connection.rs`, `client.rs`, `topology.rs`, `sentinel.rs` | opening the link on one server, a cluster or behind Sentinel |
//! | `health.rs`, `breaker.rs`, `nodes.rs` | the slot map and one breaker per primary; the cluster's own node connections |
//! | `round_trip.rs` | the link's measured round trip, and how long a call may go unanswered |
//! | `config.rs`, `scripts.rs`, `scripts/*.lua` | settings; the Lua scripts, each one atomic step |
//! | `eviction.rs` | whether a node may evict our keys, as last seen: read at connect, then by each lock acquisition (whose script refuses the lock where it may) |

mod acks;
mod barrier;
mod breaker;
pub(crate) mod carried;
mod client;
pub(crate) mod config;
pub(crate) mod connection;
mod connections;
mod entries;
mod error;
mod eviction;
pub(crate) mod health;
pub(crate) mod held;
mod keys;
pub(crate) mod lease;
pub(crate) mod liveness;
pub(crate) mod lock;
mod messages;
mod nodes;
pub(crate) mod notify;
mod outage;
pub(crate) mod renew;
mod round_trip;
mod scripts;
mod sentinel;
mod start;
mod supervisor;
#[cfg(test)]
pub(crate) mod testing;
mod topology;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::RedisError;

use crate::key::Key;
use crate::metrics::Labels;
use crate::store::generations::{Field, Scope};
use barrier::Barrier;
pub(crate) use barrier::{Pending, Purged};
use config::TlsPem;
use connection::Topology;
use connections::Connections;
use entries::Entries;
pub(crate) use entries::{Fetched, Remote};
pub(crate) use error::{may_mend, migrating, setup_error, TierError};
pub(crate) use lease::Lease;
use lock::{Attempt, Locks};
pub(crate) use notify::Invalidated;
use notify::{Notifier, OnInvalidate, Registration};
pub(crate) use start::Start;
use supervisor::SupervisorGuard;

/// Settings of the Redis tier.
#[derive(Clone, Debug)]
pub(crate) struct TierConfig {
    pub topology: Topology,
    pub tls: TlsPem,
    pub prefix: String,
    pub deadline: Duration,
    pub connect_timeout: Duration,
    pub probe_interval: Duration,
    /// How long past the subscription lease the in-process tier is still
    /// served while the subscription is not confirmed (see
    /// [`liveness`]).
    pub outage_grace: Duration,
}

/// Counters of the shared tier, for diagnostics and tests.
#[derive(Default)]
pub(crate) struct TierStats {
    pub fenced_writes: AtomicU64,
    pub corrupt_entries: AtomicU64,
    pub errors: AtomicU64,
    /// Invalidations whose barrier was not confirmed (they waited a whole
    /// subscription lease).
    pub unconfirmed_invalidations: AtomicU64,
}

/// A snapshot of the shared tier's counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TierCounters {
    pub wakeups_by_message: u64,
    pub wakeups_by_timeout: u64,
    pub wakeups_with_entry: u64,
    pub fenced_writes: u64,
    pub corrupt_entries: u64,
    pub errors: u64,
    pub unconfirmed_invalidations: u64,
}

/// The shared tier: a facade over its components, each with its own state
/// and calls (see the module doc).
pub(crate) struct RedisTier {
    /// The connections and the call path every component uses.
    conns: Arc<Connections>,
    /// Entries, rebuild leases, commits.
    entries: Arc<Entries>,
    /// Invalidations: pending, membership, acknowledgements, the table.
    barrier: Arc<Barrier>,
    /// The lease as a distributed lock.
    locks: Arc<Locks>,
    /// Fleet-wide wake-ups: waiters register here.
    notifier: Arc<Notifier>,
    stats: Arc<TierStats>,
    /// Whether Redis may evict our keys, as last seen (see [`eviction`]).
    eviction: eviction::Eviction,
    /// Every lease this process holds now (see [`held`]).
    pub(crate) held: held::HeldLeases,
    /// Stops the supervisor when the tier is dropped, or at shutdown.
    supervisor: SupervisorGuard,
}

impl RedisTier {
    /// Connects the command and subscriber connections, subscribes, and loads
    /// the scripts. Fails (with the server's reason) if Redis cannot be
    /// reached or refuses the credentials. `on_invalidate` is called with
    /// every key invalidated anywhere in the fleet.
    pub(crate) async fn connect(
        config: TierConfig,
        on_invalidate: OnInvalidate,
    ) -> Result<Arc<Self>, RedisError> {
        let notifier = Arc::new(Notifier::with_grace(
            on_invalidate,
            supervisor::SUBSCRIPTION_LEASE,
            config.outage_grace,
        ));
        let stats = Arc::new(TierStats::default());
        let started = Instant::now();
        let connect_timeout = config.connect_timeout;
        let conns = Connections::connect(config, notifier.clone(), stats.clone()).await?;
        let conns = Arc::new(conns);
        conns.refresh_slots().await;
        // After the slot map: on a cluster every primary is read.
        let eviction = eviction::Eviction::new();
        eviction.connect(&conns).await;
        let barrier = Arc::new(Barrier::new(conns.clone(), notifier.clone()));
        let tier = Arc::new(RedisTier {
            supervisor: supervisor::start(conns.clone(), barrier.clone()),
            held: held::HeldLeases::default(),
            entries: Arc::new(Entries::new(conns.clone(), barrier.clone())),
            locks: Arc::new(Locks::new(conns.clone())),
            barrier,
            conns,
            notifier,
            stats,
            eviction,
        });
        // A member from the start: a subscription confirmed just now.
        // Subscribed, every message published from `started` on is heard;
        // the in-process tier is trusted once the membership holds. The
        // first renewal is part of connecting, and has the connect timeout
        // as every other step of it: under the request deadline a busy
        // process start (CPU load, a burst of connects) would leave the
        // in-process tier untrusted until the first keepalive, and the first
        // requests would all go to Redis. The trust still counts from
        // `started`, before the renewal was sent, so it never outlasts the
        // membership Redis records.
        if tier.barrier.renew_membership(connect_timeout).await {
            tier.notifier.liveness.confirm(started);
        }
        Ok(tier)
    }

    /// Leaves the fleet: waits until `deadline` for the rebuilds holding a
    /// lease to commit or give it up, hands back every lease and lock hold
    /// still held (a rebuild lease's release wakes the instances waiting
    /// for it, so one of them takes over at once), stops the supervisor
    /// (which leaves the membership on its way out) and closes the
    /// connections. The hand-back and the supervisor's stop each get at
    /// most the connect timeout, so a shutdown returns within `deadline`
    /// plus twice the connect timeout, however many leases are held and
    /// whatever Redis does. Returns how many rebuilds had not finished,
    /// and what was handed back.
    pub(crate) async fn shutdown(self: &Arc<Self>, deadline: Instant) -> (usize, held::HandedBack) {
        let unfinished = self.held.drained(deadline).await;
        let patience = self.conns.config.connect_timeout;
        let handed = self.held.hand_back(self, patience).await;
        self.supervisor.stop(patience).await;
        self.close();
        (unfinished, handed)
    }

    /// Closes the connections: every call from now on fails at once.
    /// Idempotent.
    fn close(&self) {
        self.supervisor.stop_now();
        self.conns.close();
        // Waiters here ask again, and find no tier.
        self.notifier.wake_all();
    }

    /// [`close`](Self::close), once the supervisor has stopped (and left
    /// the membership) on a task of its own; at once without a runtime.
    pub(crate) fn close_soon(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.close();
            return;
        };
        let tier = self.clone();
        runtime.spawn(async move {
            tier.supervisor
                .stop(tier.conns.config.connect_timeout)
                .await;
            tier.close();
        });
    }

    /// Stops the background work without waiting: the supervisor (which
    /// leaves the membership on its way out). Calls still work.
    pub(crate) fn stop_background(&self) {
        self.supervisor.stop_now();
    }

    /// Whether the in-process tier must be dropped before anything is
    /// served: the subscription's lease ran out, so a purge may have gone
    /// unheard.
    pub(crate) fn must_drop_l1(&self, now: Instant) -> bool {
        self.notifier.liveness.must_drop(now)
    }

    /// Whether every message published on the channel up to `now` has been
    /// heard (no gap in the subscription, its lease running).
    pub(crate) fn hears_everything(&self, now: Instant) -> bool {
        self.notifier.hears_everything(now)
    }

    /// What a health report reads of the tier; the outage log follows it
    /// (see [`outage`]).
    pub(crate) fn reading(&self) -> outage::Reading {
        self.conns.reading(None)
    }

    /// Gaps in the subscription that ended with an outage grace set (see
    /// [`Notifier::rejoins`]).
    pub(crate) fn rejoins(&self) -> u64 {
        self.notifier.rejoins()
    }

    /// A read of the table that began after the first `rejoins` such gaps
    /// was applied, and what the in-process tier held decided on: the
    /// subscription hears everything again once its lease is confirmed.
    pub(crate) fn caught_up(&self, rejoins: u64) {
        self.notifier.caught_up(rejoins);
    }

    /// How long the supervisor waits before trying a failed job again.
    pub(crate) fn probe_interval(&self) -> Duration {
        self.conns.config.probe_interval
    }

    /// Whether the subscription is between a lost link and its resubscription.
    pub(crate) fn in_gap(&self) -> bool {
        self.notifier.in_gap()
    }

    /// Listens for `key`'s wake-ups; register before asking Redis, so a
    /// publish between the answer and the wait still wakes the waiter.
    pub(crate) fn listen(&self, key: Key) -> Registration {
        self.notifier.register(key)
    }

    /// The tier's counters as they are now.
    pub(crate) fn counters(&self) -> TierCounters {
        let wakes = &self.notifier.stats;
        TierCounters {
            wakeups_by_message: wakes.by_message.load(Ordering::Relaxed),
            wakeups_by_timeout: wakes.by_timeout.load(Ordering::Relaxed),
            wakeups_with_entry: wakes.carried.load(Ordering::Relaxed),
            fenced_writes: self.stats.fenced_writes.load(Ordering::Relaxed),
            corrupt_entries: self.stats.corrupt_entries.load(Ordering::Relaxed),
            errors: self.stats.errors.load(Ordering::Relaxed),
            unconfirmed_invalidations: self.stats.unconfirmed_invalidations.load(Ordering::Relaxed),
        }
    }

    /// Counts a wait answered by the entry its wake-up carried.
    pub(crate) fn count_carried(&self) {
        self.notifier.stats.carried.fetch_add(1, Ordering::Relaxed);
    }

    /// Redis's `maxmemory-policy` as last seen (at connect, or by a lock's
    /// acquisition), if it may evict keys.
    pub(crate) fn eviction(&self) -> Option<String> {
        match self.eviction.current() {
            eviction::Policy::Evicts { policy, .. } => Some(policy),
            eviction::Policy::Keeps | eviction::Policy::Unknown => None,
        }
    }

    /// Whether every circuit lets calls through.
    pub(crate) fn is_available(&self) -> bool {
        self.conns.health.all_closed()
    }

    /// Circuits open now.
    pub(crate) fn open_circuits(&self) -> u64 {
        self.conns.health.open_circuits()
    }

    /// On a cluster, each primary of the slot map with its circuit (see
    /// [`health`]); empty on one server or behind Sentinel.
    pub(crate) fn node_circuits(&self) -> Vec<health::NodeCircuit> {
        self.conns.health.circuits()
    }

    /// Degraded episodes since the tier connected (see [`outage`]).
    pub(crate) fn outages(&self) -> u64 {
        self.conns.outage.count.load(Ordering::Relaxed)
    }

    /// Circuits opened since the tier connected.
    pub(crate) fn circuit_openings(&self) -> u64 {
        self.conns.health.openings.load(Ordering::Relaxed)
    }

    /// Whether the circuit of the node that serves `key` lets calls
    /// through (on one server or behind Sentinel, the one circuit).
    pub(crate) fn is_available_for(&self, key: &Key) -> bool {
        self.conns.health.breaker(&keys::route(key)).is_closed()
    }

    // Entries and rebuild leases (see [`entries`]).

    /// Returns the entry if fresh; otherwise tries to take the lease. With
    /// `early`, also takes the lease for a fresh entry that has no more than
    /// that much freshness left. One round trip.
    pub(crate) async fn fetch_or_lease(
        self: &Arc<Self>,
        key: &Key,
        lease_time: Duration,
        early: Option<Duration>,
    ) -> Result<Fetched, TierError> {
        self.entries
            .fetch_or_lease(self, key, lease_time, early)
            .await
    }

    /// Stores a rebuilt entry under the lease's fence, releases the lease and
    /// wakes the fleet. Returns false if a newer entry won.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        lease: &mut Lease,
        entry: Bytes,
        fresh: Duration,
        keep: Duration,
        labels: Labels,
    ) -> Result<bool, TierError> {
        self.entries.commit(lease, entry, fresh, keep, labels).await
    }

    /// Gives the lease up without storing, telling waiters to retry now
    /// (`failure` `None`) or to share the rebuild's failure, with its code.
    /// Returns false if it was no longer ours.
    pub(crate) async fn release(
        self: &Arc<Self>,
        lease: &mut Lease,
        failure: Option<u8>,
        answer: Option<Bytes>,
    ) -> Result<bool, TierError> {
        self.entries.release(lease, failure, answer).await
    }

    /// The origin's answer to the key's last failed rebuild, if kept.
    pub(crate) async fn failure_answer(&self, key: &Key) -> Result<Option<Bytes>, TierError> {
        self.entries.failure_answer(key).await
    }

    /// Gives back the rebuild lease `token` holds on `key`.
    pub(crate) async fn release_token(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        self.entries.release_token(key, token).await
    }

    /// Renews the rebuild lease `token` holds on `key` for `time`.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
        time: Duration,
    ) -> Result<bool, TierError> {
        self.entries.renew(key, token, time).await
    }

    /// Counts an entry Redis holds that this version cannot read.
    pub(crate) fn count_corrupt(&self, key: &Key) {
        self.entries.count_corrupt(key)
    }

    // Invalidations (see [`barrier`]).

    /// Drops the key's whole group from Redis and from every instance's L1,
    /// and waits for the fleet (see [`Barrier::invalidate`]).
    /// `what` is what the caller purged, as logged (see
    /// [`crate::key::shown`]).
    pub(crate) async fn invalidate(
        self: &Arc<Self>,
        key: &Key,
        what: &Purged,
    ) -> Result<(), TierError> {
        self.barrier.invalidate(key, what).await
    }

    /// Whether the invalidation of `key` is kept here, to be retried until
    /// Redis has it.
    pub(crate) fn is_pending(&self, key: &Key) -> bool {
        self.barrier.pending.get(&key.group()) == Some(*key)
    }

    /// Takes over invalidations that did not reach Redis before this tier
    /// existed: they are pending here from now on, retried by the
    /// supervisor until Redis has them (see [`Pending`]).
    pub(crate) fn keep_pending(&self, keys: Vec<(Key, Purged)>) {
        for (key, what) in keys {
            if !self.barrier.pending.remember(&key, &what) {
                tracing::error!(purged = %what, key = %key, "too many invalidations waiting for redis");
            }
        }
    }

    /// Moves `field`'s generation in Redis and tells every instance (see
    /// [`Barrier::bump_generation`]).
    pub(crate) async fn bump_generation(
        self: &Arc<Self>,
        field: Field,
        here: impl FnOnce(u64),
    ) -> Result<(), TierError> {
        self.barrier.bump_generation(field, here).await
    }

    /// The invalidation table as Redis holds it now (see
    /// [`Barrier::load_generations`]).
    pub(crate) async fn load_generations(
        self: &Arc<Self>,
        fields: Option<&[Field]>,
        floor: u64,
    ) -> Result<(u64, Vec<(Field, u64)>), TierError> {
        self.barrier.load_generations(fields, floor).await
    }

    /// The whole invalidation table, read as a step of joining the fleet
    /// or after a gap in the subscription: tried again until Redis answers
    /// or the connect timeout passes, not once under the request deadline. Until the table is read, every
    /// entry rebuilt here is built under an epoch this instance does not
    /// know yet, and the read that learns it drops that entry (it is not
    /// stored, here nor in Redis): a read that misses the deadline would
    /// cost every key rebuilt meanwhile a second origin call.
    pub(crate) async fn load_table_joining(
        self: &Arc<Self>,
        floor: u64,
        scopes: &[Scope],
    ) -> Result<(u64, Vec<(Field, u64)>), TierError> {
        let until = Instant::now() + self.conns.config.connect_timeout;
        self.barrier
            .load_generations_until(None, scopes, floor, Some(until))
            .await
    }

    // The lease as a distributed lock (see [`lock`]).

    /// One acquisition attempt (see [`Locks::acquire`]); with `judge`,
    /// refused by the server that would grant it if that server may evict
    /// the lock's key. What the server was seen to do is kept for the stats
    /// and the logs (see [`eviction`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn lock_acquire(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        attempt: &str,
        lease: Duration,
        beat: Option<Duration>,
        reenter: bool,
        synced: Option<(u32, Duration)>,
        judge: bool,
    ) -> Result<Attempt, TierError> {
        let (answer, seen) = self
            .locks
            .acquire(id, token, attempt, lease, beat, reenter, synced, judge)
            .await?;
        if let Some(policy) = seen {
            let [lock, ..] = self.conns.keys.lock(id);
            self.eviction.seen(self.conns.health.node(&lock), policy);
        }
        Ok(answer)
    }

    /// Releases the hold taken by `attempt` (see [`Locks::release`]).
    pub(crate) async fn lock_release(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        fence: u64,
        attempt: &str,
        until: Instant,
    ) -> Result<bool, TierError> {
        self.locks.release(id, token, fence, attempt, until).await
    }

    /// One renewal try (see [`Locks::renew`]).
    pub(crate) async fn lock_renew(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, TierError> {
        self.locks.renew(id, token, fence, lease).await
    }

    /// Leaves the queue and gives back what `attempt` took (see
    /// [`Locks::leave`]).
    pub(crate) async fn lock_leave(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        attempt: &str,
        until: Instant,
    ) -> Result<(), TierError> {
        self.locks.leave(id, token, attempt, until).await
    }

    /// [`lock_leave`](Self::lock_leave) on its own task (see
    /// [`Locks::abandon`]).
    pub(crate) fn lock_abandon(
        self: &Arc<Self>,
        id: Key,
        token: String,
        attempt: String,
        lease: Duration,
    ) {
        self.locks.abandon(id, token, attempt, lease)
    }

    /// This instance's name in the membership.
    #[cfg(test)]
    pub(crate) fn instance(&self) -> &str {
        &self.notifier.instance
    }
}
