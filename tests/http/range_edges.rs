//! Attacks on range handling: edge values, repeated fields, validators,
//! and what an origin 206 may become.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{local_guard, send, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use stampede_guard::StampedeGuard;
use tokio::sync::Notify;

const PATIENCE: Duration = Duration::from_secs(30);
const BODY: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
const LM: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

/// A route answering `body` with a strong ETag and a Last-Modified; counts
/// calls and calls that carried Range/If-Range.
fn file_app(body: &'static [u8], guard: StampedeGuard) -> (Router, Origin, Arc<AtomicUsize>) {
    let origin = Origin::default();
    let ranged = Arc::new(AtomicUsize::new(0));
    let (o, r) = (origin.clone(), ranged.clone());
    let router = Router::new().route(
        "/file",
        get(move |headers: HeaderMap| {
            let (origin, ranged) = (o.clone(), r.clone());
            async move {
                let (_n, _running) = origin.enter();
                if headers.contains_key("range") || headers.contains_key("if-range") {
                    ranged.fetch_add(1, Ordering::SeqCst);
                }
                // `Last-Modified` long before `Date`: a strong date, which
                // `If-Range` may name (RFC 9110 §8.8.2.2).
                let date = httpdate::fmt_http_date(std::time::SystemTime::now());
                (
                    [
                        ("etag", "\"v1\""),
                        ("last-modified", LM),
                        ("date", date.as_str()),
                        ("content-type", "text/plain"),
                    ],
                    body,
                )
                    .into_response()
            }
        })
        .layer(guard),
    );
    (router, origin, ranged)
}

