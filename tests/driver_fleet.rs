//! The driver's promises with the Redis backend: a rebuild outlives its
//! clients and fills both tiers, failures release no herd across the fleet,
//! and `invalidate()` is a barrier for every instance.
#![cfg(feature = "redis")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::redis::RedisServer;
use common::{get as get_req, send, Answer, Origin};
use http::StatusCode;
use http_body_util::BodyExt;
use stampede_guard::{Backend, Cache, StampedeGuard};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::ServiceExt;

const CLIENTS: usize = 20;
const SPACING: Duration = Duration::from_millis(100);
const PATIENCE: Duration = Duration::from_millis(300);
const SLOW: Duration = Duration::from_millis(700);
const HERD: usize = 30;

async fn connect(redis: &RedisServer) -> Backend {
    Backend::redis(&redis.url()).await.expect("redis backend")
}

#[derive(Debug)]
struct Boom;

// ---------------------------------------------------------------------------
// 1. A rebuild runs to completion on its own task, and fills L1 and Redis.
// ---------------------------------------------------------------------------

struct Impatient<T> {
    after_landing: bool,
    answer: Option<T>,
}

/// `CLIENTS` clients, one every `SPACING`, each giving up after `PATIENCE`.
/// A client is "after the landing" if the rebuild had finished one spacing
/// before it was sent.
async fn impatient_clients<T, F, Fut>(finished: Arc<AtomicUsize>, client: F) -> Vec<Impatient<T>>
where
    T: Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut landed_before_previous = false;
    for i in 0..CLIENTS {
        tokio::time::sleep_until(start + SPACING * i as u32).await;
        let after_landing = landed_before_previous;
        landed_before_previous = finished.load(Ordering::SeqCst) > 0;
        let request = client();
        tasks.push((
            after_landing,
            tokio::spawn(async move { tokio::time::timeout(PATIENCE, request).await.ok() }),
        ));
    }
    let mut seen = Vec::new();
    for (after_landing, task) in tasks {
        seen.push(Impatient {
            after_landing,
            answer: task.await.expect("client task"),
        });
    }
    seen
}

fn slow_app(origin: &Origin, finished: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    let finished = finished.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            let finished = finished.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(SLOW).await;
                finished.fetch_add(1, Ordering::SeqCst);
                format!("v{n}")
            }
        })
        .layer(guard),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_clients_do_not_cancel_the_rebuild_which_fills_l1_and_redis() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let configure = |backend| StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = slow_app(&origin, &finished, configure(connect(&redis).await));
    let seen = impatient_clients(finished.clone(), || {
        let app = app.clone();
        async move { send(&app, get_req("/report")).await }
    })
    .await;

    assert!(
        seen[0].answer.is_none(),
        "the client that started the rebuild gave up"
    );
    assert_eq!(origin.calls(), 1, "the handler started once");
    assert_eq!(finished.load(Ordering::SeqCst), 1, "and finished once");
    for answer in seen.iter().filter_map(|s| s.answer.as_ref()) {
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (StatusCode::OK, "v1")
        );
    }
    let after: Vec<_> = seen.iter().filter(|s| s.after_landing).collect();
    assert!(
        after.len() >= 5,
        "the scenario has clients after the landing"
    );
    for s in after {
        let answer = s
            .answer
            .as_ref()
            .expect("answered at once after the landing");
        assert_eq!(
            answer.x_cache(),
            "HIT",
            "the abandoned rebuild filled the L1"
        );
    }
    // Another instance, with an empty L1, finds the entry in Redis.
    let other = slow_app(&origin, &finished, configure(connect(&redis).await));
    let answer = send(&other, get_req("/report")).await;
    assert_eq!((answer.x_cache(), answer.text().as_str()), ("HIT", "v1"));
    assert_eq!(origin.calls(), 1, "the abandoned rebuild filled Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_cache_callers_do_not_cancel_the_rebuild_which_fills_l1_and_redis() {
    let redis = RedisServer::start();
    let cache: Cache<String> = Cache::new(connect(&redis).await).ttl(Duration::from_secs(60));
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let seen = impatient_clients(finished.clone(), || {
        let cache = cache.clone();
        let origin = origin.clone();
        let finished = finished.clone();
        async move {
            cache
                .get_or_rebuild("report", move || async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(SLOW).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Boom>(format!("v{n}"))
                })
                .await
                .expect("the rebuild succeeds")
        }
    })
    .await;

    assert!(seen[0].answer.is_none(), "the first caller gave up");
    assert_eq!(origin.calls(), 1, "the rebuild started once");
    assert_eq!(finished.load(Ordering::SeqCst), 1, "and finished once");
    for value in seen.iter().filter_map(|s| s.answer.as_ref()) {
        assert_eq!(value, "v1");
    }
    let after: Vec<_> = seen.iter().filter(|s| s.after_landing).collect();
    assert!(
        after.len() >= 5,
        "the scenario has callers after the landing"
    );
    for s in after {
        assert_eq!(s.answer.as_deref(), Some("v1"));
    }
    assert_eq!(cache.get("report").as_deref(), Some("v1"), "in the L1");
    let other: Cache<String> = Cache::new(connect(&redis).await).ttl(Duration::from_secs(60));
    let value = other
        .get_or_rebuild("report", || async { Ok::<_, Boom>("rebuilt".to_string()) })
        .await
        .unwrap();
    assert_eq!(value, "v1", "and in Redis");
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------------------
// 2. No failure releases a herd, across a fleet.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Failure {
    BodyError,
    Panic,
    Timeout,
}

