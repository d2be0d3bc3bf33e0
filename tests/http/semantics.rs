//! HEAD, Vary, keys, headers the layer adds, origin Cache-Control, and the L1
//! byte bound.

use std::time::Duration;

use crate::common::{get as get_req, local_guard, send, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

/// A route that echoes the call number and the request's accept-language.
fn echo_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/r",
        get(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let lang = headers
                    .get("accept-language")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                format!("call {n} lang {lang}")
            }
        })
        .layer(guard),
    )
}

fn head(uri: &str) -> Request<Body> {
    Request::head(uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn head_on_a_cold_key_fills_the_get_entry() {
    let origin = Origin::default();
    let app = echo_app(&origin, local_guard());
    let h = send(&app, head("/r")).await;
    assert_eq!(h.status, StatusCode::OK);
    assert!(h.body.is_empty(), "HEAD has no body");
    assert_eq!(h.headers["content-length"], "13");
    let g = send(&app, get_req("/r")).await;
    assert_eq!((g.x_cache(), g.text().as_str()), ("HIT", "call 1 lang -"));
    let h2 = send(&app, head("/r")).await;
    assert_eq!(h2.x_cache(), "HIT");
    assert!(h2.body.is_empty());
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn vary_headers_keep_separate_entries() {
    let origin = Origin::default();
    let app = echo_app(
        &origin,
        local_guard().vary([HeaderName::from_static("accept-language")]),
    );
    let lang = |l: &str| {
        Request::get("/r")
            .header("accept-language", l)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, lang("en")).await.text(), "call 1 lang en");
    assert_eq!(send(&app, lang("fr")).await.text(), "call 2 lang fr");
    assert_eq!(send(&app, lang("en")).await.text(), "call 1 lang en");
    assert_eq!(send(&app, lang("fr")).await.text(), "call 2 lang fr");
    assert_eq!(send(&app, get_req("/r")).await.text(), "call 3 lang -");
    assert_eq!(origin.calls(), 3);
}

#[tokio::test]
async fn without_vary_the_header_does_not_split_entries() {
    let origin = Origin::default();
    let app = echo_app(&origin, local_guard());
    let lang = |l: &str| {
        Request::get("/r")
            .header("accept-language", l)
            .body(Body::empty())
            .unwrap()
    };
    send(&app, lang("en")).await;
    assert_eq!(send(&app, lang("fr")).await.text(), "call 1 lang en");
}

#[tokio::test]
async fn query_order_host_and_path_select_entries() {
    let origin = Origin::default();
    let o = origin.clone();
    let handler = move || {
        let origin = o.clone();
        async move { format!("call {}", origin.enter().0) }
    };
    let app = Router::new()
        .route("/r", get(handler.clone()).layer(local_guard()))
        .route("/s", get(handler).layer(local_guard()));
    assert_eq!(send(&app, get_req("/r?a=1&b=2")).await.text(), "call 1");
    assert_eq!(send(&app, get_req("/r?b=2&a=1")).await.text(), "call 1");
    assert_eq!(send(&app, get_req("/s?a=1&b=2")).await.text(), "call 2");
    let host = |h: &str| {
        Request::get("/r?a=1&b=2")
            .header("host", h)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, host("one.example")).await.text(), "call 3");
    assert_eq!(send(&app, host("two.example")).await.text(), "call 4");
}

#[tokio::test]
async fn key_function_and_invalidation() {
    let origin = Origin::default();
    let guard = local_guard().key_fn(|req| {
        let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
        Some(format!("tenant:{tenant}"))
    });
    let app = echo_app(&origin, guard.clone());
    let tenant = |t: &str, q: &str| {
        Request::get(format!("/r?{q}"))
            .header("x-tenant", t)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, tenant("a", "x=1")).await.text(), "call 1 lang -");
    assert_eq!(send(&app, tenant("a", "x=2")).await.text(), "call 1 lang -");
    assert_eq!(send(&app, tenant("b", "x=1")).await.text(), "call 2 lang -");
    // No tenant: the key function says "don't cache".
    let anonymous = send(&app, get_req("/r")).await;
    assert_eq!(anonymous.x_cache(), "BYPASS");
    assert_eq!(origin.calls(), 3);

    guard
        .invalidate(&tenant("a", "ignored"))
        .await
        .expect("embedded invalidation cannot fail");
    assert_eq!(send(&app, tenant("a", "x=1")).await.text(), "call 4 lang -");
}

