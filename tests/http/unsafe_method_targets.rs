//! Unsafe methods against the cache: the references their answers name
//! (relative, dot segments, a bare query, behind a nested router), writes
//! that must not purge another host, the opt-out and failed writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{get as get_req, local_guard, request_with, send, Origin};
use axum::extract::OriginalUri;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{CONTENT_LOCATION, LOCATION};
use http::{HeaderMap, Method, StatusCode};
use stampede_guard::StampedeGuard;

// ---------------------------------------------------------------------------
// Unsafe methods.
// ---------------------------------------------------------------------------

/// Items behind `Router::nest("/api", …)`: GET answers the item's version,
/// POST bumps every version and answers 201 with the `Location` in its
/// `loc` query parameter.
fn items_app(version: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let v = version.clone();
    let read = move |OriginalUri(uri): OriginalUri| {
        let v = v.clone();
        async move { format!("{}@{}", uri.path(), v.load(Ordering::SeqCst)) }
    };
    let v = version.clone();
    let write = move |OriginalUri(uri): OriginalUri| {
        let v = v.clone();
        async move {
            v.fetch_add(1, Ordering::SeqCst);
            let loc = uri
                .query()
                .and_then(|q| q.strip_prefix("loc="))
                .unwrap_or("")
                .to_owned();
            (StatusCode::CREATED, [(LOCATION, loc)]).into_response()
        }
    };
    let inner = Router::new().route("/items/{id}", get(read).post(write).layer(guard));
    Router::new().nest("/api", inner)
}

/// Behind a nested router, a relative `Location` names a URI under the
/// prefix the client used: the entry a GET of it reads is dropped.
#[tokio::test]
async fn a_relative_location_behind_a_nested_router_is_invalidated() {
    for loc in ["/api/items/2", "2", "./2"] {
        let version = Arc::new(AtomicUsize::new(0));
        let app = items_app(&version, local_guard());
        let h = [("host", "a.example")];
        assert_eq!(
            send(&app, request_with(Method::GET, "/api/items/2", &h))
                .await
                .text(),
            "/api/items/2@0"
        );
        assert_eq!(
            send(&app, request_with(Method::GET, "/api/items/2", &h))
                .await
                .x_cache(),
            "HIT"
        );
        let uri = format!("/api/items/1?loc={loc}");
        let w = send(&app, request_with(Method::POST, &uri, &h)).await;
        assert_eq!(w.status, StatusCode::CREATED);
        let after = send(&app, request_with(Method::GET, "/api/items/2", &h)).await;
        assert_eq!(
            after.text(),
            "/api/items/2@1",
            "Location: {loc} was not invalidated"
        );
    }
}

/// An attacker's write cannot purge another host's entries: not with its
/// own Host and a Location (built from a forged X-Forwarded-Host) naming the
/// victim, nor with a network-path or userinfo trick.
#[tokio::test]
async fn an_attackers_write_never_purges_another_host() {
    for (headers, loc) in [
        (
            vec![("host", "evil.example"), ("x-forwarded-host", "a.example")],
            "http://a.example/api/items/2",
        ),
        (vec![("host", "evil.example")], "//a.example/api/items/2"),
        (
            vec![("host", "evil.example")],
            "http://a.example@evil.example/api/items/2",
        ),
        (
            vec![("host", "evil.example")],
            "http://evil.example@a.example/api/items/2",
        ),
        (
            vec![("host", "evil.example")],
            "http://a.example:80/api/items/2",
        ),
        (
            vec![("host", "evil.example")],
            "HTTP://A.EXAMPLE/api/items/2",
        ),
    ] {
        let version = Arc::new(AtomicUsize::new(0));
        let app = items_app(&version, local_guard());
        let victim = [("host", "a.example")];
        assert_eq!(
            send(&app, request_with(Method::GET, "/api/items/2", &victim))
                .await
                .text(),
            "/api/items/2@0"
        );
        let uri = format!("/api/items/1?loc={loc}");
        let w = send(&app, request_with(Method::POST, &uri, &headers)).await;
        assert_eq!(w.status, StatusCode::CREATED);
        let after = send(&app, request_with(Method::GET, "/api/items/2", &victim)).await;
        assert_eq!(
            after.x_cache(),
            "HIT",
            "{headers:?} Location: {loc} purged the victim"
        );
    }
}