const REBUILD_TIMEOUT: Duration = Duration::from_millis(500);
const FAIL_AFTER: Duration = Duration::from_millis(150);

fn failing_app(origin: &Origin, failure: Failure, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            async move {
                let (_n, _running) = origin.enter();
                match failure {
                    Failure::BodyError => {
                        tokio::time::sleep(FAIL_AFTER).await;
                        let parts: Vec<Result<Bytes, std::io::Error>> = vec![
                            Ok(Bytes::from_static(b"part")),
                            Err(std::io::Error::other("body broke")),
                        ];
                        Response::new(Body::from_stream(tokio_stream::iter(parts)))
                    }
                    Failure::Panic => {
                        tokio::time::sleep(FAIL_AFTER).await;
                        panic!("handler panicked (on purpose)");
                    }
                    Failure::Timeout => {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        "too late".into_response()
                    }
                }
            }
        })
        .layer(guard.rebuild_timeout(REBUILD_TIMEOUT)),
    )
}

/// Status and x-cache of a request; `None` if its task panicked.
async fn status_of(app: Router) -> Option<(StatusCode, String)> {
    let task = tokio::spawn(async move {
        let response = app.oneshot(get_req("/report")).await.expect("infallible");
        let x_cache = response
            .headers()
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let status = response.status();
        let _ = response.into_body().collect().await;
        (status, x_cache)
    });
    task.await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rebuild_costs_a_fleet_of_three_at_most_two_origin_calls() {
    let mut report = Vec::new();
    for (failure, waiter_status) in [
        (Failure::BodyError, StatusCode::BAD_GATEWAY),
        (Failure::Panic, StatusCode::INTERNAL_SERVER_ERROR),
        (Failure::Timeout, StatusCode::GATEWAY_TIMEOUT),
    ] {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let mut apps = Vec::new();
        for _ in 0..3 {
            let guard = StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60));
            apps.push(failing_app(&origin, failure, guard));
        }
        let tasks: Vec<_> = (0..HERD)
            .map(|i| tokio::spawn(status_of(apps[i % apps.len()].clone())))
            .collect();
        for t in tasks {
            if let Some((status, x_cache)) = t.await.unwrap() {
                if x_cache == "COALESCED" {
                    assert_eq!(status, waiter_status, "{failure:?}: the shared failure");
                }
            }
        }
        report.push((failure, origin.calls()));
    }
    assert!(
        report.iter().all(|(_, calls)| *calls <= 2),
        "{HERD} requests over three instances; origin calls per failure kind: {report:?}"
    );
}

