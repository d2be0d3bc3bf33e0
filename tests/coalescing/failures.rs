//! Attacks on the driver's promises on the embedded backend: failures that
//! look like answers, HEAD and conditional starters, background refreshes
//! racing an invalidation, fail-closed waits, and leaks over many keys.
//! Tests that fail here document a promise that does not hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::{
    counted_app, flaky_app, spawn_requests, versioned_app, Versioned, FAIL_AFTER, HERD,
};
use crate::common::{burst, get as get_req, send, Answer, Origin};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{CACHE_CONTROL, ETAG, SET_COOKIE};
use http::{Request, StatusCode};
use stampede_guard::{Backend, Cache, StampedeGuard, WaitTimeout};

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local())
}

/// How the origin fails while `failing` is set.
#[derive(Clone, Copy, Debug)]
enum Failing {
    /// `503` with `Cache-Control: no-store`, as most frameworks mark errors.
    NoStore503,
    /// `500` with a `Set-Cookie` a session middleware adds to every answer.
    Cookie500,
    /// `502` with `Cache-Control: private`.
    Private502,
}

impl Failing {
    /// The error answer, after `FAIL_AFTER`.
    async fn respond(self) -> Response {
        tokio::time::sleep(FAIL_AFTER).await;
        match self {
            Failing::NoStore503 => (
                StatusCode::SERVICE_UNAVAILABLE,
                [(CACHE_CONTROL, "no-store")],
                "down",
            )
                .into_response(),
            Failing::Cookie500 => (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(SET_COOKIE, "session=abc")],
                "down",
            )
                .into_response(),
            Failing::Private502 => (
                StatusCode::BAD_GATEWAY,
                [(CACHE_CONTROL, "private")],
                "down",
            )
                .into_response(),
        }
    }
}

/// `/report`: answers `v<call>`, or, while `failing` is set, fails as `how`
/// says.
fn failing_origin(
    origin: &Origin,
    failing: &Arc<AtomicBool>,
    how: Failing,
    guard: StampedeGuard,
) -> Router {
    flaky_app(origin, failing, guard, move || how.respond())
}

/// A cold herd on an origin that fails with an uncacheable error answer:
/// the failing origin must be called at most twice.
async fn cold_herd_on_an_uncacheable_error(how: Failing) {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(true));
    let app = failing_origin(&origin, &failing, how, guard().ttl(Duration::from_secs(60)));
    let answers = burst(&app, HERD, || get_req("/report")).await;
    let calls = origin.calls();
    let errors = answers
        .iter()
        .filter(|a| a.status.is_server_error())
        .count();
    assert_eq!(errors, HERD, "{how:?}: every request saw the failure");
    assert!(
        calls <= 2,
        "{how:?}: {HERD} concurrent requests cost {calls} calls to a failing origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_marked_no_store_costs_at_most_two_origin_calls() {
    cold_herd_on_an_uncacheable_error(Failing::NoStore503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_with_a_session_cookie_costs_at_most_two_origin_calls() {
    cold_herd_on_an_uncacheable_error(Failing::Cookie500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_marked_private_costs_at_most_two_origin_calls() {
    cold_herd_on_an_uncacheable_error(Failing::Private502).await;
}

/// The same failure on an expired key inside stale-if-error: everyone should
/// get the stale copy, for at most two origin calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_marked_no_store_is_covered_by_stale_if_error() {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let app = failing_origin(
        &origin,
        &failing,
        Failing::NoStore503,
        guard()
            .ttl(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(30)),
    );
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(150)).await;
    failing.store(true, Ordering::SeqCst);
    let answers = burst(&app, HERD, || get_req("/report")).await;
    let calls = origin.calls() - 1;
    let stale = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK && a.text() == "v1")
        .count();
    let statuses: Vec<_> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert!(
        calls <= 2 && stale == HERD,
        "{HERD} requests cost {calls} origin calls; {stale} got the stale-if-error copy; statuses {statuses:?}"
    );
}

// ---------------------------------------------------------------------------
// HEAD and If-None-Match as the request that starts a rebuild.
// ---------------------------------------------------------------------------