fn req(method: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().method(method).uri("/file");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

fn cl(answer: &crate::common::Answer) -> Option<usize> {
    answer
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

/// Every answer's Content-Length, when present, is its body's length.
fn assert_framing(answer: &crate::common::Answer) {
    if let Some(n) = cl(answer) {
        assert_eq!(n, answer.body.len(), "Content-Length lies: {answer:?}");
    }
}

async fn warm(app: &Router) {
    let first = send(app, req("GET", &[])).await;
    assert_eq!(first.body, Bytes::from_static(BODY));
}

// ---------------------------------------------------------------- ranges

#[tokio::test(flavor = "current_thread")]
async fn range_edge_values_are_answered_per_rfc_9110() {
    let (app, origin, ranged) = file_app(BODY, local_guard());
    warm(&app).await;
    let len = BODY.len();
    // (Range, status, body, Content-Range)
    let cases: Vec<(String, StatusCode, &[u8], Option<String>)> = vec![
        (
            "bytes=0-0".into(),
            StatusCode::PARTIAL_CONTENT,
            &BODY[0..1],
            Some(format!("bytes 0-0/{len}")),
        ),
        (
            "bytes=-0".into(),
            StatusCode::RANGE_NOT_SATISFIABLE,
            b"",
            Some(format!("bytes */{len}")),
        ),
        ("bytes=5-4".into(), StatusCode::OK, BODY, None),
        (
            "BYTES=2-3".into(),
            StatusCode::PARTIAL_CONTENT,
            &BODY[2..4],
            Some(format!("bytes 2-3/{len}")),
        ),
        (
            format!("bytes={len}-"),
            StatusCode::RANGE_NOT_SATISFIABLE,
            b"",
            Some(format!("bytes */{len}")),
        ),
        (
            format!("bytes={}-", "9".repeat(300)),
            StatusCode::RANGE_NOT_SATISFIABLE,
            b"",
            Some(format!("bytes */{len}")),
        ),
        (
            format!("bytes=-{}", "9".repeat(300)),
            StatusCode::PARTIAL_CONTENT,
            BODY,
            Some(format!("bytes 0-{}/{len}", len - 1)),
        ),
        (
            format!("bytes=0-{}", u64::MAX),
            StatusCode::PARTIAL_CONTENT,
            BODY,
            Some(format!("bytes 0-{}/{len}", len - 1)),
        ),
        ("bytes=0-1,3-4".into(), StatusCode::OK, BODY, None),
        ("bytes=".into(), StatusCode::OK, BODY, None),
        ("bytes=--1".into(), StatusCode::OK, BODY, None),
        ("bytes=-1-2".into(), StatusCode::OK, BODY, None),
        ("bytes=1".into(), StatusCode::OK, BODY, None),
        ("pages=0-1".into(), StatusCode::OK, BODY, None),
        ("bytes=0x1-2".into(), StatusCode::OK, BODY, None),
        (
            "bytes=35-35".into(),
            StatusCode::PARTIAL_CONTENT,
            &BODY[35..36],
            Some(format!("bytes 35-35/{len}")),
        ),
    ];
    for (range, status, body, content_range) in cases {
        let a = send(&app, req("GET", &[("range", &range)])).await;
        assert_eq!(a.status, status, "{range}");
        assert_eq!(&a.body[..], body, "{range}");
        assert_eq!(
            a.headers
                .get("content-range")
                .map(|v| v.to_str().unwrap().to_owned()),
            content_range,
            "{range}"
        );
        assert_eq!(cl(&a), Some(body.len()), "{range}: Content-Length");
        assert_framing(&a);
    }
    assert_eq!(origin.calls(), 1);
    assert_eq!(ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn two_range_lines_are_several_ranges_not_the_first_one() {
    // RFC 9110 §5.3: field lines of a list-based field combine into one
    // comma-separated list; `Range: bytes=0-1` + `Range: bytes=5-6` asks for
    // two ranges, which the promise answers with the whole 200. Answering
    // the first line alone hands the client a part it did not ask for (and
    // a cache in front that combines the lines disagrees with this one).
    let (app, _origin, _) = file_app(BODY, local_guard());
    warm(&app).await;
    let a = send(
        &app,
        req("GET", &[("range", "bytes=0-1"), ("range", "bytes=5-6")]),
    )
    .await;
    assert_framing(&a);
    assert_eq!(a.status, StatusCode::OK, "several ranges get the whole 200");
    assert_eq!(a.body, Bytes::from_static(BODY));
}

#[tokio::test(flavor = "current_thread")]
async fn two_if_range_lines_never_let_a_range_through() {
    // If-Range is a single value; two lines is invalid, and the safe answer
    // is the whole 200, never a part chosen by the first line.
    let (app, _origin, _) = file_app(BODY, local_guard());
    warm(&app).await;
    let a = send(
        &app,
        req(
            "GET",
            &[
                ("range", "bytes=0-1"),
                ("if-range", "\"v1\""),
                ("if-range", "\"v0\""),
            ],
        ),
    )
    .await;
    assert_framing(&a);
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, Bytes::from_static(BODY));
}

#[tokio::test(flavor = "current_thread")]
async fn if_range_weak_or_wrong_validators_get_the_whole_200() {
    let (app, origin, ranged) = file_app(BODY, local_guard());
    warm(&app).await;
    for (validator, partial) in [
        ("\"v1\"", true),
        (LM, true),
        ("W/\"v1\"", false),
        ("\"v2\"", false),
        ("Sun, 06 Nov 1994 08:49:38 GMT", false),
        ("Sunday, 06-Nov-94 08:49:37 GMT", false),
        ("v1", false),
        ("", false),
    ] {
        let a = send(
            &app,
            req("GET", &[("range", "bytes=1-2"), ("if-range", validator)]),
        )
        .await;
        assert_framing(&a);
        if partial {
            assert_eq!(a.status, StatusCode::PARTIAL_CONTENT, "{validator}");
            assert_eq!(&a.body[..], &BODY[1..3]);
        } else {
            assert_eq!(a.status, StatusCode::OK, "{validator}");
            assert_eq!(a.body, Bytes::from_static(BODY), "{validator}");
            assert!(a.headers.get("content-range").is_none());
        }
    }
    assert_eq!(origin.calls(), 1);
    assert_eq!(ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn if_range_with_a_weak_stored_etag_never_matches() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/file",
        get(move || {
            let origin = o.clone();
            async move {
                let _ = origin.enter();
                ([("etag", "W/\"v1\"")], BODY).into_response()
            }
        })
        .layer(local_guard()),
    );
    warm(&app).await;
    for validator in ["W/\"v1\"", "\"v1\""] {
        let a = send(
            &app,
            req("GET", &[("range", "bytes=1-2"), ("if-range", validator)]),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{validator}");
        assert_eq!(a.body, Bytes::from_static(BODY));
        assert_framing(&a);
    }
    let a = send(&app, req("GET", &[("range", "bytes=1-2")])).await;
    assert_eq!(a.status, StatusCode::PARTIAL_CONTENT);
}

#[tokio::test(flavor = "current_thread")]
async fn range_with_a_matching_if_none_match_is_a_304_and_head_ignores_range() {
    let (app, _origin, _) = file_app(BODY, local_guard());
    warm(&app).await;
    let a = send(
        &app,
        req(
            "GET",
            &[("range", "bytes=1-2"), ("if-none-match", "\"v1\"")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_MODIFIED);
    assert!(a.body.is_empty());
    assert!(a.headers.get("content-range").is_none());
    let a = send(
        &app,
        req(
            "GET",
            &[("range", "bytes=1-2"), ("if-none-match", "\"v0\"")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&a.body[..], &BODY[1..3]);
    assert_framing(&a);
    for range in ["bytes=1-2", "bytes=999-", "bytes=-0"] {
        let a = send(&app, req("HEAD", &[("range", range)])).await;
        assert_eq!(a.status, StatusCode::OK, "{range}");
        assert!(a.body.is_empty());
        assert!(a.headers.get("content-range").is_none());
        assert_eq!(cl(&a), Some(BODY.len()));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_range_on_an_empty_body_is_416_with_star_slash_zero() {
    let (app, origin, _) = file_app(b"", local_guard());
    let first = send(&app, req("GET", &[])).await;
    assert_eq!(first.status, StatusCode::OK);
    for range in ["bytes=0-0", "bytes=0-", "bytes=-1", "bytes=-0"] {
        let a = send(&app, req("GET", &[("range", range)])).await;
        assert_eq!(a.status, StatusCode::RANGE_NOT_SATISFIABLE, "{range}");
        assert_eq!(a.headers["content-range"], "bytes */0");
        assert_eq!(cl(&a), Some(0));
        assert!(a.body.is_empty());
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_cold_range_request_gets_its_part_and_the_origin_sees_no_range() {
    let (app, origin, ranged) = file_app(BODY, local_guard());
    let a = send(
        &app,
        req("GET", &[("range", "bytes=-3"), ("if-range", "\"v1\"")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&a.body[..], &BODY[BODY.len() - 3..]);
    assert_framing(&a);
    let whole = send(&app, req("GET", &[])).await;
    assert_eq!(whole.x_cache(), "HIT");
    assert_eq!(whole.body, Bytes::from_static(BODY));
    assert_eq!(origin.calls(), 1);
    assert_eq!(ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn an_origin_206_is_neither_shared_nor_stored() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let (o, g) = (origin.clone(), gate.clone());
    let app = Router::new().route(
        "/file",
        get(move || {
            let (origin, gate) = (o.clone(), g.clone());
            async move {
                let (n, _r) = origin.enter();
                if n == 1 {
                    gate.notified().await;
                }
                (
                    StatusCode::PARTIAL_CONTENT,
                    [
                        ("content-range", "bytes 0-1/36"),
                        ("cache-control", "max-age=60"),
                    ],
                    format!("p{n}"),
                )
                    .into_response()
            }
        })
        .layer(local_guard()),
    );
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, req("GET", &[])).await })
        })
        .collect();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let mut bodies = Vec::new();
    for t in tasks {
        let a = tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
        assert_framing(&a);
        if a.status == StatusCode::PARTIAL_CONTENT {
            bodies.push(a.text());
        }
    }
    bodies.sort();
    bodies.dedup();
    // Each 206 went to the request that fetched it alone.
    assert_eq!(bodies.len(), origin.calls(), "{bodies:?}");
    let next = send(&app, req("GET", &[])).await;
    assert_ne!(next.x_cache(), "HIT");
}
