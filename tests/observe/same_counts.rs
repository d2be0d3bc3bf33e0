//! Counters are kept in one place: the same workload through the HTTP layer
//! and through `Cache<V>` counts the same.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{get as get_req, send, Origin};
use axum::routing::get;
use axum::Router;
use metrics_util::debugging::Snapshotter;
use stampede_guard::{Backend, Cache, StampedeGuard};
use tokio::sync::Semaphore;

const BURST: usize = 10;
const HITS: usize = 5;
const STALE: usize = 4;
const TTL: Duration = Duration::from_millis(300);
const SWR: Duration = Duration::from_millis(300);

const COUNTERS: [&str; 8] = [
    "stampede_guard_hits_total",
    "stampede_guard_misses_total",
    "stampede_guard_coalesced_total",
    "stampede_guard_stale_total",
    "stampede_guard_origin_calls_total",
    "stampede_guard_wait_timeouts_total",
    "stampede_guard_bypass_total",
    "stampede_guard_refreshes_total",
];

/// The origin: counts calls, and each call waits for one permit of `gate`.
#[derive(Clone)]
struct Gated {
    origin: Origin,
    gate: Arc<Semaphore>,
    finished: Arc<AtomicUsize>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            origin: Origin::default(),
            gate: Arc::new(Semaphore::new(0)),
            finished: Arc::new(AtomicUsize::new(0)),
        }
    }

    async fn call(&self) -> String {
        let (n, _running) = self.origin.enter();
        self.gate.acquire().await.expect("gate open").forget();
        self.finished.fetch_add(1, Ordering::SeqCst);
        format!("v{n}")
    }

    fn release_one(&self) {
        self.gate.add_permits(1);
    }

    async fn until_finished(&self, n: usize) {
        for _ in 0..250 {
            if self.finished.load(Ordering::SeqCst) >= n {
                // Let the flight settle after the origin returned.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the origin call {n} never finished");
    }
}

/// One request (or `get_or_rebuild` call) of the workload.
trait Client: Clone + Send + Sync + 'static {
    fn request(&self) -> impl Future<Output = String> + Send + 'static;
}

/// A burst of `BURST` on a missing key whose origin is held until all have
/// joined; `HITS` hits; expiry into stale-while-revalidate, `STALE` stale
/// answers while the one refresh is held; the refresh lands; expiry past
/// every window; another held burst.
async fn workload<C: Client>(client: C, origin: &Gated) {
    async fn held_burst<C: Client>(client: &C, origin: &Gated) {
        let tasks: Vec<_> = (0..BURST)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.request().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        origin.release_one();
        for t in tasks {
            t.await.expect("request task");
        }
    }

    held_burst(&client, origin).await;
    for _ in 0..HITS {
        client.request().await;
    }
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    for _ in 0..STALE {
        assert_eq!(client.request().await, "v1", "a stale answer");
    }
    origin.release_one();
    origin.until_finished(2).await;
    tokio::time::sleep(TTL + SWR + Duration::from_millis(100)).await;
    held_burst(&client, origin).await;
}

#[derive(Clone)]
struct Http(Router);

impl Client for Http {
    fn request(&self) -> impl Future<Output = String> + Send + 'static {
        let app = self.0.clone();
        async move { send(&app, get_req("/r")).await.text() }
    }
}

#[derive(Clone)]
struct Generic(Cache<String>, Gated);

impl Client for Generic {
    fn request(&self) -> impl Future<Output = String> + Send + 'static {
        let cache = self.0.clone();
        let origin = self.1.clone();
        async move {
            cache
                .get_or_rebuild("r", move || async move {
                    Ok::<_, std::io::Error>(origin.call().await)
                })
                .await
                .expect("the rebuild succeeds")
        }
    }
}

fn counters(snapshotter: &Snapshotter) -> BTreeMap<&'static str, u64> {
    let snapshot = crate::common::metrics::counters(snapshotter);
    COUNTERS
        .iter()
        .map(|name| {
            let total = snapshot
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v)
                .sum();
            (*name, total)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_and_the_generic_cache_count_the_same_workload_the_same() {
    let (snapshotter, _turn) = crate::common::metrics::recorder().await;
    let _ = counters(snapshotter);

    let http_origin = Gated::new();
    let o = http_origin.clone();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .stale_while_revalidate(SWR);
    let app = Router::new().route(
        "/r",
        get(move || {
            let o = o.clone();
            async move { o.call().await }
        })
        .layer(guard),
    );
    workload(Http(app), &http_origin).await;
    let through_http = counters(snapshotter);

    let cache_origin = Gated::new();
    let cache: Cache<String> = Cache::new(Backend::local())
        .ttl(TTL)
        .stale_while_revalidate(SWR);
    workload(Generic(cache, cache_origin.clone()), &cache_origin).await;
    let through_cache = counters(snapshotter);

    assert_eq!(http_origin.origin.calls(), 3);
    assert_eq!(cache_origin.origin.calls(), 3);
    assert_eq!(
        through_http, through_cache,
        "the same workload counts the same through both adapters"
    );
    let expected: BTreeMap<&str, u64> = [
        ("stampede_guard_hits_total", HITS as u64),
        ("stampede_guard_misses_total", 2),
        ("stampede_guard_coalesced_total", 2 * (BURST as u64 - 1)),
        ("stampede_guard_stale_total", STALE as u64),
        ("stampede_guard_origin_calls_total", 3),
        ("stampede_guard_wait_timeouts_total", 0),
        ("stampede_guard_bypass_total", 0),
        ("stampede_guard_refreshes_total", 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        through_http, expected,
        "each request counted once, by how it was answered"
    );
}
