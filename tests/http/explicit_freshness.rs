//! Explicit freshness on any final status (RFC 9111 §3) and targeted cache
//! control (RFC 9213), on both backends: what is stored, counted in origin
//! calls.

use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

use crate::common::{send, Origin};

/// `/r`: answers `status` with `headers` and `#<call>`.
fn app(
    origin: &Origin,
    guard: StampedeGuard,
    status: StatusCode,
    headers: &'static [(&'static str, &'static str)],
) -> Router {
    let origin = origin.clone();
    Router::new()
        .route(
            "/r",
            get(move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    let mut response = (status, format!("#{n}")).into_response();
                    for (name, value) in headers {
                        response.headers_mut().append(*name, value.parse().unwrap());
                    }
                    response
                }
            }),
        )
        .layer(guard.hit_for_miss(Duration::ZERO))
}

/// Origin calls for two requests in a row.
async fn calls_for_two(
    backend: Backend,
    respect: bool,
    status: StatusCode,
    headers: &'static [(&'static str, &'static str)],
    targets: Option<&[&'static str]>,
) -> usize {
    let origin = Origin::default();
    let mut guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(60))
        .respect_cache_control(respect);
    if let Some(targets) = targets {
        guard = guard.cache_control_targets(targets.iter().map(|t| HeaderName::from_static(t)));
    }
    let app = app(&origin, guard, status, headers);
    for _ in 0..2 {
        let answer = send(&app, Request::get("/r").body(Body::empty()).unwrap()).await;
        assert_eq!(answer.status, status);
        assert_eq!(
            answer.text(),
            "#1".replace('1', &origin.calls().to_string())
        );
    }
    origin.calls()
}

/// `fleet`: on Redis an unstored server error leaves the fleet's failure
/// backoff behind, which answers the next request itself: the cases that
/// count an unstored server error's calls are for the embedded backend.
async fn any_final_status_with_explicit_freshness_is_stored(
    backend: impl Fn() -> Backend,
    fleet: bool,
) {
    let fresh: &[(&str, &str)] = &[("cache-control", "max-age=60")];
    for code in [299, 302, 303, 307, 400, 403, 499, 500, 502, 503, 504, 599] {
        let status = StatusCode::from_u16(code).unwrap();
        // Followed: stored for its max-age.
        assert_eq!(
            calls_for_two(backend(), true, status, fresh, None).await,
            1,
            "{code}"
        );
        if fleet && status.is_server_error() {
            continue;
        }
        // Without explicit freshness: not stored.
        assert_eq!(
            calls_for_two(backend(), true, status, &[], None).await,
            2,
            "{code} bare"
        );
        // Explicit but zero, or no-store: not stored.
        let zero: &[(&str, &str)] = &[("cache-control", "max-age=0")];
        assert_eq!(
            calls_for_two(backend(), true, status, zero, None).await,
            2,
            "{code} zero"
        );
        // must-understand: a status RFC 9110 defines is understood, and its
        // `no-store` ignored; an unknown one (299, 499, 599) is not stored.
        let must: &[(&str, &str)] = &[("cache-control", "max-age=60, no-store, must-understand")];
        let known = ![299, 499, 599].contains(&code);
        assert_eq!(
            calls_for_two(backend(), true, status, must, None).await,
            if known { 1 } else { 2 },
            "{code} must-understand"
        );
        let plain: &[(&str, &str)] = &[("cache-control", "max-age=60, no-store")];
        assert_eq!(
            calls_for_two(backend(), true, status, plain, None).await,
            2,
            "{code} no-store"
        );
        // The route's own ttl (the default): only the route's statuses.
        assert_eq!(
            calls_for_two(backend(), false, status, fresh, None).await,
            2,
            "{code} ttl mode"
        );
    }
    // s-maxage and a future Expires are explicit too.
    let s_maxage: &[(&str, &str)] = &[("cache-control", "s-maxage=60")];
    assert_eq!(
        calls_for_two(backend(), true, StatusCode::BAD_REQUEST, s_maxage, None).await,
        1
    );
    let expires: &[(&str, &str)] = &[("expires", "Fri, 31 Dec 9999 23:59:59 GMT")];
    assert_eq!(
        calls_for_two(backend(), true, StatusCode::FOUND, expires, None).await,
        1
    );
}

#[tokio::test]
async fn any_final_status_with_explicit_freshness_is_stored_embedded() {
    any_final_status_with_explicit_freshness_is_stored(Backend::local, false).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn any_final_status_with_explicit_freshness_is_stored_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    // One backend per case, all on one server: each answer on its own URL
    // would do too, but a backend each keeps the cases apart.
    let mut backends = Vec::new();
    for _ in 0..(12 * 6 + 2) {
        backends.push(
            Backend::redis_builder(&url)
                .prefix(format!("case{}", backends.len()))
                .deadline(crate::common::ROOMY_DEADLINE)
                .connect()
                .await
                .expect("redis backend"),
        );
    }
    let backends = std::sync::Mutex::new(backends);
    any_final_status_with_explicit_freshness_is_stored(
        || backends.lock().unwrap().pop().expect("a backend"),
        true,
    )
    .await;
}

