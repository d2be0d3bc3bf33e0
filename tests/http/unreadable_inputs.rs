//! Inputs at the edge of the promises: an `Age` that is not
//! delta-seconds, a request body that holds only trailers, header
//! names equal under case folding, and the fleet barrier across instances
//! configured with different deadlines.

use std::convert::Infallible;
#[cfg(feature = "redis")]
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::time::Duration;

use crate::common::driver::counted_app;
#[cfg(feature = "redis")]
use crate::common::proxy::Proxy;
#[cfg(feature = "redis")]
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, local_guard, send, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
#[cfg(feature = "redis")]
use stampede_guard::Backend;
use stampede_guard::StampedeGuard;

/// Under the strict invalidation barrier (no outage grace): the tests on
/// it check that a frozen instance serves nothing from before a purge.
#[cfg(feature = "redis")]
async fn backend_at(url: &str, deadline: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(deadline)
        .outage_grace(Duration::ZERO)
        .connect()
        .await
        .expect("redis backend")
}

// ---------------------------------------------------------------------------
// B. An Age that is not delta-seconds is ignored (RFC 9111 §5.1).
// ---------------------------------------------------------------------------

/// `Age: soon`, `-7200`, `7200.0` are not delta-seconds: ignored, so the
/// answer's age is its apparent age (none here) and it is served from the
/// cache while its max-age lasts; one origin call for three requests.
/// `7200;foo=bar` is 7200 with a parameter: older than its max-age, never
/// served from the cache.
#[tokio::test]
async fn an_age_that_is_not_delta_seconds_is_ignored() {
    for (age, cached) in [
        ("soon", true),
        ("-7200", true),
        ("7200.0", true),
        ("", true),
        ("7200;foo=bar", false),
        ("7200, 0", false),
        ("0, 7200", true),
    ] {
        for respect in [true, false] {
            let origin = Origin::default();
            let app = counted_app(
                &origin,
                local_guard().respect_cache_control(respect),
                move |n| async move {
                    (
                        [("cache-control", "max-age=3600"), ("age", age)],
                        format!("v{n}"),
                    )
                        .into_response()
                },
            );
            assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
            let second = send(&app, get_req("/report")).await;
            let third = send(&app, get_req("/report")).await;
            let calls = if cached { 1 } else { 3 };
            assert_eq!(
                origin.calls(),
                calls,
                "Age {age:?} (respect {respect}): second {} {:?}, third {}",
                second.x_cache(),
                second.headers.get("age"),
                third.x_cache(),
            );
            if cached {
                assert_eq!(second.text(), "v1");
                let served: u64 = second.headers["age"].to_str().unwrap().parse().unwrap();
                assert!(served < 60, "Age {age:?} served as {served} s old");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// D. A request body that has not ended is discarded.
// ---------------------------------------------------------------------------

/// `/report` answers with the `x-user` trailer of its request body.
fn trailer_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    let handler = move |request: Request<Body>| {
        let origin = origin.clone();
        async move {
            let (n, _running) = origin.enter();
            let collected = request.into_body().collect().await.expect("body");
            let user = collected
                .trailers()
                .and_then(|t| t.get("x-user"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("nobody")
                .to_owned();
            format!("{user}#{n}")
        }
    };
    Router::new().route("/report", get(handler).layer(guard))
}

/// A GET whose body has no data but trailers: its `size_hint` is exactly
/// zero (no data bytes), yet it has not ended (`is_end_stream` is false, a
/// trailers frame follows).
fn with_trailer(user: &'static str) -> Request<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert("x-user", HeaderValue::from_static(user));
    let body =
        Full::new(Bytes::new()).with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
    Request::get("/report").body(Body::new(body)).unwrap()
}

/// Trailers are part of the content the layer discards: the handler sees
/// neither data nor trailers, so no answer they shaped reaches anyone, and
/// the request costs what a plain GET does.
#[tokio::test]
async fn a_body_of_trailers_only_is_discarded_like_any_content() {
    let origin = Origin::default();
    let app = trailer_app(&origin, local_guard());
    let alice = send(&app, with_trailer("alice")).await;
    assert_eq!(alice.text(), "nobody#1", "the handler saw the trailers");
    let bob = send(&app, with_trailer("bob")).await;
    assert_eq!((bob.text(), bob.x_cache()), ("nobody#1".to_owned(), "HIT"));
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------------------
// E. The fleet barrier.
// ---------------------------------------------------------------------------

/// The sender waits one subscription lease computed from its own deadline;
/// a receiver trusts its L1 for a lease computed from its own. With A on a
/// 50 ms deadline (lease 2.25 s) and B on a 3 s one (lease 5 s), B frozen
/// while A invalidates: A's call returns `Ok` after its 2.25 s, and B,
/// whose last ping was confirmed under a second before the freeze, still
/// trusts its copy for about 2.7 s more. A request to B that starts after
/// `invalidate` returned gets the value built before it.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_different_deadlines_keep_the_barrier() {
    frozen_receiver_after_invalidate(Duration::from_millis(50), Duration::from_secs(3)).await;
}

/// The control: the same fleet with one deadline (3 s) on both.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_one_deadline_keep_the_barrier() {
    frozen_receiver_after_invalidate(Duration::from_secs(3), Duration::from_secs(3)).await;
}

#[cfg(feature = "redis")]
async fn frozen_receiver_after_invalidate(a_deadline: Duration, b_deadline: Duration) {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let numbered = |guard: StampedeGuard| {
        counted_app(
            &origin,
            guard.ttl(Duration::from_secs(60)),
            |n| async move { format!("v{n}") },
        )
    };
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), a_deadline).await);
    let a = numbered(a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = numbered(StampedeGuard::new(
        backend_at(&proxy.url(), b_deadline).await,
    ));
    assert_eq!(send(&b, get_req("/report")).await.text(), "v1");
    assert_eq!(send(&a, get_req("/report")).await.text(), "v1");
    assert_eq!(send(&b, get_req("/report")).await.x_cache(), "HIT");

    proxy.freeze();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    let after = tokio::time::timeout(Duration::from_secs(30), send(&b, get_req("/report")))
        .await
        .expect("an answer");
    assert_ne!(
        after.text(),
        "v1",
        "after invalidate returned Ok, B answered the value built before it \
         (x-cache {:?})",
        after.x_cache()
    );
    proxy.thaw();
}

// ---------------------------------------------------------------------------
// A. Query names: what some origin takes for one name keeps its order.
// ---------------------------------------------------------------------------

/// `/report` answers the values of the name `ä`, in order, matching names
/// the way a case-insensitive origin does (Unicode lowercase, as .NET's
/// `OrdinalIgnoreCase` query collection or any `to_lowercase()` lookup).
fn folded_names_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    let handler =
        move |axum::extract::Query(pairs): axum::extract::Query<Vec<(String, String)>>| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let values: Vec<String> = pairs
                    .into_iter()
                    .filter(|(name, _)| name.to_lowercase() == "ä")
                    .map(|(_, value)| value)
                    .collect();
                format!("{}#{n}", values.join(","))
            }
        };
    Router::new().route("/report", get(handler).layer(guard))
}

