//! Invalidation by tag and of everything on the embedded backend: tags from
//! response headers (removed before the client, never stored) and from the
//! request; a response's tags label its own entry only; a rebuild racing an
//! invalidation stores nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{get as request, local_guard, send, Origin};
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Cache, StampedeGuard};
use tokio::sync::Notify;

/// `/products/{id}` answers `p<id>-v<call>`, tagged `product:<id>` and
/// `products` in `Surrogate-Key` and `cat:<id % 2>` in `Cache-Tag`.
/// `/poison` answers with whatever tags its query names, and `/many` with
/// ten thousand.
fn app(origin: &Origin, guard: &StampedeGuard) -> Router {
    let product = {
        let origin = origin.clone();
        move |Path(id): Path<u32>| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let mut headers = HeaderMap::new();
                let keys = format!("product:{id} products");
                headers.insert("surrogate-key", keys.parse().unwrap());
                headers.insert("cache-tag", format!("cat:{}", id % 2).parse().unwrap());
                (headers, format!("p{id}-v{n}"))
            }
        }
    };
    let poison = {
        let origin = origin.clone();
        move |uri: axum::http::Uri| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let tags = uri.query().unwrap_or("").replace('+', " ");
                let mut headers = HeaderMap::new();
                headers.insert("surrogate-key", tags.parse().unwrap());
                (headers, format!("poison-v{n}"))
            }
        }
    };
    let many = {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let tags: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
                let mut headers = HeaderMap::new();
                headers.insert("surrogate-key", tags.join(" ").parse().unwrap());
                (headers, format!("many-v{n}"))
            }
        }
    };
    Router::new()
        .route("/products/{id}", get(product).layer(guard.clone()))
        .route("/poison", get(poison).layer(guard.clone()))
        .route("/many", get(many).layer(guard.clone()))
}

#[tokio::test]
async fn header_tags_are_removed_and_invalidate_only_their_entries() {
    let origin = Origin::default();
    let guard = local_guard();
    let app = app(&origin, &guard);
    let first = send(&app, request("/products/1")).await;
    assert_eq!(first.text(), "p1-v1");
    assert_eq!(first.x_cache(), "MISS");
    for answer in [&first, &send(&app, request("/products/1")).await] {
        assert!(answer.headers.get("surrogate-key").is_none());
        assert!(answer.headers.get("cache-tag").is_none());
    }
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");
    assert_eq!(send(&app, request("/products/2")).await.text(), "p2-v2");
    assert_eq!(send(&app, request("/products/3")).await.text(), "p3-v3");

    guard.invalidate_tag("product:1").await.unwrap();
    let after = send(&app, request("/products/1")).await;
    assert_eq!((after.text().as_str(), after.x_cache()), ("p1-v4", "MISS"));
    let other = send(&app, request("/products/2")).await;
    assert_eq!((other.text().as_str(), other.x_cache()), ("p2-v2", "HIT"));

    // A Cache-Tag tag; surrounding whitespace is no part of a tag.
    guard.invalidate_tag(" cat:1 ").await.unwrap();
    assert_eq!(send(&app, request("/products/1")).await.text(), "p1-v5");
    assert_eq!(send(&app, request("/products/3")).await.text(), "p3-v6");
    assert_eq!(send(&app, request("/products/2")).await.x_cache(), "HIT");

    // A tag shared by every product.
    guard.invalidate_tag("products").await.unwrap();
    assert_eq!(send(&app, request("/products/2")).await.text(), "p2-v7");
    assert_eq!(origin.calls(), 7);
}

#[tokio::test]
async fn request_tags_come_from_the_route_function() {
    let origin = Origin::default();
    let guard = local_guard().tags(|parts| {
        let tenant = parts.headers.get("x-tenant").and_then(|v| v.to_str().ok());
        vec![format!("tenant:{}", tenant.unwrap_or("none"))]
    });
    let app = app(&origin, &guard);
    let for_tenant = |tenant: &str| {
        let mut r = request("/products/1");
        r.headers_mut().insert("x-tenant", tenant.parse().unwrap());
        r
    };
    assert_eq!(send(&app, for_tenant("a")).await.text(), "p1-v1");
    assert_eq!(send(&app, for_tenant("a")).await.x_cache(), "HIT");
    guard.invalidate_tag("tenant:b").await.unwrap();
    assert_eq!(send(&app, for_tenant("a")).await.x_cache(), "HIT");
    guard.invalidate_tag("tenant:a").await.unwrap();
    assert_eq!(send(&app, for_tenant("a")).await.text(), "p1-v2");
    // The header's tags still count beside the function's.
    guard.invalidate_tag("product:1").await.unwrap();
    assert_eq!(send(&app, for_tenant("a")).await.text(), "p1-v3");
}

#[tokio::test]
async fn invalidate_all_drops_every_route_and_every_cache_of_the_backend() {
    let origin = Origin::default();
    let guard = local_guard();
    let app = app(&origin, &guard);
    let cache: Cache<String> = Cache::new(guard.backend().clone()).ttl(Duration::from_secs(60));
    let built = Arc::new(AtomicUsize::new(0));
    let value = || {
        let built = built.clone();
        move || async move {
            let n = built.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, std::io::Error>(format!("c{n}"))
        }
    };
    assert_eq!(cache.get_or_rebuild("k", value()).await.unwrap(), "c1");
    send(&app, request("/products/1")).await;
    send(&app, request("/poison?x")).await;
    assert_eq!(cache.get_or_rebuild("k", value()).await.unwrap(), "c1");
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");

    guard.invalidate_all().await.unwrap();
    assert_eq!(cache.get_or_rebuild("k", value()).await.unwrap(), "c2");
    assert_eq!(send(&app, request("/products/1")).await.text(), "p1-v3");
    assert_eq!(send(&app, request("/poison?x")).await.text(), "poison-v4");
    // And only once: what was built afterwards stays.
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");
    // The generic cache purges the same way.
    cache.invalidate_all().await.unwrap();
    assert_eq!(cache.get_or_rebuild("k", value()).await.unwrap(), "c3");
    assert_eq!(send(&app, request("/products/1")).await.text(), "p1-v5");
}

