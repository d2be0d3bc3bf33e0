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
//! | `{prefix}:{<group>}:g` | the group's generation: an invalidation moves it, and every entry stored under an older one is gone | a day after the last lease, and never before the group's entries (then reseeded from Redis's clock) |
//! | `…:v` | `<generation>\|` then the encoded entry | when its last stale window closes |
//! | `…:f` | freshness marker | when the entry stops being fresh (Redis's clock) |
//! | `…:l` | rebuild lease: the owner's token | after the lease time, unless renewed |
//! | `…:n` | fence hash: numbers issued and committed | a day after the last lease (then reseeded from Redis's clock) |
//! | `{prefix}:members` | the fleet's membership: each instance with the end of its subscription lease, and `born`, when this life of the set began (its own slot; see `members`) | two leases after the last renewal |
//! | `{prefix}:tags` | the invalidation table: a generation for everything and one per tag bucket (its own slot; see `generations`) | never (a lost one starts again from Redis's clock) |
//!
//! Every call has a deadline. Failures feed a circuit breaker (on Redis
//! Cluster, the one of the primary that serves the key; see [`health`]);
//! while it is open the engine does not call Redis for those keys and
//! protects the process with its in-process tier alone. The tier's one background task, its
//! supervisor, closes the circuit again and repairs the connections; it
//! lives and dies with the tier.

mod acks;
mod barrier;
mod breaker;
mod calls;
pub(crate) mod carried;
pub(crate) mod config;
pub(crate) mod connection;
mod entries;
mod generations;
mod health;
mod invalidate;
pub(crate) mod lease;
pub(crate) mod lock;
mod members;
mod nodes;
pub(crate) mod notify;
pub(crate) mod renew;
mod scripts;
mod sentinel;
mod supervisor;
#[cfg(test)]
pub(crate) mod testing;
mod topology;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::{RedisError, RetryMethod};

use crate::key::Key;
use crate::metrics as m;
pub(crate) use breaker::migrating;
use config::TlsPem;
use connection::{Conn, Link, Options, Sink, Topology};
pub(crate) use entries::{Fetched, Remote};
use health::Health;
pub(crate) use lease::Lease;
pub(crate) use notify::Invalidated;
use notify::{Notifier, OnInvalidate};
use scripts::Scripts;
use supervisor::{Signals, SupervisorGuard};

/// Settings of the Redis tier.
#[derive(Clone, Debug)]
pub(crate) struct TierConfig {
    pub topology: Topology,
    pub tls: TlsPem,
    pub prefix: String,
    pub deadline: Duration,
    pub connect_timeout: Duration,
    pub probe_interval: Duration,
}

/// The longest pause between tries of a call made past the breaker.
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(200);

/// Why a call to Redis gave no answer.
#[derive(Debug)]
pub(crate) enum TierError {
    /// The circuit is open: Redis was not asked.
    Open,
    /// No answer within the deadline.
    Timeout,
    /// Redis answered with an error, or the connection failed.
    Redis(RedisError),
}

impl TierError {
    /// Whether the command may have run on the server although the caller
    /// has no answer: it was sent, and the deadline passed or the
    /// connection failed before the reply came.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            TierError::Open => false,
            TierError::Timeout => true,
            TierError::Redis(e) => e.is_timeout() || e.is_io_error() || e.is_connection_dropped(),
        }
    }
}

impl std::fmt::Display for TierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierError::Open => f.write_str("circuit open"),
            TierError::Timeout => f.write_str("deadline passed"),
            TierError::Redis(e) => write!(f, "{e}"),
        }
    }
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

pub(crate) struct RedisTier {
    /// What requests and the supervisor both use.
    shared: Arc<Shared>,
    /// Fleet-wide wake-ups: waiters register here.
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) stats: TierStats,
    /// The eviction policy read at start-up, when Redis may evict our keys.
    eviction: Option<String>,
    /// Stops the supervisor when the tier is dropped.
    _supervisor: SupervisorGuard,
}