/// Posts and reads on one host: a write answers 200 with `Location` and
/// `Content-Location` from its query (`loc`, `cloc`); a read answers its
/// path and query with the write count.
fn site(writes: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let w = writes.clone();
    let read = move |OriginalUri(uri): OriginalUri| {
        let w = w.clone();
        async move { format!("{uri}@{}", w.load(Ordering::SeqCst)) }
    };
    let w = writes.clone();
    let write = move |OriginalUri(uri): OriginalUri| {
        let w = w.clone();
        async move {
            w.fetch_add(1, Ordering::SeqCst);
            let mut headers = HeaderMap::new();
            for pair in uri.query().unwrap_or("").split('&') {
                match pair.split_once('=') {
                    Some(("loc", v)) => {
                        headers.insert(LOCATION, v.parse().unwrap());
                    }
                    Some(("cloc", v)) => {
                        headers.insert(CONTENT_LOCATION, v.parse().unwrap());
                    }
                    _ => {}
                }
            }
            (headers, "written").into_response()
        }
    };
    Router::new()
        .route("/lists/{id}", get(read.clone()))
        .route("/items/{id}", get(read).post(write))
        .layer(guard)
}

/// RFC 3986 §5.2: `../lists/1` from `/items/5` is `/lists/1`, and `?v=full`
/// from `/items/5` is `/items/5?v=full`. The entries a GET of those reads
/// are dropped by the write.
#[tokio::test]
async fn references_resolve_as_rfc_3986_says() {
    let mut missed = Vec::new();
    for (param, reference, read) in [
        ("loc", "/lists/1", "/lists/1"),
        ("loc", "../lists/1", "/lists/1"),
        ("cloc", "./6", "/items/6"),
        ("cloc", "?v=full", "/items/5?v=full"),
    ] {
        let writes = Arc::new(AtomicUsize::new(0));
        let app = site(&writes, local_guard());
        let h = [("host", "a.example")];
        let before = send(&app, request_with(Method::GET, read, &h)).await;
        assert_eq!(before.text(), format!("{read}@0"));
        assert_eq!(
            send(&app, request_with(Method::GET, read, &h))
                .await
                .x_cache(),
            "HIT"
        );
        let uri = format!("/items/5?{param}={reference}");
        let w = send(&app, request_with(Method::POST, &uri, &h)).await;
        assert_eq!(w.text(), "written");
        let after = send(&app, request_with(Method::GET, read, &h)).await;
        if after.text() != format!("{read}@1") {
            missed.push(format!("{param}: {reference} did not drop {read}"));
        }
    }
    assert!(missed.is_empty(), "{missed:?}");
}

/// The opt-out keeps every entry, and a failed write drops nothing.
#[tokio::test]
async fn the_opt_out_and_failed_writes_drop_nothing() {
    let writes = Arc::new(AtomicUsize::new(0));
    let app = site(&writes, local_guard().invalidate_on_unsafe(false));
    let h = [("host", "a.example")];
    send(&app, request_with(Method::GET, "/items/5", &h)).await;
    send(&app, request_with(Method::POST, "/items/5", &h)).await;
    assert_eq!(
        send(&app, request_with(Method::GET, "/items/5", &h))
            .await
            .text(),
        "/items/5@0"
    );

    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new()
        .route(
            "/x",
            get(move || {
                let o = o.clone();
                async move {
                    o.enter();
                    "x"
                }
            })
            .post(|| async { StatusCode::FORBIDDEN })
            .put(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .layer(local_guard());
    send(&app, get_req("/x")).await;
    send(&app, request_with(Method::POST, "/x", &[])).await;
    send(&app, request_with(Method::PUT, "/x", &[])).await;
    assert_eq!(send(&app, get_req("/x")).await.x_cache(), "HIT");
}
