//! The same protection for any async value, without HTTP.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::engine::{
    Answer, Built, CacheValue, FailureKind, FlightPolicy, Held, Lifetime, Looked, Overtaken,
    Rebuild, SharedError, TagSet,
};
use crate::key::Key;
use crate::limits;
use crate::metrics::Labels;
use crate::store::generations::{Field, Scope};

/// The route label of a cache that was given no name.
const UNNAMED: &str = "unnamed";

/// A stampede-safe cache of `V` values: concurrent misses for one key run the
/// rebuild once and share its result, stale values can be served while one
/// refresh runs, and a failed rebuild can fall back on a stale value.
///
/// On a Redis backend a value is rebuilt once for the whole fleet only if
/// its type is shared: [`CacheValue::SHARED`] is `true` and it implements
/// `encode` and `decode`, as [`Bytes`](bytes::Bytes), `String` and `Vec<u8>`
/// do. Any other value type is rebuilt once per key **per instance**, each
/// process caching and coalescing its own (see [`CacheValue`]).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use stampede_guard::{Backend, Cache};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cache: Cache<Bytes> = Cache::new(Backend::local()).ttl(Duration::from_secs(30));
/// let row = cache
///     .get_or_rebuild("user:42", || async {
///         // An expensive query would go here.
///         Ok::<_, std::io::Error>(Bytes::from_static(b"{\"name\":\"Ada\"}"))
///     })
///     .await
///     .expect("rebuild failed");
/// assert_eq!(&row[..], b"{\"name\":\"Ada\"}");
/// # }
/// ```
pub struct Cache<V> {
    backend: Backend,
    settings: Arc<Settings>,
    _value: PhantomData<fn() -> V>,
}

#[derive(Clone, Debug)]
struct Settings {
    namespace: String,
    /// The namespace, as the generations name it.
    scope: Scope,
    route: Option<String>,
    /// The metric labels of `route` in `namespace`, made once.
    labels: Labels,
    lifetime: Lifetime,
    wait_budget: Duration,
    lease: Duration,
    rebuild_timeout: Duration,
    early_refresh: Option<f64>,
}

impl Settings {
    fn relabel(&mut self) {
        let route = self.route.as_deref().unwrap_or(UNNAMED);
        self.labels = Labels::of(route, &self.namespace);
    }
}

impl<V> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Cache {
            backend: self.backend.clone(),
            settings: self.settings.clone(),
            _value: PhantomData,
        }
    }
}

impl<V> std::fmt::Debug for Cache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("settings", &self.settings)
            .finish()
    }
}

impl<V: CacheValue> Cache<V> {
    /// A cache on `backend`: 10 s ttl, no stale windows, 10 s wait budget.
    ///
    /// ```
    /// use stampede_guard::{Backend, Cache};
    ///
    /// let cache: Cache<String> = Cache::new(Backend::local());
    /// ```
    #[must_use]
    pub fn new(backend: Backend) -> Self {
        crate::metrics::describe_once();
        Cache {
            backend,
            settings: Arc::new(Settings {
                namespace: String::new(),
                scope: Scope::ROOT,
                route: None,
                labels: Labels::of(UNNAMED, ""),
                lifetime: Lifetime {
                    ttl: Duration::from_secs(10),
                    ..Lifetime::default()
                },
                wait_budget: Duration::from_secs(10),
                lease: Duration::from_secs(5),
                rebuild_timeout: Duration::from_secs(30),
                early_refresh: None,
            }),
            _value: PhantomData,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// How long a value is fresh (default 10 s). From 0 to 2^31 s, a
    /// longer one taken as 2^31 s; at 0 nothing is stored, and concurrent
    /// calls for a key still share one rebuild.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).ttl(Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|s| s.lifetime.ttl = limits::TTL.clamp(ttl))
    }

    /// After the ttl, how long a value is still returned at once while one
    /// caller's rebuild refreshes it in the background. Default 0 (none);
    /// from 0 to 2^31 s, a longer one taken as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).stale_while_revalidate(Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn stale_while_revalidate(self, window: Duration) -> Self {
        self.with(|s| {
            s.lifetime.stale_while_revalidate = limits::STALE_WHILE_REVALIDATE.clamp(window)
        })
    }

    /// After the ttl, how long a value may stand in for a failed rebuild.
    /// Default 0 (none); from 0 to 2^31 s, a longer one taken as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).stale_if_error(Duration::from_secs(600));
    /// ```
    #[must_use]
    pub fn stale_if_error(self, window: Duration) -> Self {
        self.with(|s| s.lifetime.stale_if_error = limits::STALE_IF_ERROR.clamp(window))
    }

