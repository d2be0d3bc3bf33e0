//! Requests an attacker shapes so that one client's answer reaches another,
//! or a precondition is answered wrongly: query spellings an origin reads
//! alike, header-name spellings of the rewrite class, `Vary` and
//! `Content-Encoding` in unusual forms, per-client fields in a `304`,
//! `HEAD` before `GET`, HTTP/1.0 without `Host`, method overrides on writes.
//! Each counts origin calls and compares bodies; most run on both backends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use http::request::Parts;
use http::{Method, Request, StatusCode};
use stampede_guard::StampedeGuard;

use crate::common::backends::Backends;
use crate::common::{request_with, send};

/// Counts the handler's calls.
#[derive(Clone, Default)]
struct Calls(Arc<AtomicUsize>);

impl Calls {
    fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// `/report` (any method) behind `guard`, answered by `answer` from the
/// call's number (from 1) and the request's head as the handler sees it.
fn app<F>(calls: &Calls, guard: StampedeGuard, answer: F) -> Router
where
    F: Fn(usize, &Parts) -> Response + Clone + Send + Sync + 'static,
{
    let calls = calls.clone();
    let handler = move |request: Request<Body>| {
        let calls = calls.clone();
        let answer = answer.clone();
        async move {
            let (parts, _) = request.into_parts();
            answer(calls.next(), &parts)
        }
    };
    Router::new().route("/report", any(handler).layer(guard))
}

fn respond(body: String, headers: &[(&str, &str)]) -> Response {
    let mut r = Response::builder().status(StatusCode::OK);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::from(body)).unwrap()
}

fn get(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    request_with(Method::GET, uri, headers)
}

use crate::common::server::serve;
use crate::review_attacks::raw;

fn query(parts: &Parts) -> &str {
    parts.uri.query().unwrap_or("")
}

// ---------------------------------------------------------------------------
// Two services, one backend
// ---------------------------------------------------------------------------

/// Two services in one process share a backend with default settings. An
/// HTTP/1.0 request carries no `Host` (none is required): each service's
/// answer to it is its own, never the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_without_host_never_crosses_two_services_on_one_backend() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let (a, b) = (Calls::default(), Calls::default());
        let ttl = Duration::from_secs(60);
        let service_a = app(&a, StampedeGuard::new(backend.clone()).ttl(ttl), |n, _| {
            respond(format!("service-a-{n}"), &[])
        });
        let service_b = app(&b, StampedeGuard::new(backend.clone()).ttl(ttl), |n, _| {
            respond(format!("service-b-{n}"), &[])
        });
        let (addr_a, addr_b) = (serve(service_a).await, serve(service_b).await);
        for (i, req) in [
            "GET /report?h10 HTTP/1.0\r\n\r\n",
            // An empty `Host`, as RFC 9112 §3.2 has a client send when the
            // target has no authority.
            "GET /report?h11 HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
        ]
        .into_iter()
        .enumerate()
        {
            let (status, body) = raw(addr_a, req).await;
            assert_eq!(status, 200, "{kind}");
            assert!(body.contains("service-a-"), "{kind}: {body}");
            let (status, body) = raw(addr_b, req).await;
            if status != 200 || !body.contains("service-b-") {
                failures.push(format!(
                    "{kind} case {i}: service B answered {status} `{body}`"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// An absolute-form target names another host than `Host`: the handler
/// sees the target's host, and a later origin-form request for the `Host`
/// host gets its own answer, not the one built for the target's host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_with_another_host_never_answers_the_host_header() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let addr = serve(app(&calls, guard, |n, parts| {
            let host = parts
                .headers
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none");
            respond(format!("{host}-{n}"), &[])
        }))
        .await;
        let (_, body) = raw(
            addr,
            "GET http://evil.test/report?abs HTTP/1.1\r\nHost: good.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(body.contains("evil.test-1"), "{kind}: {body}");
        let (_, body) = raw(
            addr,
            "GET /report?abs HTTP/1.1\r\nHost: good.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            body.contains("good.test-"),
            "{kind}: Host good.test answered with evil.test's entry: {body}"
        );
    }
}

// ---------------------------------------------------------------------------
// Query spellings
// ---------------------------------------------------------------------------

/// The last value of `a` to a form decoder that folds ASCII case.
fn form_last(query: &str) -> String {
    let mut value = String::from("none");
    for pair in query.split('&') {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(n).eq_ignore_ascii_case("a") {
            value = v.to_owned();
        }
    }
    value
}