#[tokio::test]
async fn responses_carry_cache_status_and_age() {
    let origin = Origin::default();
    let app = echo_app(&origin, local_guard());
    let miss = send(&app, get_req("/r")).await;
    assert_eq!(miss.x_cache(), "MISS");
    assert_eq!(miss.headers["age"], "0");
    let hit = send(&app, get_req("/r")).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert!(hit.headers["age"].to_str().unwrap().parse::<u64>().is_ok());

    let quiet = echo_app(&Origin::default(), local_guard().x_cache_header(None));
    let answer = send(&quiet, get_req("/r")).await;
    assert!(answer.headers.get("x-cache").is_none());
    let custom = echo_app(
        &Origin::default(),
        local_guard().x_cache_header(Some(HeaderName::from_static("x-stampede"))),
    );
    assert_eq!(
        send(&custom, get_req("/r")).await.headers["x-stampede"],
        "MISS"
    );
}

#[tokio::test]
async fn origin_age_counts_toward_freshness_and_the_age_header() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                ([("cache-control", "max-age=100"), ("age", "40")], "aged")
            }
        })
        .layer(local_guard().respect_cache_control(true)),
    );
    let a = send(&app, get_req("/r")).await;
    let age: u64 = a.headers["age"].to_str().unwrap().parse().unwrap();
    assert!((40..45).contains(&age), "age {age}");
    assert_eq!(a.headers.get_all("age").iter().count(), 1);
}

#[tokio::test]
async fn origin_cache_control_sets_freshness_when_respected() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move |headers: HeaderMap| {
            let origin = o.clone();
            async move {
                let (n, _running) = origin.enter();
                let cc = headers["x-cc"].to_str().unwrap().to_owned();
                ([("cache-control", cc)], format!("call {n}")).into_response()
            }
        })
        // The route says an hour; the origin's word wins.
        .layer(
            local_guard()
                .ttl(Duration::from_secs(3600))
                .respect_cache_control(true),
        ),
    );
    let with_cc = |cc: &str, path: &str| {
        Request::get(path)
            .header("x-cc", cc)
            .body(Body::empty())
            .unwrap()
    };
    send(&app, with_cc("max-age=0", "/r?a")).await;
    send(&app, with_cc("max-age=0", "/r?a")).await;
    assert_eq!(origin.calls(), 2, "max-age=0 is not stored");

    send(&app, with_cc("public, max-age=1", "/r?b")).await;
    assert_eq!(
        send(&app, with_cc("max-age=1", "/r?b")).await.x_cache(),
        "HIT"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        send(&app, with_cc("max-age=1", "/r?b")).await.x_cache(),
        "MISS"
    );
    assert_eq!(origin.calls(), 4);

    // s-maxage forbids serving stale even when the route allows it.
    let origin2 = Origin::default();
    let o2 = origin2.clone();
    let strict = Router::new().route(
        "/r",
        get(move || {
            let origin = o2.clone();
            async move {
                let (n, _running) = origin.enter();
                ([("cache-control", "s-maxage=1")], format!("call {n}"))
            }
        })
        .layer(
            local_guard()
                .respect_cache_control(true)
                .stale_while_revalidate(Duration::from_secs(60)),
        ),
    );
    send(&strict, get_req("/r")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = send(&strict, get_req("/r")).await;
    assert_eq!((after.x_cache(), after.text().as_str()), ("MISS", "call 2"));
}

