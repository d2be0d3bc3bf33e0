//! The L1 hit path: a request in, a cached response out.
//!
//! `bare_handler` is the baseline an axum user already pays; `guarded_hit` is
//! the same route answered from the cache, so their ratio is what the guard
//! costs (or saves) on a hit. `guard_service_hit` drops the router to isolate
//! the layer itself, and `cache_get_hit` is the generic `Cache` on a warm key.
//! The `parts` group times pieces of the path: key building and the codec of
//! entries in Redis.
//!
//! ```text
//! cargo bench --bench hit_path
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{header, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use stampede_guard::{Backend, Cache, StampedeGuard};
use tower::{ServiceBuilder, ServiceExt};

/// A 1 KiB payload, about the size of a small JSON document.
static PAYLOAD: [u8; 1024] = [b'x'; 1024];
const CONTENT_TYPE: &str = "application/json";
const URI: &str = "/report?region=eu";
const TTL: Duration = Duration::from_secs(3600);

async fn handler() -> ([(header::HeaderName, &'static str); 1], Bytes) {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        Bytes::from_static(&PAYLOAD),
    )
}

fn request() -> Request<axum::body::Body> {
    Request::get(URI)
        .header(header::HOST, "bench.local")
        .body(axum::body::Body::empty())
        .expect("valid request")
}

/// One request through a router, the way axum's server drives it: a fresh
/// clone of the router per request, then the whole body read.
async fn call_router(router: &Router) -> Bytes {
    let response = router.clone().oneshot(request()).await.expect("infallible");
    response
        .into_body()
        .collect()
        .await
        .expect("in-memory body")
        .to_bytes()
}

fn hit_path(c: &mut Criterion) {
    // One thread, so the numbers are the path's own cost, not scheduling.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    // Each router gets its state now, as `axum::serve` does per connection:
    // otherwise axum builds the handler's service, and the layer around it,
    // again on every request.
    let bare = Router::new().route("/report", get(handler)).with_state(());
    let guarded = Router::new()
        .route(
            "/report",
            get(handler).layer(StampedeGuard::new(Backend::local()).ttl(TTL)),
        )
        .with_state(());
    runtime.block_on(async {
        // Warm the entry, then make sure later calls really are L1 hits.
        call_router(&guarded).await;
        let response = guarded.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.headers()["x-cache"], "HIT");
    });

    let service = ServiceBuilder::new()
        .layer(StampedeGuard::new(Backend::local()).ttl(TTL))
        .service_fn(|_: Request<Empty<Bytes>>| async {
            let response = Response::builder()
                .header(header::CONTENT_TYPE, CONTENT_TYPE)
                .body(Full::new(Bytes::from_static(&PAYLOAD)))
                .expect("valid response");
            Ok::<_, Infallible>(response)
        });
    let service_request = || {
        Request::get(URI)
            .header(header::HOST, "bench.local")
            .body(Empty::<Bytes>::new())
            .expect("valid request")
    };
    runtime.block_on(async {
        service.clone().oneshot(service_request()).await.unwrap();
        let response = service.clone().oneshot(service_request()).await.unwrap();
        assert_eq!(response.headers()["x-cache"], "HIT");
    });

    let cache: Cache<Bytes> = Cache::new(Backend::local()).ttl(TTL);
    let rebuild = || async { Ok::<_, Infallible>(Bytes::from_static(&PAYLOAD)) };
    runtime.block_on(async {
        cache.get_or_rebuild("report:eu", rebuild).await.unwrap();
        assert!(cache.get("report:eu").is_some());
    });

    let mut group = c.benchmark_group("hit_path");
    // Each iteration is well under a microsecond; a few seconds per benchmark
    // gives stable numbers and keeps the whole run short.
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    group.bench_function("bare_handler", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(call_router(&bare).await) })
    });
    group.bench_function("guarded_hit", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(call_router(&guarded).await) })
    });
    group.bench_function("guard_service_hit", |b| {
        b.to_async(&runtime).iter(|| async {
            let response = service.clone().oneshot(service_request()).await.unwrap();
            black_box(response.into_body().collect().await.unwrap().to_bytes())
        })
    });
    group.bench_function("cache_get_hit", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(cache.get_or_rebuild("report:eu", rebuild).await.unwrap()) })
    });
    group.finish();

    // The pieces of a request's path, for where the time goes.
    let mut parts_group = c.benchmark_group("parts");
    parts_group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let (parts, ()) = Request::get(URI)
        .header(header::HOST, "bench.local")
        .header(header::ACCEPT_LANGUAGE, "en")
        .body(())
        .expect("valid request")
        .into_parts();
    let vary = [header::ACCEPT_LANGUAGE];
    parts_group.bench_function("key_building", |b| {
        b.iter(|| {
            black_box(stampede_guard::__bench::request_key(
                black_box(&parts),
                &vary,
            ))
        })
    });
    let mut headers = http::HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, CONTENT_TYPE.parse().expect("valid"));
    headers.insert(header::CONTENT_LENGTH, "1024".parse().expect("valid"));
    let encoded = stampede_guard::__bench::encode_response(
        http::StatusCode::OK,
        headers.clone(),
        Bytes::from_static(&PAYLOAD),
    );
    parts_group.bench_function("codec_encode_1k", |b| {
        b.iter(|| {
            black_box(stampede_guard::__bench::encode_response(
                http::StatusCode::OK,
                headers.clone(),
                Bytes::from_static(&PAYLOAD),
            ))
        })
    });
    parts_group.bench_function("codec_decode_1k", |b| {
        b.iter(|| black_box(stampede_guard::__bench::decode_response(encoded.clone())))
    });
    parts_group.finish();
}

criterion_group!(benches, hit_path);
criterion_main!(benches);