/// Form decoding of a name: `+` is a space, `%XX` its byte.
fn form_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(x) => {
                    out.push(x);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `name` as a PHP origin reads the query: pairs split at `&`,
/// `.`, ` ` and `[` in a name read as `_`, the last pair of a name wins.
fn php_value(query: &str, name: &str) -> String {
    let mut value = String::from("none");
    for pair in query.split('&') {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n = form_decode(n);
        let n: String = n
            .trim_start_matches(' ')
            .chars()
            .map(|c| if matches!(c, '.' | ' ' | '[') { '_' } else { c })
            .collect();
        if n == name {
            value = v.to_owned();
        }
    }
    value
}

/// The value of `name` as an origin that splits pairs at `&` and `;`
/// reads it (older Python `parse_qs`, Perl `CGI.pm`), the last one winning.
fn semicolon_value(query: &str, name: &str) -> String {
    let mut value = String::from("none");
    for pair in query.split(['&', ';']) {
        match pair.split_once('=') {
            Some((n, v)) if n == name => value = v.to_owned(),
            _ => {}
        }
    }
    value
}

/// `?a.b=1&a_b=2` and `?a_b=2&a.b=1` are one name twice to a PHP origin
/// (`.` is read as `_`), in two orders: two answers. Sorting the pairs by
/// name must not make them one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_names_an_origin_folds_never_share_an_entry() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |_, parts| {
            respond(format!("role={}", php_value(query(parts), "a_b")), &[])
        });
        for uri in [
            "/report?a.b=admin&a_b=user",
            "/report?a_b=user&a.b=admin",
            "/report?a%20b=admin&a_b=user",
            "/report?a_b=user&a%20b=admin",
            "/report?%20a_b=admin&a_b=user",
            "/report?a_b=user&%20a_b=admin",
        ] {
            let answer = send(&app, get(uri, &[])).await;
            let own = format!("role={}", php_value(uri.split_once('?').unwrap().1, "a_b"));
            if answer.text() != own {
                failures.push(format!(
                    "{kind}: {uri} got `{}`, reads `{own}`",
                    answer.text()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `?x=1;a=9&a=1` and `?a=1&x=1;a=9` give `a` two different last values to
/// an origin that splits at `;` too: two answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_semicolon_separators_never_share_an_entry() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |_, parts| {
            respond(format!("a={}", semicolon_value(query(parts), "a")), &[])
        });
        let first = send(&app, get("/report?x=1;a=evil&a=good", &[])).await;
        assert_eq!(first.text(), "a=good", "{kind}");
        let second = send(&app, get("/report?a=good&x=1;a=evil", &[])).await;
        if second.text() != "a=evil" {
            failures.push(format!(
                "{kind}: `?a=good&x=1;a=evil` got `{}`",
                second.text()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Repeated keys, empty pairs and percent-encoded names: a query the origin
/// reads with another last value of a name is never served another's entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_and_encoded_query_names_keep_their_order() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |_, parts| {
            // form decoding: `%61` is `a`, `+` a space; the last `a` wins.
            respond(format!("a={}", form_last(query(parts))), &[])
        });
        for (one, other) in [
            ("/report?a=1&%61=2", "/report?%61=2&a=1"),
            ("/report?a=1&A=2&a=3", "/report?a=3&A=2&a=1"),
            ("/report?a=1&&a=2", "/report?a=2&&a=1"),
            ("/report?a=1&a+=2", "/report?a+=2&a=1"),
            ("/report?a=1&a%20=2", "/report?a%20=2&a=1"),
        ] {
            for uri in [one, other] {
                let answer = send(&app, get(uri, &[])).await.text();
                let own = format!("a={}", form_last(uri.split_once('?').unwrap().1));
                assert_eq!(answer, own, "{kind}: {uri} got another query's entry");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Rewrite headers
// ---------------------------------------------------------------------------

/// Whether each spelling of a target-rewrite header is keyed: the plain
/// entry is never served to a request with it, nor its entry to a plain one.
/// The origin honours any spelling (its separators dropped).
async fn spellings_are_keyed(names: &[&str]) {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        for (i, name) in names.iter().enumerate() {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = app(&calls, guard, |n, parts| {
                let rewritten = parts.headers.keys().any(|k| {
                    let bare = k.as_str().replace(['.', '-', '_'], "");
                    bare == "xoriginalurl" || bare == "xforwardedhost"
                });
                respond(
                    format!("{}-{n}", if rewritten { "admin" } else { "public" }),
                    &[],
                )
            });
            let uri = format!("/report?spelling={i}");
            assert_eq!(send(&app, get(&uri, &[])).await.text(), "public-1");
            let with = send(&app, get(&uri, &[(name, "/admin")])).await;
            if !with.text().starts_with("admin") {
                failures.push(format!("{kind}: `{name}` got the plain entry"));
            }
            let uri = format!("/report?spelling-first={i}");
            let _ = send(&app, get(&uri, &[(name, "/admin")])).await;
            let plain = send(&app, get(&uri, &[])).await;
            if !plain.text().starts_with("public") {
                failures.push(format!("{kind}: a plain request got `{name}`'s entry"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Upper case, underscores and doubled separators: each spelling keyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_header_spellings_in_case_and_underscores_are_keyed() {
    spellings_are_keyed(&[
        "X-ORIGINAL-URL",
        "x_Original-Url",
        "x--original--url",
        "_x_forwarded_host_",
    ])
    .await;
}

/// Dots as separators: PHP's `$_SERVER` reads `.` in a name as `_` (Caddy
/// and the built-in server pass such names on), so `X.Original.URL` is
/// `X-Original-URL` to a PHP framework. Each spelling is keyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_header_spellings_with_dots_are_keyed() {
    spellings_are_keyed(&["x-original.url", "x.original.url", "x.forwarded.host"]).await;
}

/// A `GET` carrying `X-HTTP-Method-Override: DELETE` passes the cache; a
/// framework that honours it deleted the resource, so the cached `GET` of
/// that URL must not be served afterwards (RFC 9111 §4.4 applies to the
/// method the origin ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_to_delete_invalidates_like_a_delete() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            let over = parts
                .headers
                .get("x-http-method-override")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            respond(format!("{over}-{n}"), &[])
        });
        assert_eq!(send(&app, get("/report?mo", &[])).await.text(), "-1");
        let deleted = send(
            &app,
            get("/report?mo", &[("x-http-method-override", "DELETE")]),
        )
        .await;
        assert_eq!(deleted.text(), "DELETE-2", "{kind}");
        let after = send(&app, get("/report?mo", &[])).await;
        if after.text() != "-3" {
            failures.push(format!("{kind}: after the DELETE, `{}`", after.text()));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A `POST` with `X-HTTP-Method-Override: GET` is a write to the cache
/// (it invalidates) but never stores its answer as the GET's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_overridden_to_get_is_never_stored_as_the_get() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            respond(format!("{}-{n}", parts.method), &[])
        });
        let post = send(
            &app,
            request_with(
                Method::POST,
                "/report?pg",
                &[("x-http-method-override", "GET")],
            ),
        )
        .await;
        assert_eq!(post.text(), "POST-1", "{kind}");
        let plain = send(&app, get("/report?pg", &[])).await;
        assert_eq!(plain.text(), "GET-2", "{kind}");
    }
}

// ---------------------------------------------------------------------------
// Vary
// ---------------------------------------------------------------------------

fn header<'a>(parts: &'a Parts, name: &str) -> &'a str {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
}

/// `Vary` split over two field lines, in odd case: both lines nominate.
/// A request that differs only in the second line's header never gets the
/// first request's variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_over_two_lines_selects_by_both() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            let body = format!("{}/{}-{n}", header(parts, "x-a"), header(parts, "x-b"));
            let mut r = respond(body, &[("vary", "X-A")]);
            r.headers_mut()
                .append("vary", http::HeaderValue::from_static("X-B , "));
            r
        });
        let one = send(&app, get("/report?v2", &[("x-a", "1"), ("x-b", "alice")])).await;
        assert_eq!(one.text(), "1/alice-1", "{kind}");
        let two = send(&app, get("/report?v2", &[("x-a", "1"), ("x-b", "bob")])).await;
        assert!(
            two.text().starts_with("1/bob"),
            "{kind}: bob got alice's variant: {}",
            two.text()
        );
        let none = send(&app, get("/report?v2", &[("x-a", "1")])).await;
        assert!(
            none.text().starts_with("1/-"),
            "{kind}: a request without x-b got another's variant: {}",
            none.text()
        );
    }
}