#[tokio::test]
async fn l1_stays_within_its_byte_bound() {
    let bound = 256 * 1024;
    let backend = Backend::builder().l1_max_bytes(bound).build();
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/item/{id}",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                vec![b'x'; 8 * 1024]
            }
        })
        .layer(StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(600))),
    );
    for id in 0..500 {
        let answer = send(&app, get_req(&format!("/item/{id}"))).await;
        assert_eq!(answer.body.len(), 8 * 1024);
        assert!(
            backend.l1_weighted_size() <= bound,
            "after {id}: {} > {bound}",
            backend.l1_weighted_size()
        );
    }
    // 500 × 8 KiB is far more than the bound: most entries were evicted, and
    // the bound is nearly used.
    assert!(backend.l1_weighted_size() > bound / 2);

    // A value larger than the whole bound is served but never kept.
    let huge = Backend::builder().l1_max_bytes(4 * 1024).build();
    let o = Origin::default();
    let oo = o.clone();
    let app = Router::new().route(
        "/huge",
        get(move || {
            let origin = oo.clone();
            async move {
                origin.enter();
                vec![b'y'; 16 * 1024]
            }
        })
        .layer(StampedeGuard::new(huge.clone())),
    );
    assert_eq!(send(&app, get_req("/huge")).await.body.len(), 16 * 1024);
    assert_eq!(send(&app, get_req("/huge")).await.body.len(), 16 * 1024);
    assert_eq!(o.calls(), 2);
    assert_eq!(huge.l1_weighted_size(), 0);
}

#[tokio::test]
async fn routes_sharing_a_backend_keep_their_own_policies() {
    let origin = Origin::default();
    let o = origin.clone();
    let handler = move || {
        let origin = o.clone();
        async move { format!("call {}", origin.enter().0) }
    };
    let shared = local_guard();
    let app = Router::new()
        .route("/slow", get(handler.clone()).layer(shared.clone()))
        .route(
            "/fast",
            get(handler).layer(shared.clone().ttl(Duration::from_millis(50))),
        );
    send(&app, get_req("/slow")).await;
    send(&app, get_req("/fast")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send(&app, get_req("/slow")).await.x_cache(), "HIT");
    assert_eq!(send(&app, get_req("/fast")).await.x_cache(), "MISS");
    assert_eq!(origin.calls(), 3);
}

#[tokio::test]
async fn a_client_that_has_the_entry_gets_304_from_the_cache() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                (
                    [("etag", "W/\"v1\""), ("cache-control", "public")],
                    "the body",
                )
            }
        })
        .layer(local_guard()),
    );
    let with = |tags: &str| {
        Request::get("/r")
            .header("if-none-match", tags)
            .body(Body::empty())
            .unwrap()
    };
    // The first conditional request fills the cache with the whole entry
    // (the origin never sees the condition) and is answered 304 from it.
    let first = send(&app, with("\"v1\"")).await;
    assert_eq!(
        (first.status, first.x_cache()),
        (StatusCode::NOT_MODIFIED, "MISS")
    );
    let plain = send(&app, get_req("/r")).await;
    assert_eq!(
        (plain.status, plain.text().as_str()),
        (StatusCode::OK, "the body")
    );

    let hit = send(&app, with("\"other\", \"v1\"")).await;
    assert_eq!(hit.status, StatusCode::NOT_MODIFIED);
    assert!(hit.body.is_empty());
    assert_eq!(hit.headers["etag"], "W/\"v1\"");
    assert_eq!(hit.headers["cache-control"], "public");
    // If present, Content-Length must be the 200's (RFC 9110 §8.6).
    assert_eq!(hit.headers["content-length"], "8");
    assert_eq!(hit.x_cache(), "HIT");

    assert_eq!(send(&app, with("*")).await.status, StatusCode::NOT_MODIFIED);
    let changed = send(&app, with("\"v0\"")).await;
    assert_eq!(
        (changed.status, changed.text().as_str()),
        (StatusCode::OK, "the body")
    );
    assert_eq!(origin.calls(), 1);
}