/// The key folds ASCII case only (`a`, `A`, `%61` compare equal, so their
/// pairs keep the client's order), but sorts `Ä` (`%C3%84`) before `ä`
/// (`%C3%A4`) by their bytes: `?ä=1&Ä=2` and `?Ä=2&ä=1`, two lists in
/// opposite order to a case-insensitive origin, share one entry.
#[tokio::test]
async fn names_equal_under_unicode_case_folding_keep_their_order() {
    let origin = Origin::default();
    let app = folded_names_app(&origin, local_guard());
    for uri in ["/report?%C3%A4=1&%C3%84=2", "/report?%C3%A4=1&%C3%84=2"] {
        assert_eq!(send(&app, get_req(uri)).await.text(), "1,2#1");
    }
    let reversed = send(&app, get_req("/report?%C3%84=2&%C3%A4=1")).await;
    assert_eq!(
        reversed.text(),
        "2,1#2",
        "the reversed list was answered from the other order's entry (x-cache {:?})",
        reversed.x_cache()
    );
}

/// The control: the same attack with ASCII names is kept apart.
#[tokio::test]
async fn names_equal_under_ascii_case_folding_keep_their_order() {
    let origin = Origin::default();
    let origin2 = origin.clone();
    let handler =
        move |axum::extract::Query(pairs): axum::extract::Query<Vec<(String, String)>>| {
            let origin = origin2.clone();
            async move {
                let (n, _running) = origin.enter();
                let values: Vec<String> = pairs
                    .into_iter()
                    .filter(|(name, _)| name.to_lowercase() == "b")
                    .map(|(_, value)| value)
                    .collect();
                format!("{}#{n}", values.join(","))
            }
        };
    let app = Router::new().route("/report", get(handler).layer(local_guard()));
    assert_eq!(send(&app, get_req("/report?b=1&B=2")).await.text(), "1,2#1");
    assert_eq!(send(&app, get_req("/report?B=2&b=1")).await.text(), "2,1#2");
}

