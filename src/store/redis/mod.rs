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
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod notify;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, ProtocolVersion, RedisError, Script};

use crate::codec::millis;
use crate::key::Key;
use crate::metrics::{self as m, count};
use crate::store::local::LocalTier;
use breaker::Breaker;
pub(crate) use lease::Lease;
use notify::{Event, Notifier};

/// How long the fence hash outlives the last lease on its key. A holder that
/// stalls longer than this could pass the fence check; nothing stalls a day.
const FENCE_KEEP: Duration = Duration::from_secs(24 * 3600);

/// Settings of the Redis tier.
#[derive(Clone, Debug)]
pub(crate) struct RedisConfig {
    pub url: String,
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
    conn: ConnectionManager,
    /// Kept so the subscription lives as long as the tier.
    subscriber: ConnectionManager,
    config: RedisConfig,
    channel: String,
    breaker: Breaker,
    pub(crate) notifier: Arc<Notifier>,
    scripts: Scripts,
    pub(crate) stats: TierStats,
}

impl RedisTier {
    /// Connects the command and subscriber connections, subscribes, and loads
    /// the scripts. Fails (with the server's reason) if Redis cannot be
    /// reached or refuses the credentials.
    pub(crate) async fn connect(
        config: RedisConfig,
        l1: LocalTier,
    ) -> Result<Arc<Self>, RedisError> {
        let info = config.url.as_str().into_connection_info()?;
        // RESP3 lets the subscriber receive pushes on a connection that the
        // manager reconnects and resubscribes by itself.
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(settings))?;

        let base = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.deadline))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = tokio::time::timeout(
            config.connect_timeout,
            ConnectionManager::new_with_config(client.clone(), base.clone()),
        )
        .await
        .map_err(|_| timeout_error("connecting to Redis"))??;

        let notifier = Arc::new(Notifier::new(l1));
        let sink = notifier.clone();
        let sub_config = base
            .set_push_sender(move |push| -> Result<(), redis::aio::SendError> {
                sink.on_push(push);
                Ok(())
            })
            .set_automatic_resubscription();
        let mut subscriber = tokio::time::timeout(
            config.connect_timeout,
            ConnectionManager::new_with_config(client, sub_config),
        )
        .await
        .map_err(|_| timeout_error("connecting to Redis"))??;
        let channel = format!("{}:events", config.prefix);
        subscriber.subscribe(&channel).await?;

        let scripts = Scripts::new();
        let mut loader = conn.clone();
        for script in scripts.all() {
            script.load_async(&mut loader).await?;
        }
        Ok(Arc::new(RedisTier {
            conn,
            subscriber,
            config,
            channel,
            breaker: Breaker::default(),
            notifier,
            scripts,
            stats: TierStats::default(),
        }))
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
        if self.breaker.failure() {
            tracing::warn!(
                "redis failing; serving from the in-process tier until it answers again"
            );
            self.start_probe();
        }
        Err(error)
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
                let ping = async {
                    let mut conn = t.conn.clone();
                    redis::cmd("PING").query_async::<()>(&mut conn).await?;
                    // The subscriber reconnects (and resubscribes) when used.
                    let mut sub = t.subscriber.clone();
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
        let mut conn = self.conn.clone();
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
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.commit.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation
            .arg(&lease.token)
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
    pub(crate) async fn release(self: &Arc<Self>, lease: &mut Lease) -> Result<bool, TierError> {
        lease.settle();
        self.release_token(&lease.key, &lease.token).await
    }

    pub(crate) async fn release_token(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        let [_, _, lease_key, _] = self.keys(key);
        let mut conn = self.conn.clone();
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
        let mut conn = self.conn.clone();
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
        let mut conn = self.conn.clone();
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

fn positive(ms: i64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

fn protocol_error() -> TierError {
    TierError::Redis(RedisError::from((
        redis::ErrorKind::Client,
        "unexpected reply from a stampede-guard script",
    )))
}

fn timeout_error(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}
