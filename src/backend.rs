//! Where cached values live.
//!
//! A [`Backend`] owns the tiers every guard built on it shares: the byte-bounded
//! L1 and the in-process flights. Clone it freely; clones share everything, so
//! one backend serves every route of a service (and the generic
//! [`Cache`](crate::Cache) too), under one memory bound.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::fleet::Standing;
use crate::engine::Engine;
#[cfg(feature = "redis")]
use crate::error::{Error, ErrorKind};
use crate::store::local::LocalTier;
use crate::store::locks::LocalLocks;
#[cfg(feature = "redis")]
use crate::store::redis::config::{redact, TlsPem};
#[cfg(feature = "redis")]
pub use crate::store::redis::config::{RedisConfig, TlsFiles, DEFAULT_OUTAGE_GRACE};
#[cfg(feature = "redis")]
use crate::store::redis::connection::Topology;
#[cfg(feature = "redis")]
use crate::store::redis::TierConfig;

pub use crate::store::DEFAULT_L1_MAX_BYTES;

/// The storage a [`StampedeGuard`](crate::StampedeGuard) runs on.
///
/// ```
/// use stampede_guard::Backend;
///
/// let embedded = Backend::local();
/// let small = Backend::builder().l1_max_bytes(8 << 20).build();
/// assert_eq!(small.l1_max_bytes(), 8 << 20);
/// # let _ = embedded;
/// ```
#[derive(Clone)]
pub struct Backend {
    pub(crate) engine: Arc<Engine>,
    /// Locks of the embedded backend (unused when Redis holds them).
    pub(crate) locks: Arc<LocalLocks>,
    /// Shared by every clone: when the last one goes, the background tasks
    /// stop.
    _last: Arc<LastHandle>,
    /// How many guards have been built on this backend: each takes the next
    /// ordinal, which keys the requests it sees that name no host.
    pub(crate) guards: Arc<AtomicU64>,
}

/// Stops the engine's background tasks when the last handle of a backend
/// is dropped (flights still running keep the engine itself alive, and
/// may still commit).
struct LastHandle(Arc<Engine>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.fleet.stop_background();
    }
}

/// What [`Backend::shutdown`] found and did.
///
/// ```
/// use std::time::Duration;
/// use stampede_guard::Backend;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let report = Backend::local().shutdown(Duration::from_secs(5)).await;
/// assert_eq!(report.unfinished_rebuilds, 0);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Rebuilds that held a fleet lease and had not finished by the
    /// deadline.
    pub unfinished_rebuilds: u64,
    /// Rebuild leases handed back: the instances waiting for them were
    /// told to retry, and one of them rebuilt.
    pub leases_handed_back: u64,
    /// Lock holds ([`Lock`](crate::Lock)) handed back; their guards report
    /// the lock lost.
    pub locks_handed_back: u64,
    /// Leases or lock holds that could not be handed back (no longer ours,
    /// or Redis did not answer): they lapse when their time runs out.
    pub not_handed_back: u64,
}

impl Backend {
    /// The embedded backend: an in-process L1 with in-process coalescing. It
    /// needs no server and protects one process.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::local();
    /// ```
    #[must_use]
    pub fn local() -> Self {
        Self::builder().build()
    }

    fn with_engine(engine: Arc<Engine>) -> Self {
        Backend {
            _last: Arc::new(LastHandle(engine.clone())),
            engine,
            locks: Arc::default(),
            guards: Arc::default(),
        }
    }

    /// Settings for a backend.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::builder().l1_max_bytes(16 << 20).build();
    /// ```
    #[must_use]
    pub fn builder() -> BackendBuilder {
        BackendBuilder {
            l1_max_bytes: DEFAULT_L1_MAX_BYTES,
        }
    }

    /// Bytes the L1 holds now (entries are weighed by body, headers and a fixed
    /// overhead). Applies pending evictions first, so it is exact but not free:
    /// meant for diagnostics and tests, not the request path.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::local();
    /// assert_eq!(backend.l1_weighted_size(), 0);
    /// ```
    pub fn l1_weighted_size(&self) -> u64 {
        self.engine.l1().weighted_size()
    }

    /// The L1's bound in bytes.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::builder().l1_max_bytes(16 << 20).build();
    /// assert_eq!(backend.l1_max_bytes(), 16 << 20);
    /// ```
    #[must_use]
    pub fn l1_max_bytes(&self) -> u64 {
        self.engine.l1().max_bytes()
    }

    /// A backend shared by every instance of the fleet through Redis, with
    /// the default settings. See [`Backend::redis_builder`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stampede_guard::Error> {
    /// let backend = stampede_guard::Backend::redis("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`]: when Redis cannot be reached,
    /// refuses the credentials, the TLS handshake or an ACL permission, or
    /// the settings are unusable (see [`ErrorKind`](crate::ErrorKind)).
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Self, Error> {
        Self::redis_builder(url).connect().await
    }