// ---------------------------------------------------------------------------
// 3. invalidate() is a barrier, for every instance.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Versioned {
    origin: Origin,
    current: Arc<Mutex<&'static str>>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Versioned {
    fn new() -> Self {
        Versioned {
            origin: Origin::default(),
            current: Arc::new(Mutex::new("old")),
            entered: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
        }
    }

    /// Reads what the origin answers now; the first call then parks until
    /// released.
    async fn answer(&self) -> String {
        let (n, _running) = self.origin.enter();
        let answer = *self.current.lock().unwrap();
        if n == 1 {
            self.entered.notify_one();
            self.release.notified().await;
        }
        answer.to_string()
    }

    fn switch(&self) {
        *self.current.lock().unwrap() = "new";
    }
}

struct Node {
    guard: StampedeGuard,
    app: Router,
}

async fn node(redis: &RedisServer, v: &Versioned) -> Node {
    let guard = StampedeGuard::new(connect(redis).await).ttl(Duration::from_secs(60));
    let v = v.clone();
    let app = Router::new().route(
        "/report",
        get(move || {
            let v = v.clone();
            async move { v.answer().await }
        })
        .layer(guard.clone()),
    );
    Node { guard, app }
}

fn spawn_requests(app: &Router, n: usize) -> Vec<JoinHandle<Answer>> {
    (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/report")).await })
        })
        .collect()
}

async fn texts(tasks: Vec<JoinHandle<Answer>>) -> Vec<String> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task").text());
    }
    out
}

/// Which requests issued after the invalidation got "old": (where, when).
fn olds(label: &str, texts: &[String]) -> Vec<String> {
    texts
        .iter()
        .filter(|t| *t == "old")
        .map(|_| label.to_owned())
        .collect()
}