/// `Vary` with `*` among other names, in any line, never matches: each
/// request goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_star_among_names_never_matches() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        for (i, lines) in [
            vec!["x-a, *"],
            vec!["x-a", "*"],
            vec!["x-a,*,x-b"],
            vec![" * "],
        ]
        .into_iter()
        .enumerate()
        {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = app(&calls, guard, move |n, _| {
                let mut r = respond(format!("star-{n}"), &[]);
                for line in &lines {
                    r.headers_mut()
                        .append("vary", http::HeaderValue::from_str(line).unwrap());
                }
                r
            });
            let uri = format!("/report?star={i}");
            let _ = send(&app, get(&uri, &[("x-a", "1")])).await;
            let again = send(&app, get(&uri, &[("x-a", "1")])).await;
            assert_eq!(
                again.text(),
                "star-2",
                "{kind} case {i}: a `Vary: *` answer was served from the cache"
            );
        }
    }
}

/// A learned `Vary` naming a header one request lacks and another sends
/// empty: the variant built for "absent" is not served to a request with a
/// value, nor the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_on_a_header_another_request_lacks() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            respond(
                format!("{}-{n}", header(parts, "x-tenant")),
                &[("vary", "x-tenant")],
            )
        });
        let absent = send(&app, get("/report?lack", &[])).await;
        assert_eq!(absent.text(), "--1", "{kind}");
        let with = send(&app, get("/report?lack", &[("x-tenant", "acme")])).await;
        assert!(with.text().starts_with("acme"), "{kind}: {}", with.text());
        let absent = send(&app, get("/report?lack", &[])).await;
        assert!(absent.text().starts_with("--"), "{kind}: {}", absent.text());
        let two = send(
            &app,
            get(
                "/report?lack",
                &[("x-tenant", "acme"), ("x-tenant", "evil")],
            ),
        )
        .await;
        assert_ne!(
            two.text(),
            with.text(),
            "{kind}: two x-tenant lines got the one-line variant"
        );
    }
}