    /// How long a rebuild waits, at least, for another instance's rebuild of
    /// the same key before running its own (default 10 s). It waits longer
    /// if the other may run longer: up to the rebuild timeout plus a lease.
    /// From 0 to 2^31 s, a longer one taken as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).wait_budget(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn wait_budget(self, budget: Duration) -> Self {
        self.with(|s| s.wait_budget = limits::WAIT_BUDGET.clamp(budget))
    }

    /// Fleet-wide rebuild lease time (default 5 s), renewed every third of it
    /// while a rebuild runs. Only used with a Redis backend. From 1 ms to
    /// 2^31 s: a shorter one is taken as 1 ms, a longer one as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).lease(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|s| s.lease = limits::LEASE.clamp(lease))
    }

    /// The longest a rebuild may run (default 30 s); past it the rebuild is
    /// abandoned and its callers get stale-if-error or
    /// [`RebuildError::TimedOut`]. From 1 ms to 2^31 s: a shorter one is
    /// taken as 1 ms, a longer one as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).rebuild_timeout(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn rebuild_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.rebuild_timeout = limits::REBUILD_TIMEOUT.clamp(timeout))
    }

    /// Probabilistic early refresh (XFetch) with this `beta`; see
    /// [`StampedeGuard::early_refresh`](crate::StampedeGuard::early_refresh).
    /// Off by default; a finite number, at least 0: 0 turns it off, and so
    /// does a value out of that range (NaN, an infinity, a negative number).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).early_refresh(1.0);
    /// ```
    #[must_use]
    pub fn early_refresh(self, beta: f64) -> Self {
        let beta = Some(limits::ratio(beta)).filter(|beta| *beta > 0.0);
        self.with(|s| s.early_refresh = beta)
    }

    /// Prefix for every key, to keep apart caches sharing a backend. A
    /// namespace is a service's whole cache world: this cache shares it,
    /// and its purges ([`invalidate_all`](Self::invalidate_all)), with
    /// every cache and [`StampedeGuard`](crate::StampedeGuard) of the same
    /// namespace on the backend's fleet, and with no other.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Cache};
    /// let cache: Cache<String> = Cache::new(Backend::local()).namespace("prices");
    /// ```
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        let scope = self.backend.engine.scope(&namespace);
        self.with(|s| {
            s.namespace = namespace;
            s.scope = scope;
            s.relabel();
        })
    }

    /// The `route` label of this cache's metrics (default `unnamed`; the
    /// `namespace` label is its [namespace](Self::namespace)). A name the
    /// code gives, never data from a request: every distinct name is a
    /// series of its own for the life of the process. An empty name is no
    /// name.
    ///
    /// ```
    /// use stampede_guard::{Backend, Cache};
    /// let prices: Cache<String> = Cache::new(Backend::local()).route_name("fx-rates");
    /// ```
    #[must_use]
    pub fn route_name(self, name: impl Into<String>) -> Self {
        let name: String = name.into();
        self.with(|s| {
            s.route = (!name.is_empty()).then_some(name);
            s.relabel();
        })
    }

    fn key(&self, key: &[u8]) -> Key {
        Key::for_value(&self.settings.namespace, key)
    }

    /// Returns the cached value for `key`, or runs `rebuild` to make it.
    ///
    /// Concurrent callers for one key share a single `rebuild`: the first
    /// starts it, the others wait for its value. The rebuild runs on its own
    /// task: it finishes and fills the cache even if every caller waiting for
    /// it has gone (bounded by the [rebuild timeout](Self::rebuild_timeout)).
    /// A stale value inside stale-while-revalidate is returned at once while
    /// `rebuild` runs in the background; one inside stale-if-error is returned
    /// when `rebuild` fails.
    ///
    /// # Errors
    ///
    /// When the rebuild failed and no stale value may stand in. Every caller
    /// that waited for the same rebuild gets the same error (hence `Arc<E>`,
    /// as in `moka`'s `try_get_with`); no failure sends the waiters to run
    /// their own rebuilds. See [`RebuildError`].
    ///
    /// # Panics
    ///
    /// If `rebuild` panics, the caller that started it panics with the same
    /// payload, as it would without the cache; the callers waiting for it get
    /// [`RebuildError::Panicked`].
    ///
    /// ```
    /// use stampede_guard::{Backend, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cache: Cache<String> = Cache::new(Backend::local());
    /// let price = cache
    ///     .get_or_rebuild("eur-usd", || async { Ok::<_, std::io::Error>("1.08".to_owned()) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(price, "1.08");
    /// # }
    /// ```
    pub fn get_or_rebuild<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        rebuild: F,
    ) -> impl Future<Output = Result<V, RebuildError<E>>> + Send
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        // The future owns what it uses (the key, a handle on the engine, the
        // policy) and declares itself `Send`: callers never depend on how the
        // compiler judges the borrows inside it, so it is `Send` for every
        // lifetime, as `tokio::spawn` asks, whatever future `rebuild` returns.
        let key = self.key(key.as_ref());
        let engine = Arc::clone(&self.backend.engine);
        let policy = self.flight();
        let closure = Closure {
            rebuild,
            lifetime: self.settings.lifetime,
            _types: PhantomData,
        };
        async move {
            let miss = match engine.lookup::<V>(key, &policy, Instant::now()) {
                Looked::Hit { held, refresh, .. } => {
                    if let Some(refresh) = refresh {
                        engine.refresh(refresh, policy, closure);
                    }
                    return Ok(held.value().clone());
                }
                Looked::Miss(miss) => miss,
            };
            match engine.resolve(miss, policy, closure).await {
                Answer::Served(served) | Answer::Shared(served, _) => {
                    Ok(served.held.value().clone())
                }
                Answer::Private(error) => Err(RebuildError::Failed(error)),
                Answer::Failed(failure, _) => Err(match failure.kind {
                    FailureKind::Panic => RebuildError::Panicked,
                    FailureKind::Timeout | FailureKind::WaitTimeout => RebuildError::TimedOut,
                    FailureKind::Error => match failure.error.map(|e| e.downcast::<E>()) {
                        Some(Ok(error)) => RebuildError::Failed(error),
                        // Another call site's error type, under the same key.
                        _ => RebuildError::Other,
                    },
                }),
                Answer::Alone(closure) => (closure.rebuild)()
                    .await
                    .map_err(|e| RebuildError::Failed(Arc::new(e))),
                Answer::Panicked(payload) => std::panic::resume_unwind(payload),
            }
        }
    }

    fn flight(&self) -> FlightPolicy {
        FlightPolicy {
            lease: self.settings.lease,
            wait_budget: self.settings.wait_budget,
            fail_open: true,
            rebuild_timeout: self.settings.rebuild_timeout,
            early_refresh: self.settings.early_refresh,
            labels: self.settings.labels,
            refresh_ahead: None,
            scope: self.settings.scope,
        }
    }

    /// The value for `key` if it is fresh, without rebuilding.
    ///
    /// ```
    /// # use stampede_guard::{Backend, Cache};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cache: Cache<String> = Cache::new(Backend::local());
    /// assert_eq!(cache.get("eur-usd"), None);
    /// cache
    ///     .get_or_rebuild("eur-usd", || async { Ok::<_, std::io::Error>("1.08".to_owned()) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(cache.get("eur-usd").as_deref(), Some("1.08"));
    /// # }
    /// ```
    pub fn get(&self, key: impl AsRef<[u8]>) -> Option<V> {
        self.backend
            .engine
            .peek::<V>(&self.key(key.as_ref()), self.settings.scope, Instant::now())
            .map(|held| held.value().clone())
    }

    /// Drops the value for `key`, here and (with Redis) everywhere in the
    /// fleet; the next caller rebuilds it. The key holds the cache's
    /// [namespace](Self::namespace): the same key in another namespace is
    /// kept.
    ///
    /// It is a barrier: once it returns `Ok`, no call that starts
    /// afterwards, here or (with Redis) on any instance, gets a value built
    /// before it. A rebuild that was already running stores nothing, and
    /// answers only the callers that were already waiting for it.
    ///
    /// With Redis it returns once every instance that received the
    /// invalidation acknowledged it, or after one subscription lease if
    /// some did not; those have stopped trusting what they read before it.
    /// The exact guarantee is the one of
    /// [`StampedeGuard::invalidate`](crate::StampedeGuard::invalidate).
    ///
    /// # Errors
    ///
    /// When the backend has a Redis tier and the invalidation did not reach
    /// it. This process has dropped the value all the same, takes nothing
    /// of this key from Redis until Redis has the invalidation, and retries
    /// it in the background; other instances may serve the old value until
    /// then.
    ///
    /// ```
    /// # use stampede_guard::{Backend, Cache};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cache: Cache<String> = Cache::new(Backend::local());
    /// cache
    ///     .get_or_rebuild("eur-usd", || async { Ok::<_, std::io::Error>("1.08".to_owned()) })
    ///     .await
    ///     .unwrap();
    /// cache.invalidate("eur-usd").await.unwrap();
    /// assert_eq!(cache.get("eur-usd"), None);
    /// # }
    /// ```
    pub async fn invalidate(&self, key: impl AsRef<[u8]>) -> Result<(), crate::Error> {
        let key = key.as_ref();
        // Enough bytes for the characters a log line shows, no more.
        let shown = &key[..key.len().min(4 * crate::key::SHOWN_MAX)];
        let what = format!("cache key {}", String::from_utf8_lossy(shown));
        self.backend.engine.invalidate(&self.key(key), &what).await
    }

    /// Drops every value of this cache's [namespace](Self::namespace) (every
    /// cache and every [`StampedeGuard`](crate::StampedeGuard) route on the
    /// backend with the same namespace; all with none share one), here and
    /// on every instance, in O(1); the values of other namespaces are kept.
    /// The same barrier and errors as
    /// [`StampedeGuard::invalidate_all`](crate::StampedeGuard::invalidate_all).
    ///
    /// ```
    /// # use stampede_guard::{Backend, Cache};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cache: Cache<String> = Cache::new(Backend::local());
    /// cache.invalidate_all().await.unwrap();
    /// # }
    /// ```
    pub async fn invalidate_all(&self) -> Result<(), crate::Error> {
        self.backend
            .engine
            .invalidate_field(Field::Own(self.settings.scope), "everything")
            .await
    }
}

