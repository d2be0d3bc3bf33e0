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
//! cargo bench --bench hit_path --features bench-internals
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{header, Request};
use http_body_util::BodyExt;
use stampede_guard::{Backend, Cache};
use tower::ServiceExt;

#[path = "support/hit_route.rs"]
mod hit_route;
use hit_route::{
    bare_router, call_router, guard_service, guarded_router, plain_request, warm, CONTENT_TYPE,
    PAYLOAD, TTL, URI,
};

fn hit_path(c: &mut Criterion) {
    // One thread, so the numbers are the path's own cost, not scheduling.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let bare = bare_router();
    let guarded = guarded_router();
    runtime.block_on(warm(&guarded));

    let service = guard_service();
    runtime.block_on(async {
        service.clone().oneshot(plain_request()).await.unwrap();
        let response = service.clone().oneshot(plain_request()).await.unwrap();
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
            let response = service.clone().oneshot(plain_request()).await.unwrap();
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
