//! Where cached values live.
//!
//! A [`Backend`] owns the tiers every guard built on it shares: the byte-bounded
//! L1 and the in-process flights. Clone it freely; clones share everything, so
//! one backend serves every route of a service (and the generic
//! [`Cache`](crate::Cache) too), under one memory bound.

use std::fmt;
#[cfg(feature = "redis")]
use std::sync::atomic::Ordering;
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::time::Duration;

use crate::engine::Engine;
use crate::lock::LocalLocks;
use crate::store::local::LocalTier;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisConfig, RedisTier};

/// Default L1 bound: 64 MiB of cached values.
pub const DEFAULT_L1_MAX_BYTES: u64 = 64 << 20;

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
}

impl Backend {
    /// The embedded backend: an in-process L1 with in-process coalescing. It
    /// needs no server and protects one process.
    pub fn local() -> Self {
        Self::builder().build()
    }

    /// Settings for a backend.
    pub fn builder() -> BackendBuilder {
        BackendBuilder {
            l1_max_bytes: DEFAULT_L1_MAX_BYTES,
        }
    }

    /// Bytes the L1 holds now (entries are weighed by body, headers and a fixed
    /// overhead). Applies pending evictions first, so it is exact but not free:
    /// meant for diagnostics and tests, not the request path.
    pub fn l1_weighted_size(&self) -> u64 {
        self.engine.l1().weighted_size()
    }

    /// The L1's bound in bytes.
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
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Self, Error> {
        Self::redis_builder(url).connect().await
    }

    /// Settings for a Redis-backed backend: an L1 in each process in front of
    /// a Redis shared by the fleet, which holds the entries, the rebuild
    /// leases and the wake-up channel.
    #[cfg(feature = "redis")]
    pub fn redis_builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            l1_max_bytes: DEFAULT_L1_MAX_BYTES,
            config: RedisConfig {
                url: url.to_owned(),
                prefix: "sg".to_owned(),
                deadline: Duration::from_millis(50),
                connect_timeout: Duration::from_secs(2),
                probe_interval: Duration::from_millis(250),
            },
        }
    }

    /// Counters and state, for diagnostics.
    pub fn stats(&self) -> BackendStats {
        BackendStats {
            l1_bytes: self.l1_weighted_size(),
            #[cfg(feature = "redis")]
            redis: self.engine.l2().map(|l2| RedisStats {
                available: l2.is_available(),
                wakeups_by_message: l2.notifier.stats.by_message.load(Ordering::Relaxed),
                wakeups_by_timeout: l2.notifier.stats.by_timeout.load(Ordering::Relaxed),
                fenced_writes: l2.stats.fenced_writes.load(Ordering::Relaxed),
                corrupt_entries: l2.stats.corrupt_entries.load(Ordering::Relaxed),
                errors: l2.stats.errors.load(Ordering::Relaxed),
            }),
        }
    }
}

/// A snapshot of a backend's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Bytes held by the in-process tier.
    pub l1_bytes: u64,
    /// The Redis tier's counters, if the backend has one.
    #[cfg(feature = "redis")]
    pub redis: Option<RedisStats>,
}

/// Counters of the Redis tier.
#[cfg(feature = "redis")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// False while the circuit breaker is open (Redis failing; serving from
    /// the in-process tier alone).
    pub available: bool,
    /// Waits for another instance's rebuild ended by its publish.
    pub wakeups_by_message: u64,
    /// Waits ended by the lease or the wait budget running out.
    pub wakeups_by_timeout: u64,
    /// Late commits refused because a newer entry was stored.
    pub fenced_writes: u64,
    /// Unreadable entries found at our keys (treated as misses).
    pub corrupt_entries: u64,
    /// Calls that failed or missed their deadline.
    pub errors: u64,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("l1_max_bytes", &self.l1_max_bytes())
            .finish()
    }
}

/// Why a backend could not be set up.
#[derive(Debug)]
pub struct Error {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

/// Builds a [`Backend`] on Redis.
#[cfg(feature = "redis")]
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    l1_max_bytes: u64,
    config: RedisConfig,
}

#[cfg(feature = "redis")]
impl RedisBackendBuilder {
    /// Bound of each process's in-process tier, in bytes (default 64 MiB).
    pub fn l1_max_bytes(mut self, bytes: u64) -> Self {
        self.l1_max_bytes = bytes;
        self
    }

    /// Prefix of every Redis key and of the event channel (default `sg`).
    /// Services that share a Redis but not their caches use different ones.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The longest any Redis call may take (default 50 ms). A request never
    /// waits on a slow or dead Redis longer than this; repeated failures open
    /// the circuit and the layer runs on its in-process tier alone.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.config.deadline = deadline;
        self
    }

    /// How long connecting may take at start-up (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How often an open circuit pings Redis to see whether it is back
    /// (default 250 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.config.probe_interval = interval;
        self
    }

    /// Connects, subscribes to the event channel and loads the scripts.
    /// Fails with the server's reason if Redis is unreachable or refuses the
    /// credentials: a misconfigured backend is a start-up error, not a
    /// silent fallback.
    pub async fn connect(self) -> Result<Backend, Error> {
        let l1 = LocalTier::new(self.l1_max_bytes);
        let shown = redact(&self.config.url);
        let tier = RedisTier::connect(self.config, l1.clone())
            .await
            .map_err(|e| Error {
                message: format!("could not set up Redis at {shown}: {e}"),
                source: Some(Box::new(e)),
            })?;
        Ok(Backend {
            engine: Arc::new(Engine::with_l2(l1, tier)),
            locks: Arc::default(),
        })
    }
}

/// The URL without its password, for messages.
#[cfg(feature = "redis")]
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Builds a [`Backend`].
#[derive(Clone, Debug)]
pub struct BackendBuilder {
    l1_max_bytes: u64,
}

impl BackendBuilder {
    /// Bound of the in-process tier, in bytes (default 64 MiB). A value larger
    /// than the whole bound is never kept in L1.
    pub fn l1_max_bytes(mut self, bytes: u64) -> Self {
        self.l1_max_bytes = bytes;
        self
    }

    /// Builds the backend.
    pub fn build(self) -> Backend {
        Backend {
            engine: Arc::new(Engine::new(LocalTier::new(self.l1_max_bytes))),
            locks: Arc::default(),
        }
    }
}
