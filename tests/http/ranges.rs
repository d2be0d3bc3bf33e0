//! Range requests are answered from one whole fetch: the origin never sees
//! `Range`, and each request gets its own slice of the entry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{local_guard, send, tally, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use tokio::sync::Notify;

const BODY: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// A route answering `BODY` with an ETag and a Last-Modified, after `gate`
/// if one is given; it counts the requests that reached it with a `Range`.
struct App {
    router: Router,
    origin: Origin,
    ranged: Arc<AtomicUsize>,
}

fn app(gate: Option<Arc<Notify>>) -> App {
    let origin = Origin::default();
    let ranged = Arc::new(AtomicUsize::new(0));
    let (o, r) = (origin.clone(), ranged.clone());
    let router = Router::new().route(
        "/file",
        get(move |headers: HeaderMap| {
            let (origin, ranged, gate) = (o.clone(), r.clone(), gate.clone());
            async move {
                let (_n, _running) = origin.enter();
                if headers.contains_key("range") || headers.contains_key("if-range") {
                    ranged.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(gate) = gate {
                    gate.notified().await;
                }
                // `Last-Modified` long before `Date`: a strong date, which
                // `If-Range` may name (RFC 9110 §8.8.2.2).
                let date = httpdate::fmt_http_date(std::time::SystemTime::now());
                (
                    [
                        ("etag", "\"v1\""),
                        ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
                        ("date", date.as_str()),
                        ("content-type", "text/plain"),
                    ],
                    BODY,
                )
                    .into_response()
            }
        })
        .layer(local_guard()),
    );
    App {
        router,
        origin,
        ranged,
    }
}

fn ranged(method: &str, range: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri("/file")
        .header("range", range)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn thirty_range_requests_on_a_cold_key_make_one_origin_call() {
    let gate = Arc::new(Notify::new());
    let app = app(Some(gate.clone()));
    let tasks: Vec<_> = (0..30u64)
        .map(|i| {
            let router = app.router.clone();
            let first = i % 30;
            let last = first + 5;
            let request = ranged("GET", &format!("bytes={first}-{last}"));
            tokio::spawn(async move { (first, send(&router, request).await) })
        })
        .collect();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let mut answers = Vec::new();
    for task in tasks {
        let (first, answer) = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
        let first = first as usize;
        let last = (first + 5).min(BODY.len() - 1);
        assert_eq!(answer.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(&answer.body[..], &BODY[first..=last]);
        assert_eq!(
            answer.headers["content-range"],
            format!("bytes {first}-{last}/{}", BODY.len())
        );
        assert_eq!(
            answer.headers["content-length"],
            (last - first + 1).to_string()
        );
        answers.push(answer);
    }
    assert_eq!(app.origin.calls(), 1);
    assert_eq!(
        app.ranged.load(Ordering::SeqCst),
        0,
        "the origin saw no Range"
    );
    assert_eq!(tally(&answers, "MISS"), 1);
    assert_eq!(tally(&answers, "COALESCED"), 29);

    // The entry is the whole representation.
    let whole = send(&app.router, crate::common::get("/file")).await;
    assert_eq!((whole.status, whole.x_cache()), (StatusCode::OK, "HIT"));
    assert_eq!(&whole.body[..], BODY);
}

#[tokio::test]
async fn suffix_open_and_unsatisfiable_ranges() {
    let app = app(None);
    let len = BODY.len();
    let suffix = send(&app.router, ranged("GET", "bytes=-5")).await;
    assert_eq!(suffix.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&suffix.body[..], &BODY[len - 5..]);
    assert_eq!(
        suffix.headers["content-range"],
        format!("bytes {}-{}/{len}", len - 5, len - 1)
    );

    let open = send(&app.router, ranged("GET", "bytes=5-")).await;
    assert_eq!(open.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&open.body[..], &BODY[5..]);
    assert_eq!(open.x_cache(), "HIT");

    let too_far = send(&app.router, ranged("GET", &format!("bytes={len}-"))).await;
    assert_eq!(too_far.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(too_far.headers["content-range"], format!("bytes */{len}"));
    assert!(too_far.body.is_empty());

    let huge = format!("bytes=0-{}", "9".repeat(100));
    let clamped = send(&app.router, ranged("GET", &huge)).await;
    assert_eq!(clamped.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&clamped.body[..], BODY);
    assert_eq!(app.origin.calls(), 1);
}

#[tokio::test]
async fn several_ranges_or_garbage_get_the_whole_representation() {
    let app = app(None);
    for range in [
        "bytes=0-1,5-6",
        "bytes=9-3",
        "lines=1-2",
        "bytes=x-y",
        "bytes=--1",
    ] {
        let answer = send(&app.router, ranged("GET", range)).await;
        assert_eq!(answer.status, StatusCode::OK, "{range}");
        assert_eq!(&answer.body[..], BODY, "{range}");
        assert!(answer.headers.get("content-range").is_none());
    }
    assert_eq!(app.origin.calls(), 1);
}

#[tokio::test]
async fn head_with_range_is_the_whole_head() {
    // Range is defined for GET only (RFC 9110 §14.2).
    let app = app(None);
    let head = send(&app.router, ranged("HEAD", "bytes=0-3")).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    assert_eq!(head.headers["content-length"], BODY.len().to_string());
    assert!(head.headers.get("content-range").is_none());
    assert_eq!(app.ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn if_range_applies_the_range_only_to_the_same_representation() {
    let app = app(None);
    let with = |validator: &str| {
        Request::get("/file")
            .header("range", "bytes=0-3")
            .header("if-range", validator)
            .body(Body::empty())
            .unwrap()
    };
    let same = send(&app.router, with("\"v1\"")).await;
    assert_eq!(same.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&same.body[..], &BODY[..4]);
    let date = send(&app.router, with("Sun, 06 Nov 1994 08:49:37 GMT")).await;
    assert_eq!(date.status, StatusCode::PARTIAL_CONTENT);
    for other in ["\"v2\"", "W/\"v1\"", "Mon, 07 Nov 1994 08:49:37 GMT"] {
        let answer = send(&app.router, with(other)).await;
        assert_eq!(answer.status, StatusCode::OK, "{other}");
        assert_eq!(&answer.body[..], BODY, "{other}");
    }
    assert_eq!(app.origin.calls(), 1);
    assert_eq!(app.ranged.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_partial_answer_from_the_origin_is_never_the_entry() {
    // An origin (or something in front of it) answering 206 to the whole
    // request: that slice must not become what everyone gets.
    let origin = Origin::default();
    let o = origin.clone();
    let router = Router::new().route(
        "/file",
        get(move || {
            let origin = o.clone();
            async move {
                let (_n, _running) = origin.enter();
                (
                    StatusCode::PARTIAL_CONTENT,
                    [("content-range", "bytes 0-3/36")],
                    &BODY[..4],
                )
                    .into_response()
            }
        })
        .layer(local_guard()),
    );
    let first = send(&router, crate::common::get("/file")).await;
    assert_eq!(first.status, StatusCode::PARTIAL_CONTENT);
    let second = send(&router, ranged("GET", "bytes=0-1")).await;
    assert_ne!(second.x_cache(), "HIT");
    assert_eq!(origin.calls(), 2);
}

#[tokio::test]
async fn ranges_are_not_cut_from_error_entries() {
    let origin = Origin::default();
    let o = origin.clone();
    let router = Router::new().route(
        "/gone",
        get(move || {
            let origin = o.clone();
            async move {
                let (_n, _running) = origin.enter();
                (StatusCode::NOT_FOUND, "no such thing").into_response()
            }
        })
        .layer(local_guard().cacheable_statuses([StatusCode::OK, StatusCode::NOT_FOUND])),
    );
    let request = || {
        Request::get("/gone")
            .header("range", "bytes=0-1")
            .body(Body::empty())
            .unwrap()
    };
    let first = send(&router, request()).await;
    let second = send(&router, request()).await;
    for answer in [&first, &second] {
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.text(), "no such thing");
    }
    assert_eq!(second.x_cache(), "HIT");
}
