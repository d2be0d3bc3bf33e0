//! The hit path reads the request's header names in one pass instead of a
//! lookup per header it cares about. These attacks hide each header that
//! must change the answer behind a browser's worth of others, placed last
//! or in a second line, and check the layer still sees it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use stampede_guard::{Backend, StampedeGuard};
use tower::{Service, ServiceBuilder, ServiceExt};

/// What a browser sends on a plain navigation, none of it changing the key
/// or the answer.
const BROWSER: [(&str, &str); 10] = [
    ("host", "shop.example"),
    ("user-agent", "Mozilla/5.0"),
    ("accept", "text/html"),
    ("accept-language", "en"),
    ("sec-fetch-mode", "navigate"),
    ("sec-fetch-site", "none"),
    ("dnt", "1"),
    ("x-request-id", "abc"),
    ("priority", "u=0, i"),
    ("referer", "https://shop.example/"),
];

type Guarded = Box<
    dyn FnMut(
        Request<Empty<Bytes>>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = (StatusCode, String, usize)> + Send>,
    >,
>;

/// A guarded origin that counts its calls; each call answers with a body of
/// its own (`build N`), 1 KiB long with `Last-Modified` and an `ETag`.
fn app() -> (Guarded, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let service = ServiceBuilder::new()
        .layer(StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60)))
        .service_fn(move |_: Request<Empty<Bytes>>| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let body = format!("build {n:<1018}");
                Ok::<_, Infallible>(
                    Response::builder()
                        .header(header::CONTENT_TYPE, "text/plain")
                        .header(header::ETAG, "\"v1\"")
                        .header(header::LAST_MODIFIED, "Sun, 01 Nov 2026 00:00:00 GMT")
                        .body(Full::new(Bytes::from(body)))
                        .expect("valid response"),
                )
            }
        });
    let call: Guarded = Box::new(move |request| {
        let mut service = service.clone();
        Box::pin(async move {
            let response = service
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("infallible");
            let status = response.status();
            let cache = response
                .headers()
                .get("x-cache")
                .map(|v| v.to_str().unwrap_or("?").to_owned())
                .unwrap_or_default();
            let len = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes()
                .len();
            (status, cache, len)
        })
    });
    (call, calls)
}

fn request(extra: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut builder = Request::get("/page?id=7");
    for (name, value) in BROWSER.iter().chain(extra) {
        builder = builder.header(*name, *value);
    }
    builder.body(Empty::new()).expect("valid request")
}

#[tokio::test]
async fn a_browsers_headers_share_the_entry() {
    let (mut call, calls) = app();
    assert_eq!(call(request(&[])).await.1, "MISS");
    for _ in 0..3 {
        let (status, cache, len) = call(request(&[])).await;
        assert_eq!((status, cache.as_str(), len), (StatusCode::OK, "HIT", 1024));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn each_bypassing_header_is_seen_behind_the_others() {
    for extra in [
        [("authorization", "Bearer x")].as_slice(),
        &[("cookie", "a=1")],
        &[("proxy-authorization", "Basic eA==")],
        &[
            ("upgrade", "websocket"),
            ("connection", "keep-alive, Upgrade"),
        ],
    ] {
        let (mut call, calls) = app();
        call(request(&[])).await;
        let (_, cache, _) = call(request(extra)).await;
        assert_eq!(cache, "BYPASS", "{extra:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "{extra:?} reached the origin"
        );
    }
}

/// A body announced behind the others is seen: its content is discarded,
/// and the request is taken as the plain GET the handler then sees (on a
/// cold key, its answer is stored for the plain GETs after it).
#[tokio::test]
async fn a_body_announced_behind_the_others_is_seen() {
    for extra in [
        [("transfer-encoding", "chunked")].as_slice(),
        &[("content-length", "0"), ("content-length", "5")],
    ] {
        let (mut call, calls) = app();
        let (_, cache, _) = call(request(extra)).await;
        assert_eq!(cache, "MISS", "{extra:?}");
        assert_eq!(call(request(&[])).await.1, "HIT", "{extra:?}");
        let (_, cache, _) = call(request(extra)).await;
        assert_eq!(cache, "HIT", "{extra:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{extra:?}");
    }
}

#[tokio::test]
async fn harmless_values_of_those_headers_still_hit() {
    for extra in [
        [("content-length", "0")].as_slice(),
        &[
            ("cache-control", "max-age=0"),
            ("cache-control", "no-cache"),
        ],
        // A request's directives are not followed by default.
        &[
            ("cache-control", "max-age=0"),
            ("cache-control", "no-store"),
        ],
        &[("pragma", "no-cache")],
    ] {
        let (mut call, calls) = app();
        call(request(&[])).await;
        assert_eq!(call(request(extra)).await.1, "HIT", "{extra:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{extra:?}");
    }
}

#[tokio::test]
async fn a_forwarding_header_last_still_splits_the_entry() {
    for extra in [
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-port", "8443"),
        ("x-forwarded-prefix", "/evil"),
        ("forwarded", "host=evil.example"),
    ] {
        let (mut call, calls) = app();
        call(request(&[])).await;
        assert_eq!(call(request(&[extra])).await.1, "MISS", "{extra:?}");
        assert_eq!(call(request(&[extra])).await.1, "HIT", "{extra:?}");
        assert_eq!(call(request(&[])).await.1, "HIT", "{extra:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{extra:?}");
    }
}

#[tokio::test]
async fn conditions_and_ranges_behind_the_others_are_answered() {
    let (mut call, calls) = app();
    call(request(&[])).await;
    let (status, cache, len) = call(request(&[("if-none-match", "\"v1\"")])).await;
    assert_eq!(
        (status, cache.as_str(), len),
        (StatusCode::NOT_MODIFIED, "HIT", 0)
    );
    let since = ("if-modified-since", "Mon, 02 Nov 2026 00:00:00 GMT");
    assert_eq!(call(request(&[since])).await.0, StatusCode::NOT_MODIFIED);
    let (status, _, len) = call(request(&[("range", "bytes=0-9")])).await;
    assert_eq!((status, len), (StatusCode::PARTIAL_CONTENT, 10));
    // If-Range without Range asks for nothing less than the whole entry.
    let (status, _, len) = call(request(&[("if-range", "\"v1\"")])).await;
    assert_eq!((status, len), (StatusCode::OK, 1024));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn host_case_does_not_split_and_a_lone_pair_keeps_its_bytes() {
    let (mut call, calls) = app();
    call(request(&[])).await;
    let upper = Request::get("/page?id=7")
        .header("host", "SHOP.Example")
        .body(Empty::new())
        .expect("valid request");
    assert_eq!(call(upper).await.1, "HIT");
    let other = Request::get("/page?id=8")
        .header("host", "shop.example")
        .body(Empty::new())
        .expect("valid request");
    assert_eq!(call(other).await.1, "MISS");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