// ---------------------------------------------------------------------------
// Content-Encoding
// ---------------------------------------------------------------------------

/// A body coded twice (`gzip, br`, or two lines, in odd case) reaches only
/// clients that accept both codings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_several_codings_reaches_only_clients_accepting_all() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        for (i, lines) in [vec!["gzip, br"], vec!["GZIP", "Br"], vec!["identity, gzip"]]
            .into_iter()
            .enumerate()
        {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = app(&calls, guard, move |n, parts| {
                let ae = header(parts, "accept-encoding").to_owned();
                let mut r = respond(format!("coded-for[{ae}]-{n}"), &[]);
                // The origin codes only for the client that accepts both.
                if ae == "gzip, br" {
                    for line in &lines {
                        r.headers_mut().append(
                            "content-encoding",
                            http::HeaderValue::from_str(line).unwrap(),
                        );
                    }
                }
                r
            });
            let uri = format!("/report?ce={i}");
            let coded = send(&app, get(&uri, &[("accept-encoding", "gzip, br")])).await;
            assert!(coded.headers.contains_key("content-encoding"));
            for ae in [
                "br",
                "identity",
                "gzip;q=1, br;q=0",
                "GZIP",
                "gzip, br;q=0.000",
            ] {
                let other = send(&app, get(&uri, &[("accept-encoding", ae)])).await;
                // Only the `gzip` entry may reach a client that accepts gzip.
                let may = i == 2 && ae.to_ascii_lowercase().starts_with("gzip");
                assert!(
                    may || !other.headers.contains_key("content-encoding"),
                    "{kind} case {i}: a client accepting `{ae}` got a body coded for another: {}",
                    other.text()
                );
            }
            let bare = send(&app, get(&uri, &[])).await;
            assert!(
                !bare.headers.contains_key("content-encoding"),
                "{kind} case {i}: a client without Accept-Encoding got a coded body"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Preconditions
// ---------------------------------------------------------------------------

const OLD: &str = "Mon, 01 Jan 2024 00:00:00 GMT";
const LATER: &str = "Mon, 01 Jan 2035 00:00:00 GMT";

fn validated(n: usize) -> Response {
    respond(
        format!("body-{n}"),
        &[("etag", "\"a\""), ("last-modified", OLD)],
    )
}

/// `If-None-Match` that does not match beside an `If-Modified-Since` that
/// would: `If-Modified-Since` is ignored (RFC 9110 §13.1.3), so a `200`;
/// on a cold key (coalesced miss) and on a hit, for GET and HEAD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_match_takes_precedence_over_if_modified_since() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| validated(n));
        let conds = [("if-none-match", "\"b\""), ("if-modified-since", LATER)];
        let cold = send(&app, get("/report?inm", &conds)).await;
        assert_eq!(cold.status, StatusCode::OK, "{kind}: cold");
        let hit = send(&app, get("/report?inm", &conds)).await;
        assert_eq!(hit.status, StatusCode::OK, "{kind}: hit");
        let head = send(&app, request_with(Method::HEAD, "/report?inm", &conds)).await;
        assert_eq!(head.status, StatusCode::OK, "{kind}: head");
        // Weak comparison for If-None-Match: W/"a" matches "a".
        let weak = send(&app, get("/report?inm", &[("if-none-match", "W/\"a\"")])).await;
        assert_eq!(weak.status, StatusCode::NOT_MODIFIED, "{kind}: weak");
        let head = send(
            &app,
            request_with(
                Method::HEAD,
                "/report?inm",
                &[("if-none-match", "\"x\", \"a\"")],
            ),
        )
        .await;
        assert_eq!(head.status, StatusCode::NOT_MODIFIED, "{kind}: head list");
        // Strong comparison for If-Match: W/"a" never matches.
        let strong = send(&app, get("/report?inm", &[("if-match", "W/\"a\"")])).await;
        assert_eq!(strong.status, StatusCode::PRECONDITION_FAILED, "{kind}");
        // If-Match fails before If-None-Match is looked at.
        let both = send(
            &app,
            get(
                "/report?inm",
                &[("if-match", "\"z\""), ("if-none-match", "\"a\"")],
            ),
        )
        .await;
        assert_eq!(both.status, StatusCode::PRECONDITION_FAILED, "{kind}");
        assert_eq!(calls.get(), 1, "{kind}");
    }
}

