//! Request headers a client controls, on a warm key of a route with the
//! default rules: how many origin calls each costs. Credentials are meant
//! to pass; a client must not be able to turn the protection off otherwise.

use std::time::Duration;

use axum::body::Body;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

use crate::common::driver::counted_app;
use crate::common::{get, send, Origin};

fn request(headers: &[(&str, &str)], body: &'static str) -> Request<Body> {
    let mut r = Request::get("/report");
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    r.body(Body::from(body)).unwrap()
}

/// Origin calls that ten requests carrying `headers` cost on a warm key.
async fn calls_for(headers: &[(&str, &str)], body: &'static str) -> usize {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    assert_eq!(send(&app, get("/report")).await.text(), "v1");
    for _ in 0..10 {
        let _ = send(&app, request(headers, body)).await;
    }
    origin.calls() - 1
}

/// Request headers whose calls over ten requests on a warm key exceed one.
async fn costly(cases: Vec<(&[(&str, &str)], &'static str)>) -> Vec<String> {
    let mut costly = Vec::new();
    for (headers, body) in cases {
        let calls = calls_for(headers, body).await;
        if calls > 1 {
            costly.push(format!("{headers:?} body {body:?}: {calls} calls for 10"));
        }
    }
    costly
}

/// Cache directives in any spelling, conditions and ranges: answered from
/// the entry.
#[tokio::test]
async fn request_directives_in_odd_spellings_cost_no_origin_call_on_a_warm_key() {
    let costly = costly(vec![
        (&[("cache-control", "NO-STORE")], ""),
        (&[("cache-control", "no-store ,,")], ""),
        (&[("cache-control", "max-age=\"0\"")], ""),
        (
            &[("cache-control", "no-cache"), ("cache-control", "no-store")],
            "",
        ),
        (&[("cache-control", "only-if-cached")], ""),
        (&[("cache-control", "max-stale")], ""),
        (&[("cache-control", "min-fresh=999999")], ""),
        (&[("pragma", "NO-CACHE")], ""),
        (&[("if-none-match", "*")], ""),
        (
            &[("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT")],
            "",
        ),
        (&[("range", "bytes=0-0")], ""),
        (&[("content-length", "0")], ""),
    ])
    .await;
    assert!(costly.is_empty(), "{costly:#?}");
}

/// Headers any client can add to a GET, none of them credentials: an
/// `Upgrade` without `Connection: upgrade` (no upgrade, RFC 9110 §7.8), a
/// body on a GET (the entry answers a hit without the handler), a repeated
/// `Host` (refused).
#[tokio::test]
async fn headers_any_client_can_add_cost_no_origin_call_on_a_warm_key() {
    let costly = costly(vec![
        (&[("upgrade", "h2c")], ""),
        (&[("content-length", "1")], "x"),
        (&[("transfer-encoding", "chunked")], ""),
        (&[("host", "a.example"), ("host", "a.example")], ""),
    ])
    .await;
    assert!(costly.is_empty(), "{costly:#?}");
}

/// Thirty requests at once on a warm key, each with a header any client can
/// add: origin calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_with_headers_any_client_can_add_costs_no_origin_call_on_a_warm_key() {
    let mut costly = Vec::new();
    for headers in [[("upgrade", "h2c")], [("content-length", "1")]] {
        let origin = Origin::default();
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
        let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
        send(&app, get("/report")).await;
        let body = if headers[0].0 == "content-length" {
            "x"
        } else {
            ""
        };
        let _ = crate::common::burst(&app, 30, || request(&headers, body)).await;
        if origin.calls() > 1 {
            costly.push(format!(
                "{headers:?}: {} calls for 30 at once",
                origin.calls() - 1
            ));
        }
    }
    assert!(costly.is_empty(), "{costly:#?}");
}

