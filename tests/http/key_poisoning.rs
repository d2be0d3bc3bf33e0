//! Attacks on the cache key: requests a handler sees differently must never
//! share an entry (scheme of an absolute-form target, query names a parser
//! decodes alike, hosts and authorities, forwarding headers, codings), and
//! the bypasses that keep one client's request out of the others' answers.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::common::server::serve;
use crate::common::{get as get_req, local_guard, send, Origin};
use axum::body::Body;
use axum::extract::Query;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, HOST, LOCATION};
use http::{HeaderMap, Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use stampede_guard::StampedeGuard;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_http::compression::CompressionLayer;

/// One hand-written request on its own connection: status and headers
/// (lowercase names).
async fn raw(addr: SocketAddr, request: &str) -> (u16, HashMap<String, String>) {
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

async fn get_raw(addr: SocketAddr, target: &str, host: &str) -> (u16, HashMap<String, String>) {
    let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    raw(addr, &request).await
}

/// A cacheable redirect to the request's own scheme and host, as a handler
/// that reads the URI it was given builds it (`https` when the target names
/// no scheme: the deployment's default).
fn self_redirect_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    let handler = move |headers: HeaderMap, uri: Uri| {
        let origin = origin.clone();
        async move {
            origin.enter();
            let scheme = uri.scheme_str().unwrap_or("https").to_owned();
            let host = headers
                .get(HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let location = format!("{scheme}://{host}/new");
            (StatusCode::MOVED_PERMANENTLY, [(LOCATION, location)]).into_response()
        }
    };
    Router::new().route("/old", get(handler).layer(guard))
}

/// RFC 9111 §4: the primary key is the target URI, and `http://h/x` and
/// `https://h/x` are two URIs. An attacker's absolute-form `http://` target
/// must not store a downgrade redirect for the victim's `https` request.
#[tokio::test]
async fn the_scheme_of_an_absolute_form_target_is_part_of_the_key() {
    let origin = Origin::default();
    let addr = serve(self_redirect_app(&origin, local_guard())).await;
    let (status, h) = get_raw(addr, "http://victim.test/old", "victim.test").await;
    assert_eq!(status, 301);
    assert_eq!(h["location"], "http://victim.test/new");

    let (_, h) = get_raw(addr, "https://victim.test/old", "victim.test").await;
    assert_eq!(
        h["location"], "https://victim.test/new",
        "an https target was answered with the http target's entry ({})",
        h["x-cache"]
    );
}

/// The victim's origin-form request (which the handler sees without a
/// scheme, and answers for its https deployment) is not answered with the
/// entry an attacker's `http://` absolute-form target stored.
#[tokio::test]
async fn an_absolute_form_http_target_never_answers_an_origin_form_request() {
    let origin = Origin::default();
    let addr = serve(self_redirect_app(&origin, local_guard())).await;
    let (_, h) = get_raw(addr, "http://victim.test/old", "victim.test").await;
    assert_eq!(h["location"], "http://victim.test/new");
    let (_, h) = get_raw(addr, "/old", "victim.test").await;
    assert_eq!(
        h["location"], "https://victim.test/new",
        "an origin-form request was answered with an absolute-form target's entry ({})",
        h["x-cache"]
    );
}

/// The handler reads the query with axum's `Query`, which decodes names
/// (lossily: every invalid UTF-8 byte becomes U+FFFD) and keeps the last of
/// a repeated name. `?%FF=a&%FE=b` and `?%FE=b&%FF=a` are then two lists of
/// one name in two orders, which the key must not merge.
#[tokio::test]
async fn names_a_parser_decodes_alike_keep_their_order() {
    let origin = Origin::default();
    let o = origin.clone();
    let handler = move |Query(q): Query<HashMap<String, String>>| {
        let origin = o.clone();
        async move {
            origin.enter();
            q.get("\u{FFFD}").cloned().unwrap_or_default()
        }
    };
    let app = Router::new().route("/q", get(handler).layer(local_guard()));
    let first = send(&app, get_req("/q?%FF=evil&%FE=good")).await;
    assert_eq!(first.text(), "good");
    let second = send(&app, get_req("/q?%FE=good&%FF=evil")).await;
    assert_eq!(
        second.text(),
        "evil",
        "another URL was answered from the first one's entry ({})",
        second.x_cache()
    );
}

/// Names the key's own normalisation compares alike (case, `%xx`, `+`) keep
/// their order; different names may be sorted, and values are never touched.
/// A route that answers the query's pairs in order, as axum's `Query`
/// decodes them.
fn pairs_app(origin: &Origin, guard: Option<StampedeGuard>) -> Router {
    let o = origin.clone();
    let handler = move |Query(pairs): Query<Vec<(String, String)>>| {
        let origin = o.clone();
        async move {
            origin.enter();
            format!("{pairs:?}")
        }
    };
    match guard {
        Some(guard) => Router::new().route("/q", get(handler).layer(guard)),
        None => Router::new().route("/q", get(handler)),
    }
}

/// Names the key's own normalisation compares alike (case, `%xx`, `+`) keep
/// their order; different names may be sorted, and values are never touched.
#[tokio::test]
async fn query_normalisation_never_merges_what_the_handler_reads_apart() {
    let origin = Origin::default();
    let app = pairs_app(&origin, Some(local_guard()));
    let plain = pairs_app(&origin, None);
    let urls = [
        "/q?a=1&A=2",
        "/q?A=2&a=1",
        "/q?a+b=1&a%20b=2",
        "/q?a%20b=2&a+b=1",
        "/q?%61=1&a=2",
        "/q?a=2&%61=1",
        "/q?x=%41",
        "/q?x=A",
        "/q?x=1;y=2",
        "/q?y=2;x=1",
        "/q?x=1%26y=2",
        "/q?x=1&y=2",
    ];
    for url in urls {
        let want = send(&plain, get_req(url)).await.text();
        let got = send(&app, get_req(url)).await;
        assert_eq!(
            got.text(),
            want,
            "{url} answered from another URL's entry ({})",
            got.x_cache()
        );
    }
}

/// Absolute-form targets (with userinfo, a port, another case) and HTTP/2
/// authorities name the host the handler sees and the key uses.
#[tokio::test]
async fn authorities_and_host_headers_never_cross() {
    let origin = Origin::default();
    let addr = serve(self_redirect_app(&origin, local_guard())).await;
    // The attacker's Host is ignored for an absolute-form target.
    let (_, h) = raw(
        addr,
        "GET https://evil@victim.test/old HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(h["location"], "https://victim.test/new");
    // Another port is another host.
    let (_, h) = get_raw(addr, "https://victim.test:8443/old", "victim.test").await;
    assert_eq!(h["location"], "https://victim.test:8443/new");
    let (_, h) = get_raw(addr, "/old", "evil.test").await;
    assert_eq!(h["location"], "https://evil.test/new");
    let (_, h) = get_raw(addr, "/old", "victim.test:8443").await;
    assert_eq!(h["location"], "https://victim.test:8443/new");

    // HTTP/2: :authority wins over a Host header the attacker adds.
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2");
    tokio::spawn(conn);
    let request = Request::get("https://other.test/old")
        .header(HOST, "evil.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.expect("h2 response");
    assert_eq!(response.headers()[LOCATION], "https://other.test/new");
    let (_, h) = get_raw(addr, "/old", "evil.test").await;
    assert_eq!(h["location"], "https://evil.test/new");
}

/// Forwarding headers a client forges (in every spelling: repeated lines,
/// `Forwarded` host in another element or case) never reach another client.
#[tokio::test]
async fn forged_forwarding_headers_never_reach_another_client() {
    let origin = Origin::default();
    let o = origin.clone();
    let handler = move |headers: HeaderMap| {
        let origin = o.clone();
        async move {
            origin.enter();
            let mut seen = Vec::new();
            for name in [
                "x-forwarded-host",
                "x-forwarded-proto",
                "x-forwarded-port",
                "x-forwarded-prefix",
                "forwarded",
            ] {
                for v in headers.get_all(name) {
                    seen.push(format!("{name}={}", v.to_str().unwrap_or("?")));
                }
            }
            seen.join("|")
        }
    };
    let app = Router::new().route("/f", get(handler).layer(local_guard()));
    let forged: [&[(&str, &str)]; 10] = [
        &[("x-forwarded-host", "evil.test")],
        &[
            ("x-forwarded-host", "victim.test"),
            ("x-forwarded-host", "evil.test"),
        ],
        &[("x-forwarded-proto", "http")],
        &[("x-forwarded-port", "1")],
        &[("x-forwarded-prefix", "/evil")],
        &[("forwarded", "host=evil.test")],
        &[("forwarded", "for=1.2.3.4, host=evil.test")],
        &[("forwarded", "for=1.2.3.4;Host=evil.test")],
        &[("forwarded", "for=\"x;host=evil.test\"")],
        &[("forwarded", "proto=http;for=5.6.7.8")],
    ];
    // The clean answer first, then each forged one, then the clean one again.
    assert_eq!(send(&app, get_req("/f")).await.text(), "");
    for headers in forged {
        let mut request = Request::get("/f");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let answer = send(&app, request.body(Body::empty()).unwrap()).await;
        assert_ne!(
            answer.text(),
            "",
            "{headers:?} was answered with the clean entry"
        );
        let clean = send(&app, get_req("/f")).await;
        assert_eq!(clean.text(), "", "{headers:?} reached a clean request");
        assert_eq!(clean.x_cache(), "HIT");
    }
}

/// Whether a client sending `ae` accepts `coding` (RFC 9110 §12.5.3), for
/// the unambiguous values the test uses.
fn accepts(ae: Option<&str>, coding: &str) -> bool {
    let Some(ae) = ae else { return true };
    let mut star = None;
    for item in ae.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, q) = match item.split_once(';') {
            Some((n, p)) => {
                let p = p.trim().to_ascii_lowercase();
                let q: f32 = p
                    .strip_prefix("q=")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
                (n.trim(), q)
            }
            None => (item, 1.0),
        };
        let name = name.to_ascii_lowercase();
        let name = if name == "x-gzip" {
            "gzip".to_owned()
        } else {
            name
        };
        if name == coding {
            return q > 0.0;
        }
        if name == "*" {
            star = Some(q > 0.0);
        }
    }
    star.unwrap_or(false)
}

/// Behind the guard, tower-http's compression picks a coding per request;
/// whatever a first client sends, a second one never receives a coding it
/// did not accept.
#[tokio::test]
async fn a_coding_never_reaches_a_client_that_did_not_accept_it() {
    let values: [Option<&str>; 18] = [
        None,
        Some(""),
        Some("identity"),
        Some("gzip"),
        Some("GZIP"),
        Some("gzip;q=0"),
        Some("gzip; q=0"),
        Some("gzip;Q=0.000"),
        Some("gzip ;q=0.001"),
        Some("x-gzip"),
        Some("br"),
        Some("br;q=0.5, gzip;q=0.5"),
        Some("gzip, br;q=0"),
        Some("zstd"),
        Some("deflate"),
        Some("*"),
        Some("*;q=0, identity"),
        Some("gzip br"),
    ];
    let text = "an expensive, very compressible answer; ".repeat(60);
    let mut coded = 0;
    for guard_outside in [false, true] {
        for first in values {
            for second in values {
                let origin = Origin::default();
                let o = origin.clone();
                let t = text.clone();
                let route = get(move || {
                    let origin = o.clone();
                    let t = t.clone();
                    async move {
                        origin.enter();
                        t
                    }
                });
                // Guard outside compression: it sees and stores codings.
                // Guard inside: it stores one identity copy.
                let app = if guard_outside {
                    Router::new()
                        .route("/c", route)
                        .layer(CompressionLayer::new())
                        .layer(local_guard())
                } else {
                    Router::new()
                        .route("/c", route)
                        .layer(local_guard())
                        .layer(CompressionLayer::new())
                };
                let request = |ae: Option<&str>| {
                    let mut r = Request::get("/c");
                    if let Some(ae) = ae {
                        r = r.header(ACCEPT_ENCODING, ae);
                    }
                    r.body(Body::empty()).unwrap()
                };
                // Twice: the first teaches the route, the second is stored.
                send(&app, request(first)).await;
                send(&app, request(first)).await;
                let answer = send(&app, request(second)).await;
                if answer.status == StatusCode::NOT_ACCEPTABLE {
                    continue;
                }
                let coding = answer
                    .headers
                    .get(CONTENT_ENCODING)
                    .map(|v| v.to_str().unwrap().to_owned());
                if let Some(coding) = coding {
                    coded += 1;
                    assert!(
                        accepts(second, &coding),
                        "{coding} reached {second:?} after {first:?} ({}, guard outside compression: {guard_outside})",
                        answer.x_cache()
                    );
                } else {
                    assert_eq!(answer.text(), text, "{second:?} after {first:?}");
                }
            }
        }
    }
    assert!(coded > 100, "the compression layer compressed ({coded})");
}
