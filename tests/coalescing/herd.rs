//! One origin call per key: coalescing, stale serving and leader hand-over,
//! on real axum routers under real concurrency.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{burst, get as get_req, send, tally, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use stampede_guard::{Backend, StampedeGuard, WaitTimeout};
use tokio::sync::Notify;

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local())
}

/// A route whose handler takes `delay` and answers `v<call number>`.
fn slow_app(origin: &Origin, delay: Duration, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(delay).await;
                format!("v{n}")
            }
        })
        .layer(guard),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_requests_on_a_cold_key_call_the_handler_once() {
    let origin = Origin::default();
    let app = slow_app(&origin, Duration::from_millis(100), guard());
    let answers = burst(&app, 1000, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v1"));
    assert_eq!(tally(&answers, "MISS"), 1);
    assert_eq!(
        tally(&answers, "COALESCED") + tally(&answers, "HIT"),
        999,
        "every other request is answered by the one rebuild"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_over_tcp_call_the_handler_once() {
    use http_body_util::BodyExt;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let origin = Origin::default();
    let app = slow_app(&origin, Duration::from_millis(100), guard());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let client = client.clone();
            let uri: http::Uri = format!("http://{addr}/report").parse().unwrap();
            tokio::spawn(async move {
                let response = client.get(uri).await.expect("request");
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, body)
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"v1");
    }
    assert_eq!(origin.calls(), 1);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_key_is_rebuilt_once_per_expiry() {
    let origin = Origin::default();
    let app = slow_app(
        &origin,
        Duration::from_millis(50),
        guard().ttl(Duration::from_millis(200)),
    );
    burst(&app, 200, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = burst(&app, 200, || get_req("/report")).await;
    assert_eq!(origin.calls(), 2);
    assert!(answers.iter().all(|a| a.text() == "v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_stale_and_refreshes_once() {
    let origin = Origin::default();
    let app = slow_app(
        &origin,
        Duration::from_millis(300),
        guard()
            .ttl(Duration::from_millis(200))
            .stale_while_revalidate(Duration::from_secs(30)),
    );
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(250)).await;

    let answers = burst(&app, 300, || get_req("/report")).await;
    assert!(
        answers
            .iter()
            .all(|a| a.x_cache() == "STALE" && a.text() == "v1"),
        "nobody waits while the entry is revalidated"
    );
    // Let the one background refresh land.
    for _ in 0..100 {
        if origin.calls() == 2 && send(&app, get_req("/report")).await.text() == "v2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.calls(), 2, "exactly one background refresh");
    let after = send(&app, get_req("/report")).await;
    assert_eq!((after.x_cache(), after.text().as_str()), ("HIT", "v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_the_stale_copy_on_a_5xx() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/report",
        get(move || {
            let origin = o.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(Duration::from_millis(50)).await;
                if n == 1 {
                    (StatusCode::OK, "good").into_response()
                } else {
                    (StatusCode::BAD_GATEWAY, "bad").into_response()
                }
            }
        })
        .layer(
            guard()
                .ttl(Duration::from_millis(100))
                .stale_if_error(Duration::from_secs(30)),
        ),
    );
    send(&app, get_req("/report")).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let answers = burst(&app, 50, || get_req("/report")).await;
    assert_eq!(origin.calls(), 2, "one failed rebuild for the whole burst");
    for a in &answers {
        assert_eq!(
            (a.status, a.text().as_str(), a.x_cache()),
            (StatusCode::OK, "good", "STALE")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_rebuild_without_stale_is_shared_not_stored() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/report",
        get(move || {
            let origin = o.clone();
            async move {
                let (_n, _running) = origin.enter();
                tokio::time::sleep(Duration::from_millis(100)).await;
                (StatusCode::SERVICE_UNAVAILABLE, "down")
            }
        })
        .layer(guard()),
    );
    let answers = burst(&app, 100, || get_req("/report")).await;
    assert_eq!(
        origin.calls(),
        1,
        "a failing origin is not stampeded either"
    );
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::SERVICE_UNAVAILABLE));
    send(&app, get_req("/report")).await;
    assert_eq!(origin.calls(), 2, "the 5xx was not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_service_errors_pass_through_or_fall_back_on_stale() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Service, ServiceBuilder, ServiceExt};

    let calls = Arc::new(AtomicUsize::new(0));
    let make = |guard: StampedeGuard| {
        let calls = calls.clone();
        ServiceBuilder::new()
            .layer(guard)
            .service_fn(move |_req: Request<Body>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Ok(Response::new(Body::from("first")))
                    } else {
                        Err(std::io::Error::other("origin down"))
                    }
                }
            })
    };

    // Without stale-if-error the inner error type reaches the caller unchanged.
    let mut plain = make(guard().ttl(Duration::from_millis(50)));
    plain
        .ready()
        .await
        .unwrap()
        .call(get_req("/x"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let error: std::io::Error = plain
        .ready()
        .await
        .unwrap()
        .call(get_req("/x"))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "origin down");

    calls.store(0, Ordering::SeqCst);
    let mut tolerant = make(
        guard()
            .ttl(Duration::from_millis(50))
            .stale_if_error(Duration::from_secs(30)),
    );
    tolerant
        .ready()
        .await
        .unwrap()
        .call(get_req("/y"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let response = tolerant
        .ready()
        .await
        .unwrap()
        .call(get_req("/y"))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-cache"], "STALE");
    let answer = crate::common::collect(response.map(Body::new)).await;
    assert_eq!(answer.text(), "first");
}

/// A route whose first call parks until released (then does `first`), and
/// whose later calls answer at once.
fn parked_first_call(
    origin: &Origin,
    entered: Arc<Notify>,
    release: Arc<Notify>,
    panic: bool,
) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            let entered = entered.clone();
            let release = release.clone();
            async move {
                let (n, _running) = origin.enter();
                if n == 1 {
                    entered.notify_one();
                    release.notified().await;
                    if panic {
                        panic!("handler panicked (on purpose)");
                    }
                }
                format!("v{n}")
            }
        })
        .layer(guard()),
    )
}

/// The leader parks in the handler while 100 followers queue on its flight;
/// then it goes away (its client's task is aborted, and the handler is let go
/// on), or its handler panics. Returns how the leader's task ended, the
/// followers' answers and the origin.
async fn leader_goes_away(
    panic: bool,
) -> (tokio::task::JoinError, Vec<crate::common::Answer>, Origin) {
    let origin = Origin::default();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let app = parked_first_call(&origin, entered.clone(), release.clone(), panic);

    let leader = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get_req("/report")).await })
    };
    entered.notified().await;
    let followers = {
        let app = app.clone();
        tokio::spawn(async move { burst(&app, 100, || get_req("/report")).await })
    };
    // Let the followers queue on the flight before the leader goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if !panic {
        leader.abort();
    }
    release.notify_one();
    let ended = leader.await.expect_err("the leader does not finish");
    (ended, followers.await.unwrap(), origin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leader_does_not_cancel_the_rebuild() {
    let (ended, answers, origin) = leader_goes_away(false).await;
    assert!(ended.is_cancelled());
    assert_eq!(
        origin.calls(),
        1,
        "the rebuild belongs to the key, not the client"
    );
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v1"));
    assert_eq!(
        tally(&answers, "MISS"),
        0,
        "nobody started a second rebuild"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_flight_once_for_every_waiter() {
    let (ended, answers, origin) = leader_goes_away(true).await;
    assert!(
        ended.is_panic(),
        "the leader's client sees the panic as without the layer"
    );
    assert_eq!(origin.calls(), 1, "no waiter went to the origin");
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::INTERNAL_SERVER_ERROR && a.x_cache() == "COALESCED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_wait_budget_answers_as_configured() {
    let origin = Origin::default();
    let app = slow_app(
        &origin,
        Duration::from_millis(1500),
        guard()
            .wait_budget(Duration::from_millis(50))
            .on_wait_timeout(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE)),
    );
    let answers = burst(&app, 20, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE)
            .count(),
        19
    );

    // Fail open (the default): waiters past the budget are still answered,
    // and not by a herd of their own origin calls: they keep waiting for the
    // rebuild that is running.
    let origin = Origin::default();
    let app = slow_app(
        &origin,
        Duration::from_millis(300),
        guard().wait_budget(Duration::from_millis(50)),
    );
    let answers = burst(&app, 10, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unshareable_answers_send_waiters_to_the_origin_side_by_side() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/me",
        get(move || {
            let origin = o.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(Duration::from_millis(100)).await;
                ([("set-cookie", format!("session={n}"))], format!("for {n}"))
            }
        })
        .layer(guard()),
    );
    let answers = burst(&app, 40, || get_req("/me")).await;
    assert_eq!(origin.calls(), 40, "each request got its own answer");
    assert!(
        origin.peak() > 1,
        "waiters went to the origin together, not one after another"
    );
    let mut cookies: Vec<_> = answers
        .iter()
        .map(|a| a.headers["set-cookie"].to_str().unwrap().to_owned())
        .collect();
    cookies.sort();
    cookies.dedup();
    assert_eq!(
        cookies.len(),
        40,
        "no cookie was replayed to another client"
    );
    assert_eq!(tally(&answers, "COALESCED"), 0);
}