/// A precondition on a stored entry without `Last-Modified`:
/// `If-Unmodified-Since` is ignored (RFC 9110 §13.1.4), a `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_unmodified_since_without_last_modified_is_ignored() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| respond(format!("b{n}"), &[]));
        let _ = send(&app, get("/report?ius", &[])).await;
        let r = send(&app, get("/report?ius", &[("if-unmodified-since", OLD)])).await;
        assert_eq!(r.status, StatusCode::OK, "{kind}");
        let r = send(&app, get("/report?ius", &[("if-match", "*")])).await;
        assert_eq!(r.status, StatusCode::OK, "{kind}: If-Match * on a 200");
    }
}

/// `If-Range` with a weak tag never matches (RFC 9110 §13.1.5): the whole
/// `200`, not a `206`. With the strong stored tag, a `206`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_range_with_a_weak_tag_gets_the_whole_representation() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| {
            respond(format!("0123456789-{n}"), &[("etag", "W/\"w\"")])
        });
        let _ = send(&app, get("/report?ir", &[])).await;
        let r = send(
            &app,
            get(
                "/report?ir",
                &[("range", "bytes=0-1"), ("if-range", "W/\"w\"")],
            ),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{kind}: weak If-Range gave a range"
        );
        let r = send(
            &app,
            get("/report?ir", &[("range", "bytes=0-1"), ("if-range", OLD)]),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{kind}: a date If-Range without Last-Modified gave a range"
        );
    }
}

/// `HEAD` on a cold key, then `GET`: the `GET` gets the whole body, and
/// the `HEAD` the same headers without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_before_get_never_stores_an_empty_body() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| respond(format!("payload-{n}"), &[]));
        let head = send(&app, request_with(Method::HEAD, "/report?hg", &[])).await;
        assert_eq!(head.status, StatusCode::OK, "{kind}");
        assert!(head.body.is_empty(), "{kind}: HEAD got a body");
        let get = send(&app, get("/report?hg", &[])).await;
        assert!(
            get.text().starts_with("payload-"),
            "{kind}: GET after HEAD got `{}`",
            get.text()
        );
    }
}

/// Requests with credentials (`Authorization`, `Cookie`) are never
/// answered from, nor stored for, anonymous requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_credentials_never_reach_anonymous_clients() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            let who = if parts.headers.contains_key("authorization")
                || parts.headers.contains_key("cookie")
            {
                "alice"
            } else {
                "anon"
            };
            respond(
                format!("{who}-{n}"),
                &[("cache-control", "public, max-age=60")],
            )
        });
        for (i, cred) in [
            ("authorization", "Bearer alice"),
            ("cookie", "session=alice"),
        ]
        .into_iter()
        .enumerate()
        {
            let uri = format!("/report?cred={i}");
            let _ = send(&app, get(&uri, &[cred])).await;
            let anon = send(&app, get(&uri, &[])).await;
            assert!(anon.text().starts_with("anon"), "{kind}: {}", anon.text());
        }
    }
}

// ---------------------------------------------------------------------------
// Revalidation
// ---------------------------------------------------------------------------

/// A `304` that renews an entry carries fields for the client whose request
/// caused it: with `Set-Cookie` and `Set-Cookie2` (the renewal then goes
/// to that client alone), or with `Authentication-Info`,
/// `Proxy-Authentication-Info` and a field its `Connection` names (the
/// renewal is stored without them). No later client gets any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_fields_of_a_304_are_never_replayed() {
    let backends = Backends::start();
    let cases: [&[(&str, &str)]; 2] = [
        &[("set-cookie", "sid=victim"), ("set-cookie2", "sid2=victim")],
        &[
            ("authentication-info", "nextnonce=\"victim\""),
            ("proxy-authentication-info", "nextnonce=\"victim\""),
            ("connection", "x-token"),
            ("x-token", "victim"),
        ],
    ];
    for (kind, backend) in backends.each().await {
        for (i, fields) in cases.into_iter().enumerate() {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).respect_cache_control(true);
            let app = app(&calls, guard, move |n, parts| {
                if parts.headers.contains_key("if-none-match") {
                    let mut r = Response::builder()
                        .status(StatusCode::NOT_MODIFIED)
                        .header("etag", "\"r\"")
                        .header("cache-control", "max-age=60");
                    for (k, v) in fields {
                        r = r.header(*k, *v);
                    }
                    return r.body(Body::empty()).unwrap();
                }
                respond(
                    format!("rev-{n}"),
                    &[("etag", "\"r\""), ("cache-control", "max-age=1")],
                )
            });
            let uri = format!("/report?rev={i}");
            let _ = send(&app, get(&uri, &[])).await;
            // Past the one-second lifetime the next request revalidates
            // (condition-polled: a hit until then).
            let mut renewed = None;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let a = send(&app, get(&uri, &[])).await;
                if calls.get() >= 2 {
                    renewed = Some(a);
                    break;
                }
            }
            let renewed = renewed.expect("the entry was revalidated");
            eprintln!(
                "{kind} case {i}: renewal answered `{}` ({}), {} origin calls",
                renewed.text(),
                renewed.x_cache(),
                calls.get()
            );
            for _ in 0..3 {
                let other = send(&app, get(&uri, &[])).await;
                for (name, _) in fields {
                    assert!(
                        !other.headers.contains_key(*name),
                        "{kind} case {i}: `{name}` of one client's 304 replayed to another \
                         ({}, `{}`)",
                        other.x_cache(),
                        other.text()
                    );
                }
            }
        }
    }
}

