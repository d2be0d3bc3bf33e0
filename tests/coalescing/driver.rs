//! The driver's promises on the embedded backend, through both adapters (the
//! HTTP layer and `Cache<V>`): a rebuild runs to completion on its own task,
//! no failure releases a herd, and `invalidate()` is a barrier.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::{
    counted_app, failing_app, impatient_callers, impatient_requests, join_all,
    rebuild_outlived_requests, rebuilt_once_for_callers, slow_app, spawn_calls, spawn_request,
    spawn_requests, texts, values, versioned_app, Boom, Failure, Versioned, FAIL_AFTER, HERD,
    REBUILD_TIMEOUT,
};
use crate::common::{get as get_req, send, Answer, Origin};
use axum::body::Body;
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use stampede_guard::{Backend, Cache, RebuildError, StampedeGuard};
use tokio::sync::Notify;
use tokio::task::JoinError;
use tower::{ServiceBuilder, ServiceExt};

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local())
}

// ---------------------------------------------------------------------------
// 1. A rebuild runs to completion on its own task.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_clients_do_not_cancel_the_rebuild_and_later_requests_hit() {
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let app = slow_app(&origin, &finished, guard().ttl(Duration::from_secs(60)));
    let seen = impatient_requests(&app, &finished).await;

    rebuild_outlived_requests(
        &seen,
        &origin,
        &finished,
        "the client that started the rebuild gave up before it landed",
        "a client after the landing is answered at once",
        "the abandoned rebuild filled the cache",
    );
    let last = send(&app, get_req("/report")).await;
    assert_eq!((last.x_cache(), last.text().as_str()), ("HIT", "v1"));
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_callers_do_not_cancel_the_rebuild_and_its_value_is_cached() {
    let cache: Cache<String> = Cache::new(Backend::local()).ttl(Duration::from_secs(60));
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let seen = impatient_callers(&cache, &origin, &finished).await;

    rebuilt_once_for_callers(&seen, &origin, &finished);
    assert_eq!(cache.get("report").as_deref(), Some("v1"));
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------------------
// 2. No failure releases a herd.
// ---------------------------------------------------------------------------

/// A response whose body may fail to collect.
struct Raw {
    status: StatusCode,
    x_cache: String,
    body: Result<Bytes, String>,
}

async fn send_raw(app: &Router, request: Request<Body>) -> Raw {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    Raw {
        status: parts.status,
        x_cache: parts
            .headers
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        body: body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| e.to_string()),
    }
}

/// `HERD` concurrent requests; a task that panicked is an `Err`.
async fn herd(app: &Router) -> Vec<Result<Raw, JoinError>> {
    let tasks: Vec<_> = (0..HERD)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send_raw(&app, get_req("/report")).await })
        })
        .collect();
    join_all(tasks).await
}

/// After a failed flight the next request rebuilds: the failure was not
/// stored.
async fn next_request_rebuilds(app: &Router, origin: &Origin, failing: &AtomicBool) {
    failing.store(false, Ordering::SeqCst);
    let before = origin.calls();
    let next = send(app, get_req("/report")).await;
    assert_eq!(origin.calls(), before + 1, "the next request rebuilds");
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(next.x_cache(), "MISS");
    assert_eq!(next.text(), format!("v{}", before + 1));
}