    /// A backend on the server an application's own [`redis::Client`]
    /// connects to, with the default settings. See
    /// [`RedisBackendBuilder::from_client`] to change them.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stampede_guard::Error> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    /// let backend = stampede_guard::Backend::redis_from_client(&client).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`].
    #[cfg(feature = "redis")]
    pub async fn redis_from_client(client: &redis::Client) -> Result<Self, Error> {
        RedisBackendBuilder::from_client(client).connect().await
    }

    /// Settings for a Redis-backed backend: an L1 in each process in front of
    /// a Redis shared by the fleet, which holds the entries, the rebuild
    /// leases and the wake-up channel.
    ///
    /// The URL also names the topology: `redis://` or `rediss://` for one
    /// server, `redis-cluster://host1:port1,host2:port2` for Redis Cluster,
    /// `redis-sentinel://host1:port1,host2:port2/SERVICE` for a primary found
    /// through Sentinel (see [`RedisConfig`] for every form).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").prefix("shop");
    /// ```
    #[cfg(feature = "redis")]
    #[must_use]
    pub fn redis_builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder::from_config(RedisConfig::new(url))
    }

    /// A backend on Redis Cluster with the default settings, from the URLs of
    /// one or more of its nodes. See [`Backend::redis_cluster_builder`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stampede_guard::Error> {
    /// let backend = stampede_guard::Backend::redis_cluster([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    /// ])
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`]: when Redis cannot be reached,
    /// refuses the credentials, the TLS handshake or an ACL permission, or
    /// the settings are unusable (see [`ErrorKind`](crate::ErrorKind)).
    #[cfg(feature = "redis-cluster")]
    pub async fn redis_cluster<I, S>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::redis_cluster_builder(nodes).connect().await
    }

    /// Settings for a backend on Redis Cluster, from the URLs of one or more
    /// of its nodes (`redis://[user:password@]host:port`, or `rediss://`).
    /// The client learns the rest of the cluster from them, follows MOVED and
    /// ASK redirections and refreshes its view when a node is lost.
    ///
    /// ```
    /// let builder = stampede_guard::Backend::redis_cluster_builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]);
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[must_use]
    pub fn redis_cluster_builder<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        let mut builder = RedisBackendBuilder::from_config(RedisConfig::new(nodes.join(",")));
        builder.topology = Some(Topology::Cluster(nodes));
        builder
    }

    /// A Redis-backed backend from settings a service loaded from its own
    /// configuration (see [`RedisConfig`]).
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`]: when Redis cannot be reached,
    /// refuses the credentials, the TLS handshake or an ACL permission, or
    /// the settings are unusable (see [`ErrorKind`](crate::ErrorKind)).
    ///
    /// ```
    /// use stampede_guard::{RedisBackendBuilder, RedisConfig};
    ///
    /// let builder = RedisBackendBuilder::from_config(RedisConfig::new("redis://127.0.0.1:6379"));
    /// ```
    #[cfg(feature = "redis")]
    pub async fn from_config(config: RedisConfig) -> Result<Self, Error> {
        RedisBackendBuilder::from_config(config).connect().await
    }

    /// A readiness answer: whether this backend protects the whole fleet
    /// now, or only this process, and why. Cheap (a few atomic reads): fit
    /// for a readiness or health endpoint.
    ///
    /// ```
    /// use stampede_guard::{Backend, Status};
    ///
    /// let health = Backend::local().health();
    /// assert_eq!(health.status, Status::Local);
    /// # #[cfg(feature = "redis")]
    /// assert!(health.redis.is_none());
    /// ```
    #[must_use]
    pub fn health(&self) -> Health {
        match self.engine.fleet.standing() {
            Standing::Embedded => Health {
                status: Status::Local,
                #[cfg(feature = "redis")]
                redis: None,
            },
            #[cfg(feature = "redis")]
            Standing::Connecting => Health {
                status: Status::Degraded,
                redis: Some(RedisHealth {
                    connected: false,
                    reachable: false,
                    subscription_live: false,
                    breaker: Breaker::Open { circuits: 1 },
                    open_nodes: Vec::new(),
                }),
            },
            #[cfg(feature = "redis")]
            Standing::Connected {
                reachable,
                subscription_live,
                open_circuits,
            } => Health {
                status: if reachable && subscription_live {
                    Status::Fleet
                } else {
                    Status::Degraded
                },
                redis: Some(RedisHealth {
                    connected: true,
                    reachable,
                    subscription_live,
                    breaker: if open_circuits == 0 && reachable {
                        Breaker::Closed
                    } else {
                        Breaker::Open {
                            circuits: open_circuits.max(1),
                        }
                    },
                    open_nodes: self
                        .engine
                        .fleet
                        .tier()
                        .map(|tier| {
                            tier.node_circuits()
                                .into_iter()
                                .filter(|c| c.open)
                                .map(|c| format!("{}:{}", c.address.0, c.address.1))
                                .collect()
                        })
                        .unwrap_or_default(),
                }),
            },
            #[cfg(not(feature = "redis"))]
            Standing::Connecting | Standing::Connected { .. } => Health {
                status: Status::Local,
            },
        }
    }

    /// Stops cleanly: leaves the fleet without leaving anything for other
    /// instances to wait out.
    ///
    /// 1. From the call on, no flight takes a fleet lease: a miss is
    ///    rebuilt in this process (coalesced in it, one origin call per key
    ///    per process).
    /// 2. Rebuilds that hold a lease get until `deadline` from now to
    ///    finish; those that do commit and publish as usual, so the fleet
    ///    is served from them.
    /// 3. At the deadline every lease still held is handed back by its
    ///    token, which wakes the instances waiting for it: one of them
    ///    takes the key over at once instead of waiting for the lease to
    ///    expire. Held [`Lock`](crate::Lock)s are handed back the same way
    ///    and their guards report them lost. A rebuild that finishes later
    ///    still answers its own waiters, but stores nothing in Redis. The
    ///    releases run side by side and get the connect timeout
    ///    ([`RedisBuilder::connect_timeout`](crate::RedisBackendBuilder::connect_timeout))
    ///    in all: a lease or lock not handed back by then (Redis frozen or
    ///    gone) is counted in `not_handed_back` and lapses after its lease
    ///    time.
    /// 4. The instance leaves the fleet's membership (invalidations stop
    ///    waiting for it), its background tasks stop and its Redis
    ///    connections close.
    ///
    /// Requests still waiting for another instance's rebuild when it is
    /// called are not kept past the close of the connections: from then on
    /// they are served as on the embedded backend, at most one origin call
    /// per key in this process beside the fleet's rebuild. Stopping the
    /// server first (and letting its requests end) avoids that call.
    ///
    /// The call returns within `deadline` plus twice the connect timeout
    /// (once for the hand-back, once for leaving the membership), however
    /// many leases are held and whatever Redis does.
    ///
    /// Afterwards the backend is outside the fleet, and is treated as an
    /// instance in a Redis outage ([`health`](Self::health) says
    /// [`Status::Local`]). It keeps answering, coalescing requests in the
    /// process, but it no longer hears the fleet's invalidations, and none
    /// waits for it: its in-process tier is trusted for the
    /// [`outage_grace`](RedisBackendBuilder::outage_grace) at most, counted
    /// from the shutdown (then dropped, and again once per grace). With no
    /// grace (the default) it answers nothing from it: every request that
    /// finds no rebuild running calls the origin. An invalidation
    /// (`invalidate`, `invalidate_tag`, `invalidate_all`) returns an error
    /// (`ErrorKind::Unavailable`): it can no longer reach the fleet, and is
    /// not kept. A [`Lock`](crate::Lock) is refused
    /// (`LockError::Unavailable`): a lock taken in this process alone would
    /// exclude nobody. Call it once per
    /// backend, after the server stopped taking requests (every guard built
    /// on it is shut down with it); later calls return at once with an
    /// empty report. If the returned future is dropped before it completes,
    /// the backend still leaves the membership and closes its connections;
    /// leases not handed back yet then lapse. On the embedded backend it
    /// does nothing.
    ///
    /// Dropping the last handle of a backend without it only stops the
    /// background tasks (and leaves the membership); a lease held by a
    /// rebuild then lapses after its lease time.
    ///
    /// ```
    /// # async fn run() {
    /// # use std::time::Duration;
    /// let backend = stampede_guard::Backend::local();
    /// let report = backend.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!(report.leases_handed_back, 0);
    /// # }
    /// ```
    pub async fn shutdown(&self, deadline: Duration) -> ShutdownReport {
        let deadline = Instant::now()
            .checked_add(deadline)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        let done = self.engine.fleet.shutdown(deadline).await;
        ShutdownReport {
            unfinished_rebuilds: done.unfinished,
            leases_handed_back: done.handed_back,
            locks_handed_back: done.locks_handed_back,
            not_handed_back: done.not_handed_back,
        }
    }

    /// Counters and state, for diagnostics.
    ///
    /// ```
    /// let stats = stampede_guard::Backend::local().stats();
    /// assert_eq!(stats.l1_bytes, 0);
    /// # #[cfg(feature = "redis")]
    /// assert!(stats.redis.is_none());
    /// ```
    #[must_use]
    pub fn stats(&self) -> BackendStats {
        BackendStats {
            l1_bytes: self.l1_weighted_size(),
            #[cfg(feature = "redis")]
            redis: self.redis_stats(),
        }
    }

    /// The Redis tier's counters: from construction on for a Redis backend
    /// (what the start counted, before and after the first connection),
    /// `None` for the embedded one and after a shutdown.
    #[cfg(feature = "redis")]
    fn redis_stats(&self) -> Option<RedisStats> {
        let fleet = &self.engine.fleet;
        let start = fleet.start()?;
        let (errors, began_down) = (start.errors(), start.began_down());
        let Some(l2) = fleet.tier() else {
            if fleet.is_shut() {
                return None;
            }
            // Not connected yet: what the attempts counted, the circuit open.
            return Some(RedisStats {
                address: start.address().to_owned(),
                connected: false,
                available: false,
                open_circuits: 1,
                circuit_openings: began_down,
                outages: began_down,
                errors,
                ..RedisStats::default()
            });
        };
        let counters = l2.counters();
        Some(RedisStats {
            address: start.address().to_owned(),
            connected: true,
            available: l2.is_available(),
            open_circuits: l2.open_circuits(),
            circuit_openings: l2.circuit_openings().saturating_add(began_down),
            outages: l2.outages().saturating_add(began_down),
            wakeups_by_message: counters.wakeups_by_message,
            wakeups_by_timeout: counters.wakeups_by_timeout,
            wakeups_with_entry: counters.wakeups_with_entry,
            fenced_writes: counters.fenced_writes,
            corrupt_entries: counters.corrupt_entries,
            errors: counters.errors.saturating_add(errors),
            unconfirmed_invalidations: counters.unconfirmed_invalidations,
            eviction_policy: l2.eviction(),
            nodes: l2
                .node_circuits()
                .into_iter()
                .map(|c| NodeStats {
                    address: format!("{}:{}", c.address.0, c.address.1),
                    open: c.open,
                    circuit_openings: c.openings,
                })
                .collect(),
        })
    }
}

