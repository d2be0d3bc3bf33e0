//! Attacks on the `stored` a rebuild's `Cache-Status` tells: `stored` only
//! when a later request is a hit (an answer heavier than the in-process
//! tier, with and without Redis), and the one window the README admits (a
//! body that fails after its head left).

use std::time::Duration;

use crate::common::status::{ours, with};
use crate::common::{send, Origin};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{header, Request};
use stampede_guard::{Backend, StampedeGuard};

/// An answer heavier than the whole in-process tier, on a backend without
/// Redis: the tier does not keep it (a value larger than the whole bound is
/// never kept), so its `Cache-Status` must not say `stored`, and the next
/// request is a miss. The same for a request that starts the rebuild but is
/// answered from the whole entry (a `HEAD`), and for an answer streamed
/// without a length.
#[tokio::test]
async fn an_answer_the_in_process_tier_cannot_hold_does_not_say_stored() {
    for (method, path) in [("GET", "/big"), ("HEAD", "/big"), ("GET", "/chunked")] {
        let origin = Origin::default();
        let backend = Backend::builder().l1_max_bytes(16 * 1024).build();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let big = {
            let origin = origin.clone();
            move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    format!("v{n}:{}", "x".repeat(64 * 1024))
                }
            }
        };
        let chunked = {
            let origin = origin.clone();
            move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    let chunks = (0..64).map(move |i| {
                        let chunk = if i == 0 {
                            format!("v{n}:")
                        } else {
                            "x".repeat(1024)
                        };
                        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(chunk))
                    });
                    Body::from_stream(tokio_stream::iter(chunks))
                }
            }
        };
        let app = Router::new()
            .route("/big", get(big))
            .route("/chunked", get(chunked))
            .layer(guard);
        let first = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let first = send(&app, first).await;
        let told = ours(&first).0;
        let second = send(&app, with(path, &[])).await;
        let hit = second.text().starts_with("v1:");
        assert_eq!(
            told.ends_with("; stored"),
            hit,
            "{method} {path}: the first answer said {told:?}; the next was {:?} (origin calls: {})",
            ours(&second).0,
            origin.calls()
        );
        assert_eq!(origin.calls(), 2, "{method} {path}: never kept");
    }
}

/// The same answer fits a larger in-process tier: stored, and says so.
#[tokio::test]
async fn an_answer_the_in_process_tier_holds_says_stored() {
    let origin = Origin::default();
    let backend = Backend::builder().l1_max_bytes(1 << 20).build();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let big = {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                format!("v{n}:{}", "x".repeat(64 * 1024))
            }
        }
    };
    let app = Router::new().route("/big", get(big).layer(guard));
    let first = send(&app, with("/big", &[])).await;
    assert_eq!(ours(&first).0, "stampede-guard; fwd=uri-miss; stored");
    let second = send(&app, with("/big", &[])).await;
    assert_eq!(ours(&second).0, "stampede-guard; hit");
    assert_eq!(origin.calls(), 1);
}

/// The `Cache-Status` an answer's head carries, and whether its body was
/// read whole.
async fn head_then_body(app: &Router, request: Request<Body>) -> (String, bool) {
    let response = tower::ServiceExt::oneshot(app.clone(), request)
        .await
        .unwrap();
    let told = response
        .headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let whole = http_body_util::BodyExt::collect(response.into_body())
        .await
        .is_ok();
    (told, whole)
}

/// The origin declares 64 KiB and ends after 1 KiB: a failed body, never
/// stored. The head leaves before the body is whole, so it says `stored`
/// (README, "Known limits": the streamed head is told before the body
/// ends); the client's body then ends with an error, and the next request
/// rebuilds.
#[tokio::test]
async fn a_body_that_ends_short_after_a_head_that_said_stored() {
    let origin = Origin::default();
    let short = {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let chunks = [Ok::<_, std::convert::Infallible>(bytes::Bytes::from(
                    format!("v{n}:{}", "x".repeat(1024)),
                ))];
                (
                    [(header::CONTENT_LENGTH, (64 * 1024).to_string())],
                    Body::from_stream(tokio_stream::iter(chunks)),
                )
            }
        }
    };
    let app = Router::new().route(
        "/short",
        get(short).layer(StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60))),
    );
    let (told, whole) = head_then_body(&app, with("/short", &[])).await;
    assert!(!whole, "the short body ends with an error");
    assert_eq!(told, "stampede-guard; fwd=uri-miss; stored");
    let (again, _) = head_then_body(&app, with("/short", &[])).await;
    assert_eq!(again, "stampede-guard; fwd=uri-miss; stored");
    assert_eq!(origin.calls(), 2, "a failed body is not stored");
}

/// With Redis, an answer heavier than the in-process tier is still stored
/// (in Redis): every way of starting its rebuild says `stored`, and the
/// next request is a hit from Redis.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_an_answer_heavier_than_the_in_process_tier_is_stored() {
    let redis = crate::common::redis::RedisServer::start();
    for (n, method) in ["GET", "HEAD"].into_iter().enumerate() {
        let origin = Origin::default();
        let backend = Backend::redis_builder(&redis.url())
            .prefix(format!("heavy{n}"))
            .l1_max_bytes(16 * 1024)
            .deadline(crate::common::ROOMY_DEADLINE)
            .connect()
            .await
            .expect("redis backend");
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let big = {
            let origin = origin.clone();
            move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    format!("v{n}:{}", "x".repeat(64 * 1024))
                }
            }
        };
        let app = Router::new().route("/big", get(big).layer(guard));
        let first = Request::builder()
            .method(method)
            .uri("/big")
            .body(Body::empty())
            .unwrap();
        let first = send(&app, first).await;
        assert_eq!(
            ours(&first).0,
            "stampede-guard; fwd=uri-miss; stored",
            "{method}"
        );
        let second = send(&app, with("/big", &[])).await;
        assert_eq!(ours(&second).0, "stampede-guard; hit", "{method}");
        assert_eq!(origin.calls(), 1, "{method}");
    }
}
