//! RFC 9111 semantics for the requests waiting on a rebuild, as an attacker
//! would test them: refusals meant for one client, hit-for-miss windows,
//! and the end of a wait.

use std::time::Duration;

use crate::common::driver::{counted_app, headers_app};
use crate::common::{get as get_req, local_guard, request_with, send, tally, Answer, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard, WaitTimeout};

const TTL: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------
// 6. Refusals are not handed to waiters.
// ---------------------------------------------------------------------------

/// How long the refusing origin takes: long enough for waiters to gather.
const REFUSE_AFTER: Duration = Duration::from_millis(200);

/// `/report` that takes a while and refuses (with `refusal`, and a
/// challenge cookie) a request from `x-client: bot`, answering `v<call>` to
/// everyone else.
fn refusing_app(origin: &Origin, guard: StampedeGuard, refusal: StatusCode) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(REFUSE_AFTER).await;
                if headers.get("x-client").is_some_and(|v| v == "bot") {
                    return (refusal, [("set-cookie", "challenge=1")], "go away").into_response();
                }
                format!("v{n}").into_response()
            }
        })
        .layer(guard),
    )
}

fn bot() -> Request<Body> {
    request_with("GET", "/report", &[("x-client", "bot")])
}

#[tokio::test]
async fn a_refusal_timed_at_expiry_is_not_handed_to_the_waiters() {
    for refusal in [
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::FORBIDDEN,
        StatusCode::UNAUTHORIZED,
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        StatusCode::CREATED,
        StatusCode::BAD_REQUEST,
    ] {
        let origin = Origin::default();
        let app = refusing_app(&origin, local_guard(), refusal);
        let attacker = {
            let app = app.clone();
            tokio::spawn(async move { send(&app, bot()).await })
        };
        tokio::time::sleep(REFUSE_AFTER / 4).await;
        let waiters = crate::common::driver::spawn_requests(&app, 20);
        let attacked = attacker.await.unwrap();
        assert_eq!(attacked.status, refusal);
        assert_eq!(attacked.text(), "go away");
        let texts = crate::common::driver::texts(waiters).await;
        // One waiter led again; the others waited on it.
        assert!(texts.iter().all(|t| t == "v2"), "{refusal}: {texts:?}");
        assert_eq!(origin.calls(), 2, "{refusal}");
        assert_eq!(origin.peak(), 1, "{refusal}: never a herd");
        // No hit-for-miss marker: the key is cached and coalesced as usual.
        let next = send(&app, get_req("/report")).await;
        assert_eq!(
            (next.x_cache(), next.text().as_str()),
            ("HIT", "v2"),
            "{refusal}"
        );
    }
}

#[tokio::test]
async fn a_refusal_does_not_open_a_hit_for_miss_window() {
    let origin = Origin::default();
    let app = refusing_app(&origin, local_guard(), StatusCode::FORBIDDEN);
    assert_eq!(send(&app, bot()).await.status, StatusCode::FORBIDDEN);
    // The next requests coalesce on one rebuild, as if nothing happened.
    let answers = crate::common::burst(&app, 10, || get_req("/report")).await;
    assert_eq!(tally(&answers, "BYPASS"), 0);
    assert!(answers.iter().all(|a| a.text() == "v2"));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test]
async fn a_refusal_leaves_the_stale_if_error_copy_in_place() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .stale_if_error(Duration::from_secs(60));
    let app = refusing_app(&origin, guard, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert_eq!(
        send(&app, bot()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, get_req("/report")).await.text(), "v3");
    assert_eq!(origin.calls(), 3);
}

// ---------------------------------------------------------------------------
// 7. Hit-for-miss does not block the key.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn one_cookie_does_not_turn_a_hot_key_into_uncoalesced_calls() {
    let origin = Origin::default();
    let app = counted_app(&origin, local_guard(), |n| async move {
        if n == 1 {
            return ([("set-cookie", "sid=secret")], "personal").into_response();
        }
        format!("v{n}").into_response()
    });
    let first = send(&app, get_req("/report")).await;
    assert_eq!(first.text(), "personal");
    // A steady stream inside the 5 s hit-for-miss window.
    let mut tasks = Vec::new();
    for _ in 0..100 {
        tasks.push(crate::common::driver::spawn_request(&app));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let texts = crate::common::driver::texts(tasks).await;
    assert!(
        origin.calls() <= 3,
        "{} origin calls for 101 requests",
        origin.calls()
    );
    assert!(
        texts.iter().all(|t| t.starts_with('v')),
        "nobody gets the cookie answer"
    );
    let last = send(&app, get_req("/report")).await;
    assert_eq!(last.x_cache(), "HIT");
    assert!(last.headers.get("set-cookie").is_none());
}

#[tokio::test]
async fn a_key_that_keeps_setting_cookies_stays_uncoalesced_and_unstored() {
    let origin = Origin::default();
    let app = headers_app(
        &origin,
        local_guard(),
        vec![("set-cookie", HeaderValue::from_static("sid=x"))],
    );
    for n in 1..=5 {
        let a = send(&app, get_req("/report")).await;
        assert_eq!(a.text(), format!("v{n}"));
        assert_eq!(a.headers["set-cookie"], "sid=x");
    }
    assert_eq!(origin.calls(), 5);
}

