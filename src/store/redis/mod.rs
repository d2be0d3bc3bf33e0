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
//! its in-process tier alone. The tier's one background task, its
//! supervisor, closes the circuit again and repairs the connections; it
//! lives and dies with the tier.

mod breaker;
pub(crate) mod config;
pub(crate) mod connection;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod notify;
pub(crate) mod renew;
mod supervisor;
#[cfg(test)]
pub(crate) mod testing;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
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
use supervisor::{Signals, SupervisorGuard};

/// How long the fence hash outlives the last lease on its key, so idle keys
/// cost Redis nothing. A hash that expired (or was evicted, or lost to a
/// restart) starts again from Redis's clock in microseconds, above every
/// number issued before: expiry never lets numbers go back.
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

/// How long a lease may be held by a token whose release went unanswered,
/// when the caller does not know the lease's own time.
const DEFAULT_ORPHAN_WINDOW: Duration = Duration::from_secs(30);

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
    /// What requests and the supervisor both use.
    shared: Arc<Shared>,
    /// Fleet-wide wake-ups: waiters register here.
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) stats: TierStats,
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
    /// Requests read its flag; only the supervisor closes it.
    breaker: Breaker,
    notifier: Arc<Notifier>,
    scripts: Scripts,
    /// How requests ask the supervisor for help.
    signals: Signals,
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
        let scripts = Scripts::new();
        let link = open(&config, &channel, &notifier, &scripts).await?;
        let shared = Arc::new(Shared {
            link: RwLock::new(Arc::new(link)),
            config,
            channel,
            breaker: Breaker::default(),
            notifier: notifier.clone(),
            scripts,
            signals: Signals::default(),
        });
        Ok(Arc::new(RedisTier {
            _supervisor: supervisor::start(shared.clone()),
            shared,
            notifier,
            stats: TierStats::default(),
        }))
    }

    /// The command connection (a cheap clone).
    pub(crate) fn conn(&self) -> Conn {
        self.shared.link().conn.clone()
    }

    /// Whether the circuit lets calls through.
    pub(crate) fn is_available(&self) -> bool {
        self.shared.breaker.is_closed()
    }

    fn keys(&self, key: &Key) -> [String; 4] {
        let base = format!("{}:{{{key}}}", self.shared.config.prefix);
        [
            format!("{base}:v"),
            format!("{base}:f"),
            format!("{base}:l"),
            format!("{base}:n"),
        ]
    }

    /// Runs one Redis call under the deadline and the breaker. A failure
    /// signals the supervisor; the call itself never waits for it.
    async fn call<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, TierError> {
        let shared = &self.shared;
        if !shared.breaker.is_closed() {
            return Err(TierError::Open);
        }
        let error = match tokio::time::timeout(shared.config.deadline, call).await {
            Ok(Ok(value)) => {
                shared.breaker.success();
                return Ok(value);
            }
            Ok(Err(e)) => TierError::Redis(e),
            Err(_) => TierError::Timeout,
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        count(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call failed");
        if shared.config.topology.needs_resolve() {
            shared.signals.call_failed.notify_one();
        }
        if shared.breaker.failure() {
            tracing::warn!(
                "redis failing; serving from the in-process tier until it answers again"
            );
            shared.signals.circuit_opened.notify_one();
        }
        Err(error)
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
        let mut invocation = self.shared.scripts.fetch_or_lease.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation
            .arg(&token)
            .arg(millis(lease_time).max(1))
            .arg(early.map_or(-1, |d| millis(d).min(1 << 52) as i64))
            .arg(millis(FENCE_KEEP));
        let reply = self.call(invocation.invoke_async(&mut conn)).await;
        let (status, value, a, value_pttl): (i64, Vec<u8>, i64, i64) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                // The script may have run, and taken the lease, after we
                // stopped waiting: nobody else knows the token.
                if e.may_have_run() {
                    self.release_orphan(*key, token, lease_time);
                }
                return Err(e);
            }
        };
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
        let mut invocation = self.shared.scripts.commit.prepare_invoke();
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
            .arg(&self.shared.channel)
            .arg(Event::Committed.message(&lease.key))
            .arg(Event::Failed.message(&lease.key));
        let stored: i64 = match self.call(invocation.invoke_async(&mut conn)).await {
            Ok(stored) => stored,
            Err(e) => {
                // Whether or not the commit ran, the lease must not outlive
                // it: release it by its token (a no-op if the commit did).
                self.release_orphan(lease.key, lease.token().to_owned(), lease.time);
                return Err(e);
            }
        };
        if stored == 0 {
            self.stats.fenced_writes.fetch_add(1, Ordering::Relaxed);
            count(m::FENCED_WRITES);
            tracing::info!(key = %lease.key, fence = lease.fence.0, "late commit refused: a newer entry is stored");
        }
        Ok(stored == 1)
    }

    /// Gives the lease up without storing, telling waiters to retry now
    /// (`failure` `None`) or to share the rebuild's failure, with its code.
    /// Returns false if it was no longer ours.
    pub(crate) async fn release(
        self: &Arc<Self>,
        lease: &mut Lease,
        failure: Option<u8>,
    ) -> Result<bool, TierError> {
        lease.settle();
        if lease.is_lost() {
            // The token is gone from Redis (renewal refused, or the lease
            // lapsed): the compare-token script would do nothing, and a
            // failing Redis need not be asked again.
            return Ok(false);
        }
        let message = match failure {
            Some(code) => Event::failure(&lease.key, code),
            None => Event::Failed.message(&lease.key),
        };
        self.release_with(&lease.key, lease.token(), message, lease.time)
            .await
    }

    pub(crate) async fn release_token(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        self.release_with(
            key,
            token,
            Event::Failed.message(key),
            DEFAULT_ORPHAN_WINDOW,
        )
        .await
    }

    async fn release_with(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
        message: String,
        window: Duration,
    ) -> Result<bool, TierError> {
        match self.call(self.release_script(key, token, &message)).await {
            Ok(released) => Ok(released == 1),
            Err(e) => {
                // Unanswered, or not even sent (the circuit is open): the
                // lease is still held, and only this token can free it.
                self.release_orphan(*key, token.to_owned(), window);
                Err(e)
            }
        }
    }

    /// The release script itself, without the deadline or the breaker.
    async fn release_script(
        &self,
        key: &Key,
        token: &str,
        message: &str,
    ) -> Result<i64, RedisError> {
        let [_, _, lease_key, _] = self.keys(key);
        let mut conn = self.conn();
        self.shared
            .scripts
            .release
            .key(lease_key)
            .arg(token)
            .arg(&self.shared.channel)
            .arg(message)
            .invoke_async(&mut conn)
            .await
    }

    /// Releases a lease by its token in the background, for a call whose
    /// outcome is unknown (its deadline passed, its connection failed) or
    /// that could not be made: a script may have taken or kept the lease
    /// after the caller stopped waiting, and then nobody else could release
    /// it, and the fleet would wait it out. Retries past the circuit breaker
    /// until the lease would have lapsed by itself; a release of a token that
    /// no longer holds the lease does nothing.
    pub(crate) fn release_orphan(self: &Arc<Self>, key: Key, token: String, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tier = self.clone();
        let until = std::time::Instant::now() + lease;
        runtime.spawn(async move {
            let deadline = tier.shared.config.deadline;
            let message = Event::Failed.message(&key);
            let mut pause = deadline;
            loop {
                let attempt = tier.release_script(&key, &token, &message);
                if let Ok(Ok(released)) = tokio::time::timeout(deadline, attempt).await {
                    if released == 1 {
                        tracing::debug!(key = %key, "released a lease whose call had no answer");
                    }
                    return;
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
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
                self.shared
                    .scripts
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
                self.shared
                    .scripts
                    .invalidate
                    .key(value)
                    .key(fresh)
                    .key(fence)
                    .arg(&self.shared.channel)
                    .arg(self.notifier.invalidation(key))
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

impl Shared {
    fn link(&self) -> Arc<Link> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Opens new connections and swaps them in. Waiters are woken: messages
    /// sent while the old ones failed were lost.
    async fn reopen(&self) -> Result<(), RedisError> {
        let link = open(&self.config, &self.channel, &self.notifier, &self.scripts).await?;
        let old = std::mem::replace(
            &mut *self.link.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(link),
        );
        old.retired.store(true, Ordering::Release);
        self.notifier.wake_all();
        Ok(())
    }
}

/// Opens both connections, subscribes, and loads the scripts. Scripts are
/// not replicated with the data: a new primary needs them loaded, and
/// loading them now spares a request a NOSCRIPT retry inside its deadline.
async fn open(
    config: &TierConfig,
    channel: &str,
    notifier: &Arc<Notifier>,
    scripts: &Scripts,
) -> Result<Link, RedisError> {
    let options = Options {
        connect_timeout: config.connect_timeout,
        deadline: config.deadline,
        tls: &config.tls,
        channel,
    };
    // Pushes from a link that has been replaced (closing down) are ignored.
    let retired = Arc::new(AtomicBool::new(false));
    let sink = notifier.clone();
    let gone = retired.clone();
    let sink: Sink = Arc::new(move |push| {
        if !gone.load(Ordering::Acquire) {
            sink.on_push(push);
        }
    });
    let link = connection::open(&config.topology, &options, sink, retired).await?;
    let mut loader = link.conn.clone();
    for script in scripts.all() {
        script.load_async(&mut loader).await?;
    }
    Ok(link)
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
