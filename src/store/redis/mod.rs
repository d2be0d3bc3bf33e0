//! The shared tier: cached entries, rebuild leases and wake-ups in Redis.
//!
//! Every key of one entry shares a hash tag, `{prefix}:{<key>}:…`, so value,
//! freshness marker, lease and fence sit in one cluster slot and every script
//! touches one slot only:
//!
//! | key | holds | expires |
//! |---|---|---|
//! | `…:v` | the encoded entry | when its last stale window closes |
//! | `…:f` | freshness marker | when the entry stops being fresh (Redis's clock) |
//! | `…:l` | rebuild lease: the owner's token | after the lease time, unless renewed |
//! | `…:n` | fence hash: numbers issued and committed | a day after the last lease |
//!
//! Every call has a deadline. Failures feed a circuit breaker; while it is
//! open the engine does not call Redis at all and protects the process with
//! its in-process tier alone.

mod breaker;
pub(crate) mod config;
pub(crate) mod connection;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod notify;
pub(crate) mod renew;
#[cfg(test)]
pub(crate) mod testing;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use redis::{RedisError, Script};

use crate::key::Key;
use crate::metrics::{self as m, count};
use crate::store::millis;
use breaker::Breaker;
use config::TlsPem;
use connection::{Conn, Link, Options, Sink, Topology};
pub(crate) use lease::Lease;
use notify::{Event, Notifier, OnInvalidate};

/// How long the fence hash outlives the last lease on its key. A holder that
/// stalls longer than this could pass the fence check; nothing stalls a day.
const FENCE_KEEP: Duration = Duration::from_secs(24 * 3600);

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

impl std::fmt::Display for TierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierError::Open => f.write_str("circuit open"),
            TierError::Timeout => f.write_str("deadline passed"),
            TierError::Redis(e) => write!(f, "{e}"),
        }
    }
}

/// An entry as Redis holds it, with its remaining lifetimes.
pub(crate) struct Remote {
    pub bytes: Bytes,
    /// Remaining freshness; `None` when stale.
    pub fresh: Option<Duration>,
    /// Time until the value expires from Redis altogether, if it has a TTL.
    pub remaining: Option<Duration>,
}

/// What `fetch_or_lease` found.
pub(crate) enum Fetched {
    /// A fresh entry.
    Fresh(Remote),
    /// The lease is ours: rebuild, then commit. The old entry, if any.
    Leased { lease: Lease, stale: Option<Remote> },
    /// Someone else holds the lease for `lease_pttl`. The old entry, if any.
    Held {
        lease_pttl: Duration,
        stale: Option<Remote>,
    },
}

struct Scripts {
    fetch_or_lease: Script,
    commit: Script,
    release: Script,
    renew: Script,
    invalidate: Script,
    lock_acquire: Script,
    lock_release: Script,
    lock_renew: Script,
    lock_leave: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            fetch_or_lease: Script::new(include_str!("scripts/fetch_or_lease.lua")),
            commit: Script::new(include_str!("scripts/commit.lua")),
            release: Script::new(include_str!("scripts/release.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
            invalidate: Script::new(include_str!("scripts/invalidate.lua")),
            lock_acquire: Script::new(include_str!("scripts/lock_acquire.lua")),
            lock_release: Script::new(include_str!("scripts/lock_release.lua")),
            lock_renew: Script::new(include_str!("scripts/lock_renew.lua")),
            lock_leave: Script::new(include_str!("scripts/lock_leave.lua")),
        }
    }

    fn all(&self) -> [&Script; 9] {
        [
            &self.fetch_or_lease,
            &self.commit,
            &self.release,
            &self.renew,
            &self.invalidate,
            &self.lock_acquire,
            &self.lock_release,
            &self.lock_renew,
            &self.lock_leave,
        ]
    }
}

/// Counters of the shared tier, for diagnostics and tests.
#[derive(Default)]
pub(crate) struct TierStats {
    pub fenced_writes: AtomicU64,
    pub corrupt_entries: AtomicU64,
    pub errors: AtomicU64,
}

