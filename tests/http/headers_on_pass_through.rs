//! Headers at the HTTP edge beyond the cached path: tag headers on the
//! answers the cache never takes (pass-throughs), an upstream
//! `Cache-Status` that is not a structured-field list, headers a `304`
//! renewal tries to slip into an entry, and the purge example's tagging.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::status::{cache_status, no_tag_headers};
use crate::common::{get as request, request_with, send, Origin};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use http::{header, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

/// `/r` answers every method with both tag headers, an upstream member.
fn tagged_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let o = origin.clone();
    let handler = move || {
        let origin = o.clone();
        async move {
            let (n, _) = origin.enter();
            let mut h = HeaderMap::new();
            h.insert("surrogate-key", "secret-tenant-7 internal".parse().unwrap());
            h.insert("cache-tag", "ct-internal".parse().unwrap());
            (h, format!("v{n}"))
        }
    };
    Router::new().route(
        "/r",
        get(handler.clone())
            .post(handler.clone())
            .delete(handler)
            .layer(guard),
    )
}

/// The docs: tag headers "never reach a client" unless the route exposes
/// them. Every answer the cache passes through without storing is such an
/// answer too: a request with credentials, a request `no-store`, a method
/// the cache does not take, a key function that declines, an upgrade.
#[tokio::test]
async fn a_passed_through_answer_carries_no_tag_header() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(60))
        .invalidate_on_unsafe(false)
        .respect_request_cache_control(true)
        .key_fn(|parts| (parts.uri.query() != Some("nokey")).then(|| parts.uri.to_string()));
    let app = tagged_app(&origin, guard);
    for (what, req) in [
        (
            "credentials",
            request_with("GET", "/r", &[("authorization", "Bearer x")]),
        ),
        ("a cookie", request_with("GET", "/r", &[("cookie", "s=1")])),
        (
            "request no-store",
            request_with("GET", "/r", &[("cache-control", "no-store")]),
        ),
        ("POST", request_with("POST", "/r", &[])),
        ("key_fn None", request_with("GET", "/r?nokey", &[])),
        (
            "upgrade",
            request_with(
                "GET",
                "/r",
                &[("upgrade", "websocket"), ("connection", "upgrade")],
            ),
        ),
    ] {
        let answer = send(&app, req).await;
        assert_eq!(answer.x_cache(), "BYPASS", "{what}");
        no_tag_headers(&answer, what);
    }
    // With `invalidate_on_unsafe` on (the default), too.
    let origin = Origin::default();
    let app = tagged_app(&origin, StampedeGuard::new(Backend::local()));
    let answer = send(&app, request_with("DELETE", "/r", &[])).await;
    no_tag_headers(&answer, "DELETE");
}

/// Exposed tag headers stay on a pass-through, as on the starter's answer.
#[tokio::test]
async fn an_exposing_route_keeps_them_on_a_pass_through() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).expose_tag_headers(true);
    let app = tagged_app(&origin, guard);
    let answer = send(
        &app,
        request_with("GET", "/r", &[("authorization", "Bearer x")]),
    )
    .await;
    assert_eq!(
        answer.headers.get("surrogate-key").unwrap(),
        "secret-tenant-7 internal"
    );
}

/// Whether `field` (every line joined with `, `) parses as an RFC 8941
/// List of items with parameters, as this layer's members and the ones the
/// test origin sends are built (tokens, strings, integers; no inner lists).
fn is_sf_list(field: &str) -> bool {
    let b = field.as_bytes();
    let mut i = 0;
    let skip_sp = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t') {
            *i += 1;
        }
    };
    let bare_item = |i: &mut usize| -> bool {
        match b.get(*i) {
            Some(b'"') => {
                *i += 1;
                loop {
                    match b.get(*i) {
                        None => return false,
                        Some(b'\\') => {
                            if !matches!(b.get(*i + 1), Some(b'"' | b'\\')) {
                                return false;
                            }
                            *i += 2;
                        }
                        Some(b'"') => {
                            *i += 1;
                            return true;
                        }
                        Some(c) if (0x20..0x7f).contains(c) => *i += 1,
                        Some(_) => return false,
                    }
                }
            }
            Some(c) if c.is_ascii_alphabetic() || *c == b'*' => {
                *i += 1;
                while b
                    .get(*i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(c))
                {
                    *i += 1;
                }
                true
            }
            Some(c) if c.is_ascii_digit() || *c == b'-' => {
                *i += 1;
                let start = *i;
                while b.get(*i).is_some_and(|c| c.is_ascii_digit()) {
                    *i += 1;
                }
                *i > start || b[start - 1] != b'-'
            }
            _ => false,
        }
    };
    let key = |i: &mut usize| -> bool {
        if !b
            .get(*i)
            .is_some_and(|c| c.is_ascii_lowercase() || *c == b'*')
        {
            return false;
        }
        while b
            .get(*i)
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c))
        {
            *i += 1;
        }
        true
    };
    skip_sp(&mut i);
    loop {
        if !bare_item(&mut i) {
            return false;
        }
        while b.get(i) == Some(&b';') {
            i += 1;
            skip_sp(&mut i);
            if !key(&mut i) {
                return false;
            }
            if b.get(i) == Some(&b'=') {
                i += 1;
                if !bare_item(&mut i) {
                    return false;
                }
            }
        }
        skip_sp(&mut i);
        if i == b.len() {
            return true;
        }
        if b[i] != b',' {
            return false;
        }
        i += 1;
        skip_sp(&mut i);
        if i == b.len() {
            return false;
        }
    }
}