async fn targeted_cache_control_speaks_first(backend: impl Fn() -> Backend) {
    let ok = StatusCode::OK;
    let cases: [(&'static [(&'static str, &'static str)], usize); 8] = [
        // The targeted field replaces Cache-Control and Expires.
        (
            &[
                ("cdn-cache-control", "max-age=60"),
                ("cache-control", "no-store"),
            ],
            1,
        ),
        (
            &[
                ("cdn-cache-control", "no-store"),
                ("cache-control", "max-age=60"),
            ],
            2,
        ),
        (
            &[
                ("cdn-cache-control", "private"),
                ("cache-control", "max-age=60"),
            ],
            2,
        ),
        (
            &[
                ("cdn-cache-control", "max-age=0"),
                ("expires", "Fri, 31 Dec 9999 23:59:59 GMT"),
            ],
            2,
        ),
        (&[("cdn-cache-control", "max-age=60"), ("expires", "0")], 1),
        // Invalid: ignored as if absent, Cache-Control speaks.
        (
            &[
                ("cdn-cache-control", "max-age=60, &&"),
                ("cache-control", "no-store"),
            ],
            2,
        ),
        (
            &[
                ("cdn-cache-control", "max-age=\"60\""),
                ("cache-control", "no-store"),
            ],
            2,
        ),
        (
            &[
                ("cdn-cache-control", "max-age =60"),
                ("cache-control", "max-age=60"),
            ],
            1,
        ),
    ];
    for (headers, calls) in cases {
        assert_eq!(
            calls_for_two(backend(), true, ok, headers, None).await,
            calls,
            "{headers:?}"
        );
    }
    // The deployment's own field first, then the CDN one.
    let targets: &[&str] = &["acme-cache-control", "cdn-cache-control"];
    let own: &[(&str, &str)] = &[
        ("acme-cache-control", "max-age=60"),
        ("cdn-cache-control", "no-store"),
    ];
    assert_eq!(
        calls_for_two(backend(), true, ok, own, Some(targets)).await,
        1
    );
    let invalid_own: &[(&str, &str)] = &[
        ("acme-cache-control", "max-age=-1"),
        ("cdn-cache-control", "no-store"),
    ];
    assert_eq!(
        calls_for_two(backend(), true, ok, invalid_own, Some(targets)).await,
        2
    );
    // No targets: Cache-Control alone.
    let cdn_only: &[(&str, &str)] = &[
        ("cdn-cache-control", "max-age=60"),
        ("cache-control", "no-store"),
    ];
    assert_eq!(
        calls_for_two(backend(), true, ok, cdn_only, Some(&[])).await,
        2
    );
    // The route's own ttl: a forbidding word in the targeted field counts.
    let forbidding: &[(&str, &str)] = &[("cdn-cache-control", "no-store")];
    assert_eq!(
        calls_for_two(backend(), false, ok, forbidding, None).await,
        2
    );
    let fresh: &[(&str, &str)] = &[
        ("cdn-cache-control", "max-age=60"),
        ("cache-control", "private"),
    ];
    assert_eq!(calls_for_two(backend(), false, ok, fresh, None).await, 2);
}

#[tokio::test]
async fn targeted_cache_control_speaks_first_embedded() {
    targeted_cache_control_speaks_first(Backend::local).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn targeted_cache_control_speaks_first_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    let mut backends = Vec::new();
    for _ in 0..13 {
        backends.push(
            Backend::redis_builder(&url)
                .prefix(format!("case{}", backends.len()))
                .deadline(crate::common::ROOMY_DEADLINE)
                .connect()
                .await
                .expect("redis backend"),
        );
    }
    let backends = std::sync::Mutex::new(backends);
    targeted_cache_control_speaks_first(|| backends.lock().unwrap().pop().expect("a backend"))
        .await;
}

/// The targeted field goes downstream untouched (RFC 9213 §3), on a miss
/// and on a hit.
#[tokio::test]
async fn the_targeted_field_is_forwarded() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).respect_cache_control(true);
    let app = app(
        &origin,
        guard,
        StatusCode::OK,
        &[("cdn-cache-control", "max-age=60")],
    );
    for _ in 0..2 {
        let answer = send(&app, Request::get("/r").body(Body::empty()).unwrap()).await;
        assert_eq!(answer.headers["cdn-cache-control"], "max-age=60");
    }
    assert_eq!(origin.calls(), 1);
}
