//! The same protection for any async value, without HTTP.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::engine::{Finish, FleetPolicy, Leader, Lease, Lookup, Outcome, Plan, SharedError};
use crate::entry::{CacheValue, Entry, Lifetime};
use crate::key::Key;
use crate::metrics::{self as m, count};
use crate::service::EARLY_SLACK;

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
    lease: Duration,
    early_refresh: Option<f64>,
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
                lease: Duration::from_secs(5),
                early_refresh: None,
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

    /// Fleet-wide rebuild lease time (default 5 s), renewed every third of it
    /// while a rebuild runs. Only used with a Redis backend.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|s| s.lease = lease)
    }

    /// Probabilistic early refresh (XFetch) with this `beta`; see
    /// [`StampedeGuard::early_refresh`](crate::StampedeGuard::early_refresh).
    pub fn early_refresh(self, beta: f64) -> Self {
        let beta = (beta.is_finite() && beta > 0.0).then_some(beta);
        self.with(|s| s.early_refresh = beta)
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
        let now = Instant::now();
        let mut lookup = engine.lookup(key, now);
        loop {
            let (follower, stale) = match lookup {
                Lookup::Fresh(entry) => {
                    let Some(value) = entry.value::<V>() else {
                        return run_alone(rebuild).await;
                    };
                    count(m::HITS);
                    if let Some(beta) = self.settings.early_refresh {
                        if let Some(leader) = engine.early_refresh(key, &entry, beta, now) {
                            let left = entry.fresh_for(now) + EARLY_SLACK;
                            self.spawn(leader, None, Start::Early(left), rebuild);
                        }
                    }
                    return Ok(value.clone());
                }
                Lookup::Stale { entry, refresh } => {
                    let Some(value) = entry.value::<V>().cloned() else {
                        return run_alone(rebuild).await;
                    };
                    count(m::STALE);
                    if let Some(leader) = refresh {
                        self.spawn(leader, Some(entry), Start::Refresh, rebuild);
                    }
                    return Ok(value);
                }
                Lookup::Lead { leader, stale } => {
                    count(m::MISSES);
                    let plan = engine.plan::<V>(key, stale, self.fleet(), true, None).await;
                    return match plan {
                        Plan::Hit { entry, .. } => {
                            let value = entry.value::<V>().cloned();
                            engine.finish(leader, Finish::Store(entry));
                            match value {
                                Some(value) => Ok(value),
                                None => run_alone(rebuild).await,
                            }
                        }
                        Plan::StaleNow { entry, lease } => match entry.value::<V>().cloned() {
                            Some(value) => {
                                count(m::STALE);
                                engine.serve_stale_meanwhile(&leader, &entry);
                                let start = match lease {
                                    Some(lease) => Start::Rebuild(lease),
                                    None => Start::Refresh,
                                };
                                self.spawn(leader, Some(entry), start, rebuild);
                                Ok(value)
                            }
                            None => {
                                lead(
                                    &self.backend,
                                    leader,
                                    rebuild,
                                    self.settings.lifetime,
                                    None,
                                    lease,
                                )
                                .await
                            }
                        },
                        Plan::Rebuild { lease, stale } => {
                            lead(
                                &self.backend,
                                leader,
                                rebuild,
                                self.settings.lifetime,
                                stale,
                                lease,
                            )
                            .await
                        }
                        // Nobody else's rebuild came in time: build it here.
                        Plan::TimedOut { stale } => {
                            count(m::WAIT_TIMEOUTS);
                            lead(
                                &self.backend,
                                leader,
                                rebuild,
                                self.settings.lifetime,
                                stale,
                                None,
                            )
                            .await
                        }
                    };
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

    fn fleet(&self) -> FleetPolicy {
        FleetPolicy {
            lease: self.settings.lease,
            wait_budget: self.settings.wait_budget,
        }
    }

    /// Settles a key in the background: nobody waits on it.
    fn spawn<F, Fut, E>(&self, leader: Leader, stale: Option<Arc<Entry>>, start: Start, rebuild: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        count(m::REFRESHES);
        let backend = self.backend.clone();
        let key = leader.key();
        let (lifetime, fleet) = (self.settings.lifetime, self.fleet());
        runtime.spawn(async move {
            let engine = &backend.engine;
            let plan = match start {
                Start::Rebuild(lease) => Plan::Rebuild {
                    lease: Some(lease),
                    stale,
                },
                Start::Refresh => engine.plan::<V>(key, stale, fleet, false, None).await,
                Start::Early(left) => engine.plan::<V>(key, stale, fleet, false, Some(left)).await,
            };
            match plan {
                Plan::Hit { entry, .. } => engine.finish(leader, Finish::Store(entry)),
                Plan::Rebuild { lease, stale } => {
                    let _ = lead(&backend, leader, rebuild, lifetime, stale, lease).await;
                }
                Plan::StaleNow { .. } | Plan::TimedOut { .. } => {
                    engine.finish(leader, Finish::Failed(None))
                }
            }
        });
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

    /// Drops the value for `key`, here and (with Redis) everywhere in the
    /// fleet; the next caller rebuilds it.
    pub async fn invalidate(&self, key: impl AsRef<[u8]>) {
        self.backend
            .engine
            .invalidate(&self.key(key.as_ref()))
            .await;
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

/// Work on a key that no caller waits for.
enum Start {
    Refresh,
    /// An early refresh of an entry with this much freshness left.
    Early(Duration),
    Rebuild(Lease),
}

/// Runs `rebuild` as the key's leader and settles the key.
async fn lead<V, F, Fut, E>(
    backend: &Backend,
    leader: Leader,
    rebuild: F,
    lifetime: Lifetime,
    stale: Option<Arc<Entry>>,
    lease: Option<Lease>,
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
    let (finish, result) = match rebuild().await {
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
            (finish, Ok(value))
        }
        Err(error) => {
            let now = Instant::now();
            let fallback = stale
                .filter(|e| e.usable_on_error(now))
                .and_then(|e| Some((e.value::<V>()?.clone(), e)));
            match fallback {
                Some((value, entry)) => (Finish::ServeStale(entry), Ok(value)),
                None => {
                    let error = Arc::new(error);
                    let shared: SharedError = error.clone();
                    (Finish::Failed(Some(shared)), Err(error))
                }
            }
        }
    };
    engine.settle::<V>(leader, finish, lease).await;
    result
}