fn etag_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move |req: Request<Body>| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(FAIL_AFTER).await;
                // A conditional or HEAD request reaching the origin would
                // give the waiters less than the entry.
                if req.headers().contains_key(http::header::IF_NONE_MATCH) {
                    return StatusCode::NOT_MODIFIED.into_response();
                }
                if req.method() == http::Method::HEAD {
                    return (StatusCode::OK, [(ETAG, "\"t\"")]).into_response();
                }
                (StatusCode::OK, [(ETAG, "\"t\"")], format!("body{n}")).into_response()
            }
        })
        .layer(guard),
    )
}

async fn starter_then_waiters(app: &Router, starter: Request<Body>) -> (Answer, Vec<Answer>) {
    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, starter).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiters = burst(app, 10, || get_req("/report")).await;
    (first.await.expect("starter"), waiters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_starter_gets_the_head_and_get_waiters_the_whole_body() {
    let origin = Origin::default();
    let app = etag_app(&origin, guard().ttl(Duration::from_secs(60)));
    let head = Request::head("/report").body(Body::empty()).unwrap();
    let (starter, waiters) = starter_then_waiters(&app, head).await;
    assert_eq!(origin.calls(), 1);
    assert_eq!((starter.status, starter.body.len()), (StatusCode::OK, 0));
    for w in waiters {
        assert_eq!((w.status, w.text().as_str()), (StatusCode::OK, "body1"));
    }
    let later = send(&app, get_req("/report")).await;
    assert_eq!((later.x_cache(), later.text().as_str()), ("HIT", "body1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_if_none_match_starter_gets_304_and_waiters_the_whole_body() {
    let origin = Origin::default();
    let app = etag_app(&origin, guard().ttl(Duration::from_secs(60)));
    let conditional = Request::get("/report")
        .header(http::header::IF_NONE_MATCH, "\"t\"")
        .body(Body::empty())
        .unwrap();
    let (starter, waiters) = starter_then_waiters(&app, conditional).await;
    assert_eq!(origin.calls(), 1);
    assert_eq!(starter.status, StatusCode::NOT_MODIFIED);
    for w in waiters {
        assert_eq!((w.status, w.text().as_str()), (StatusCode::OK, "body1"));
    }
}

// ---------------------------------------------------------------------------
// Set-Cookie stripped from the shared copy: the waiters never see the
// starter's cookie.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_starters_cookie_reaches_it_alone_while_thirty_wait() {
    let origin = Origin::default();
    let app = counted_app(
        &origin,
        guard().ttl(Duration::from_secs(60)).strip_set_cookie(true),
        |n| async move {
            tokio::time::sleep(FAIL_AFTER).await;
            ([(SET_COOKIE, format!("session=s{n}"))], format!("v{n}")).into_response()
        },
    );
    let answers = burst(&app, HERD, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    let with_cookie = answers
        .iter()
        .filter(|a| a.headers.contains_key(SET_COOKIE))
        .count();
    assert_eq!(with_cookie, 1, "only the starter gets the cookie");
    let later = send(&app, get_req("/report")).await;
    assert!(!later.headers.contains_key(SET_COOKIE));
}

// ---------------------------------------------------------------------------
// Fail-closed waits (WaitTimeout::Respond) on a failing rebuild.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_waiters_get_the_route_code_and_the_failing_origin_is_called_once() {
    let origin = Origin::default();
    let app = counted_app(
        &origin,
        guard()
            .ttl(Duration::from_secs(60))
            .wait_budget(Duration::from_millis(100))
            .on_wait_timeout(WaitTimeout::Respond(StatusCode::TOO_MANY_REQUESTS)),
        |_| async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            panic!("handler panicked (on purpose)");
            #[allow(unreachable_code)]
            ""
        },
    );
    let tasks = spawn_requests(&app, HERD);
    let mut panicked = 0;
    let mut codes = Vec::new();
    for t in tasks {
        match t.await {
            Ok(a) => codes.push(a.status),
            Err(e) if e.is_panic() => panicked += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(origin.calls(), 1);
    assert_eq!(panicked, 1, "the starter sees its panic");
    assert!(
        codes.iter().all(|c| *c == StatusCode::TOO_MANY_REQUESTS),
        "waiters past the budget get the route's code: {codes:?}"
    );
}

// ---------------------------------------------------------------------------
// A background refresh (stale-while-revalidate) running when invalidate()
// is called must not store, and requests after invalidate() get new data.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_refresh_running_at_invalidate_neither_stores_nor_answers_later_requests() {
    let v = Versioned::unparked();
    let g = guard()
        .ttl(Duration::from_millis(100))
        .stale_while_revalidate(Duration::from_secs(30));
    let app = versioned_app(&v, g.clone());
    assert_eq!(send(&app, get_req("/report")).await.text(), "old");
    tokio::time::sleep(Duration::from_millis(150)).await;
    v.park.store(true, Ordering::SeqCst);
    let stale = send(&app, get_req("/report")).await;
    assert_eq!((stale.x_cache(), stale.text().as_str()), ("STALE", "old"));
    v.entered.notified().await; // the refresh read "old" and is parked
    *v.current.lock().unwrap() = "new";
    g.invalidate(&get_req("/report")).await.expect("embedded");
    let after = burst(&app, 5, || get_req("/report")).await;
    v.release.notify_one();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let later = burst(&app, 5, || get_req("/report")).await;
    for a in after.iter().chain(&later) {
        assert_eq!(
            a.text(),
            "new",
            "a request after invalidate() got {:?}",
            a.x_cache()
        );
    }
}

/// The same with the generic cache and early refresh: a hot key refreshed
/// early, invalidated while the early refresh runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_refresh_running_at_invalidate_does_not_store() {
    let v = Versioned::unparked();
    let cache: Cache<String> = Cache::new(Backend::local())
        .ttl(Duration::from_millis(300))
        .early_refresh(1000.0);
    let call = |cache: Cache<String>, v: Versioned| async move {
        cache
            .get_or_rebuild("k", move || async move {
                Ok::<_, std::io::Error>(v.answer().await)
            })
            .await
            .expect("rebuild")
    };
    // The first rebuild takes a while so the entry has a rebuild cost.
    assert_eq!(call(cache.clone(), v.clone()).await, "old");
    v.park.store(true, Ordering::SeqCst);
    // Hit until the early refresh starts (and parks).
    let parked = async {
        loop {
            let _ = call(cache.clone(), v.clone()).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            if !v.park.load(Ordering::SeqCst) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(2), parked)
        .await
        .expect("an early refresh started");
    *v.current.lock().unwrap() = "new";
    cache.invalidate("k").await.expect("embedded");
    assert_eq!(call(cache.clone(), v.clone()).await, "new");
    v.release.notify_one();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(cache.get("k").as_deref(), Some("new"));
}

// ---------------------------------------------------------------------------
// Nothing stranded: many keys, every outcome, no task left behind.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_and_every_outcome_leave_no_task_behind() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/k/{id}",
        get(move |axum::extract::Path(id): axum::extract::Path<u32>| {
            let o = o.clone();
            async move {
                let _ = o.enter();
                tokio::time::sleep(Duration::from_millis(20)).await;
                match id % 5 {
                    0 => panic!("on purpose"),
                    1 => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(CACHE_CONTROL, "no-store")],
                        "x",
                    )
                        .into_response(),
                    2 => ([(SET_COOKIE, "a=b")], "c").into_response(),
                    3 => {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        "late".into_response()
                    }
                    _ => format!("v{id}").into_response(),
                }
            }
        })
        .layer(
            guard()
                .ttl(Duration::from_secs(60))
                .rebuild_timeout(Duration::from_millis(200)),
        ),
    );
    let metrics = tokio::runtime::Handle::current().metrics();
    let base = metrics.num_alive_tasks();
    for round in 0..2 {
        let tasks: Vec<_> = (0..200u32)
            .flat_map(|id| (0..3).map(move |_| id).collect::<Vec<_>>())
            .map(|id| {
                let app = app.clone();
                tokio::spawn(async move {
                    let _ = send(&app, get_req(&format!("/k/{id}"))).await;
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        let _ = round;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive = metrics.num_alive_tasks();
    assert!(
        alive <= base,
        "{} tasks alive after the requests ended (before: {base})",
        alive
    );
}
