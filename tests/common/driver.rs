//! Origins and clients for the driver's scenarios (`driver`, `driver_fleet`,
//! `attack_driver`, `attack_fleet`): routes on `/report`, impatient clients,
//! failing rebuilds, and an origin whose data changes under a parked rebuild.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::StatusCode;
#[cfg(feature = "redis")]
use stampede_guard::Backend;
use stampede_guard::{Cache, StampedeGuard};
use tokio::sync::Notify;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

#[cfg(feature = "redis")]
use super::redis::RedisServer;
use super::{get as get_req, send, Answer, Origin};

/// How many impatient clients a scenario sends.
pub const CLIENTS: usize = 20;
/// The time between two impatient clients.
pub const SPACING: Duration = Duration::from_millis(100);
/// How long an impatient client waits before it gives up.
pub const PATIENCE: Duration = Duration::from_millis(300);
/// How long a slow rebuild takes.
pub const SLOW: Duration = Duration::from_millis(700);
/// How many concurrent requests make a herd.
pub const HERD: usize = 30;
/// The rebuild timeout of the failing routes.
pub const REBUILD_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failing origin takes to fail: long enough for a herd to gather.
pub const FAIL_AFTER: Duration = Duration::from_millis(150);

/// The error of a rebuild that fails.
#[derive(Debug)]
pub struct Boom;

/// A backend on `redis`.
#[cfg(feature = "redis")]
pub async fn connect(redis: &RedisServer) -> Backend {
    Backend::redis(&redis.url()).await.expect("redis backend")
}

/// `k` instances of what `app` builds, each on a backend of its own.
#[cfg(feature = "redis")]
pub async fn fleet_apps(
    redis: &RedisServer,
    k: usize,
    app: impl Fn(StampedeGuard) -> Router,
) -> Vec<Router> {
    let mut apps = Vec::new();
    for _ in 0..k {
        apps.push(app(StampedeGuard::new(connect(redis).await)));
    }
    apps
}

/// Awaits every task; a task that panicked is an `Err`.
pub async fn join_all<T>(tasks: Vec<JoinHandle<T>>) -> Vec<Result<T, JoinError>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

// ---------------------------------------------------------------------------
// Routes on `/report`.
// ---------------------------------------------------------------------------

/// `/report`, answered by `handler` behind `guard`.
pub fn report_app<H, Fut, R>(guard: StampedeGuard, handler: H) -> Router
where
    H: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoResponse + 'static,
{
    Router::new().route("/report", get(handler).layer(guard))
}

/// `/report`: each call counts in `origin` while it runs and answers what
/// `answer` makes of the call's number (from 1).
pub fn counted_app<F, Fut, R>(origin: &Origin, guard: StampedeGuard, answer: F) -> Router
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoResponse + 'static,
{
    let origin = origin.clone();
    report_app(guard, move || {
        let origin = origin.clone();
        let answer = answer.clone();
        async move {
            let (n, _running) = origin.enter();
            answer(n).await
        }
    })
}