#[test]
fn the_checker_reads_lists() {
    assert!(is_sf_list(
        "a; hit; ttl=3, b; fwd=uri-miss; detail=\"x, y\""
    ));
    assert!(!is_sf_list("\"open, a; hit"));
    assert!(!is_sf_list("a,"));
    assert!(!is_sf_list("a; hit; ttl=-"));
}

/// An origin (or the upstream cache in front of it) that sends a
/// `Cache-Status` which is not a list: joined with it, this layer's member
/// would be swallowed (an unterminated string) or the whole field thrown
/// away by a parser (RFC 8941 §4.2: a list that fails to parse is ignored).
/// The field this layer sends must still parse, and still say what this
/// layer did.
#[tokio::test]
async fn a_malformed_upstream_member_does_not_swallow_ours() {
    for upstream in [
        "\"unterminated, upstream; hit",
        "upstream; detail=\"open",
        "1bad token",
        "upstream; fwd=miss,",
        "upstream;;hit",
    ] {
        let origin = Origin::default();
        let o = origin.clone();
        let app = Router::new().route(
            "/r",
            get(move || {
                let origin = o.clone();
                async move {
                    let (n, _) = origin.enter();
                    let mut h = HeaderMap::new();
                    h.insert("cache-status", upstream.parse().unwrap());
                    h.append("cache-status", "good-upstream; fwd=miss".parse().unwrap());
                    (h, format!("v{n}"))
                }
            })
            .layer(StampedeGuard::new(Backend::local())),
        );
        for (what, req) in [
            ("a miss", request("/r")),
            (
                "a pass-through",
                request_with("GET", "/r", &[("authorization", "x")]),
            ),
        ] {
            let answer = send(&app, req).await;
            let all = cache_status(&answer);
            let field = all.join(", ");
            assert!(is_sf_list(&field), "{upstream:?} on {what}: {field:?}");
            assert!(
                all.last().unwrap().starts_with("stampede-guard; fwd="),
                "{upstream:?} on {what}: {all:?}"
            );
            assert!(
                all.iter().any(|m| m == "good-upstream; fwd=miss"),
                "a valid upstream member is kept: {all:?}"
            );
        }
    }
}

