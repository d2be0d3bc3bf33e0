//! Namespaces whose names are alike: case, surrounding spaces, the two
//! Unicode spellings of one letter, `.`/`:`, a prefix of the other, very
//! long names, a NUL. Each is its own world: a tag purge, a purge of
//! everything and a URL purge through one cost the other nothing. The
//! empty name and no name are one namespace and share every purge.
//! Counted as origin calls.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::header::HOST;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

use crate::common::{send, Origin};

struct Side {
    guard: StampedeGuard,
    app: Router,
    origin: Origin,
}

fn side(backend: &Backend, namespace: Option<&str>) -> Side {
    let mut guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(600));
    if let Some(namespace) = namespace {
        guard = guard.namespace(namespace);
    }
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/products/1",
        get(move || {
            let o = o.clone();
            async move {
                let (n, _running) = o.enter();
                ([("surrogate-key", "product:1 shared")], format!("v{n}"))
            }
        })
        .layer(guard.clone()),
    );
    Side { guard, app, origin }
}

fn page() -> Request<Body> {
    page_at("api.example.com")
}

fn page_at(host: &str) -> Request<Body> {
    Request::get("/products/1")
        .header(HOST, host)
        .body(Body::empty())
        .unwrap()
}

/// The calls `b` paid for one request after each of three purges through
/// `a` (tag, everything, URL), its entry warmed first; and the calls `a`
/// paid (one per purge, plus the first).
async fn crossed(backend: &Backend, a: Option<&str>, b: Option<&str>) -> (usize, usize) {
    let (a, b) = (side(backend, a), side(backend, b));
    send(&a.app, page()).await;
    send(&b.app, page()).await;
    a.guard.invalidate_tag("shared").await.unwrap();
    send(&a.app, page()).await;
    send(&b.app, page()).await;
    a.guard.invalidate_all().await.unwrap();
    send(&a.app, page()).await;
    send(&b.app, page()).await;
    a.guard
        .invalidate_url("https://api.example.com/products/1")
        .await
        .unwrap();
    send(&a.app, page()).await;
    send(&b.app, page()).await;
    (a.origin.calls(), b.origin.calls())
}

fn alike() -> Vec<(String, String)> {
    let long = "x".repeat(64 * 1024);
    vec![
        ("shop".into(), "Shop".into()),
        ("shop".into(), "SHOP".into()),
        ("shop".into(), " shop".into()),
        ("shop".into(), "shop ".into()),
        ("caf\u{e9}".into(), "cafe\u{301}".into()),
        ("a.b".into(), "a:b".into()),
        ("a.b".into(), "a b".into()),
        ("shop".into(), "shop.".into()),
        ("shop".into(), "shopping".into()),
        ("s0000000000000001".into(), "s0000000000000001.all".into()),
        ("\0".into(), "\0\0".into()),
        (long.clone(), format!("{long}y")),
        (long.clone(), long[1..].to_owned()),
    ]
}

async fn every_alike_pair_is_apart(backend: fn() -> Backend) {
    let mut crossed_pairs = Vec::new();
    for (x, y) in alike() {
        for (a, b) in [(&x, &y), (&y, &x)] {
            let (own, other) = crossed(&backend(), Some(a), Some(b)).await;
            assert_eq!(own, 4, "{:?}: its own purges", &a[..a.len().min(20)]);
            if other != 1 {
                crossed_pairs.push(format!(
                    "{:?} -> {:?}: {other} calls",
                    &a[..a.len().min(20)],
                    &b[..b.len().min(20)]
                ));
            }
        }
    }
    assert!(crossed_pairs.is_empty(), "{crossed_pairs:#?}");
}

#[tokio::test]
async fn alike_namespaces_never_share_a_purge() {
    every_alike_pair_is_apart(Backend::local).await;
}

#[tokio::test]
async fn the_empty_namespace_and_none_share_every_purge() {
    for (a, b) in [(Some(""), None), (None, Some(""))] {
        // One entry for both: each purge costs one call, whichever
        // origin the next request reached first.
        let (own, other) = crossed(&Backend::local(), a, b).await;
        assert_eq!(own + other, 4, "{a:?} -> {b:?}");
    }
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;

    /// The same pairs on one Redis, each purge heard by a second instance
    /// whose guards in both namespaces count alike.
    #[tokio::test]
    async fn alike_namespaces_never_share_a_purge_on_redis() {
        let redis = RedisServer::start();
        let first = backend_at(&redis.url(), Duration::from_secs(1)).await;
        let second = backend_at(&redis.url(), Duration::from_secs(1)).await;
        let mut crossed_pairs = Vec::new();
        for (i, (x, y)) in alike().into_iter().enumerate() {
            // A host of its own per pair: a name seen in an earlier pair
            // starts with no entry.
            let host = format!("pair{i}.example.com");
            let (a, b) = (side(&first, Some(&x)), side(&second, Some(&y)));
            send(&a.app, page_at(&host)).await;
            send(&b.app, page_at(&host)).await;
            a.guard.invalidate_tag("shared").await.unwrap();
            a.guard.invalidate_all().await.unwrap();
            send(&a.app, page_at(&host)).await;
            send(&b.app, page_at(&host)).await;
            assert_eq!(a.origin.calls(), 2, "{:?}", &x[..x.len().min(20)]);
            if b.origin.calls() != 1 {
                crossed_pairs.push(format!("{:?}", &y[..y.len().min(20)]));
            }
        }
        assert!(crossed_pairs.is_empty(), "{crossed_pairs:#?}");
    }
}

/// An `Admin` router over guards of two namespaces (one given twice, one
/// of them under the empty name): a tag purge and a purge of everything
/// through it reach both, once each, and not a third namespace on the
/// same backend.
#[cfg(feature = "admin")]
#[tokio::test]
async fn an_admin_router_over_two_namespaces_purges_those_only() {
    let backend = Backend::local();
    let (shop, blog, other) = (
        side(&backend, Some("shop")),
        side(&backend, Some("")),
        side(&backend, Some("other")),
    );
    let admin = stampede_guard::Admin::new(shop.guard.clone())
        .route(blog.guard.clone())
        .route(shop.guard.clone())
        .route(StampedeGuard::new(backend.clone()))
        .router::<()>();
    for side in [&shop, &blog, &other] {
        send(&side.app, page()).await;
    }
    for (path, body) in [
        ("/purge/tag", Some(r#"{"tag": "shared"}"#)),
        ("/purge/all", None),
    ] {
        let request = Request::post(path);
        let request = match body {
            Some(body) => request
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(body)),
            None => request.body(Body::empty()),
        };
        let answer = send(&admin, request.unwrap()).await;
        assert_eq!(answer.status, http::StatusCode::OK, "{}", answer.text());
        for side in [&shop, &blog, &other] {
            send(&side.app, page()).await;
        }
    }
    let calls = (
        shop.origin.calls(),
        blog.origin.calls(),
        other.origin.calls(),
    );
    assert_eq!(calls, (3, 3, 1), "(shop, the empty one, other)");
}
