//! The key is what the client asked for, exactly as the handler sees it:
//! attacks that try to store one request's answer for another (absolute-form
//! targets, HTTP/2 authorities, nested routers, query order, forwarding
//! headers, GET bodies), against real axum apps served by hyper.

use std::net::SocketAddr;

use crate::common::server::serve;
use crate::common::{get as get_req, local_guard, send, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{HOST, LOCATION};
use http::{HeaderMap, HeaderName, Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use stampede_guard::StampedeGuard;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The host a framework would build links from: `X-Forwarded-Host`, then
/// `Host`, then the URI's authority (what axum-extra's `Host` does).
fn seen_host(headers: &HeaderMap, uri: &Uri) -> String {
    headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(HOST))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .unwrap_or_default()
}

/// A permanent redirect built from the request's host and scheme: cacheable,
/// and an open redirect if stored under another host's key.
fn redirect_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    let handler = move |headers: HeaderMap, uri: Uri| {
        let origin = origin.clone();
        async move {
            origin.enter();
            let proto = headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("https");
            let host = seen_host(&headers, &uri);
            let location = format!("{proto}://{host}/new");
            (StatusCode::MOVED_PERMANENTLY, [(LOCATION, location)]).into_response()
        }
    };
    Router::new()
        .route("/old", get(handler.clone()).post(handler))
        .layer(guard)
}