/// Preconditions on an entry served stale under stale-while-revalidate are
/// evaluated against it: a matching `If-None-Match` gets a `304`, a failing
/// `If-Match` a `412`, never the body nor a silent `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preconditions_on_a_stale_entry_are_evaluated() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend)
            .ttl(Duration::from_secs(1))
            .stale_while_revalidate(Duration::from_secs(600));
        let app = app(&calls, guard, |n, _| validated(n));
        let _ = send(&app, get("/report?swr", &[])).await;
        let mut stale = None;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let a = send(&app, get("/report?swr", &[("if-none-match", "\"a\"")])).await;
            if a.x_cache() == "STALE" {
                stale = Some(a);
                break;
            }
            assert_eq!(a.status, StatusCode::NOT_MODIFIED, "{kind}: fresh hit");
        }
        let stale = stale.expect("served stale");
        assert_eq!(stale.status, StatusCode::NOT_MODIFIED, "{kind}: stale INM");
        let failed = send(&app, get("/report?swr", &[("if-match", "\"zz\"")])).await;
        assert_eq!(failed.status, StatusCode::PRECONDITION_FAILED, "{kind}");
    }
}

// ---------------------------------------------------------------------------
// Learned Vary under coalescing
// ---------------------------------------------------------------------------

/// A cold key whose origin varies on `x-user`, which the route does not
/// list: alice's request and bob's arrive together, before the `Vary` is
/// known. Bob never gets alice's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_variants_never_get_each_others_answer() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let slow = move |request: Request<Body>| {
            let calls = calls.clone();
            async move {
                let user = request
                    .headers()
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                let n = calls.next();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let status = if user == "bad" {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                };
                Response::builder()
                    .status(status)
                    .header("vary", "x-user")
                    .body(Body::from(format!("{user}-{n}")))
                    .unwrap()
            }
        };
        let app = Router::new().route("/report", any(slow).layer(guard));
        for (first, second) in [("alice", "bob"), ("bad", "carol")] {
            let uri = format!("/report?cv={first}");
            let a = {
                let app = app.clone();
                let uri = uri.clone();
                tokio::spawn(async move { send(&app, get(&uri, &[("x-user", first)])).await })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            let b = send(&app, get(&uri, &[("x-user", second)])).await;
            let a = a.await.expect("first");
            assert!(a.text().starts_with(first), "{kind}: {}", a.text());
            assert!(
                b.text().starts_with(second) && b.status == StatusCode::OK,
                "{kind}: {second} got {} `{}` built for {first}",
                b.status,
                b.text()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Learned Vary: how values are compared
// ---------------------------------------------------------------------------

/// A learned `Vary: x-user` compares the request's values as the origin
/// would tell them apart: `Alice` and `alice` (case), `"a,b"` and `"a, b"`
/// (a comma inside a quoted string) are other users to an origin that reads
/// the value whole; neither gets the other's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_vary_values_that_differ_never_share() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        for (i, (one, other)) in [("Alice", "alice"), ("\"a,b\"", "\"a, b\""), ("a;b", "a; b")]
            .into_iter()
            .enumerate()
        {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = app(&calls, guard, |n, parts| {
                respond(
                    format!("[{}]-{n}", header(parts, "x-user")),
                    &[("vary", "x-user")],
                )
            });
            let uri = format!("/report?vv={i}");
            let _ = send(&app, get(&uri, &[("x-user", one)])).await;
            let b = send(&app, get(&uri, &[("x-user", other)])).await;
            if !b.text().starts_with(&format!("[{other}]")) {
                failures.push(format!("{kind}: `{other}` got `{}`", b.text()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `If-None-Match: *` on a `200`: a `304`, on a cold key (coalesced miss)
/// and on a hit; an invalid `If-Modified-Since` is ignored (a `200`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_match_star_and_invalid_dates() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| validated(n));
        let star = [("if-none-match", "*")];
        let cold = send(&app, get("/report?star", &star)).await;
        assert_eq!(cold.status, StatusCode::NOT_MODIFIED, "{kind}: cold");
        let hit = send(&app, get("/report?star", &star)).await;
        assert_eq!(hit.status, StatusCode::NOT_MODIFIED, "{kind}: hit");
        let bad = send(
            &app,
            get("/report?star", &[("if-modified-since", "yesterday")]),
        )
        .await;
        assert_eq!(bad.status, StatusCode::OK, "{kind}: invalid date");
        let two = send(
            &app,
            get(
                "/report?star",
                &[("if-modified-since", LATER), ("if-modified-since", LATER)],
            ),
        )
        .await;
        assert_eq!(two.status, StatusCode::OK, "{kind}: two date lines");
        assert_eq!(calls.get(), 1, "{kind}");
    }
}

// ---------------------------------------------------------------------------
// Stale copies and variants
// ---------------------------------------------------------------------------

/// An origin that varies on `x-user` (learned): alice's entry expires. Bob,
/// whose variant was never stored, is never answered with alice's copy,
/// neither under stale-while-revalidate nor when the origin fails under
/// stale-if-error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_variant_never_answers_another_variant() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        for (i, swr) in [true, false].into_iter().enumerate() {
            let calls = Calls::default();
            let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(1));
            let guard = match swr {
                true => guard.stale_while_revalidate(Duration::from_secs(600)),
                false => guard.stale_if_error(Duration::from_secs(600)),
            };
            let fail = failing.clone();
            let app = app(&calls, guard, move |n, parts| {
                let user = header(parts, "x-user").to_owned();
                let mut r = respond(format!("{user}-{n}"), &[("vary", "x-user")]);
                if fail.load(Ordering::SeqCst) {
                    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                }
                r
            });
            let uri = format!("/report?sv={i}");
            let _ = send(&app, get(&uri, &[("x-user", "alice")])).await;
            // Until alice's copy is stale (condition-polled).
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let a = send(&app, get(&uri, &[("x-user", "alice")])).await;
                if a.x_cache() == "STALE" || calls.get() >= 2 {
                    break;
                }
            }
            failing.store(!swr, Ordering::SeqCst);
            let bob = send(&app, get(&uri, &[("x-user", "bob")])).await;
            if bob.text().starts_with("alice") {
                failures.push(format!(
                    "{kind} {}: bob got alice's copy ({})",
                    if swr { "swr" } else { "sie" },
                    bob.x_cache()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A stored `200` whose own fields belong to its requester (a field its
/// `Connection` names, `Authentication-Info`, `Proxy-Authentication-Info`)
/// is replayed to others without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_fields_of_a_stored_200_are_never_replayed() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, _| {
            let mut r = respond(
                format!("pc-{n}"),
                &[
                    ("connection", "keep-alive"),
                    ("connection", "X-Secret, x-other"),
                    ("x-secret", "alice"),
                    ("x-other", "alice"),
                    ("authentication-info", "rspauth=\"alice\""),
                    ("proxy-authentication-info", "rspauth=\"alice\""),
                ],
            );
            r.headers_mut()
                .insert("x-kept", http::HeaderValue::from_static("shared"));
            r
        });
        let _ = send(&app, get("/report?pc", &[])).await;
        let other = send(&app, get("/report?pc", &[])).await;
        assert_eq!(other.text(), "pc-1", "{kind}: stored");
        assert!(other.headers.contains_key("x-kept"), "{kind}");
        for name in [
            "x-secret",
            "x-other",
            "authentication-info",
            "proxy-authentication-info",
        ] {
            assert!(
                !other.headers.contains_key(name),
                "{kind}: `{name}` replayed from the entry"
            );
        }
    }
}

/// `If-Range` with a date: a cache may take the entry's `Last-Modified` as
/// strong only when it is at least 60 s before the entry's `Date` (RFC 9110
/// §8.8.2.2); otherwise the date is weak and `If-Range` is false (§13.1.5):
/// the whole `200`, never a range that could be spliced onto another
/// version written within the same second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_range_with_a_weak_date_gets_the_whole_representation() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        let stamp = now.clone();
        let app = app(&calls, guard, move |n, _| {
            respond(
                format!("0123456789-{n}"),
                &[("date", &stamp), ("last-modified", &stamp)],
            )
        });
        let _ = send(&app, get("/report?ird", &[])).await;
        let r = send(
            &app,
            get("/report?ird", &[("range", "bytes=0-1"), ("if-range", &now)]),
        )
        .await;
        if r.status != StatusCode::OK {
            failures.push(format!(
                "{kind}: {} for If-Range with a weak date",
                r.status
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Headers frameworks have honoured to rewrite the query or the matched
/// route rather than the path (Next.js read `x-invoke-query` and
/// `x-now-route-matches` as the query and route parameters to render),
/// or under names the word list does not hold (`x-request-target`,
/// `x-query-string`): each changes what the handler answers, so each is
/// keyed like the rest of the target-rewrite class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_and_route_rewrite_headers_are_keyed() {
    let backends = Backends::start();
    let names = [
        "x-invoke-query",
        "x-now-route-matches",
        "x-query-string",
        "x-request-target",
    ];
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        for (i, name) in names.into_iter().enumerate() {
            let calls = Calls::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = app(&calls, guard, move |n, parts| {
                respond(format!("{}-{n}", header(parts, name)), &[])
            });
            let uri = format!("/report?qr={i}");
            let _ = send(&app, get(&uri, &[(name, "id=evil")])).await;
            let plain = send(&app, get(&uri, &[])).await;
            if plain.text().starts_with("id=evil") {
                failures.push(format!("{kind}: a plain request got `{name}`'s entry"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Requests that join one slow miss each get their own answer from it: a
/// `HEAD` leading, then a `GET` (the body), a failing `If-Match` (`412`), a
/// matching `If-None-Match` (`304`), a `Range` with a weak `If-Range` (the
/// whole `200`) and a plain `Range` (`206`); one origin call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_joining_one_miss_get_their_own_preconditions() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let counted = calls.clone();
        let slow = move |_: Request<Body>| {
            let calls = counted.clone();
            async move {
                let n = calls.next();
                tokio::time::sleep(Duration::from_millis(400)).await;
                respond(format!("0123456789-{n}"), &[("etag", "\"j\"")])
            }
        };
        let app = Router::new().route("/report", any(slow).layer(guard));
        let spawn = |method: Method, headers: &'static [(&'static str, &'static str)]| {
            let app = app.clone();
            tokio::spawn(
                async move { send(&app, request_with(method, "/report?join", headers)).await },
            )
        };
        let head = spawn(Method::HEAD, &[]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let joined = [
            spawn(Method::GET, &[]),
            spawn(Method::GET, &[("if-match", "\"zz\"")]),
            spawn(Method::GET, &[("if-none-match", "W/\"j\"")]),
            spawn(
                Method::GET,
                &[("range", "bytes=0-1"), ("if-range", "W/\"j\"")],
            ),
            spawn(Method::GET, &[("range", "bytes=0-1")]),
        ];
        let head = head.await.expect("head");
        assert_eq!(head.status, StatusCode::OK, "{kind}: head");
        assert!(head.body.is_empty(), "{kind}: head body");
        let mut got = Vec::new();
        for j in joined {
            let a = j.await.expect("joined");
            got.push((a.status.as_u16(), a.text()));
        }
        assert_eq!(
            got,
            vec![
                (200, "0123456789-1".to_owned()),
                (412, String::new()),
                (304, String::new()),
                (200, "0123456789-1".to_owned()),
                (206, "01".to_owned()),
            ],
            "{kind}"
        );
        assert_eq!(calls.get(), 1, "{kind}");
    }
}

/// A `gzip` body stored without `Vary` never reaches a client that refuses
/// gzip in any spelling: `Q=0` (parameter names are case-insensitive),
/// spaces around `;`, `q=0.000`, `*;q=0`, `GZIP;q=0`, or `x-gzip;q=0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_entry_never_reaches_a_client_refusing_gzip_in_any_spelling() {
    let backends = Backends::start();
    let mut failures = Vec::new();
    for (kind, backend) in backends.each().await {
        let calls = Calls::default();
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(&calls, guard, |n, parts| {
            let ae = header(parts, "accept-encoding").to_owned();
            let mut r = respond(format!("[{ae}]-{n}"), &[]);
            if ae == "gzip" {
                r.headers_mut()
                    .insert("content-encoding", http::HeaderValue::from_static("gzip"));
            }
            r
        });
        let _ = send(&app, get("/report?gz", &[("accept-encoding", "gzip")])).await;
        for ae in [
            "gzip;Q=0",
            "gzip ; q=0",
            "gzip;q=0.000",
            "*;q=0",
            "GZIP;q=0",
            "x-gzip;q=0",
            "gzip;q=0, identity",
        ] {
            let a = send(&app, get("/report?gz", &[("accept-encoding", ae)])).await;
            if a.headers.contains_key("content-encoding") {
                failures.push(format!("{kind}: `{ae}` got the gzip body"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