pub(crate) struct RedisTier {
    /// The connections; replaced when a Sentinel-managed primary moves.
    link: RwLock<Arc<Link>>,
    config: TierConfig,
    channel: String,
    breaker: Breaker,
    /// Set while a task asks the sentinels where the primary is.
    following: AtomicBool,
    pub(crate) notifier: Arc<Notifier>,
    scripts: Scripts,
    pub(crate) stats: TierStats,
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
        let notifier = Arc::new(Notifier::new(on_invalidate));
        let channel = format!("{}:events", config.prefix);
        let link = Self::open(&config, &channel, &notifier).await?;
        let scripts = Scripts::new();
        let mut loader = link.conn.clone();
        for script in scripts.all() {
            script.load_async(&mut loader).await?;
        }
        let cluster = matches!(config.topology, Topology::Cluster(_));
        let tier = Arc::new(RedisTier {
            link: RwLock::new(Arc::new(link)),
            config,
            channel,
            breaker: Breaker::default(),
            following: AtomicBool::new(false),
            notifier,
            scripts,
            stats: TierStats::default(),
        });
        if cluster {
            tier.start_keeper();
        }
        Ok(tier)
    }

    async fn open(
        config: &TierConfig,
        channel: &str,
        notifier: &Arc<Notifier>,
    ) -> Result<Link, RedisError> {
        let options = Options {
            connect_timeout: config.connect_timeout,
            deadline: config.deadline,
            tls: &config.tls,
            channel,
        };
        let retired = Arc::new(AtomicBool::new(false));
        let sink = notifier.clone();
        let gone = retired.clone();
        let sink: Sink = Arc::new(move |push| {
            if !gone.load(Ordering::Acquire) {
                sink.on_push(push);
            }
        });
        connection::open(&config.topology, &options, sink, retired).await
    }

    /// Opens new connections, loads the scripts on them and swaps them in.
    /// Waiters are woken: messages sent while the old ones failed were lost.
    async fn reopen(&self) -> Result<(), RedisError> {
        let link = Self::open(&self.config, &self.channel, &self.notifier).await?;
        // Scripts are not replicated with the data: load them now rather
        // than pay a NOSCRIPT retry inside a request's deadline.
        let mut loader = link.conn.clone();
        for script in self.scripts.all() {
            script.load_async(&mut loader).await?;
        }
        let old = std::mem::replace(
            &mut *self.link.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(link),
        );
        old.retired.store(true, Ordering::Release);
        self.notifier.wake_all();
        Ok(())
    }

    /// On a cluster, keeps the subscription alive across the loss of the
    /// node it was on. The client moves subscriptions when it refreshes its
    /// slot map, but the subscriber sends no commands that would make it
    /// refresh; so after a disconnection the tier opens a new subscriber
    /// (and command client) once the cluster is whole again.
    fn start_keeper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tier = Arc::downgrade(self);
        let notifier = self.notifier.clone();
        runtime.spawn(async move {
            loop {
                notifier.disconnected.notified().await;
                loop {
                    let interval = match tier.upgrade() {
                        Some(t) => t.config.probe_interval,
                        None => return,
                    };
                    tokio::time::sleep(interval).await;
                    let Some(t) = tier.upgrade() else { return };
                    let limit = t.config.connect_timeout;
                    match tokio::time::timeout(limit, t.reopen()).await {
                        Ok(Ok(())) => {
                            tracing::info!("redis cluster subscription re-established");
                            break;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "cannot re-subscribe to the cluster yet");
                        }
                        Err(_) => {}
                    }
                }
            }
        });
    }

    fn link(&self) -> Arc<Link> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The command connection (a cheap clone).
    pub(crate) fn conn(&self) -> Conn {
        self.link().conn.clone()
    }

    /// Behind Sentinel: asks where the primary is now and, if it moved,
    /// opens new connections to it and swaps them in. Waiters are woken,
    /// since messages published on the new primary before the swap were
    /// not heard.
    async fn follow_primary(&self) -> Result<(), RedisError> {
        let Topology::Sentinel {
            sentinels, service, ..
        } = &self.config.topology
        else {
            return Ok(());
        };
        let options = Options {
            connect_timeout: self.config.connect_timeout,
            deadline: self.config.deadline,
            tls: &self.config.tls,
            channel: &self.channel,
        };
        let address = connection::resolve(sentinels, service, &options).await?;
        if self.link().primary.as_ref() == Some(&address) {
            return Ok(());
        }
        self.reopen().await?;
        tracing::info!(host = %address.0, port = address.1, "redis primary moved; following it");
        Ok(())
    }

    /// Whether the circuit lets calls through.
    pub(crate) fn is_available(&self) -> bool {
        self.breaker.is_closed()
    }

    fn keys(&self, key: &Key) -> [String; 4] {
        let base = format!("{}:{{{key}}}", self.config.prefix);
        [
            format!("{base}:v"),
            format!("{base}:f"),
            format!("{base}:l"),
            format!("{base}:n"),
        ]
    }

    /// Runs one Redis call under the deadline and the breaker.
    async fn call<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, TierError> {
        if !self.breaker.is_closed() {
            return Err(TierError::Open);
        }
        let error = match tokio::time::timeout(self.config.deadline, call).await {
            Ok(Ok(value)) => {
                self.breaker.success();
                return Ok(value);
            }
            Ok(Err(e)) => TierError::Redis(e),
            Err(_) => TierError::Timeout,
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        count(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call failed");
        if self.config.topology.needs_resolve() {
            self.start_follow();
        }
        if self.breaker.failure() {
            tracing::warn!(
                "redis failing; serving from the in-process tier until it answers again"
            );
            self.start_probe();
        }
        Err(error)
    }

    /// Behind Sentinel, a failed call may mean the primary moved: ask the
    /// sentinels now (one task at a time) rather than only once the circuit
    /// has opened, so an instance that was idle during a failover loses at
    /// most the call that found the old primary gone.
    fn start_follow(self: &Arc<Self>) {
        if self.following.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.following.store(false, Ordering::Release);
            return;
        };
        let tier = Arc::downgrade(self);
        runtime.spawn(async move {
            let Some(t) = tier.upgrade() else { return };
            let limit = t.config.connect_timeout;
            if let Ok(Err(e)) = tokio::time::timeout(limit, t.follow_primary()).await {
                tracing::debug!(error = %e, "cannot follow the redis primary yet");
            }
            t.following.store(false, Ordering::Release);
        });
    }

    /// Pings Redis in the background until it answers, then closes the circuit.
    fn start_probe(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tier: Weak<Self> = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                let interval = match tier.upgrade() {
                    Some(t) => t.config.probe_interval,
                    None => return,
                };
                tokio::time::sleep(interval).await;
                let Some(t) = tier.upgrade() else { return };
                if t.config.topology.needs_resolve() {
                    let limit = t.config.connect_timeout;
                    match tokio::time::timeout(limit, t.follow_primary()).await {
                        Ok(Ok(())) => {}
                        // The sentinels may be unreachable while the primary
                        // is fine: the ping below decides.
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "cannot follow the redis primary yet");
                        }
                        Err(_) => {}
                    }
                }
                let link = t.link();
                let ping = async {
                    let mut conn = link.conn.clone();
                    redis::cmd("PING").query_async::<()>(&mut conn).await?;
                    // The subscriber reconnects (and resubscribes) when used.
                    let mut sub = link.subscriber.clone();
                    redis::cmd("PING").query_async::<()>(&mut sub).await
                };
                if let Ok(Ok(())) = tokio::time::timeout(t.config.deadline, ping).await {
                    tracing::info!("redis answers again; fleet-wide protection restored");
                    t.breaker.close();
                    return;
                }
            }
        });
    }

    /// Returns the entry if fresh; otherwise tries to take the lease. With
    /// `early`, also takes the lease for a fresh entry that has no more than
    /// that much freshness left. One round trip.
    pub(crate) async fn fetch_or_lease(
        self: &Arc<Self>,
        key: &Key,
        lease_time: Duration,
        early: Option<Duration>,
    ) -> Result<Fetched, TierError> {
        let keys = self.keys(key);
        let token = Lease::new_token();
        let mut conn = self.conn();
        let mut invocation = self.scripts.fetch_or_lease.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation
            .arg(&token)
            .arg(millis(lease_time).max(1))
            .arg(early.map_or(-1, |d| millis(d).min(1 << 52) as i64))
            .arg(millis(FENCE_KEEP));
        let (status, value, a, value_pttl): (i64, Vec<u8>, i64, i64) =
            self.call(invocation.invoke_async(&mut conn)).await?;
        let remote = |fresh: Option<Duration>| {
            (!value.is_empty()).then(|| Remote {
                bytes: Bytes::from(value.clone()),
                fresh,
                remaining: positive(value_pttl),
            })
        };
        Ok(match status {
            1 => match remote(positive(a)) {
                Some(entry) => Fetched::Fresh(entry),
                None => return Err(protocol_error()),
            },
            2 => Fetched::Leased {
                stale: remote(None),
                lease: Lease::new(self.clone(), *key, token, a.max(0) as u64, lease_time),
            },
            3 => Fetched::Held {
                lease_pttl: positive(a).unwrap_or(Duration::ZERO),
                stale: remote(None),
            },
            _ => return Err(protocol_error()),
        })
    }

    /// Stores a rebuilt entry under the lease's fence, releases the lease and
    /// wakes the fleet. Returns false if a newer entry won.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        lease: &mut Lease,
        entry: Bytes,
        fresh: Duration,
        keep: Duration,
    ) -> Result<bool, TierError> {
        lease.settle();
        let keys = self.keys(&lease.key);
        let mut conn = self.conn();
        let mut invocation = self.scripts.commit.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation
            .arg(lease.token())
            .arg(lease.fence.0)
            .arg(entry.as_ref())
            .arg(millis(fresh))
            .arg(millis(keep).max(1))
            .arg(millis(FENCE_KEEP))
            .arg(&self.channel)
            .arg(Event::Committed.message(&lease.key))
            .arg(Event::Failed.message(&lease.key));
        let stored: i64 = self.call(invocation.invoke_async(&mut conn)).await?;
        if stored == 0 {
            self.stats.fenced_writes.fetch_add(1, Ordering::Relaxed);
            count(m::FENCED_WRITES);
            tracing::info!(key = %lease.key, fence = lease.fence.0, "late commit refused: a newer entry is stored");
        }
        Ok(stored == 1)
    }

    /// Gives the lease up without storing, telling waiters to retry now.
    /// Returns false if it was no longer ours.
    pub(crate) async fn release(self: &Arc<Self>, lease: &mut Lease) -> Result<bool, TierError> {
        lease.settle();
        if lease.is_lost() {
            // The token is gone from Redis (renewal refused, or the lease
            // lapsed): the compare-token script would do nothing, and a
            // failing Redis need not be asked again.
            return Ok(false);
        }
        self.release_token(&lease.key, lease.token()).await
    }

    pub(crate) async fn release_token(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        let [_, _, lease_key, _] = self.keys(key);
        let mut conn = self.conn();
        let released: i64 = self
            .call(
                self.scripts
                    .release
                    .key(lease_key)
                    .arg(token)
                    .arg(&self.channel)
                    .arg(Event::Failed.message(key))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(released == 1)
    }

    pub(crate) async fn renew(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
        time: Duration,
    ) -> Result<bool, TierError> {
        let [_, _, lease_key, _] = self.keys(key);
        let mut conn = self.conn();
        let renewed: i64 = self
            .call(
                self.scripts
                    .renew
                    .key(lease_key)
                    .arg(token)
                    .arg(millis(time).max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(renewed == 1)
    }

    /// Drops the entry from Redis and from every instance's L1.
    pub(crate) async fn invalidate(self: &Arc<Self>, key: &Key) -> Result<(), TierError> {
        let [value, fresh, _, fence] = self.keys(key);
        let mut conn = self.conn();
        let _: i64 = self
            .call(
                self.scripts
                    .invalidate
                    .key(value)
                    .key(fresh)
                    .key(fence)
                    .arg(&self.channel)
                    .arg(Event::Invalidated.message(key))
                    .arg(millis(FENCE_KEEP))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    pub(crate) fn count_corrupt(&self, key: &Key) {
        self.stats.corrupt_entries.fetch_add(1, Ordering::Relaxed);
        count(m::CORRUPT_ENTRIES);
        tracing::warn!(key = %key, "unreadable entry in Redis; treating it as a miss");
    }
}

impl Drop for RedisTier {
    fn drop(&mut self) {
        // Lets a keeper task waiting for a disconnection see the tier gone.
        self.notifier.disconnected.notify_one();
    }
}

fn positive(ms: i64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

fn protocol_error() -> TierError {
    TierError::Redis(RedisError::from((
        redis::ErrorKind::Client,
        "unexpected reply from a stampede-guard script",
    )))
}
