//! A request's own cache directives (`Cache-Control: no-store`, `no-cache`,
//! `max-age=0`, `Pragma: no-cache`): by default no client can cost the
//! origin more than one miss per key with them; a route that opts in
//! follows them (RFC 9111 §5.2.1), one origin call per such request.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Semaphore;

use crate::common::driver::counted_app;
use crate::common::{burst, get, send, tally, Origin};

/// Every request directive a client may send to force an origin call.
const DIRECTIVES: [(&str, &str); 6] = [
    ("cache-control", "no-store"),
    ("cache-control", "no-cache"),
    ("cache-control", "max-age=0"),
    ("cache-control", "no-cache, no-store, max-age=0"),
    ("cache-control", "must-revalidate, min-fresh=100000"),
    ("pragma", "no-cache"),
];

fn with(header: (&str, &str)) -> Request<Body> {
    Request::get("/report")
        .header(header.0, header.1)
        .body(Body::empty())
        .unwrap()
}

/// `/report` answering `v<call>`; calls after the first wait for a permit
/// from `gate`.
fn gated_app(origin: &Origin, guard: StampedeGuard, gate: &Arc<Semaphore>) -> Router {
    let gate = gate.clone();
    counted_app(origin, guard, move |n| {
        let gate = gate.clone();
        async move {
            if n > 1 {
                gate.acquire().await.expect("gate").forget();
            }
            format!("v{n}")
        }
    })
}

/// Polls until `origin` has been called `n` times (or a generous limit).
async fn until_calls(origin: &Origin, n: usize) {
    for _ in 0..2000 {
        if origin.calls() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the origin was called {} times, not {n}", origin.calls());
}

#[tokio::test]
async fn request_directives_on_a_warm_key_cost_no_origin_call_by_default() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    assert_eq!(send(&app, get("/report")).await.text(), "v1");
    for header in DIRECTIVES {
        // Ten one after the other.
        for _ in 0..10 {
            let answer = send(&app, with(header)).await;
            assert_eq!((answer.x_cache(), answer.text().as_str()), ("HIT", "v1"));
        }
        // Thirty at once.
        let answers = burst(&app, 30, || with(header)).await;
        assert_eq!(tally(&answers, "HIT"), 30, "{header:?}");
        assert!(answers.iter().all(|a| a.text() == "v1"), "{header:?}");
    }
    assert_eq!(origin.calls(), 1, "a request directive reached the origin");
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_no_cache_on_an_expired_key_is_one_coalesced_rebuild() {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_millis(200));
    let app = gated_app(&origin, guard, &gate);
    assert_eq!(send(&app, get("/report")).await.text(), "v1");
    // Past the ttl (a sleep longer than it makes the entry expired,
    // whatever the load).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let app = app.clone();
            let header = DIRECTIVES[i % DIRECTIVES.len()];
            tokio::spawn(async move { send(&app, with(header)).await })
        })
        .collect();
    // The flight's task runs after every request of the burst has joined it.
    until_calls(&origin, 2).await;
    gate.add_permits(100);
    for task in tasks {
        let answer = task.await.unwrap();
        assert_eq!(answer.text(), "v2");
        assert!(
            ["MISS", "COALESCED"].contains(&answer.x_cache()),
            "{}",
            answer.x_cache()
        );
    }
    assert_eq!(origin.calls(), 2, "one rebuild for the whole burst");
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_no_cache_on_a_stale_key_is_one_background_revalidation() {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(200))
        .stale_while_revalidate(Duration::from_secs(600));
    let app = gated_app(&origin, guard, &gate);
    assert_eq!(send(&app, get("/report")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let answers = burst(&app, 30, || with(("cache-control", "no-cache"))).await;
    assert_eq!(tally(&answers, "STALE"), 30);
    assert!(answers.iter().all(|a| a.text() == "v1"));
    until_calls(&origin, 2).await;
    gate.add_permits(100);
    // The refresh lands: the next request is a hit on it.
    for _ in 0..2000 {
        let answer = send(&app, get("/report")).await;
        if answer.text() == "v2" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(origin.calls(), 2, "one revalidation for the whole burst");
}

#[tokio::test]
async fn a_route_that_follows_request_directives_sends_each_to_the_origin() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(600))
        .respect_request_cache_control(true);
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    assert_eq!(send(&app, get("/report")).await.text(), "v1");
    for _ in 0..10 {
        let answer = send(&app, with(("cache-control", "no-store"))).await;
        assert_eq!(answer.x_cache(), "BYPASS");
    }
    assert_eq!(origin.calls(), 11);
    let answers = burst(&app, 30, || with(("pragma", "no-cache"))).await;
    assert_eq!(tally(&answers, "BYPASS"), 30);
    assert_eq!(origin.calls(), 41);
    // None of them replaced the entry.
    let answer = send(&app, get("/report")).await;
    assert_eq!((answer.x_cache(), answer.text().as_str()), ("HIT", "v1"));
    // A directive it does not follow changes nothing.
    let answer = send(&app, with(("cache-control", "max-age=5"))).await;
    assert_eq!(answer.x_cache(), "HIT");
    assert_eq!(origin.calls(), 41);
}

#[tokio::test]
async fn the_safety_rules_hold_whatever_the_directives() {
    // Credentials still pass through on either kind of route.
    for follow in [false, true] {
        let origin = Origin::default();
        let guard = StampedeGuard::new(Backend::local())
            .ttl(Duration::from_secs(600))
            .respect_request_cache_control(follow);
        let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
        send(&app, get("/report")).await;
        let request = Request::get("/report")
            .header("authorization", "Bearer x")
            .header("cache-control", "max-age=600")
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, request).await.x_cache(), "BYPASS");
        assert_eq!(origin.calls(), 2, "follow={follow}");
    }
}
