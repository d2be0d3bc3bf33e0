//! Attacks on tag headers reaching clients: answers too big to store,
//! shared by every waiter as they stream, and answers with too many tags.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{burst, get as request, Origin};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};

fn app(origin: &Origin, guard: StampedeGuard, tags: usize) -> Router {
    let o = origin.clone();
    Router::new().route(
        "/big",
        get(move || {
            let origin = o.clone();
            async move {
                let (n, _running) = origin.enter();
                // Long enough for the burst to gather behind it.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut h = HeaderMap::new();
                let keys: Vec<String> = (0..tags).map(|i| format!("internal:{i}")).collect();
                h.insert("surrogate-key", keys.join(" ").parse().unwrap());
                h.insert("cache-tag", "secret-tenant".parse().unwrap());
                (h, format!("{n:0>64}"))
            }
        })
        .layer(guard),
    )
}

/// An answer over `max_body_bytes`, streamed to every waiter: no waiter
/// sees the tags, exposed or not; exposed, only the rebuilding request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_big_to_store_carries_no_tags_to_the_waiters() {
    for expose in [false, true] {
        let origin = Origin::default();
        let guard = StampedeGuard::new(Backend::local())
            .ttl(Duration::from_secs(60))
            .max_body_bytes(32)
            .expose_tag_headers(expose);
        let app = app(&origin, guard, 2);
        let answers = burst(&app, 12, || request("/big")).await;
        let tagged = answers
            .iter()
            .filter(|a| {
                a.headers.contains_key("surrogate-key") || a.headers.contains_key("cache-tag")
            })
            .count();
        let allowed = if expose { origin.calls() } else { 0 };
        assert!(
            tagged <= allowed,
            "expose={expose}: {tagged} answers carried the tags, {} origin calls",
            origin.calls()
        );
    }
}

/// An answer with tags in too many buckets is served but not stored; its
/// tags still never reach a client, and the waiters are not a herd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_too_many_tags_leaks_none() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let app = app(&origin, guard, 5_000);
    let answers = burst(&app, 12, || request("/big")).await;
    for a in &answers {
        assert_eq!(a.status, 200);
        assert!(!a.headers.contains_key("surrogate-key"));
        assert!(!a.headers.contains_key("cache-tag"));
    }
}

/// `stored` (RFC 9211 §2.6) only when the answer was stored: an answer with
/// too many tags is served and not stored, and must not say it was.
#[tokio::test]
async fn an_answer_not_stored_does_not_say_stored() {
    // Too many tags in the response's header, or from the request.
    let from_request = |_: &http::request::Parts| (0..5_000).map(|i| format!("r{i}")).collect();
    for (header_tags, guard) in [
        (5_000, StampedeGuard::new(Backend::local())),
        (1, StampedeGuard::new(Backend::local()).tags(from_request)),
    ] {
        let origin = Origin::default();
        let app = app(&origin, guard.ttl(Duration::from_secs(60)), header_tags);
        for _ in 0..2 {
            let a = crate::common::send(&app, request("/big")).await;
            let member = a.headers.get("cache-status").unwrap().to_str().unwrap();
            assert_eq!(a.x_cache(), "MISS");
            assert!(!member.contains("stored"), "{member}: not stored at all");
        }
        assert_eq!(origin.calls(), 2, "nothing was stored");
    }
}

/// A body over the cap with no `Content-Length` is found too big only as it
/// streams: the starter's answer, sent before, must not say `stored`.
#[tokio::test]
async fn a_streamed_answer_over_the_cap_does_not_say_stored() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/chunked",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                let chunks = (0..4).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 64]));
                axum::body::Body::from_stream(tokio_stream::iter(chunks))
            }
        })
        .layer(
            StampedeGuard::new(Backend::local())
                .ttl(Duration::from_secs(60))
                .max_body_bytes(16),
        ),
    );
    for _ in 0..2 {
        let a = crate::common::send(&app, request("/chunked")).await;
        assert_eq!(a.body.len(), 256);
        let member = a.headers.get("cache-status").unwrap().to_str().unwrap();
        assert!(!member.contains("stored"), "{member}: not stored");
    }
    assert_eq!(origin.calls(), 2, "over the cap: never stored");
}

/// A rebuild a purge overtook stores nothing: its answer must not say
/// `stored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_overtaken_by_a_purge_does_not_say_stored() {
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
                "slow"
            }
        })
        .layer(guard.clone()),
    );
    let a = app.clone();
    let first = tokio::spawn(async move { crate::common::send(&a, request("/slow")).await });
    entered.notified().await;
    guard.invalidate_all().await.unwrap();
    gate.add_permits(2);
    let first = first.await.unwrap();
    let member = first.headers.get("cache-status").unwrap().to_str().unwrap();
    let second = crate::common::send(&app, request("/slow")).await;
    assert_eq!(
        second.x_cache(),
        "MISS",
        "the overtaken rebuild stored nothing"
    );
    assert!(!member.contains("stored"), "{member}: nothing was stored");
}

/// The same with the URL's own invalidation (no tag moves): the rebuild it
/// overtook stores nothing and its answer does not say `stored`; the
/// rebuild after it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_overtaken_by_a_url_invalidation_does_not_say_stored() {
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
                "slow"
            }
        })
        .layer(guard.clone()),
    );
    let a = app.clone();
    let first = tokio::spawn(async move { crate::common::send(&a, request("/slow")).await });
    entered.notified().await;
    guard.invalidate(&request("/slow")).await.unwrap();
    gate.add_permits(2);
    let first = first.await.unwrap();
    let member = first.headers.get("cache-status").unwrap().to_str().unwrap();
    assert!(!member.contains("stored"), "{member}: nothing was stored");
    let second = crate::common::send(&app, request("/slow")).await;
    assert_eq!(
        second.x_cache(),
        "MISS",
        "the overtaken rebuild stored nothing"
    );
    let member = second
        .headers
        .get("cache-status")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(member.contains("stored"), "{member}: this one was stored");
    assert_eq!(
        crate::common::send(&app, request("/slow")).await.x_cache(),
        "HIT"
    );
}