/// The tier's state that its supervisor needs too. Only the tier and its
/// supervisor task hold it, so it goes when both have.
pub(crate) struct Shared {
    /// The connections; replaced when a Sentinel-managed primary moves or a
    /// cluster subscription is opened again.
    link: RwLock<Arc<Link>>,
    config: TierConfig,
    channel: String,
    /// The circuit breakers (one per cluster primary): requests read their
    /// flags; only the supervisor closes them.
    health: Health,
    notifier: Arc<Notifier>,
    scripts: Scripts,
    /// How requests ask the supervisor for help.
    signals: Signals,
    /// This process's acknowledgement channel.
    ack_channel: String,
    /// Invalidations that did not reach Redis, retried until they do.
    pending: barrier::Pending,
    /// On a cluster, a connection of its own to each primary that serves
    /// keys (see [`calls`]).
    node_conns: nodes::NodeConns,
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
        let notifier = Arc::new(Notifier::new(on_invalidate, supervisor::SUBSCRIPTION_LEASE));
        let channel = format!("{}:events", config.prefix);
        let ack_channel = notifier.ack_channel(&channel);
        let scripts = Scripts::new();
        let started = Instant::now();
        let retired = Arc::default();
        let link = open(&config, &channel, &ack_channel, &notifier, retired).await?;
        // Scripts are not replicated with the data: loading them now spares
        // a request a NOSCRIPT retry inside its deadline, and tells a user
        // the server refuses them at once.
        load_scripts(&config, &link, &scripts).await?;
        let eviction = eviction_policy(&link.conn, config.connect_timeout).await;
        if let Some(policy) = &eviction {
            tracing::warn!(
                policy = %policy,
                "redis may evict keys: cached entries and fencing counters survive it \
                 (counters start again from Redis's clock), but an evicted lock is a lost \
                 lock; keep locks on a Redis with maxmemory-policy noeviction"
            );
        }
        let health = Health::new(matches!(config.topology, Topology::Cluster(_)));
        let shared = Arc::new(Shared {
            link: RwLock::new(Arc::new(link)),
            config,
            channel,
            health,
            notifier: notifier.clone(),
            scripts,
            signals: Signals::default(),
            ack_channel,
            pending: barrier::Pending::default(),
            node_conns: nodes::NodeConns::default(),
        });
        shared.refresh_slots().await;
        let tier = Arc::new(RedisTier {
            _supervisor: supervisor::start(shared.clone()),
            shared,
            notifier,
            stats: TierStats::default(),
            eviction,
        });
        // A member from the start: a subscription confirmed just now.
        // Subscribed, every message published from `started` on is heard;
        // the in-process tier is trusted once the membership holds.
        if tier.shared.renew_membership().await {
            tier.notifier.liveness.confirm(started);
        }
        supervisor::retry_pending(&tier);
        Ok(tier)
    }

    /// Redis's `maxmemory-policy` as read at start-up, if it may evict keys.
    pub(crate) fn eviction(&self) -> Option<&str> {
        self.eviction.as_deref()
    }

    /// The command connection (a cheap clone).
    pub(crate) fn conn(&self) -> Conn {
        self.shared.link().conn.clone()
    }

    /// Whether every circuit lets calls through.
    pub(crate) fn is_available(&self) -> bool {
        self.shared.health.all_closed()
    }

    /// Circuits open now.
    pub(crate) fn open_circuits(&self) -> u64 {
        self.shared.health.open_circuits()
    }

    /// Circuits opened since the tier connected.
    pub(crate) fn circuit_openings(&self) -> u64 {
        self.shared.health.openings.load(Ordering::Relaxed)
    }

    /// The Redis keys of an entry: value, freshness marker, lease, fence
    /// hash, and its group's generation. All carry the group's hash tag, so
    /// every variant of a URL shares one cluster slot with the generation.
    fn keys(&self, key: &Key) -> [String; 6] {
        let prefix = &self.shared.config.prefix;
        let group = key.group();
        let generation = format!("{prefix}:{{{group}}}:g");
        let base = if key.is_group() {
            format!("{prefix}:{{{key}}}")
        } else {
            format!("{prefix}:{{{group}}}:{key}")
        };
        [
            format!("{base}:v"),
            format!("{base}:f"),
            format!("{base}:l"),
            format!("{base}:n"),
            generation,
            format!("{base}:x"),
        ]
    }

    /// Whether the circuit of the node that serves `key` lets calls
    /// through (on one server or behind Sentinel, the one circuit).
    pub(crate) fn is_available_for(&self, key: &Key) -> bool {
        self.shared.health.breaker(&route(key)).is_closed()
    }
}

/// A Redis key in the slot of every key of `key`'s entry (its hash tag).
fn route(key: &Key) -> String {
    if key.is_group() {
        format!("{{{key}}}")
    } else {
        format!("{{{}}}", key.group())
    }
}