/// A `304` that renews an entry may carry an upstream `Cache-Status`, tag
/// headers and a status header of its own: none of them reaches a later
/// hit, and the renewal keeps the tags.
#[tokio::test]
async fn a_renewing_304_slips_nothing_into_the_entry() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(200))
        .stale_if_error(Duration::from_secs(60));
    let app = Router::new().route(
        "/p",
        get(move |headers: HeaderMap| {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let mut h = HeaderMap::new();
                h.insert(header::ETAG, "\"e\"".parse().unwrap());
                if headers.get("if-none-match").is_some() {
                    h.insert("cache-status", "upstream; fwd=stale".parse().unwrap());
                    h.insert("surrogate-key", "from-304".parse().unwrap());
                    h.insert("x-cache", "UPSTREAM".parse().unwrap());
                    return (StatusCode::NOT_MODIFIED, h, String::new());
                }
                h.insert("surrogate-key", "first".parse().unwrap());
                (StatusCode::OK, h, format!("v{n}"))
            }
        })
        .layer(guard.clone()),
    );
    assert_eq!(send(&app, request("/p")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renewed = send(&app, request("/p")).await;
    assert_eq!(renewed.text(), "v1");
    no_tag_headers(&renewed, "the renewing request");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    for (what, req) in [
        ("GET", request("/p")),
        ("HEAD", request_with("HEAD", "/p", &[])),
        (
            "304",
            request_with("GET", "/p", &[("if-none-match", "\"e\"")]),
        ),
    ] {
        let hit = send(&app, req).await;
        assert_eq!(hit.x_cache(), "HIT", "{what}");
        no_tag_headers(&hit, what);
        let all = cache_status(&hit);
        assert_eq!(all.len(), 1, "{what}: {all:?}");
        assert!(all[0].starts_with("stampede-guard; hit; ttl="), "{all:?}");
    }
    // Both the stored tag and the 304's reach the renewed entry.
    guard.invalidate_tag("first").await.unwrap();
    assert_eq!(send(&app, request("/p")).await.x_cache(), "MISS");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// The purge example's route tags `product:<id>` from the path the client
/// sent; the handler reads the id percent-decoded (`Path<u32>`), so
/// `/products/%37` is product 7 too, and its purge must reach that entry.
#[allow(dead_code)]
#[path = "../../examples/purge.rs"]
mod purge_example;

async fn check_spelling(spelling: &str) -> (String, String) {
    let app = purge_example::router(Backend::local(), "secret");
    let get = || {
        Request::get(spelling)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let before = send(&app, get()).await.text();
    let write = Request::post("/products/7")
        .body(axum::body::Body::from("80"))
        .unwrap();
    assert_eq!(send(&app, write).await.status, StatusCode::NO_CONTENT);
    let after = send(&app, get()).await.text();
    (before, after)
}

#[tokio::test]
async fn the_purge_example_reaches_every_spelling_of_an_id() {
    for spelling in [
        "/products/7",
        "/products/007",
        "/products/%37",
        "/products/%2B7",
    ] {
        let (before, after) = check_spelling(spelling).await;
        assert_eq!(before, "product 7: 100 EUR\n", "{spelling}");
        assert_eq!(after, "product 7: 80 EUR\n", "{spelling}: purge missed");
    }
}

/// A tag header line with one tag in UTF-8 (or one byte that is not text):
/// the other tags of the line still label the entry, so their purge drops
/// it; the UTF-8 tag is purged by its own name.
#[tokio::test]
async fn a_non_ascii_tag_does_not_hide_the_others_of_its_line() {
    for (line, purged) in [
        (&b"product:42 cat\xc3\xa9gorie"[..], "product:42"),
        (&b"product:42 cat\xc3\xa9gorie"[..], "cat\u{e9}gorie"),
        (&b"\xff\xfe, product:43"[..], "product:43"),
    ] {
        let origin = Origin::default();
        let o = origin.clone();
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
        let app = Router::new().route(
            "/t",
            get(move || {
                let origin = o.clone();
                async move {
                    let (n, _) = origin.enter();
                    let mut h = HeaderMap::new();
                    h.insert(
                        "surrogate-key",
                        http::HeaderValue::from_bytes(line).unwrap(),
                    );
                    (h, format!("v{n}"))
                }
            })
            .layer(guard.clone()),
        );
        let first = send(&app, request("/t")).await;
        no_tag_headers(&first, "the starter");
        assert_eq!(send(&app, request("/t")).await.x_cache(), "HIT");
        guard.invalidate_tag(purged).await.unwrap();
        let after = send(&app, request("/t")).await;
        assert_eq!(after.x_cache(), "MISS", "{purged} missed the entry");
        assert_eq!(after.text(), "v2");
    }
}

/// The member of a waiter whose budget ran out, and of a request sent alone
/// in a hit-for-miss window: one valid member that agrees with `x-cache`,
/// and no tag header on either.
#[tokio::test]
async fn a_timed_out_waiter_and_a_hit_for_miss_request_say_so_validly() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (g, c) = (gate.clone(), calls.clone());
    let guard = StampedeGuard::new(Backend::local())
        .wait_budget(Duration::from_millis(50))
        .on_wait_timeout(stampede_guard::WaitTimeout::Respond(
            StatusCode::SERVICE_UNAVAILABLE,
        ))
        .hit_for_miss(Duration::from_secs(60));
    let app = Router::new().route(
        "/w",
        get(move || {
            let (gate, calls) = (g.clone(), c.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                let mut h = HeaderMap::new();
                h.insert("surrogate-key", "w".parse().unwrap());
                h.insert(header::CACHE_CONTROL, "private".parse().unwrap());
                (h, "mine")
            }
        })
        .layer(guard),
    );
    let a = app.clone();
    let starter = tokio::spawn(async move { send(&a, request("/w")).await });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiter = send(&app, request("/w")).await;
    assert_eq!(waiter.status, StatusCode::SERVICE_UNAVAILABLE);
    let all = cache_status(&waiter);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(is_sf_list(&all[0]), "{all:?}");
    assert!(all[0].contains("detail=wait-timeout"), "{all:?}");
    assert!(!all[0].contains("; hit"), "{all:?} {}", waiter.x_cache());
    assert_ne!(waiter.x_cache(), "HIT");
    no_tag_headers(&waiter, "a timed-out waiter");

    gate.add_permits(1);
    let starter = starter.await.unwrap();
    assert_eq!(starter.text(), "mine");
    no_tag_headers(&starter, "a private answer");
    assert!(is_sf_list(&cache_status(&starter).join(", ")));

    // The window: the next request runs its own rebuild, not stored.
    gate.add_permits(1);
    let alone = send(&app, request("/w")).await;
    assert_eq!(alone.text(), "mine");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    no_tag_headers(&alone, "a hit-for-miss request");
    let all = cache_status(&alone);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(is_sf_list(&all[0]), "{all:?}");
    assert!(all[0].starts_with("stampede-guard; fwd="), "{all:?}");
    assert!(!all[0].contains("stored"), "{all:?}");
    assert_ne!(alone.x_cache(), "HIT");
}