/// Why [`Cache::get_or_rebuild`] has no value.
///
/// ```
/// use stampede_guard::{Backend, Cache, RebuildError};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cache: Cache<String> = Cache::new(Backend::local());
/// let failed = cache
///     .get_or_rebuild("eur-usd", || async {
///         Err::<String, _>(std::io::Error::other("feed down"))
///     })
///     .await;
/// match failed {
///     Err(RebuildError::Failed(e)) => assert_eq!(e.to_string(), "feed down"),
///     other => panic!("{other:?}"),
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RebuildError<E> {
    /// The rebuild returned this error. Every caller that waited for the same
    /// rebuild shares it.
    Failed(Arc<E>),
    /// The rebuild panicked (the caller that started it panics instead).
    Panicked,
    /// The rebuild ran past the cache's rebuild timeout.
    TimedOut,
    /// The rebuild failed with an error of another type: two call sites
    /// with different error types rebuilt the same key.
    Other,
}

impl<E> RebuildError<E> {
    /// The rebuild's own error, if it returned one.
    ///
    /// ```
    /// use stampede_guard::RebuildError;
    ///
    /// let e: RebuildError<std::io::Error> = RebuildError::TimedOut;
    /// assert!(e.error().is_none());
    /// ```
    #[must_use]
    pub fn error(&self) -> Option<&Arc<E>> {
        match self {
            RebuildError::Failed(error) => Some(error),
            _ => None,
        }
    }
}