/// Status, headers (lowercase names) and the rest, of one request written by
/// hand on its own connection.
async fn raw(addr: SocketAddr, request: &str) -> (u16, Vec<(String, String)>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

async fn get_raw(addr: SocketAddr, target: &str, host: &str) -> (u16, Vec<(String, String)>) {
    let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    raw(addr, &request).await
}

#[tokio::test]
async fn absolute_form_target_overrides_host_for_key_and_handler() {
    let origin = Origin::default();
    let addr = serve(redirect_app(&origin, local_guard())).await;

    // The attacker names the victim in the target and itself in Host.
    let (status, h) = get_raw(addr, "http://victim.test/old", "evil.test").await;
    assert_eq!(status, 301);
    assert_eq!(header(&h, "x-cache"), "MISS");
    assert_eq!(header(&h, "location"), "https://victim.test/new");

    // The same target under any other Host is answered from that entry:
    // the key is the target's host.
    let (_, h) = get_raw(addr, "http://victim.test/old", "other.test").await;
    assert_eq!(header(&h, "x-cache"), "HIT");
    assert_eq!(header(&h, "location"), "https://victim.test/new");

    // The victim's plain request names no scheme: another variant of the
    // URL (RFC 9111 §4), answered correctly.
    let (_, h) = get_raw(addr, "/old", "victim.test").await;
    assert_eq!(header(&h, "location"), "https://victim.test/new");

    // The attacker's own host has its own entry.
    let (_, h) = get_raw(addr, "/old", "evil.test").await;
    assert_eq!(header(&h, "x-cache"), "MISS");
    assert_eq!(header(&h, "location"), "https://evil.test/new");
    assert_eq!(origin.calls(), 3);

    // Passed through (POST), the handler sees the target's host too.
    let request = "POST http://victim.test/old HTTP/1.1\r\nHost: evil.test\r\n\
                   Content-Length: 0\r\nConnection: close\r\n\r\n";
    let (_, h) = raw(addr, request).await;
    assert_eq!(header(&h, "x-cache"), "BYPASS");
    assert_eq!(header(&h, "location"), "https://victim.test/new");
}

#[tokio::test]
async fn absolute_form_target_with_userinfo_and_case_keys_on_the_host() {
    let origin = Origin::default();
    let addr = serve(redirect_app(&origin, local_guard())).await;
    let (_, h) = get_raw(addr, "http://evil@Victim.test:8080/old", "evil.test").await;
    assert_eq!(header(&h, "location"), "https://Victim.test:8080/new");
    // Same scheme and host, without userinfo, in another case: one entry.
    let (_, h) = get_raw(addr, "http://victim.test:8080/old", "evil.test").await;
    assert_eq!(header(&h, "x-cache"), "HIT");
    assert_eq!(origin.calls(), 1);
}

/// Several `Host` lines make a request malformed (RFC 9112 §3.2): refused
/// with a `400`, before the handler or the cache sees it.
#[tokio::test]
async fn two_host_lines_are_refused() {
    let origin = Origin::default();
    let app = redirect_app(&origin, local_guard());
    for hosts in [["victim.test", "evil.test"], ["victim.test", "victim.test"]] {
        let request = Request::get("/old")
            .header(HOST, hosts[0])
            .header(HOST, hosts[1])
            .body(Body::empty())
            .unwrap();
        let answer = send(&app, request).await;
        assert_eq!(answer.status, http::StatusCode::BAD_REQUEST, "{hosts:?}");
        assert_eq!(answer.x_cache(), "BYPASS", "{hosts:?}");
    }
    assert_eq!(origin.calls(), 0);
    // Nothing was stored for either host.
    let a = send(
        &app,
        Request::get("/old")
            .header(HOST, "victim.test")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(a.x_cache(), "MISS");
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn http2_authority_overrides_host_for_key_and_handler() {
    let origin = Origin::default();
    let addr = serve(redirect_app(&origin, local_guard())).await;
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let request = Request::get("http://victim.test/old")
        .header(HOST, "evil.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.expect("h2 response");
    assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(response.headers()[LOCATION], "https://victim.test/new");

    // Over HTTP/1, the same target (scheme and host) shares the entry, and
    // it is the right one.
    let (_, h) = get_raw(addr, "http://victim.test/old", "evil.test").await;
    assert_eq!(header(&h, "x-cache"), "HIT");
    assert_eq!(header(&h, "location"), "https://victim.test/new");
    assert_eq!(origin.calls(), 1);
}

#[cfg(feature = "axum")]
mod nested {
    use super::*;
    use axum::extract::OriginalUri;

    /// The same handler nested under two prefixes; its answer names the
    /// prefix the client used.
    fn versioned(origin: &Origin, guard: StampedeGuard, guard_on_router: bool) -> Router {
        let origin = origin.clone();
        let items = get(move |OriginalUri(uri): OriginalUri| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                format!("{} #{n}", uri.path())
            }
        });
        let inner = if guard_on_router {
            Router::new().route("/items", items).layer(guard)
        } else {
            Router::new().route("/items", items.layer(guard))
        };
        Router::new().nest("/v1", inner.clone()).nest("/v2", inner)
    }

    #[tokio::test]
    async fn nested_prefixes_have_their_own_entries_and_invalidate_by_full_url() {
        for guard_on_router in [false, true] {
            let origin = Origin::default();
            let guard = local_guard();
            let app = versioned(&origin, guard.clone(), guard_on_router);
            let v1 = send(&app, get_req("/v1/items")).await;
            let v2 = send(&app, get_req("/v2/items")).await;
            assert_eq!((v1.text(), v1.x_cache()), ("/v1/items #1".into(), "MISS"));
            assert_eq!((v2.text(), v2.x_cache()), ("/v2/items #2".into(), "MISS"));
            let again = send(&app, get_req("/v2/items")).await;
            assert_eq!(
                (again.text(), again.x_cache()),
                ("/v2/items #2".into(), "HIT")
            );

            // The full URL reaches the entry, wherever the guard sits.
            guard
                .invalidate(&get_req("/v1/items"))
                .await
                .expect("local");
            let v1 = send(&app, get_req("/v1/items")).await;
            assert_eq!((v1.text(), v1.x_cache()), ("/v1/items #3".into(), "MISS"));
            let v2 = send(&app, get_req("/v2/items")).await;
            assert_eq!(v2.x_cache(), "HIT", "only /v1 was invalidated");
            assert_eq!(origin.calls(), 3);
        }
    }
}

/// Echoes the raw query, numbered.
fn query_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/r",
        get(move |uri: Uri| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                format!("{} #{n}", uri.query().unwrap_or(""))
            }
        })
        .layer(guard),
    )
}

