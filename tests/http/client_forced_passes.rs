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

/// Headers any client can add to a GET, none of them credentials, each of
/// which sends every request to the origin on a warm key (10 calls for 10;
/// concurrent ones are not coalesced either): an `Upgrade` without
/// `Connection: upgrade` (no upgrade, RFC 9110 §7.8), a body on a GET (the
/// entry answers a hit without the handler), a repeated `Host`.
#[tokio::test]
#[ignore = "a client forces origin calls on a warm key with these headers"]
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
#[ignore = "a client forces origin calls on a warm key with these headers"]
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