/// `/report` answering `v<call>` with `headers` (appended, in order).
pub fn headers_app(
    origin: &Origin,
    guard: StampedeGuard,
    headers: Vec<(&'static str, http::HeaderValue)>,
) -> Router {
    counted_app(origin, guard, move |n| {
        let headers = headers.clone();
        async move {
            let mut map = http::HeaderMap::new();
            for (k, v) in headers {
                map.append(k, v);
            }
            (map, format!("v{n}")).into_response()
        }
    })
}

/// `/report` varying on Accept-Language, answering `<lang>:<version>`;
/// each call counts in `calls`. Entries are fresh for 60 s.
pub fn variant_app(
    version: &Arc<AtomicUsize>,
    calls: &Arc<AtomicUsize>,
    guard: StampedeGuard,
) -> Router {
    let (version, calls) = (version.clone(), calls.clone());
    let handler = move |headers: http::HeaderMap| {
        let (version, calls) = (version.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let lang = headers
                .get(http::header::ACCEPT_LANGUAGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            format!("{lang}:{}", version.load(Ordering::SeqCst))
        }
    };
    Router::new().route(
        "/report",
        get(handler).layer(
            guard
                .ttl(Duration::from_secs(60))
                .vary([http::header::ACCEPT_LANGUAGE]),
        ),
    )
}

/// `/report`: takes `SLOW`, answers `v<call>`, and counts finished calls.
pub fn slow_app(origin: &Origin, finished: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let finished = finished.clone();
    counted_app(origin, guard, move |n| {
        let finished = finished.clone();
        async move {
            tokio::time::sleep(SLOW).await;
            finished.fetch_add(1, Ordering::SeqCst);
            format!("v{n}")
        }
    })
}

/// `/k/{id}`: counts the call in `origin`, takes 20 ms and answers
/// `v<id>`; while `failing` is set, the call for key `id` panics
/// (`id % 3 == 0`), never ends (`1`) or answers 503 (`2`), that 503 marked
/// `no-store` if `no_store`.
pub fn churn_app(
    origin: &Origin,
    failing: &Arc<AtomicBool>,
    no_store: bool,
    guard: StampedeGuard,
) -> Router {
    let (origin, failing) = (origin.clone(), failing.clone());
    Router::new().route(
        "/k/{id}",
        get(move |axum::extract::Path(id): axum::extract::Path<u32>| {
            let (origin, failing) = (origin.clone(), failing.clone());
            async move {
                let _ = origin.enter();
                tokio::time::sleep(Duration::from_millis(20)).await;
                if failing.load(Ordering::SeqCst) {
                    match id % 3 {
                        0 => panic!("on purpose"),
                        1 => std::future::pending::<()>().await,
                        _ => {}
                    }
                    if no_store {
                        let no_store = [(http::header::CACHE_CONTROL, "no-store")];
                        return (StatusCode::SERVICE_UNAVAILABLE, no_store, "x").into_response();
                    }
                    return (StatusCode::SERVICE_UNAVAILABLE, "x").into_response();
                }
                format!("v{id}").into_response()
            }
        })
        .layer(guard),
    )
}

/// `/report`: answers `v<call>`, or, while `failing` is set, what `fail`
/// gives.
pub fn flaky_app<F, Fut>(
    origin: &Origin,
    failing: &Arc<AtomicBool>,
    guard: StampedeGuard,
    fail: F,
) -> Router
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    let failing = failing.clone();
    counted_app(origin, guard, move |n| {
        let failing = failing.clone();
        let fail = fail.clone();
        async move {
            if !failing.load(Ordering::SeqCst) {
                return format!("v{n}").into_response();
            }
            fail().await
        }
    })
}

/// `n` concurrent requests for `/report`.
pub fn spawn_requests(app: &Router, n: usize) -> Vec<JoinHandle<Answer>> {
    (0..n).map(|_| spawn_request(app)).collect()
}

/// One request for `/report`, on a task of its own.
pub fn spawn_request(app: &Router) -> JoinHandle<Answer> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, get_req("/report")).await })
}

/// The bodies of the answers, in order.
pub async fn texts(tasks: Vec<JoinHandle<Answer>>) -> Vec<String> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task").text());
    }
    out
}

// ---------------------------------------------------------------------------
// Impatient clients: a rebuild runs to completion on its own task.
// ---------------------------------------------------------------------------

/// What one impatient client saw: whether the rebuild had already landed when
/// the client before it was sent, and its answer (None: it gave up).
pub struct Impatient<T> {
    pub after_landing: bool,
    pub answer: Option<T>,
}

/// Sends `CLIENTS` clients, one every `SPACING`, each giving up after
/// `PATIENCE`. `finished` tells whether the rebuild has finished.
pub async fn impatient_clients<T, F, Fut>(
    finished: Arc<AtomicUsize>,
    client: F,
) -> Vec<Impatient<T>>
where
    T: Send + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut landed_before_previous = false;
    for i in 0..CLIENTS {
        tokio::time::sleep_until(start + SPACING * i as u32).await;
        // A client counts as "after the landing" only if the rebuild had
        // finished one spacing before it was sent.
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

/// Impatient requests for `/report`.
pub async fn impatient_requests(
    app: &Router,
    finished: &Arc<AtomicUsize>,
) -> Vec<Impatient<Answer>> {
    impatient_clients(finished.clone(), || {
        let app = app.clone();
        async move { send(&app, get_req("/report")).await }
    })
    .await
}

/// The `started` (handler or rebuild) behind impatient `clients` started and
/// finished once, every answer passes `check`, and the scenario has at least
/// five clients after the landing: returns those.
fn landed_once<'a, T>(
    seen: &'a [Impatient<T>],
    origin: &Origin,
    finished: &AtomicUsize,
    started: &str,
    clients: &str,
    check: impl Fn(&T),
) -> Vec<&'a Impatient<T>> {
    assert_eq!(origin.calls(), 1, "the {started} started once");
    assert_eq!(finished.load(Ordering::SeqCst), 1, "and finished once");
    for answer in seen.iter().filter_map(|s| s.answer.as_ref()) {
        check(answer);
    }
    let after: Vec<_> = seen.iter().filter(|s| s.after_landing).collect();
    assert!(
        after.len() >= 5,
        "the scenario has {clients} after the landing"
    );
    after
}