#[tokio::test]
async fn repeated_query_names_in_another_order_are_another_url() {
    let origin = Origin::default();
    let app = query_app(&origin, local_guard());
    let a = send(&app, get_req("/r?sort=price&sort=name")).await;
    let b = send(&app, get_req("/r?sort=name&sort=price")).await;
    assert_eq!(a.text(), "sort=price&sort=name #1");
    assert_eq!(
        (b.text(), b.x_cache()),
        ("sort=name&sort=price #2".into(), "MISS")
    );
    // Distinct names still share an entry whatever their order.
    let c = send(&app, get_req("/r?page=2&sort=name&sort=price")).await;
    let d = send(&app, get_req("/r?sort=name&page=2&sort=price")).await;
    assert_eq!(c.x_cache(), "MISS");
    assert_eq!((d.text(), d.x_cache()), (c.text(), "HIT"));
    // Encodings are not folded: %61 is not a.
    let e = send(&app, get_req("/r?page=%32&sort=name&sort=price")).await;
    assert_eq!(e.x_cache(), "MISS");
    // A name spelled another way is still the same list to a decoder.
    let f = send(&app, get_req("/r?%73ort=price&sort=name")).await;
    let g = send(&app, get_req("/r?sort=name&%73ort=price")).await;
    assert_eq!((f.x_cache(), g.x_cache()), ("MISS", "MISS"));
    let h = send(&app, get_req("/r?SORT=price&sort=name")).await;
    let i = send(&app, get_req("/r?sort=name&SORT=price")).await;
    assert_eq!((h.x_cache(), i.x_cache()), ("MISS", "MISS"));
    assert_eq!(origin.calls(), 8);
}

fn with_headers(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get(uri).header(HOST, "victim.test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn forwarding_headers_from_a_client_never_reach_another_client() {
    let origin = Origin::default();
    let app = redirect_app(&origin, local_guard());
    let forged = send(
        &app,
        with_headers("/old", &[("x-forwarded-host", "evil.test")]),
    )
    .await;
    assert_eq!(forged.headers[LOCATION], "https://evil.test/new");
    let looped = send(&app, with_headers("/old", &[("x-forwarded-proto", "http")])).await;
    assert_eq!(looped.headers[LOCATION], "http://victim.test/new");
    for forwarded in [
        "host=evil.test",
        "proto=http",
        "for=192.0.2.1, host=evil.test",
    ] {
        let a = send(&app, with_headers("/old", &[("forwarded", forwarded)])).await;
        assert_eq!(a.x_cache(), "MISS", "{forwarded}");
    }
    let plain = send(&app, with_headers("/old", &[])).await;
    assert_eq!(plain.x_cache(), "MISS");
    assert_eq!(plain.headers[LOCATION], "https://victim.test/new");
    assert_eq!(origin.calls(), 6);

    // `for=` names the client: it splits nothing.
    let one = send(
        &app,
        with_headers("/old", &[("forwarded", "for=192.0.2.1;proto=https")]),
    )
    .await;
    let two = send(
        &app,
        with_headers(
            "/old",
            &[("forwarded", "for=\"[2001:db8::1]\";proto=https")],
        ),
    )
    .await;
    assert_eq!((one.x_cache(), two.x_cache()), ("MISS", "HIT"));
    assert_eq!(origin.calls(), 7);
}

#[tokio::test]
async fn a_deployment_that_strips_forwarding_headers_can_say_so() {
    let origin = Origin::default();
    let proto = HeaderName::from_static("x-forwarded-proto");
    let app = redirect_app(&origin, local_guard().forwarded_headers([proto]));
    let a = send(&app, with_headers("/old", &[("x-forwarded-prefix", "/a")])).await;
    let b = send(&app, with_headers("/old", &[("x-forwarded-prefix", "/b")])).await;
    assert_eq!((a.x_cache(), b.x_cache()), ("MISS", "HIT"));
    // The one it keeps is still keyed.
    let c = send(&app, with_headers("/old", &[("x-forwarded-proto", "http")])).await;
    assert_eq!(c.x_cache(), "MISS");
    assert_eq!(origin.calls(), 2);
}

/// Answers with what the request's body said, numbered.
fn body_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/r",
        get(move |body: String| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                format!("body={body} #{n}")
            }
        })
        .layer(guard),
    )
}