#[tokio::test]
async fn a_response_cannot_invalidate_or_poison_another_entry() {
    let origin = Origin::default();
    let guard = local_guard();
    let app = app(&origin, &guard);
    assert_eq!(send(&app, request("/products/1")).await.text(), "p1-v1");
    // Another route's answer names product:1's tags, "all", and garbage:
    // those label its own entry and nothing else.
    let hostile = "/poison?product:1+products+all+*+%00";
    let poison = send(&app, request(hostile)).await;
    assert!(poison.headers.get("surrogate-key").is_none());
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");
    assert_eq!(send(&app, request(hostile)).await.x_cache(), "HIT");
    // Ten thousand tags: answered, not stored (dropping some of its tags
    // would let an invalidation miss it), and nothing else is touched.
    for n in [3, 4] {
        let many = send(&app, request("/many")).await;
        assert_eq!(many.text(), format!("many-v{n}"));
        assert!(many.headers.get("surrogate-key").is_none());
    }
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");
    // Purging product:1 drops the hostile answer too: it said it was one.
    guard.invalidate_tag("product:1").await.unwrap();
    assert_eq!(send(&app, request(hostile)).await.x_cache(), "MISS");
}

#[tokio::test]
async fn exposed_tag_headers_reach_the_rebuilding_request_only() {
    let origin = Origin::default();
    let guard = local_guard().expose_tag_headers(true);
    let app = app(&origin, &guard);
    let miss = send(&app, request("/products/1")).await;
    assert_eq!(miss.headers["surrogate-key"], "product:1 products");
    let hit = send(&app, request("/products/1")).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert!(hit.headers.get("surrogate-key").is_none(), "never stored");
    assert!(hit.headers.get("cache-tag").is_none());
}

#[tokio::test]
async fn the_tag_headers_are_configurable() {
    let origin = Origin::default();
    let guard = local_guard().tag_headers([http::HeaderName::from_static("cache-tag")]);
    let app = app(&origin, &guard);
    let miss = send(&app, request("/products/1")).await;
    // Not a tag header any more: passed on (and stored) as any header.
    assert_eq!(miss.headers["surrogate-key"], "product:1 products");
    assert!(miss.headers.get("cache-tag").is_none());
    guard.invalidate_tag("product:1").await.unwrap();
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "HIT");
    guard.invalidate_tag("cat:1").await.unwrap();
    assert_eq!(send(&app, request("/products/1")).await.x_cache(), "MISS");
}

/// `/slow` parks its first call until released, then answers `slow-v<n>`
/// tagged `slow`.
fn slow_app(
    origin: &Origin,
    guard: &StampedeGuard,
    entered: &Arc<Notify>,
    release: &Arc<Notify>,
) -> Router {
    let (origin, entered, release) = (origin.clone(), entered.clone(), release.clone());
    let handler = move || {
        let (origin, entered, release) = (origin.clone(), entered.clone(), release.clone());
        async move {
            let (n, _running) = origin.enter();
            if n == 1 {
                entered.notify_one();
                release.notified().await;
            }
            ([("surrogate-key", "slow")], format!("slow-v{n}"))
        }
    };
    Router::new().route("/slow", get(handler).layer(guard.clone()))
}

#[tokio::test]
async fn a_rebuild_racing_invalidate_tag_stores_nothing_and_gets_no_new_waiters() {
    let origin = Origin::default();
    let guard = local_guard();
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let app = slow_app(&origin, &guard, &entered, &release);
    let before = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request("/slow")).await }
    });
    entered.notified().await;
    // The tag is invalidated while the first rebuild, from older data, runs.
    guard.invalidate_tag("slow").await.unwrap();
    // A request after it does not join that rebuild: it gets its own.
    let after = send(&app, request("/slow")).await;
    assert_eq!(after.text(), "slow-v2");
    release.notify_one();
    assert_eq!(before.await.unwrap().text(), "slow-v1");
    // The racing rebuild stored nothing over the newer value.
    let next = send(&app, request("/slow")).await;
    assert_eq!((next.text().as_str(), next.x_cache()), ("slow-v2", "HIT"));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test]
async fn tag_headers_are_removed_from_answers_that_are_not_stored() {
    let guard = local_guard();
    let tagged = || async {
        (
            [("surrogate-key", "secret:internal"), ("set-cookie", "s=1")],
            "x",
        )
    };
    let app = Router::new().route("/cookie", get(tagged).post(tagged).layer(guard.clone()));
    // Answers for one client (a cookie) and unsafe methods: never stored,
    // and still without the tags.
    for method in ["GET", "GET", "POST"] {
        let request = http::Request::builder()
            .method(method)
            .uri("/cookie")
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = send(&app, request).await;
        assert_eq!(answer.text(), "x");
        assert!(answer.headers.get("set-cookie").is_some());
        assert!(answer.headers.get("surrogate-key").is_none(), "{method}");
    }
}