/// A herd on a cold key whose rebuild fails: the origin is called at most
/// twice, every request that did not start a rebuild gets `waiter_status`
/// (COALESCED), and the next request rebuilds. Returns the starters' results.
async fn cold_herd_on_a_failing_rebuild(
    failure: Failure,
    waiter_status: StatusCode,
) -> Vec<Result<Raw, JoinError>> {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(true));
    let app = failing_app(
        &origin,
        &failing,
        failure,
        guard().ttl(Duration::from_secs(60)),
    );
    let results = herd(&app).await;
    let calls = origin.calls();
    assert!(
        calls <= 2,
        "{failure:?}: {HERD} requests cost {calls} origin calls"
    );
    let (waiters, starters): (Vec<_>, Vec<_>) = results
        .into_iter()
        .partition(|r| matches!(r, Ok(raw) if raw.x_cache == "COALESCED"));
    assert_eq!(
        starters.len(),
        calls,
        "{failure:?}: one starter per rebuild"
    );
    for w in &waiters {
        let raw = w.as_ref().unwrap();
        assert_eq!(raw.status, waiter_status, "{failure:?}: the shared failure");
        assert_eq!(raw.body.as_deref().ok(), Some(&b""[..]));
    }
    next_request_rebuilds(&app, &origin, &failing).await;
    starters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_error_costs_one_origin_call_and_waiters_share_a_502() {
    let starters =
        cold_herd_on_a_failing_rebuild(Failure::BodyError, StatusCode::BAD_GATEWAY).await;
    for s in starters {
        let raw = s.expect("the starter is answered");
        assert_eq!(
            (raw.status, raw.x_cache.as_str()),
            (StatusCode::OK, "MISS"),
            "the starter gets its own response"
        );
        assert!(raw.body.is_err(), "whose body fails as the origin's did");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_costs_one_origin_call_panics_its_starter_and_waiters_share_a_500() {
    let starters =
        cold_herd_on_a_failing_rebuild(Failure::Panic, StatusCode::INTERNAL_SERVER_ERROR).await;
    for s in starters {
        let ended = s.err().expect("the starter's task does not return");
        assert!(ended.is_panic(), "the panic resumes in the starter's task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_past_its_timeout_costs_one_origin_call_and_everyone_gets_a_504() {
    let starters =
        cold_herd_on_a_failing_rebuild(Failure::Timeout, StatusCode::GATEWAY_TIMEOUT).await;
    for s in starters {
        let raw = s.expect("the starter is answered");
        assert_eq!(
            (raw.status, raw.x_cache.as_str()),
            (StatusCode::GATEWAY_TIMEOUT, "MISS")
        );
    }
}

/// A herd on an expired key inside stale-if-error whose rebuild fails: every
/// request, the starter included, gets the stale copy, for one origin call.
async fn stale_herd_on_a_failing_rebuild(failure: Failure) {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let app = failing_app(
        &origin,
        &failing,
        failure,
        guard()
            .ttl(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(30)),
    );
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(150)).await;
    failing.store(true, Ordering::SeqCst);
    let results = herd(&app).await;
    let calls = origin.calls() - 1;
    assert!(
        calls <= 2,
        "{failure:?}: {HERD} requests cost {calls} origin calls"
    );
    for r in results {
        let raw = r.expect("nobody panics when a stale copy stands in");
        assert_eq!(
            (raw.status, raw.x_cache.as_str(), raw.body.as_deref().ok()),
            (StatusCode::OK, "STALE", Some(&b"v1"[..])),
            "{failure:?}"
        );
    }
    next_request_rebuilds(&app, &origin, &failing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_error_is_covered_by_stale_if_error_for_every_request() {
    stale_herd_on_a_failing_rebuild(Failure::BodyError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_covered_by_stale_if_error_for_every_request() {
    stale_herd_on_a_failing_rebuild(Failure::Panic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_timeout_is_covered_by_stale_if_error_for_every_request() {
    stale_herd_on_a_failing_rebuild(Failure::Timeout).await;
}

type Guarded = Response<stampede_guard::GuardBody<Body>>;

/// The old name still names the same type, for one release.
#[test]
#[allow(deprecated)]
fn the_old_body_name_is_the_same_type() {
    fn same(body: stampede_guard::Body<Body>) -> stampede_guard::GuardBody<Body> {
        body
    }
    let _ = same;
    assert_eq!(
        std::any::type_name::<stampede_guard::Body<Body>>(),
        std::any::type_name::<stampede_guard::GuardBody<Body>>()
    );
}

/// A guarded `service_fn` whose inner service fails with `Err` while
/// `failing` is set (after a pause), else answers `v<call>`.
fn failing_service(
    origin: &Origin,
    failing: &Arc<AtomicBool>,
    guard: StampedeGuard,
) -> impl tower::Service<
    Request<Body>,
    Response = Guarded,
    Error = std::io::Error,
    Future = impl std::future::Future<Output = Result<Guarded, std::io::Error>> + Send + 'static + use<>,
>
       + Clone
       + Send
       + 'static
       + use<> {
    let origin = origin.clone();
    let failing = failing.clone();
    ServiceBuilder::new()
        .layer(guard)
        .service_fn(move |_req: Request<Body>| {
            let origin = origin.clone();
            let failing = failing.clone();
            async move {
                let (n, _running) = origin.enter();
                if failing.load(Ordering::SeqCst) {
                    tokio::time::sleep(FAIL_AFTER).await;
                    Err(std::io::Error::other("origin down"))
                } else {
                    Ok(Response::new(Body::from(format!("v{n}"))))
                }
            }
        })
}

async fn call_herd<S>(service: &S) -> Vec<Result<Answer, std::io::Error>>
where
    S: tower::Service<
            Request<Body>,
            Response = Response<stampede_guard::GuardBody<Body>>,
            Error = std::io::Error,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let tasks: Vec<_> = (0..HERD)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                match service.oneshot(get_req("/report")).await {
                    Ok(response) => Ok(crate::common::collect(response.map(Body::new)).await),
                    Err(e) => Err(e),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_error_costs_one_origin_call_reaches_its_starter_and_waiters_share_a_502() {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(true));
    let service = failing_service(&origin, &failing, guard().ttl(Duration::from_secs(60)));
    let results = call_herd(&service).await;
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} requests cost {calls} origin calls");
    let errors: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), calls, "each starter gets its own error");
    for e in errors {
        assert_eq!(
            e.to_string(),
            "origin down",
            "the inner error type, unchanged"
        );
    }
    for answer in results.iter().filter_map(|r| r.as_ref().ok()) {
        assert_eq!(
            (answer.status, answer.x_cache()),
            (StatusCode::BAD_GATEWAY, "COALESCED")
        );
    }

    failing.store(false, Ordering::SeqCst);
    let next = crate::common::collect(
        service
            .clone()
            .oneshot(get_req("/report"))
            .await
            .expect("the origin is back")
            .map(Body::new),
    )
    .await;
    assert_eq!(origin.calls(), calls + 1, "the next request rebuilds");
    assert_eq!(
        (next.x_cache(), next.text()),
        ("MISS", format!("v{}", calls + 1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_error_is_covered_by_stale_if_error_for_every_request() {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let service = failing_service(
        &origin,
        &failing,
        guard()
            .ttl(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(30)),
    );
    service.clone().oneshot(get_req("/report")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    failing.store(true, Ordering::SeqCst);
    let results = call_herd(&service).await;
    let calls = origin.calls() - 1;
    assert!(calls <= 2, "{HERD} requests cost {calls} origin calls");
    for r in results {
        let answer = r.expect("the stale copy stands in, for the starter too");
        assert_eq!(
            (answer.status, answer.x_cache(), answer.text().as_str()),
            (StatusCode::OK, "STALE", "v1")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_starter_costs_one_origin_call_and_its_waiters_get_the_value() {
    let origin = Origin::default();
    let entered = Arc::new(Notify::new());
    let e = entered.clone();
    let app = counted_app(&origin, guard().ttl(Duration::from_secs(60)), move |n| {
        let entered = e.clone();
        async move {
            entered.notify_one();
            tokio::time::sleep(Duration::from_millis(300)).await;
            format!("v{n}")
        }
    });
    let starter = spawn_request(&app);
    entered.notified().await;
    let waiters = spawn_requests(&app, HERD - 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    starter.abort();
    assert!(starter.await.unwrap_err().is_cancelled());
    for w in waiters {
        let answer = w.await.unwrap();
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (StatusCode::OK, "v1")
        );
        assert_ne!(
            answer.x_cache(),
            "MISS",
            "no waiter started a rebuild of its own"
        );
    }
    assert_eq!(origin.calls(), 1);
    let after = send(&app, get_req("/report")).await;
    assert_eq!((after.x_cache(), after.text().as_str()), ("HIT", "v1"));
}

// Cache<V>

/// `Err` if `None`), after a pause. Returns each caller's task result.
async fn cache_herd(
    cache: &Cache<String>,
    origin: &Origin,
    failure: Option<Failure>,
) -> Vec<Result<Result<String, RebuildError<Boom>>, JoinError>> {
    let tasks: Vec<_> = (0..HERD)
        .map(|_| {
            let cache = cache.clone();
            let origin = origin.clone();
            tokio::spawn(async move {
                cache
                    .get_or_rebuild("k", move || async move {
                        let (_n, _running) = origin.enter();
                        match failure {
                            Some(Failure::Timeout) => {
                                tokio::time::sleep(Duration::from_secs(10)).await;
                                Ok("too late".to_string())
                            }
                            Some(Failure::Panic) => {
                                tokio::time::sleep(FAIL_AFTER).await;
                                panic!("rebuild panicked (on purpose)");
                            }
                            _ => {
                                tokio::time::sleep(FAIL_AFTER).await;
                                Err(Boom)
                            }
                        }
                    })
                    .await
            })
        })
        .collect();
    join_all(tasks).await
}

fn failing_cache() -> Cache<String> {
    Cache::new(Backend::local())
        .ttl(Duration::from_secs(60))
        .rebuild_timeout(REBUILD_TIMEOUT)
}

async fn cache_next_call_rebuilds(cache: &Cache<String>, origin: &Origin) {
    let before = origin.calls();
    let o = origin.clone();
    let value = cache
        .get_or_rebuild("k", move || async move {
            let (n, _running) = o.enter();
            Ok::<_, Boom>(format!("v{n}"))
        })
        .await
        .expect("the origin is back");
    assert_eq!(origin.calls(), before + 1, "the next call rebuilds");
    assert_eq!(value, format!("v{}", before + 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rebuild_runs_once_and_every_caller_shares_one_error() {
    let cache = failing_cache();
    let origin = Origin::default();
    let results = cache_herd(&cache, &origin, None).await;
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} callers cost {calls} rebuilds");
    let mut errors: Vec<Arc<Boom>> = Vec::new();
    for r in results {
        let error = r.expect("no panic").expect_err("the rebuild failed");
        assert!(matches!(error, RebuildError::Failed(_)));
        errors.push(error.error().expect("the rebuild's own error").clone());
    }
    let mut distinct: Vec<&Arc<Boom>> = Vec::new();
    for e in &errors {
        if !distinct.iter().any(|d| Arc::ptr_eq(d, e)) {
            distinct.push(e);
        }
    }
    assert_eq!(distinct.len(), calls, "one shared Arc<E> per rebuild");
    cache_next_call_rebuilds(&cache, &origin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_rebuild_runs_once_panics_its_starter_and_waiters_get_panicked() {
    let cache = failing_cache();
    let origin = Origin::default();
    let results = cache_herd(&cache, &origin, Some(Failure::Panic)).await;
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} callers cost {calls} rebuilds");
    let mut panicked = 0;
    for r in results {
        match r {
            Err(ended) => {
                assert!(ended.is_panic());
                panicked += 1;
            }
            Ok(result) => assert!(matches!(result, Err(RebuildError::Panicked))),
        }
    }
    assert_eq!(
        panicked, calls,
        "the caller that started it panics, no other"
    );
    cache_next_call_rebuilds(&cache, &origin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_past_its_timeout_runs_once_and_every_caller_gets_timed_out() {
    let cache = failing_cache();
    let origin = Origin::default();
    let results = cache_herd(&cache, &origin, Some(Failure::Timeout)).await;
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} callers cost {calls} rebuilds");
    for r in results {
        assert!(matches!(r.expect("no panic"), Err(RebuildError::TimedOut)));
    }
    cache_next_call_rebuilds(&cache, &origin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cache_failure_is_covered_by_stale_if_error_for_every_caller() {
    for failure in [None, Some(Failure::Panic), Some(Failure::Timeout)] {
        let cache: Cache<String> = Cache::new(Backend::local())
            .ttl(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(30))
            .rebuild_timeout(REBUILD_TIMEOUT);
        let origin = Origin::default();
        cache
            .get_or_rebuild("k", || async { Ok::<_, Boom>("old".to_string()) })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let results = cache_herd(&cache, &origin, failure).await;
        let calls = origin.calls();
        assert!(
            calls <= 2,
            "{failure:?}: {HERD} callers cost {calls} rebuilds"
        );
        for r in results {
            assert_eq!(
                r.expect("no panic").expect("stale stands in"),
                "old",
                "{failure:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_first_caller_costs_one_rebuild_and_its_waiters_get_the_value() {
    let cache: Cache<String> = Cache::new(Backend::local()).ttl(Duration::from_secs(60));
    let origin = Origin::default();
    let entered = Arc::new(Notify::new());
    let call = |cache: &Cache<String>| {
        let cache = cache.clone();
        let origin = origin.clone();
        let entered = entered.clone();
        tokio::spawn(async move {
            cache
                .get_or_rebuild("k", move || async move {
                    let (n, _running) = origin.enter();
                    entered.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, Boom>(format!("v{n}"))
                })
                .await
        })
    };
    let first = call(&cache);
    entered.notified().await;
    let waiters: Vec<_> = (0..HERD - 1).map(|_| call(&cache)).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap(), "v1");
    }
    assert_eq!(origin.calls(), 1);
    assert_eq!(cache.get("k").as_deref(), Some("v1"));
}

// ---------------------------------------------------------------------------
// 3. invalidate() is a barrier.
// ---------------------------------------------------------------------------

/// A rebuild that read "old" is parked; invalidate, switch the origin to
/// "new"; with `during`, requests arrive while the old rebuild is still
/// running; then the old rebuild lands; then more requests.
async fn invalidate_during_a_rebuild_http(during: bool) {
    let v = Versioned::new();
    let guard = guard().ttl(Duration::from_secs(60));
    let app = versioned_app(&v, guard.clone());
    let starter = spawn_requests(&app, 1);
    v.entered.notified().await;
    let before = spawn_requests(&app, 5);
    tokio::time::sleep(Duration::from_millis(50)).await;

    v.switch();
    guard
        .invalidate(&get_req("/report"))
        .await
        .expect("embedded invalidation cannot fail");
    let during_tasks = if during {
        spawn_requests(&app, 10)
    } else {
        Vec::new()
    };
    let during_texts = texts(during_tasks).await;
    v.release.notify_one();
    // The old rebuild has landed once its starter is answered.
    let old = texts(starter).await;
    texts(before).await;
    assert_eq!(old, ["old"], "the scenario's rebuild read the old data");
    let after_texts = texts(spawn_requests(&app, 10)).await;

    for t in during_texts.iter().chain(&after_texts) {
        assert_eq!(
            t, "new",
            "a request issued after invalidate() returned got the old value"
        );
    }
    let later = send(&app, get_req("/report")).await;
    assert_eq!(
        (later.x_cache(), later.text().as_str()),
        ("HIT", "new"),
        "the old rebuild did not store its answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_invalidate_never_get_the_answer_of_a_rebuild_already_running() {
    invalidate_during_a_rebuild_http(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_running_at_invalidate_does_not_store_its_old_answer() {
    invalidate_during_a_rebuild_http(false).await;
}

async fn invalidate_during_a_rebuild_cache(during: bool) {
    let v = Versioned::new();
    let cache: Cache<String> = Cache::new(Backend::local()).ttl(Duration::from_secs(60));
    let spawn_calls = |n: usize| spawn_calls(&cache, &v, n);
    let starter = spawn_calls(1);
    v.entered.notified().await;
    let before = spawn_calls(5);
    tokio::time::sleep(Duration::from_millis(50)).await;

    v.switch();
    cache
        .invalidate("k")
        .await
        .expect("embedded invalidation cannot fail");
    let during_values = values(if during { spawn_calls(10) } else { Vec::new() }).await;
    v.release.notify_one();
    assert_eq!(
        values(starter).await,
        ["old"],
        "the scenario's rebuild read the old data"
    );
    values(before).await;
    let after_values = values(spawn_calls(10)).await;
    for value in during_values.iter().chain(&after_values) {
        assert_eq!(
            value, "new",
            "a call that started after invalidate() returned got the old value"
        );
    }
    assert_eq!(
        cache.get("k").as_deref(),
        Some("new"),
        "the old rebuild did not store its answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_calls_after_invalidate_never_get_the_value_of_a_rebuild_already_running() {
    invalidate_during_a_rebuild_cache(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_rebuild_running_at_invalidate_does_not_store_its_old_value() {
    invalidate_during_a_rebuild_cache(false).await;
}