impl RedisTier {
    /// For the lock's calls the caller is owed whatever the breaker says (a
    /// release, leaving the queue): tries `call` (on the link's connection,
    /// through the cluster client on a cluster; a cache key's owed calls
    /// use [`call_owed_until`](Self::call_owed_until)) until Redis answers
    /// or `until` passes, at least once, each try under the deadline and
    /// none through the circuit breaker. Errors that no retry can mend (a
    /// refused script, a permission) end it at once.
    pub(crate) async fn call_until<T, F, Fut>(
        self: &Arc<Self>,
        until: Instant,
        mut call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut pause = Duration::from_millis(5);
        loop {
            let error = match self.call_past_breaker(call(self.conn())).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let permanent = matches!(&error, TierError::Redis(e)
                if !e.may_have_run_or_transient());
            let left = until.saturating_duration_since(Instant::now());
            if permanent || left.is_zero() {
                return Err(error);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(RETRY_PAUSE_MAX);
        }
    }

    /// One try under the deadline, past the breaker. A
    /// failure is counted, and tells the supervisor (which follows a moved
    /// primary), like any call's.
    pub(crate) async fn call_past_breaker<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, TierError> {
        let shared = &self.shared;
        let error = match tokio::time::timeout(shared.config.deadline, call).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => TierError::Redis(e),
            Err(_) => TierError::Timeout,
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call past the breaker failed");
        if shared.config.topology.needs_resolve() {
            shared.signals.call_failed.notify_one();
        }
        Err(error)
    }
}

/// Whether trying again may help: the call may not have run, or the server
/// is between states (loading, failing over, a moved slot).
pub(crate) trait Retryable {
    fn may_have_run_or_transient(&self) -> bool;
}

impl Retryable for RedisError {
    fn may_have_run_or_transient(&self) -> bool {
        self.is_timeout()
            || self.is_io_error()
            || self.is_connection_dropped()
            || self.is_connection_refusal()
            || !matches!(self.retry_method(), RetryMethod::NoRetry)
            // Redis answered but is busy (a slow script, loading its data
            // set, a replica syncing): it will take the call soon.
            || matches!(self.code(), Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN"))
    }
}

impl Shared {
    fn link(&self) -> Arc<Link> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Opens new connections and swaps them in. Waiters are woken: messages
    /// sent while the old ones failed were lost.
    async fn reopen(&self) -> Result<(), RedisError> {
        // Messages published before the new subscription are not heard,
        // and a link that fails after subscribing leaves the gap open.
        let retired = Arc::new(AtomicBool::new(false));
        let opening = self.notifier.opening(retired.clone());
        let before = self.link();
        let link = open(
            &self.config,
            &self.channel,
            &self.ack_channel,
            &self.notifier,
            retired,
        )
        .await?;
        let old = {
            let mut current = self.link.write().unwrap_or_else(|p| p.into_inner());
            opening.swapped_in();
            if !Arc::ptr_eq(&current, &before) {
                // Another reopen, begun later (a failover announced while
                // this one waited on the old primary), swapped in first:
                // keep it.
                link.retired.store(true, Ordering::Release);
                return Ok(());
            }
            std::mem::replace(&mut *current, Arc::new(link))
        };
        old.retired.store(true, Ordering::Release);
        self.notifier.wake_all();
        // Only once the new subscription is in use: on a new primary the
        // scripts spare requests a NOSCRIPT retry, but a load that fails or
        // hangs (a node frozen on a cluster, `SCRIPT LOAD` refused to the
        // user) only leaves them to that retry. Had it kept the link from
        // being swapped in, the gap would stay open, and the in-process
        // tier untrusted, for as long as the load failed.
        if let Err(e) = load_scripts(&self.config, &self.link(), &self.scripts).await {
            tracing::debug!(error = %e, "cannot load the scripts on the new connections yet");
        }
        Ok(())
    }
}

/// Opens both connections and subscribes. The scripts are loaded after
/// (see [`load_scripts`]).
async fn open(
    config: &TierConfig,
    channel: &str,
    ack_channel: &str,
    notifier: &Arc<Notifier>,
    retired: Arc<AtomicBool>,
) -> Result<Link, RedisError> {
    let options = Options {
        connect_timeout: config.connect_timeout,
        deadline: config.deadline,
        tls: &config.tls,
        channel,
        ack_channel,
    };
    // Pushes from a link that has been replaced (closing down), or that
    // failed to open, are ignored.
    let sink = notifier.clone();
    let gone = retired.clone();
    let sink: Sink = Arc::new(move |push| {
        if !gone.load(Ordering::Acquire) {
            sink.on_push(push);
        }
    });
    connection::open(&config.topology, &options, sink, retired).await
}

/// Loads every script on `link`'s primaries (on a cluster, each of them).
async fn load_scripts(
    config: &TierConfig,
    link: &Link,
    scripts: &Scripts,
) -> Result<(), RedisError> {
    let mut loader = link.conn.clone();
    let load = async {
        for script in scripts.all() {
            script.load_async(&mut loader).await?;
        }
        Ok(())
    };
    connection::with_timeout(config.connect_timeout, "loading the scripts", load).await
}

/// Redis's eviction policy, if a `maxmemory` is set and the policy may evict
/// keys (anything but `noeviction`). `None` too when it cannot be read: a
/// user confined to the crate's commands may not run `INFO`.
async fn eviction_policy(conn: &Conn, limit: Duration) -> Option<String> {
    let mut conn = conn.clone();
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    let info = cmd.query_async::<String>(&mut conn);
    let info = match tokio::time::timeout(limit, info).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot read redis's eviction policy");
            return None;
        }
        Err(_) => return None,
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let limited = field("maxmemory").is_some_and(|bytes| bytes != "0");
    let policy = field("maxmemory_policy")?;
    (limited && policy != "noeviction").then(|| policy.to_owned())
}