/// Instance `a` runs a rebuild that read "old" (parked); requests wait for it
/// on `a` and on `b`. `invalidator` (0: `a`, 1: `b`) invalidates and the
/// origin switches to "new"; with `during`, both instances get requests
/// while the old rebuild still runs; it lands; then every instance (and a
/// fresh one) gets requests. None issued after invalidate() returned may
/// get "old".
async fn invalidate_during_a_fleet_rebuild(invalidator: usize, during: bool) {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let a = node(&redis, &v).await;
    let b = node(&redis, &v).await;

    let starter = spawn_requests(&a.app, 1);
    v.entered.notified().await;
    let before_a = spawn_requests(&a.app, 5);
    let before_b = spawn_requests(&b.app, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;

    v.switch();
    [&a, &b][invalidator]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    // Time for the invalidation notice to reach every instance, so that what
    // follows is not a delivery delay.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut old = Vec::new();
    if during {
        let on_a = spawn_requests(&a.app, 10);
        let on_b = spawn_requests(&b.app, 10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        v.release.notify_one();
        old.extend(olds(
            "instance a, while the old rebuild ran",
            &texts(on_a).await,
        ));
        old.extend(olds(
            "instance b, while the old rebuild ran",
            &texts(on_b).await,
        ));
    } else {
        v.release.notify_one();
    }
    assert_eq!(
        texts(starter).await,
        ["old"],
        "the scenario's rebuild read the old data"
    );
    texts(before_a).await;
    texts(before_b).await;

    let c = node(&redis, &v).await;
    for (label, n) in [
        ("instance a", &a),
        ("instance b", &b),
        ("a new instance", &c),
    ] {
        old.extend(olds(
            &format!("{label}, after the old rebuild landed"),
            &texts(spawn_requests(&n.app, 5)).await,
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (label, n) in [
        ("instance a", &a),
        ("instance b", &b),
        ("a new instance", &c),
    ] {
        old.extend(olds(
            &format!("{label}, later"),
            &texts(spawn_requests(&n.app, 1)).await,
        ));
    }
    old.dedup();
    assert!(
        old.is_empty(),
        "requests issued after invalidate() returned got the old value: {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_any_instance_after_invalidate_never_get_the_answer_of_a_rebuild_already_running(
) {
    invalidate_during_a_fleet_rebuild(0, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_running_at_invalidate_stores_its_old_answer_neither_in_l1_nor_in_redis() {
    invalidate_during_a_fleet_rebuild(0, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_on_another_instance_keeps_a_running_rebuilds_old_answer_from_later_requests() {
    invalidate_during_a_fleet_rebuild(1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_on_another_instance_keeps_a_running_rebuild_from_storing_its_old_answer() {
    invalidate_during_a_fleet_rebuild(1, false).await;
}

/// The same through `Cache<V>`, on two backends (and a fresh third).
async fn invalidate_during_a_fleet_cache_rebuild(invalidator: usize, during: bool) {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let new_cache =
        || async { Cache::<String>::new(connect(&redis).await).ttl(Duration::from_secs(60)) };
    let a = new_cache().await;
    let b = new_cache().await;
    let spawn_calls = |cache: &Cache<String>, n: usize| -> Vec<JoinHandle<String>> {
        (0..n)
            .map(|_| {
                let cache = cache.clone();
                let v = v.clone();
                tokio::spawn(async move {
                    cache
                        .get_or_rebuild("k", move || async move { Ok::<_, Boom>(v.answer().await) })
                        .await
                        .expect("the rebuild succeeds")
                })
            })
            .collect()
    };
    async fn values(tasks: Vec<JoinHandle<String>>) -> Vec<String> {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("caller task"));
        }
        out
    }

    let starter = spawn_calls(&a, 1);
    v.entered.notified().await;
    let before_a = spawn_calls(&a, 5);
    let before_b = spawn_calls(&b, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;

    v.switch();
    [&a, &b][invalidator]
        .invalidate("k")
        .await
        .expect("the invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut old = Vec::new();
    if during {
        let on_a = spawn_calls(&a, 10);
        let on_b = spawn_calls(&b, 10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        v.release.notify_one();
        old.extend(olds(
            "cache a, while the old rebuild ran",
            &values(on_a).await,
        ));
        old.extend(olds(
            "cache b, while the old rebuild ran",
            &values(on_b).await,
        ));
    } else {
        v.release.notify_one();
    }
    assert_eq!(
        values(starter).await,
        ["old"],
        "the scenario's rebuild read the old data"
    );
    values(before_a).await;
    values(before_b).await;

    let c = new_cache().await;
    for (label, cache) in [("cache a", &a), ("cache b", &b), ("a new cache", &c)] {
        old.extend(olds(
            &format!("{label}, after the old rebuild landed"),
            &values(spawn_calls(cache, 5)).await,
        ));
    }
    for (label, cache) in [("cache a", &a), ("cache b", &b), ("a new cache", &c)] {
        if cache.get("k").as_deref() == Some("old") {
            old.push(format!("{label}, in its L1"));
        }
    }
    old.dedup();
    assert!(
        old.is_empty(),
        "calls that started after invalidate() returned got the old value: {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_calls_on_any_instance_after_invalidate_never_get_the_value_of_a_rebuild_already_running(
) {
    invalidate_during_a_fleet_cache_rebuild(0, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_rebuild_running_at_invalidate_stores_its_old_value_neither_in_l1_nor_in_redis() {
    invalidate_during_a_fleet_cache_rebuild(0, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_invalidate_on_another_instance_keeps_a_running_rebuilds_old_value_from_later_calls()
{
    invalidate_during_a_fleet_cache_rebuild(1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_invalidate_on_another_instance_keeps_a_running_rebuild_from_storing_its_old_value() {
    invalidate_during_a_fleet_cache_rebuild(1, false).await;
}