/// What impatient requests saw of a rebuild that outlived them: the first
/// request gave up (`gave_up`), the rebuild started and finished once,
/// every request answered got `v1`, and the scenario has at least five
/// requests after the landing, each answered at once (`answered`) by a hit
/// (`filled`).
pub fn rebuild_outlived_requests(
    seen: &[Impatient<Answer>],
    origin: &Origin,
    finished: &AtomicUsize,
    gave_up: &str,
    answered: &str,
    filled: &str,
) {
    assert!(seen[0].answer.is_none(), "{gave_up}");
    let after = landed_once(seen, origin, finished, "handler", "clients", |answer| {
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (StatusCode::OK, "v1")
        );
    });
    for s in after {
        let answer = s.answer.as_ref().expect(answered);
        assert_eq!(answer.x_cache(), "HIT", "{filled}");
    }
}

/// Impatient callers of `cache` for "report", whose rebuild takes `SLOW`
/// and answers `v<call>`.
pub async fn impatient_callers(
    cache: &Cache<String>,
    origin: &Origin,
    finished: &Arc<AtomicUsize>,
) -> Vec<Impatient<String>> {
    impatient_clients(finished.clone(), || {
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
    .await
}

/// The first impatient caller gave up, the rebuild started and finished
/// once, and every caller answered, all those after the landing among them,
/// got `v1`.
pub fn rebuilt_once_for_callers(
    seen: &[Impatient<String>],
    origin: &Origin,
    finished: &AtomicUsize,
) {
    assert!(seen[0].answer.is_none(), "the first caller gave up");
    let after = landed_once(seen, origin, finished, "rebuild", "callers", |value| {
        assert_eq!(value, "v1");
    });
    for s in after {
        assert_eq!(s.answer.as_deref(), Some("v1"));
    }
}

// ---------------------------------------------------------------------------
// Rebuilds that fail.
// ---------------------------------------------------------------------------

/// How a rebuild fails.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Failure {
    /// The handler's body yields an error part way.
    BodyError,
    /// The handler panics.
    Panic,
    /// The handler runs past the rebuild timeout.
    Timeout,
}

impl Failure {
    /// The handler's failure: a broken body or a panic after `FAIL_AFTER`,
    /// or an answer after ten seconds.
    pub async fn respond(self) -> Response {
        match self {
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
}

/// `/report`: while `failing` is set, fails as `failure` says (after a
/// pause long enough for a herd to gather); otherwise answers `v<call>`.
/// Rebuilds time out after `REBUILD_TIMEOUT`.
pub fn failing_app(
    origin: &Origin,
    failing: &Arc<AtomicBool>,
    failure: Failure,
    guard: StampedeGuard,
) -> Router {
    flaky_app(
        origin,
        failing,
        guard.rebuild_timeout(REBUILD_TIMEOUT),
        move || failure.respond(),
    )
}

// ---------------------------------------------------------------------------
// invalidate() under a running rebuild.
// ---------------------------------------------------------------------------

/// What the origin currently answers, "old" until the test switches it to
/// "new". While `park` is set, the next call reads its answer, then parks
/// until released.
#[derive(Clone)]
pub struct Versioned {
    pub origin: Origin,
    pub current: Arc<Mutex<&'static str>>,
    pub park: Arc<AtomicBool>,
    pub entered: Arc<Notify>,
    pub release: Arc<Notify>,
}

impl Versioned {
    /// The first call parks.
    pub fn new() -> Self {
        Self::parking(true)
    }

    /// No call parks until `park` is set.
    pub fn unparked() -> Self {
        Self::parking(false)
    }

    fn parking(park: bool) -> Self {
        Versioned {
            origin: Origin::default(),
            current: Arc::new(Mutex::new("old")),
            park: Arc::new(AtomicBool::new(park)),
            entered: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
        }
    }

    /// Reads what the origin answers now; parks if asked to.
    pub async fn answer(&self) -> String {
        let (_, _running) = self.origin.enter();
        let answer = *self.current.lock().unwrap();
        if self.park.swap(false, Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        answer.to_string()
    }

    pub fn switch(&self) {
        *self.current.lock().unwrap() = "new";
    }
}

/// `/report`, answered by `v`.
pub fn versioned_app(v: &Versioned, guard: StampedeGuard) -> Router {
    let v = v.clone();
    report_app(guard, move || {
        let v = v.clone();
        async move { v.answer().await }
    })
}

/// `n` concurrent callers of `cache` for "k", whose rebuild asks `v`.
pub fn spawn_calls(cache: &Cache<String>, v: &Versioned, n: usize) -> Vec<JoinHandle<String>> {
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
}

/// The callers' values, in order.
pub async fn values(tasks: Vec<JoinHandle<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("caller task"));
    }
    out
}