/// The rebuild's own error is not repeated: it is the
/// [`source`](std::error::Error::source) (and [`RebuildError::error`]).
impl<E> std::fmt::Display for RebuildError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RebuildError::Failed(_) => f.write_str("rebuild failed"),
            RebuildError::Panicked => f.write_str("rebuild panicked"),
            RebuildError::TimedOut => f.write_str("rebuild timed out"),
            RebuildError::Other => f.write_str("rebuild failed with an error of another type"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RebuildError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RebuildError::Failed(error) => Some(&**error),
            _ => None,
        }
    }
}

/// The caller's closure, as the engine's rebuild.
struct Closure<V, F, E> {
    rebuild: F,
    lifetime: Lifetime,
    _types: PhantomData<fn() -> (V, E)>,
}

impl<V, F, Fut, E> Rebuild for Closure<V, F, E>
where
    V: CacheValue,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<V, E>> + Send + 'static,
    E: Send + Sync + 'static,
{
    type Value = V;
    type Private = Arc<E>;

    async fn rebuild(self, _stale: Option<Held<V>>, _overtaken: Overtaken) -> Built<V, Arc<E>> {
        match (self.rebuild)().await {
            Ok(value) => Built::Value {
                value,
                lifetime: self.lifetime,
                initial_age: Duration::ZERO,
                store: !self.lifetime.ttl.is_zero(),
                failure: false,
                private: None,
                tags: TagSet::default(),
                hit_for_miss: None,
            },
            Err(error) => {
                let error = Arc::new(error);
                let shared: SharedError = error.clone();
                Built::Failed {
                    shared: Some(shared),
                    private: Some(error),
                    answer: None,
                }
            }
        }
    }
}