/// More of what a client can add to a GET without asking for anything the
/// handler must do: hop-by-hop tricks, an `Upgrade` that `Connection` does
/// not name (or names without an `Upgrade`), an expectation, framing that
/// announces no content, a target in absolute form, forwarding limits. At
/// most the one miss of a new key each.
#[tokio::test]
async fn hop_by_hop_and_framing_tricks_cost_at_most_one_miss_on_a_warm_key() {
    let costly = costly(vec![
        (&[("upgrade", "websocket"), ("connection", "close")], ""),
        (&[("upgrade", "h2c"), ("connection", "keep-alive")], ""),
        (&[("connection", "upgrade")], ""),
        (&[("connection", "upgrade"), ("upgrade", "")], ""),
        (&[("expect", "100-continue")], ""),
        (&[("expect", "100-continue"), ("content-length", "1")], "x"),
        (&[("te", "trailers"), ("connection", "te")], ""),
        (&[("connection", "cache-control, host, content-length")], ""),
        (&[("max-forwards", "0")], ""),
        (&[("content-length", "0, 0")], ""),
        (&[("content-length", "0"), ("content-length", "0")], ""),
        (&[("content-length", "-1")], ""),
        (&[("content-length", "abc")], ""),
        (&[("transfer-encoding", "gzip, chunked")], "x"),
        (&[("transfer-encoding", "identity")], ""),
        (
            &[("content-length", "5"), ("transfer-encoding", "chunked")],
            "hello",
        ),
        (&[("host", "a.example")], ""),
    ])
    .await;
    assert!(costly.is_empty(), "{costly:#?}");
}

/// A HEAD with a body, and a GET with a body and a precondition: answered
/// from the fresh entry like any other.
#[tokio::test]
async fn a_head_or_a_conditional_get_with_a_body_is_answered_from_the_entry() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    let first = send(&app, get("/report")).await;
    let etag = first.headers.get("etag").cloned();
    for _ in 0..5 {
        let head = Request::head("/report")
            .header("content-length", "1")
            .body(Body::from("x"))
            .unwrap();
        let a = send(&app, head).await;
        assert_eq!(a.status, http::StatusCode::OK);
        assert!(a.body.is_empty());
        if let Some(etag) = &etag {
            let conditional = Request::get("/report")
                .header("if-none-match", etag)
                .header("transfer-encoding", "chunked")
                .body(Body::from("x"))
                .unwrap();
            assert_eq!(
                send(&app, conditional).await.status,
                http::StatusCode::NOT_MODIFIED
            );
        }
    }
    assert_eq!(origin.calls(), 1);
}

/// A GET with a body on a cold key: its content is discarded, so the
/// handler answers the plain GET it is, which is stored and coalesced like
/// any other: the plain GET after it is a hit.
#[tokio::test]
async fn a_get_with_a_body_on_a_cold_key_is_taken_as_the_plain_get_it_is() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    let a = send(&app, request(&[("content-length", "1")], "x")).await;
    assert_eq!((a.text().as_str(), a.x_cache()), ("v1", "MISS"));
    let b = send(&app, get("/report")).await;
    assert_eq!((b.text().as_str(), b.x_cache()), ("v1", "HIT"));
    assert_eq!(origin.calls(), 1);
}

/// A real protocol switch (`Upgrade` named in `Connection`, HTTP/1.1)
/// reaches the handler, warm key or not: only the handler can accept it.
/// This handler answers it as a plain GET (a `200`, no switch), which the
/// layer learns: the switches after it on the key are taken as plain GETs
/// (a hit), without the `Upgrade`. Any other `Upgrade` is no switch, and the
/// handler of a miss never sees it.
#[tokio::test]
async fn a_real_upgrade_reaches_the_handler_and_a_false_one_never_does() {
    let origin = Origin::default();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<bool>::new()));
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let (origin, seen) = (origin.clone(), seen.clone());
        axum::Router::new().route(
            "/report",
            axum::routing::get(move |headers: http::HeaderMap| {
                let (origin, seen) = (origin.clone(), seen.clone());
                async move {
                    let (n, _running) = origin.enter();
                    seen.lock().unwrap().push(headers.contains_key("upgrade"));
                    format!("v{n}")
                }
            })
            .layer(guard),
        )
    };
    // A false upgrade starts the key's flight as a plain GET.
    let a = send(&app, request(&[("upgrade", "h2c")], "")).await;
    assert_eq!(a.x_cache(), "MISS");
    let mut states = Vec::new();
    for _ in 0..3 {
        let a = send(
            &app,
            request(&[("upgrade", "websocket"), ("connection", "Upgrade")], ""),
        )
        .await;
        states.push(a.x_cache().to_owned());
    }
    assert_eq!(states, ["BYPASS", "HIT", "HIT"]);
    assert_eq!(origin.calls(), 2);
    assert_eq!(*seen.lock().unwrap(), [false, true]);
}