/// A GET or HEAD with a body: its content is discarded before the handler
/// (which reads it here), so no answer a body shaped exists to be stored;
/// the request is taken as the plain GET the handler sees.
#[tokio::test]
async fn get_with_a_body_never_reaches_the_handler_and_costs_a_plain_get() {
    let origin = Origin::default();
    let app = body_app(&origin, local_guard());
    let with_body = || {
        Request::get("/r")
            .header("content-length", "4")
            .body(Body::from("evil"))
            .unwrap()
    };
    let mut seen = Vec::new();
    for _ in 1..=2 {
        let a = send(&app, with_body()).await;
        seen.push((a.text(), a.x_cache().to_owned()));
    }
    assert_eq!(
        seen,
        [
            ("body= #1".to_owned(), "MISS".to_owned()),
            ("body= #1".to_owned(), "HIT".to_owned())
        ]
    );
    let head = Request::head("/r")
        .header("transfer-encoding", "chunked")
        .body(Body::from("evil"))
        .unwrap();
    assert_eq!(send(&app, head).await.x_cache(), "HIT");
    let plain = send(&app, get_req("/r")).await;
    assert_eq!((plain.text(), plain.x_cache()), ("body= #1".into(), "HIT"));
    // An explicit empty body is no body.
    let zero = Request::get("/r")
        .header("content-length", "0")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, zero).await.x_cache(), "HIT");
    assert_eq!(origin.calls(), 1);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn http2_get_with_data_frames_and_no_length_never_reaches_the_handler() {
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    let origin = Origin::default();
    let addr = serve(body_app(&origin, local_guard())).await;
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    for state in ["MISS", "HIT"] {
        // A stream of unknown length: no Content-Length is sent.
        let frames = tokio_stream::once(Ok::<_, std::convert::Infallible>(Frame::data(
            bytes::Bytes::from_static(b"evil"),
        )));
        let request = Request::get("http://a.test/r")
            .body(StreamBody::new(frames))
            .unwrap();
        let response = sender.send_request(request).await.expect("h2 response");
        assert_eq!(response.headers()["x-cache"], state);
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(body, "body= #1", "the handler saw the body");
    }
    assert_eq!(origin.calls(), 1);
    // A body without any length header, handed over in process, too.
    let app = body_app(&origin, local_guard());
    let unannounced = Request::get("/r").body(Body::from("evil")).unwrap();
    let a = send(&app, unannounced).await;
    assert_eq!((a.text(), a.x_cache()), ("body= #2".to_owned(), "MISS"));
}

#[tokio::test]
async fn chunked_get_over_the_wire_is_taken_as_a_plain_get() {
    let origin = Origin::default();
    let addr = serve(body_app(&origin, local_guard())).await;
    let request = "GET /r HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\
                   Connection: close\r\n\r\n4\r\nevil\r\n0\r\n\r\n";
    let (status, h) = raw(addr, request).await;
    assert_eq!((status, header(&h, "x-cache")), (200, "MISS"));
    let (_, h) = get_raw(addr, "/r", "a.test").await;
    assert_eq!(header(&h, "x-cache"), "HIT");
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn invalid_requests_from_the_network_never_panic() {
    let origin = Origin::default();
    let addr = serve(redirect_app(&origin, local_guard())).await;
    for request in [
        "GET http://[::1/old HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /old HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\nConnection: close\r\n\r\n",
        "GET /old?a=%ZZ&&&=&a HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip;q=9.99999, *;q=\r\nForwarded: for=\"\\\"\r\nConnection: close\r\n\r\n",
    ] {
        let (status, _) = raw(addr, request).await;
        assert!(status == 301 || status == 400, "{request:?}: {status}");
    }
    // The server still answers.
    let (status, _) = get_raw(addr, "/old", "a").await;
    assert_eq!(status, 301);
}