/// Two instances invalidate the same URL at once while a third is
/// rebuilding it from the origin (a slow one, started before both): once
/// both calls have returned `Ok`, no instance answers the value that
/// rebuild made, whether a request joins it or reads what it stored.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_invalidations_during_a_rebuild_elsewhere() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let entered = Arc::new(tokio::sync::Notify::new());
    let slow = |guard: StampedeGuard| {
        let entered = entered.clone();
        counted_app(&origin, guard.ttl(Duration::from_secs(60)), move |n| {
            let entered = entered.clone();
            async move {
                entered.notify_one();
                if n == 1 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                format!("v{n}")
            }
        })
    };
    let mut guards = Vec::new();
    let mut apps = Vec::new();
    for _ in 0..3 {
        let g = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await);
        apps.push(slow(g.clone()));
        guards.push(g);
    }
    let first = {
        let c = apps[2].clone();
        tokio::spawn(async move { send(&c, get_req("/report")).await })
    };
    entered.notified().await;
    let (ra, rb) = (get_req("/report"), get_req("/report"));
    let (x, y) = tokio::join!(guards[0].invalidate(&ra), guards[1].invalidate(&rb));
    x.expect("first invalidation");
    y.expect("second invalidation");
    let mut seen = Vec::new();
    for app in &apps {
        let answer = tokio::time::timeout(Duration::from_secs(20), send(app, get_req("/report")))
            .await
            .expect("an answer");
        seen.push(answer.text());
    }
    // And once the old rebuild has ended, what it built is nowhere.
    assert_eq!(first.await.expect("first").text(), "v1");
    for app in &apps {
        seen.push(send(app, get_req("/report")).await.text());
    }
    assert!(
        seen.iter().all(|v| v != "v1"),
        "a request started after both invalidations got the old rebuild's value: {seen:?}"
    );
}

/// B is rebuilding (a slow origin call, started before the invalidation)
/// when its link freezes; A invalidates and returns after a lease without
/// B's acknowledgement. A request to B that starts afterwards neither
/// joins that rebuild nor, once it has ended, reads what it built.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_rebuilding_at_invalidate_serves_nothing_from_before() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let entered = Arc::new(tokio::sync::Notify::new());
    let app = |guard: StampedeGuard| {
        let entered = entered.clone();
        counted_app(&origin, guard.ttl(Duration::from_secs(60)), move |n| {
            let entered = entered.clone();
            async move {
                entered.notify_one();
                if n == 1 {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                }
                format!("v{n}")
            }
        })
    };
    let deadline = Duration::from_millis(200);
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), deadline).await);
    let _a = app(a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = app(StampedeGuard::new(backend_at(&proxy.url(), deadline).await));
    let first = {
        let b = b.clone();
        tokio::spawn(async move { send(&b, get_req("/report")).await })
    };
    entered.notified().await;
    proxy.freeze();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    let mut seen = Vec::new();
    let after = tokio::time::timeout(Duration::from_secs(30), send(&b, get_req("/report")))
        .await
        .expect("an answer");
    seen.push(after.text());
    assert_eq!(first.await.expect("first").text(), "v1");
    let later = tokio::time::timeout(Duration::from_secs(30), send(&b, get_req("/report")))
        .await
        .expect("an answer");
    seen.push(later.text());
    proxy.thaw();
    assert!(
        seen.iter().all(|v| v != "v1"),
        "B answered the rebuild started before the invalidation: {seen:?}"
    );
}