// ---------------------------------------------------------------------------
// 8. No herd at the end of a wait.
// ---------------------------------------------------------------------------

async fn herd_after_budget(guard: StampedeGuard) -> (Origin, Vec<Answer>) {
    let origin = Origin::default();
    let app = counted_app(
        &origin,
        guard.wait_budget(Duration::from_millis(100)),
        |n| async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            format!("v{n}")
        },
    );
    let answers = crate::common::burst(&app, 30, || get_req("/report")).await;
    (origin, answers)
}

#[tokio::test]
async fn waiters_out_of_budget_never_call_the_origin_together() {
    // Failing closed: the waiters get the route's status, one call runs.
    let (origin, answers) = herd_after_budget(
        local_guard().on_wait_timeout(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE)),
    )
    .await;
    assert_eq!((origin.calls(), origin.peak()), (1, 1));
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    let refused = answers
        .iter()
        .filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!((ok, refused), (1, 29));

    // Failing open: they keep waiting on the one flight.
    let (origin, answers) = herd_after_budget(local_guard()).await;
    assert_eq!((origin.calls(), origin.peak()), (1, 1));
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v1"));
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_out_of_budget_never_call_the_origin_together_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    let backend = crate::common::driver::connect(&redis).await;
    let (origin, answers) =
        herd_after_budget(StampedeGuard::new(backend).ttl(Duration::from_secs(60))).await;
    assert_eq!((origin.calls(), origin.peak()), (1, 1));
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v1"));
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_not_handed_to_the_waiters_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    let backend = crate::common::driver::connect(&redis).await;
    let origin = Origin::default();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = refusing_app(&origin, guard, StatusCode::TOO_MANY_REQUESTS);
    let attacker = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, bot()).await })
    };
    tokio::time::sleep(REFUSE_AFTER / 4).await;
    let waiters = crate::common::driver::spawn_requests(&app, 20);
    assert_eq!(
        attacker.await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let texts = crate::common::driver::texts(waiters).await;
    assert!(texts.iter().all(|t| t == "v2"), "{texts:?}");
    assert_eq!((origin.calls(), origin.peak()), (2, 1));
}

#[tokio::test]
async fn a_refusal_to_a_background_refresh_keeps_the_stale_copy() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .stale_while_revalidate(Duration::from_secs(60));
    let app = refusing_app(&origin, guard, StatusCode::FORBIDDEN);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    // The bot's request is served stale and its refresh is refused.
    let stale = send(&app, bot()).await;
    assert_eq!((stale.x_cache(), stale.text().as_str()), ("STALE", "v1"));
    tokio::time::sleep(REFUSE_AFTER + Duration::from_millis(100)).await;
    assert_eq!(origin.calls(), 2);
    // The copy is still there, and the next refresh is anyone's.
    let next = send(&app, get_req("/report")).await;
    assert_eq!((next.x_cache(), next.text().as_str()), ("STALE", "v1"));
    tokio::time::sleep(REFUSE_AFTER + Duration::from_millis(100)).await;
    let fresh = send(&app, get_req("/report")).await;
    assert_eq!((fresh.x_cache(), fresh.text().as_str()), ("HIT", "v3"));
}

#[tokio::test]
async fn a_key_whose_status_is_never_stored_does_not_queue_its_requests() {
    // A hot redirect the route does not store: after two unshared answers in
    // a row the key is hit-for-miss, and its requests run side by side
    // rather than each waiting for all the ones before it.
    let origin = Origin::default();
    let app = counted_app(&origin, local_guard(), |n| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        (
            StatusCode::FOUND,
            [("location", "/elsewhere")],
            format!("v{n}"),
        )
    });
    let answers = crate::common::burst(&app, 20, || get_req("/report")).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::FOUND));
    assert!(origin.peak() > 1, "the requests ran side by side");
    assert!(origin.calls() <= 20);
    // Every answer was the caller's own.
    let mut texts: Vec<String> = answers.iter().map(Answer::text).collect();
    texts.sort();
    texts.dedup();
    assert_eq!(texts.len(), 20);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cookie_does_not_unhinge_a_hot_key_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    let backend = crate::common::driver::connect(&redis).await;
    let origin = Origin::default();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = counted_app(&origin, guard, |n| async move {
        if n == 1 {
            return ([("set-cookie", "sid=secret")], "personal").into_response();
        }
        format!("v{n}").into_response()
    });
    assert_eq!(send(&app, get_req("/report")).await.text(), "personal");
    let mut tasks = Vec::new();
    for _ in 0..50 {
        tasks.push(crate::common::driver::spawn_request(&app));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let texts = crate::common::driver::texts(tasks).await;
    assert!(texts.iter().all(|t| t.starts_with('v')), "{texts:?}");
    assert!(origin.calls() <= 3, "{} origin calls", origin.calls());
}
