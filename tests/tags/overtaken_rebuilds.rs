//! Attacks on tags and on the newest `stored` rule: rebuilds overtaken by
//! invalidations not tried before, and the tag headers of an entry another
//! guard on the same backend stored.

use std::sync::Arc;
use std::time::Duration;

use crate::common::status::{cache_status, no_tag_headers};
use crate::common::{get as request, request_with, send, Origin};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};

/// A rebuild overtaken by other invalidations than those tried so far: an
/// unsafe method on the same URL, a purge of a tag the entry will not
/// carry, and the same for a `HEAD` starter (answered from the entry once
/// the engine decided). None stores, none says `stored`; the next request
/// rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_overtaken_otherwise_does_not_say_stored() {
    for (overtaker, method) in [
        ("post", "GET"),
        ("unrelated tag", "GET"),
        ("unrelated tag", "HEAD"),
        ("post", "HEAD"),
    ] {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let entered = Arc::new(tokio::sync::Notify::new());
        let (g, e) = (gate.clone(), entered.clone());
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
        let app = Router::new().route(
            "/slow",
            get(move || {
                let (g, e) = (g.clone(), e.clone());
                async move {
                    e.notify_one();
                    g.acquire().await.unwrap().forget();
                    let mut h = HeaderMap::new();
                    h.insert("surrogate-key", "mine".parse().unwrap());
                    (h, "slow")
                }
            })
            .post(|| async { "posted" })
            .layer(guard.clone()),
        );
        let a = app.clone();
        let first = tokio::spawn(async move { send(&a, request_with(method, "/slow", &[])).await });
        entered.notified().await;
        match overtaker {
            "post" => {
                let posted = send(&app, request_with("POST", "/slow", &[])).await;
                assert_eq!(posted.text(), "posted");
            }
            _ => guard.invalidate_tag("unrelated").await.unwrap(),
        }
        gate.add_permits(2);
        let first = first.await.unwrap();
        no_tag_headers(&first, "an overtaken starter");
        let all = cache_status(&first);
        assert_eq!(all.len(), 1, "{overtaker}/{method}: {all:?}");
        assert!(
            !all[0].contains("stored"),
            "{overtaker}/{method}: {all:?}: nothing was stored"
        );
        let second = send(&app, request("/slow")).await;
        assert_eq!(second.x_cache(), "MISS", "{overtaker}/{method}");
    }
}

/// Two guards on one backend with other tag headers (a rolling config
/// change across a fleet): the entry the first stores keeps what is no tag
/// header to it; the second must not serve its own tag headers from that
/// entry, on any kind of hit.
#[tokio::test]
async fn a_hit_never_carries_the_serving_routes_tag_headers() {
    let origin = Origin::default();
    let backend = Backend::local();
    let custom = StampedeGuard::new(backend.clone())
        .ttl(Duration::from_secs(60))
        .tag_headers([http::HeaderName::from_static("x-tags")]);
    let default = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let o = origin.clone();
    let handler = move || {
        let origin = o.clone();
        async move {
            let (n, _) = origin.enter();
            let mut h = HeaderMap::new();
            h.insert("x-tags", "t".parse().unwrap());
            h.insert("surrogate-key", "internal-id-9".parse().unwrap());
            (h, format!("v{n}"))
        }
    };
    let custom = Router::new().route("/r", get(handler.clone()).layer(custom));
    let default = Router::new().route("/r", get(handler).layer(default));
    // Guards on one backend share the entries of requests that name a host
    // (a host-less request is keyed under the guard that got it).
    const HOST: (&str, &str) = ("host", "shop.test");
    let built = send(&custom, request_with("GET", "/r", &[HOST])).await;
    assert!(built.headers.get("x-tags").is_none());
    for (what, req) in [
        ("GET", request_with("GET", "/r", &[HOST])),
        ("HEAD", request_with("HEAD", "/r", &[HOST])),
        (
            "Range",
            request_with("GET", "/r", &[HOST, ("range", "bytes=0-0")]),
        ),
    ] {
        let hit = send(&default, req).await;
        assert_eq!(hit.x_cache(), "HIT", "{what}");
        no_tag_headers(&hit, what);
    }
    assert_eq!(origin.calls(), 1);
}
