//! The same protection for any async value, without HTTP.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::engine::{Finish, Leader, Lookup, Outcome, SharedError};
use crate::entry::{CacheValue, Entry, Lifetime};
use crate::key::Key;
use crate::metrics::{self as m, count};

/// A stampede-safe cache of `V` values: concurrent misses for one key run the
/// rebuild once and share its result, stale values can be served while one
/// refresh runs, and a failed rebuild can fall back on a stale value.
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
    lifetime: Lifetime,
    wait_budget: Duration,
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
    pub fn new(backend: Backend) -> Self {
        Cache {
            backend,
            settings: Arc::new(Settings {
                namespace: String::new(),
                lifetime: Lifetime {
                    ttl: Duration::from_secs(10),
                    ..Lifetime::default()
                },
                wait_budget: Duration::from_secs(10),
            }),
            _value: PhantomData,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// How long a value is fresh.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|s| s.lifetime.ttl = ttl)
    }

    /// After the ttl, how long a value is still returned at once while one
    /// caller's rebuild refreshes it in the background.
    pub fn stale_while_revalidate(self, window: Duration) -> Self {
        self.with(|s| s.lifetime.stale_while_revalidate = window)
    }

    /// After the ttl, how long a value may stand in for a failed rebuild.
    pub fn stale_if_error(self, window: Duration) -> Self {
        self.with(|s| s.lifetime.stale_if_error = window)
    }

    /// How long a caller waits on another caller's rebuild before running its
    /// own (default 10 s).
    pub fn wait_budget(self, budget: Duration) -> Self {
        self.with(|s| s.wait_budget = budget)
    }

    /// Prefix for every key, to keep apart caches sharing a backend.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.with(|s| s.namespace = namespace)
    }

    fn key(&self, key: &[u8]) -> Key {
        Key::for_value(&self.settings.namespace, key)
    }

    /// Returns the cached value for `key`, or runs `rebuild` to make it.
    ///
    /// Concurrent callers for one key share a single `rebuild`: the first runs
    /// it, the others wait for its value, or for its error (hence `Arc<E>`, as
    /// in `moka`'s `try_get_with`). A stale value inside stale-while-revalidate
    /// is returned at once while `rebuild` runs in the background; one inside
    /// stale-if-error is returned when `rebuild` fails. If the caller running
    /// `rebuild` is cancelled or panics, a waiting caller runs its own.
    pub async fn get_or_rebuild<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        rebuild: F,
    ) -> Result<V, Arc<E>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        let key = self.key(key.as_ref());
        let engine = &self.backend.engine;
        let lifetime = self.settings.lifetime;
        let mut lookup = engine.lookup(key, Instant::now());
        loop {
            let (follower, stale) = match lookup {
                Lookup::Fresh(entry) => {
                    if let Some(value) = entry.value::<V>() {
                        count(m::HITS);
                        return Ok(value.clone());
                    }
                    return run_alone(rebuild).await;
                }
                Lookup::Stale { entry, refresh } => {
                    let Some(value) = entry.value::<V>() else {
                        return run_alone(rebuild).await;
                    };
                    count(m::STALE);
                    if let Some(leader) = refresh {
                        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                            count(m::REFRESHES);
                            let backend = self.backend.clone();
                            runtime.spawn(async move {
                                let _ = lead(&backend, leader, rebuild, lifetime, None).await;
                            });
                        }
                    }
                    return Ok(value.clone());
                }
                Lookup::Lead { leader, stale } => {
                    count(m::MISSES);
                    return lead(&self.backend, leader, rebuild, lifetime, stale).await;
                }
                Lookup::Bypass => return run_alone(rebuild).await,
                Lookup::Follow { follower, stale } => (follower, stale),
            };
            match follower.wait(self.settings.wait_budget).await {
                Some(Outcome::Value { entry, stale }) => {
                    if let Some(value) = entry.value::<V>() {
                        count(if stale { m::STALE } else { m::COALESCED });
                        return Ok(value.clone());
                    }
                    return run_alone(rebuild).await;
                }
                Some(Outcome::Abandoned) => lookup = engine.lookup(key, Instant::now()),
                Some(Outcome::Failed(error)) => {
                    let now = Instant::now();
                    if let Some(value) = stale
                        .as_ref()
                        .filter(|e| e.usable_on_error(now))
                        .and_then(|e| e.value::<V>())
                    {
                        count(m::STALE);
                        return Ok(value.clone());
                    }
                    match error.map(|e| e.downcast::<E>()) {
                        Some(Ok(error)) => return Err(error),
                        // Another caller's error type: this caller tries itself.
                        _ => return run_alone(rebuild).await,
                    }
                }
                Some(Outcome::Pass) => return run_alone(rebuild).await,
                None => {
                    count(m::WAIT_TIMEOUTS);
                    return run_alone(rebuild).await;
                }
            }
        }
    }

    /// The value for `key` if it is fresh, without rebuilding.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Option<V> {
        match self
            .backend
            .engine
            .lookup_fresh(&self.key(key.as_ref()), Instant::now())
        {
            Some(entry) => entry.value::<V>().cloned(),
            None => None,
        }
    }

    /// Drops the value for `key`; the next caller rebuilds it.
    pub fn invalidate(&self, key: impl AsRef<[u8]>) {
        self.backend.engine.invalidate(&self.key(key.as_ref()));
    }
}

async fn run_alone<V, F, Fut, E>(rebuild: F) -> Result<V, Arc<E>>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<V, E>>,
{
    count(m::ORIGIN_CALLS);
    rebuild().await.map_err(Arc::new)
}

async fn lead<V, F, Fut, E>(
    backend: &Backend,
    leader: Leader,
    rebuild: F,
    lifetime: Lifetime,
    stale: Option<Arc<Entry>>,
) -> Result<V, Arc<E>>
where
    V: CacheValue,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<V, E>>,
    E: Send + Sync + 'static,
{
    let engine = &backend.engine;
    count(m::ORIGIN_CALLS);
    let started = Instant::now();
    match rebuild().await {
        Ok(value) => {
            let entry = Arc::new(Entry::new(
                value.clone(),
                lifetime,
                Duration::ZERO,
                started.elapsed(),
                Instant::now(),
            ));
            let finish = if lifetime.ttl.is_zero() {
                Finish::Share(entry)
            } else {
                Finish::Store(entry)
            };
            engine.finish(leader, finish);
            Ok(value)
        }
        Err(error) => {
            let now = Instant::now();
            if let Some(entry) = stale.filter(|e| e.usable_on_error(now)) {
                if let Some(value) = entry.value::<V>().cloned() {
                    engine.finish(leader, Finish::ServeStale(entry));
                    return Ok(value);
                }
            }
            let error = Arc::new(error);
            let shared: SharedError = error.clone();
            engine.finish(leader, Finish::Failed(Some(shared)));
            Err(error)
        }
    }
}