/// A backend's readiness, from [`Backend::health`]. See
/// [`Backend::health`](Backend::health) for an example.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Health {
    /// What the backend protects now.
    pub status: Status,
    /// The Redis tier's state, if the backend has one (connected or not).
    #[cfg(feature = "redis")]
    pub redis: Option<RedisHealth>,
}

/// What a backend protects now, in [`Health`].
///
/// ```
/// use stampede_guard::{Backend, Status};
///
/// match Backend::local().health().status {
///     Status::Fleet | Status::Local => println!("ready"),
///     Status::Degraded => println!("serving with in-process protection"),
///     _ => {}
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Status {
    /// The embedded backend: this process, by design.
    Local,
    /// The fleet through Redis: Redis answers and the subscription to the
    /// fleet's invalidations is confirmed live.
    Fleet,
    /// A Redis backend running on its in-process tier alone: not connected
    /// yet, Redis failing, or its subscription not confirmed. Requests are
    /// still answered, coalesced per process (see the
    /// [failures guide](crate::guide::failures)).
    Degraded,
}

/// The Redis tier's state, in [`Health`].
///
/// ```no_run
/// # async fn run() -> Result<(), stampede_guard::Error> {
/// let backend = stampede_guard::Backend::redis("redis://127.0.0.1:6379").await?;
/// if let Some(redis) = backend.health().redis {
///     println!("reachable: {}, open nodes: {:?}", redis.reachable, redis.open_nodes);
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RedisHealth {
    /// Whether the backend has connected to Redis at least once: false
    /// while it connects in the background after a start-up without Redis.
    /// It stays true after Redis dies; whether Redis answers *now* is
    /// [`reachable`](Self::reachable).
    pub connected: bool,
    /// Whether Redis answers now: every circuit closed. False from
    /// construction until the first connection, while calls fail, and once
    /// the supervisor finds the link dropped (the subscriber's connection
    /// lost and a ping on the command connection refused), with no traffic
    /// needed; true again once a probe is answered.
    pub reachable: bool,
    /// Whether the subscription to the fleet's invalidations is confirmed
    /// live (its lease running, no gap). False while Redis is gone, and
    /// from a lost link until a resubscription is confirmed.
    pub subscription_live: bool,
    /// The circuit breakers: `Open` exactly when `reachable` is false.
    pub breaker: Breaker,
    /// On Redis Cluster, the primaries (`host:port`) whose circuit is open:
    /// only their keys run on in-process protection; every other primary's
    /// keys keep the fleet's. Empty on one server or behind Sentinel.
    pub open_nodes: Vec<String>,
}

/// The state of a Redis backend's circuit breakers, in [`RedisHealth`].
///
/// ```no_run
/// use stampede_guard::{Backend, Breaker};
///
/// # async fn run() -> Result<(), stampede_guard::Error> {
/// let backend = Backend::redis("redis://127.0.0.1:6379").await?;
/// if let Some(redis) = backend.health().redis {
///     if let Breaker::Open { circuits } = redis.breaker {
///         println!("{circuits} circuit(s) open");
///     }
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Breaker {
    /// Calls go to Redis.
    Closed,
    /// Calls are not made: Redis failed (or is not connected yet); a probe
    /// asks it in the background. On Redis Cluster, `circuits` primaries
    /// have their circuit open; otherwise 1.
    Open {
        /// Circuits open.
        circuits: u64,
    },
}

/// A snapshot of a backend's counters, from [`Backend::stats`]. See
/// [`Backend::stats`](Backend::stats) for an example.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BackendStats {
    /// Bytes held by the in-process tier.
    pub l1_bytes: u64,
    /// The Redis tier's counters, if the backend has one.
    #[cfg(feature = "redis")]
    pub redis: Option<RedisStats>,
}

/// Counters of the Redis tier, in [`BackendStats`]: there for a Redis
/// backend from its construction, connected or not (`None` only for the
/// embedded backend, and after a shutdown).
///
/// On a bad day: `available` false and `open_circuits` above 0 while Redis
/// fails (from construction until the first connection, for a backend
/// that started without it); `errors`, `circuit_openings` and `outages`
/// count each failure, opening and degraded episode. Before the first
/// connection the counters of calls (wake-ups, fenced writes, corrupt
/// entries, unconfirmed invalidations) are 0, `eviction_policy` is `None`
/// and `nodes` is empty: nothing was asked yet.
///
/// ```no_run
/// # async fn run() -> Result<(), stampede_guard::Error> {
/// let backend = stampede_guard::Backend::redis("redis://127.0.0.1:6379").await?;
/// if let Some(redis) = backend.stats().redis {
///     println!("circuit openings: {}, errors: {}", redis.circuit_openings, redis.errors);
///     for node in &redis.nodes {
///         println!("{} open: {}", node.address, node.open);
///     }
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RedisStats {
    /// Where Redis is: `host:port` (a cluster's seeds, or the service and
    /// its sentinels), never a password. Tells two backends apart.
    pub address: String,
    /// Whether the backend has connected to Redis at least once. It stays
    /// true after Redis dies: what is true *now* is
    /// [`available`](Self::available). False from construction until the
    /// first connection, for a backend that started without Redis.
    pub connected: bool,
    /// Whether calls go to Redis now: false while a circuit breaker is
    /// open (Redis failing, or not connected yet; serving from the
    /// in-process tier alone). On Redis Cluster each primary has its own
    /// circuit, and this is false while any of them is open.
    pub available: bool,
    /// Circuits open now: 0 or 1 on one server or behind Sentinel (1 from
    /// construction until the first connection, for a backend that
    /// started without Redis); on a cluster, the primaries whose keys are
    /// served from the in-process tier alone.
    pub open_circuits: u64,
    /// Circuits opened since the backend was built: a start without Redis
    /// counts one, and so does each later opening (calls failing, or the
    /// link found dropped while idle).
    pub circuit_openings: u64,
    /// Episodes [`health`](Backend::health) reported as
    /// [`Status::Degraded`] since the backend was built, a start without
    /// Redis included: each logged one WARN when it began and one INFO
    /// when it ended.
    pub outages: u64,
    /// Waits for another instance's rebuild ended by its publish.
    pub wakeups_by_message: u64,
    /// Waits ended by the lease or the wait budget running out: it rises
    /// when publishes are lost (Redis or the subscription failing) or the
    /// rebuilding instance died.
    pub wakeups_by_timeout: u64,
    /// Waits answered by the entry the commit's wake-up carried (entries
    /// of at most 16 KiB encoded), without reading Redis again.
    pub wakeups_with_entry: u64,
    /// Late commits refused because a newer entry was stored.
    pub fenced_writes: u64,
    /// Unreadable entries found at our keys (treated as misses).
    pub corrupt_entries: u64,
    /// Calls that failed or missed their deadline, and attempts to
    /// connect that failed before the first connection.
    pub errors: u64,
    /// Invalidations (of a key, a tag or everything) that reached Redis
    /// but whose fleet barrier was not confirmed: an instance did not
    /// acknowledge, or the acknowledgements heard were not all recorded in
    /// Redis (forged, or sent by an instance of an earlier version). Each
    /// waited a whole subscription lease before it returned.
    pub unconfirmed_invalidations: u64,
    /// Redis's `maxmemory-policy` when, as last seen (read at connect, then
    /// by every lock acquisition), it could evict keys (a `maxmemory` set, a
    /// policy other than `noeviction`); on a cluster, the worst primary's.
    /// `None` if it cannot, or could not be read (`INFO` refused). Entries and
    /// fencing counters survive eviction; a lock does not, and is refused
    /// there by default (see [`Lock::allow_evicting_server`](crate::Lock::allow_evicting_server)
    /// and the [topology guide](crate::guide::topology)).
    pub eviction_policy: Option<String>,
    /// On Redis Cluster, each primary of the slot map and its own circuit:
    /// a stalled or dead primary opens only its own, and only its keys are
    /// served with in-process protection alone. Empty on one server or
    /// behind Sentinel (one circuit: the counters above).
    pub nodes: Vec<NodeStats>,
}

/// One Redis Cluster primary's circuit, in [`RedisStats::nodes`]. See
/// [`RedisStats`] for an example.
#[cfg(feature = "redis")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct NodeStats {
    /// `host:port`, as the cluster names the primary.
    pub address: String,
    /// Whether its circuit is open now (its keys served from the
    /// in-process tier alone).
    pub open: bool,
    /// Times its circuit opened since it became the primary of its slots.
    pub circuit_openings: u64,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("l1_max_bytes", &self.l1_max_bytes())
            .finish()
    }
}

/// Builds a [`Backend`] on Redis.
///
/// ```no_run
/// use std::time::Duration;
/// use stampede_guard::Backend;
///
/// # async fn run() -> Result<(), stampede_guard::Error> {
/// let backend = Backend::redis_builder("redis://127.0.0.1:6379")
///     .prefix("shop")
///     .deadline(Duration::from_millis(50))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    config: RedisConfig,
    /// Set by constructors that know the topology without a URL.
    topology: Option<Topology>,
    /// TLS material given in memory (files in `config.tls` add to it).
    tls: TlsPem,
    /// Why the settings handed over (an application's client) cannot be
    /// used: reported by `connect`.
    unusable: Option<String>,
}

#[cfg(feature = "redis")]
impl RedisBackendBuilder {
    /// A builder with these settings.
    ///
    /// ```
    /// use stampede_guard::{RedisBackendBuilder, RedisConfig};
    ///
    /// let builder = RedisBackendBuilder::from_config(RedisConfig::new("redis://127.0.0.1:6379"));
    /// // `.connect().await` connects.
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn from_config(config: RedisConfig) -> Self {
        RedisBackendBuilder {
            config,
            topology: None,
            tls: TlsPem::default(),
            unusable: None,
        }
    }

    /// A builder on the server an application's own [`redis::Client`]
    /// connects to: its address, database, user name and password (the
    /// `redis` crate of the same major version as this crate's). The
    /// backend opens connections of its own (it needs a subscriber, and
    /// deadlines of its own), as the client would.
    ///
    /// ```
    /// use stampede_guard::RedisBackendBuilder;
    ///
    /// let client = redis::Client::open("redis://cache:secret@127.0.0.1:6379/2").unwrap();
    /// // `.connect().await` connects.
    /// let builder = RedisBackendBuilder::from_client(&client).prefix("shop");
    /// ```
    ///
    /// A `rediss://` client built with certificates in memory cannot hand
    /// them over: [`connect`](Self::connect) then fails with
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig); give
    /// them with [`tls_ca_pem`](Self::tls_ca_pem) and
    /// [`tls_client_pem`](Self::tls_client_pem) on a builder made from a
    /// URL instead.
    #[must_use]
    pub fn from_client(client: &redis::Client) -> Self {
        Self::from_connection_info(client.get_connection_info())
    }

    /// A builder on the server `info` names, as
    /// [`from_client`](Self::from_client) does (settings the application
    /// already parsed or assembled).
    ///
    /// ```
    /// use redis::IntoConnectionInfo;
    /// use stampede_guard::RedisBackendBuilder;
    ///
    /// let info = "redis://127.0.0.1:6379".into_connection_info().unwrap();
    /// let builder = RedisBackendBuilder::from_connection_info(&info);
    /// ```
    #[must_use]
    pub fn from_connection_info(info: &redis::ConnectionInfo) -> Self {
        match crate::store::redis::config::url_of(info) {
            Ok(url) => Self::from_config(RedisConfig::new(url)),
            Err(why) => RedisBackendBuilder {
                unusable: Some(why),
                ..Self::from_config(RedisConfig::default())
            },
        }
    }

    /// Bound of each process's in-process tier, in bytes (default 64 MiB).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").l1_max_bytes(16 << 20);
    /// ```
    #[must_use]
    pub fn l1_max_bytes(mut self, bytes: u64) -> Self {
        self.config.l1_max_bytes = bytes;
        self
    }

    /// Prefix of every Redis key and of the event channel (default `sg`).
    /// Services that share a Redis but not their caches use different ones.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").prefix("shop");
    /// ```
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// How long a Redis call may go without its connection answering
    /// anything (default 50 ms). A frozen, dead or paused Redis fails a
    /// call this long after it was sent; failures in several moments in a
    /// row open the circuit, and the layer runs on its in-process tier
    /// alone.
    ///
    /// It judges Redis, not the queue in front of it: a call sent behind a
    /// burst (many keys cold at once) waits while Redis keeps answering the
    /// calls before it, up to the connect timeout; and on a link whose
    /// measured round trip needs more (a Redis a network hop away), the
    /// silence allowed is twice the smoothed round trip plus four times its
    /// variation (RFC 6298's retransmission timeout), at most the connect
    /// timeout. An entry larger than 256 KiB is read and written under a
    /// limit that also allows for its size.
    ///
    /// A value out of range is brought into it (1 ms to 2^31 s).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").deadline(Duration::from_millis(80));
    /// ```
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.config.deadline = deadline;
        self
    }

    /// How long connecting may take at start-up (default 2 s).
    ///
    /// A value out of range is brought into it (1 ms to 2^31 s).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").connect_timeout(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How often an open circuit pings Redis to see whether it is back
    /// (default 250 ms). Behind Sentinel the probe first asks the sentinels
    /// where the primary is, and follows it after a failover.
    ///
    /// A value out of range is brought into it (1 ms to 2^31 s).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// // Builds the settings; `.connect().await` connects.
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").probe_interval(Duration::from_millis(500));
    /// ```
    #[must_use]
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.config.probe_interval = interval;
        self
    }

    /// Fails [`connect`](Self::connect) when Redis cannot be reached
    /// (refused, or no answer within the connect timeout), as a fail-fast
    /// deployment wants.
    ///
    /// Without it (the default) such a backend starts anyway: it serves
    /// with in-process protection (its own L1, one origin call per key per
    /// process), logs one WARN, connects in the background (first after the
    /// probe interval, then backing off to 5 s), and joins the fleet once
    /// Redis answers (one INFO). [`Backend::health`] tells which. Errors no
    /// retry can mend (a malformed URL, refused credentials or permissions,
    /// TLS, a feature not compiled in) fail at start-up either way.
    ///
    /// ```
    /// # use stampede_guard::Backend;
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").require_redis_at_start();
    /// ```
    #[must_use]
    pub fn require_redis_at_start(mut self) -> Self {
        self.config.require_redis_at_start = true;
        self
    }

    /// How long an instance that cannot hear the fleet's invalidations
    /// (Redis down, or this instance cut off from it) keeps serving what its
    /// in-process tier holds, past the 3 s subscription lease (default
    /// zero, [`DEFAULT_OUTAGE_GRACE`](crate::DEFAULT_OUTAGE_GRACE): the
    /// strict rule below).
    ///
    /// While Redis is down for the whole fleet no invalidation can return
    /// `Ok` (each fails, and is retried once Redis is back), so serving the
    /// in-process tier is what keeps the origin at one call per key per
    /// instance. The grace bounds the other case: an instance cut off from
    /// a Redis the others still reach may serve an entry another instance
    /// invalidated (and whose invalidation returned `Ok` once this
    /// instance's membership lapsed) for at most the lease plus the grace
    /// after that invalidation. Once the grace has run out, the in-process
    /// tier is dropped, and then again every `max(grace, 3 s)` while the
    /// subscription is not back.
    ///
    /// When the subscription is back, the instance reads the invalidation
    /// table again before it counts as back in the fleet
    /// ([`health`](Backend::health) says [`Status::Fleet`] only then):
    /// - if Redis kept its data, what the in-process tier held through the
    ///   outage is dropped then: an invalidation made meanwhile is never
    ///   served past the rejoin;
    /// - if Redis lost it (restarted empty, restored from an older copy),
    ///   every invalidation made before the loss is gone with the entries it
    ///   purged, and nothing in Redis tells what was missed: what the
    ///   in-process tier held is kept, but no longer than the outage rule
    ///   above would have kept it (the lease and the grace after the last
    ///   confirmed keepalive, or a period after the last drop), then
    ///   dropped. An invalidation made after the rejoin (of a key, a tag or
    ///   everything) reaches these entries as any other.
    ///
    /// So a rejoin never lets an entry that may have missed an invalidation
    /// be served longer than the outage rule does without one (the lease
    /// plus the grace after that invalidation at most), and a Redis that
    /// restarts empty again and again costs no rebuild of what the
    /// instances hold, within the grace.
    ///
    /// `Duration::ZERO`, the default, keeps the strict rule: nothing read
    /// before an invalidation is served once it returned `Ok`, on any
    /// instance, at the cost of dropping the in-process tier at the first
    /// sign of a lost subscription and every 3 s after, for as long as
    /// Redis is gone. A grace trades that rule, for an instance cut off
    /// alone, for origin calls saved during a whole outage.
    ///
    /// A backend outside the fleet (started while Redis could not be
    /// reached and not joined yet, or shut down) is treated as cut off,
    /// with no subscription lease: no invalidation waits for it, so it
    /// trusts what its in-process tier holds for the grace at most (dropped
    /// once per grace), and with no grace it answers nothing from it (its
    /// requests are only coalesced in the process).
    ///
    /// A value out of range is brought into it (0 to 2^31 s).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::Backend;
    /// let builder = Backend::redis_builder("redis://127.0.0.1:6379").outage_grace(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn outage_grace(mut self, grace: Duration) -> Self {
        self.config.outage_grace = grace;
        self
    }

    /// Asks the sentinels of a `redis-sentinel://` URL as `user` with
    /// `password`: the sentinels' own ACL user, separate from the data
    /// nodes' (the URL's). For a sentinel with `requirepass`, the user is
    /// `default`. A wrong sentinel password fails [`connect`](Self::connect)
    /// with an [`Auth`](crate::ErrorKind::Auth) error that names the
    /// sentinel; the [topology guide](crate::guide::topology) gives the
    /// sentinel user's minimal ACL.
    ///
    /// ```
    /// # use stampede_guard::Backend;
    /// let builder = Backend::redis_builder("redis-sentinel://app:secret@10.0.0.1:26379/cache")
    ///     .sentinel_auth("watcher", "sentinel-secret");
    /// ```
    #[must_use]
    pub fn sentinel_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.sentinel_user = Some(user.into());
        self.config.sentinel_password = Some(password.into());
        self
    }

    /// Trusts this CA (PEM) for `rediss` connections instead of the system's
    /// roots: for a private CA, as managed services and self-hosted TLS use.
    ///
    /// ```
    /// # use stampede_guard::Backend;
    /// # let ca_pem = Vec::<u8>::new();
    /// let builder = Backend::redis_builder("rediss://redis.internal:6380").tls_ca_pem(ca_pem);
    /// ```
    #[must_use]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and key (PEM) to servers that
    /// require one (`tls-auth-clients yes`).
    ///
    /// ```
    /// # use stampede_guard::Backend;
    /// # let (cert_pem, key_pem) = (Vec::<u8>::new(), Vec::<u8>::new());
    /// let builder = Backend::redis_builder("rediss://redis.internal:6380")
    ///     .tls_client_pem(cert_pem, key_pem);
    /// ```
    #[must_use]
    pub fn tls_client_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// Connects, subscribes to the event channel and loads the scripts.
    /// Fails with the server's reason if Redis refuses the credentials, a
    /// permission or the TLS handshake, or the settings are unusable: a
    /// misconfigured backend is a start-up error, not a silent fallback.
    ///
    /// A Redis that cannot be reached (refused, or silent for the connect
    /// timeout) is no error unless
    /// [`require_redis_at_start`](Self::require_redis_at_start) is set: the
    /// backend starts with in-process protection and joins the fleet once
    /// Redis answers (see [`Backend::health`]).
    ///
    /// # Errors
    ///
    /// An [`Error`] whose [`kind`](Error::kind) says why:
    /// [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for a malformed
    /// URL, an unreadable certificate, a feature not compiled in or a
    /// `rediss` URL with no rustls crypto provider installed;
    /// [`Auth`](crate::ErrorKind::Auth),
    /// [`Permission`](crate::ErrorKind::Permission) or [`Tls`](crate::ErrorKind::Tls)
    /// for what the server answered; with `require_redis_at_start`, also
    /// [`Connect`](crate::ErrorKind::Connect) or
    /// [`Timeout`](crate::ErrorKind::Timeout) when it cannot be reached.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stampede_guard::Error> {
    /// let backend = stampede_guard::Backend::redis_builder("redis://127.0.0.1:6379")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<Backend, Error> {
        if let Some(why) = self.unusable {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!("could not set up Redis from the application's client: {why}"),
            ));
        }
        let config = self.config;
        let shown = redact(&config.url);
        let setup = |message: String| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("could not set up Redis at {shown}: {message}"),
            )
        };
        let topology = match self.topology {
            Some(topology) => topology,
            None => Topology::parse(&config.url).map_err(setup)?,
        };
        let topology = topology
            .with_sentinel_auth(config.sentinel_user, config.sentinel_password)
            .map_err(setup)?;
        let mut tls = self.tls;
        if let Some(files) = &config.tls {
            let read = files.read().map_err(setup)?;
            tls.ca = read.ca.or(tls.ca);
            tls.client = read.client.or(tls.client);
        }
        let certificates = tls.ca.is_some() || tls.client.is_some();
        if let Some(why) = crate::store::redis::connection::missing_feature(&topology, certificates)
        {
            return Err(setup(why.to_owned()));
        }
        let l1 = LocalTier::new(config.l1_max_bytes);
        let tier_config = TierConfig {
            topology,
            tls,
            prefix: config.prefix,
            // Set in code or read from a config file: brought into range
            // here, so no timer overflows or spins.
            deadline: crate::limits::REDIS_TIMER.clamp(config.deadline),
            connect_timeout: crate::limits::REDIS_TIMER.clamp(config.connect_timeout),
            probe_interval: crate::limits::REDIS_TIMER.clamp(config.probe_interval),
            outage_grace: crate::limits::OUTAGE_GRACE.clamp(config.outage_grace),
        };
        let require = config.require_redis_at_start;
        let engine = crate::engine::fleet::connect(l1, tier_config, require)
            .await
            .map_err(|e| crate::store::redis::setup_error(&shown, e))?;
        Ok(Backend::with_engine(engine))
    }
}

/// Builds a [`Backend`], from [`Backend::builder`].
///
/// ```
/// let backend = stampede_guard::Backend::builder().l1_max_bytes(16 << 20).build();
/// ```
#[derive(Clone, Debug)]
pub struct BackendBuilder {
    l1_max_bytes: u64,
}

impl BackendBuilder {
    /// Bound of the in-process tier, in bytes (default 64 MiB). A value larger
    /// than the whole bound is never kept in L1.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::builder().l1_max_bytes(16 << 20).build();
    /// ```
    #[must_use]
    pub fn l1_max_bytes(mut self, bytes: u64) -> Self {
        self.l1_max_bytes = bytes;
        self
    }

    /// Builds the backend.
    ///
    /// ```
    /// let backend = stampede_guard::Backend::builder().build();
    /// ```
    #[must_use]
    pub fn build(self) -> Backend {
        Backend::with_engine(Arc::new(Engine::new(LocalTier::new(self.l1_max_bytes))))
    }
}
