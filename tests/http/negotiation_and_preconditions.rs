//! What a stored answer may be given to: a coded body (`Content-Encoding`
//! without `Vary: Accept-Encoding`) only to requests that take its coding
//! as its maker's did, and a request's preconditions (RFC 9110 §13)
//! evaluated against the stored entry, on a hit and for each waiter of a
//! miss alike. Both backends.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

#[cfg(feature = "redis")]
use crate::common::backends::redis_backend;
use crate::common::{burst, send, Answer, Origin};

/// `/z`: a body coded `gzip` (`gz#<call>`) for a request whose
/// `Accept-Encoding` lists gzip with a weight above zero (or `always`),
/// else an unencoded one (`id#<call>`); never `Vary`. After `delay`.
fn coding_app(origin: &Origin, backend: Backend, delay: Duration, always: bool) -> Router {
    let origin = origin.clone();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
    Router::new()
        .route(
            "/z",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(delay).await;
                    let gzip = always
                        || headers
                            .get_all("accept-encoding")
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .flat_map(|v| v.split(','))
                            .any(|m| {
                                let m = m.trim().to_ascii_lowercase();
                                m == "gzip" || (m.starts_with("gzip;") && !m.ends_with("q=0"))
                            });
                    match gzip {
                        true => http::Response::builder()
                            .header("content-encoding", "gzip")
                            .body(Body::from(format!("gz#{n}")))
                            .unwrap(),
                        false => http::Response::new(Body::from(format!("id#{n}"))),
                    }
                }
            }),
        )
        .layer(guard)
}

fn accepting(value: Option<&str>) -> Request<Body> {
    let mut request = Request::get("/z").body(Body::empty()).unwrap();
    if let Some(value) = value {
        request
            .headers_mut()
            .insert("accept-encoding", value.parse().unwrap());
    }
    request
}

fn coded(answer: &Answer) -> bool {
    answer.headers.contains_key("content-encoding") || answer.text().starts_with("gz")
}

async fn a_coded_body_reaches_only_clients_that_accept_it(backend: Backend) {
    let origin = Origin::default();
    let app = coding_app(&origin, backend, Duration::ZERO, false);
    let first = send(&app, accepting(Some("gzip, deflate, br"))).await;
    assert_eq!(first.text(), "gz#1");
    let again = send(&app, accepting(Some("br;q=0.9, gzip"))).await;
    assert_eq!((again.text().as_str(), again.x_cache()), ("gz#1", "HIT"));
    assert!(!again.headers.contains_key("stampede-guard-selected"));
    // Clients that did not accept gzip: never the coded body.
    let refusing = [
        None,
        Some("identity"),
        Some("br"),
        Some("gzip;q=0"),
        Some("gzip;q=0, br"),
        Some("*;q=0, identity"),
        Some(""),
    ];
    for value in refusing {
        let answer = send(&app, accepting(value)).await;
        assert!(!coded(&answer), "{value:?} got {:?}", answer.text());
        assert_eq!(answer.status, StatusCode::OK, "{value:?}");
    }
    let after = origin.calls();
    // Each answer is kept for its own kind of client: asked again, no call.
    for value in refusing {
        let answer = send(&app, accepting(value)).await;
        assert!(!coded(&answer), "{value:?} got {:?}", answer.text());
    }
    let gz = send(&app, accepting(Some("gzip"))).await;
    assert_eq!(gz.text(), "gz#1");
    eprintln!(
        "a gzip entry without Vary: {after} origin calls for 8 kinds of client, {} after",
        origin.calls() - after
    );
    assert_eq!(origin.calls(), after, "the variants were not kept");
    assert!(after <= 1 + refusing.len());
}

#[tokio::test]
async fn a_coded_body_reaches_only_clients_that_accept_it_embedded() {
    a_coded_body_reaches_only_clients_that_accept_it(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_coded_body_reaches_only_clients_that_accept_it_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    a_coded_body_reaches_only_clients_that_accept_it(redis_backend(&redis).await).await;
}

/// A herd of clients that send no `Accept-Encoding`, after a gzip entry is
/// stored: one origin call for all of them, each gets the unencoded body.
async fn a_herd_that_refuses_the_coding_costs_one_call(backend: Backend) {
    let origin = Origin::default();
    let app = coding_app(&origin, backend, Duration::from_millis(100), false);
    assert_eq!(send(&app, accepting(Some("gzip"))).await.text(), "gz#1");
    let answers = burst(&app, 20, || accepting(None)).await;
    let plain = answers.iter().filter(|a| a.text() == "id#2").count();
    eprintln!(
        "20 clients without Accept-Encoding after a gzip entry: {plain} got the unencoded body, {} origin calls",
        origin.calls()
    );
    assert_eq!(plain, 20);
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_that_refuses_the_coding_costs_one_call_embedded() {
    a_herd_that_refuses_the_coding_costs_one_call(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_that_refuses_the_coding_costs_one_call_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    a_herd_that_refuses_the_coding_costs_one_call(redis_backend(&redis).await).await;
}

/// An origin that codes every answer, whatever the client says: what it
/// coded for a client that sent no `Accept-Encoding` is kept for such
/// clients (one call, then hits), and a client that refuses identity is
/// never given an unencoded body stored for others.
#[tokio::test]
async fn the_origins_own_choice_for_a_kind_of_client_is_kept_for_it() {
    let origin = Origin::default();
    let app = coding_app(&origin, Backend::local(), Duration::ZERO, true);
    for _ in 0..5 {
        assert_eq!(send(&app, accepting(None)).await.text(), "gz#1");
    }
    assert_eq!(origin.calls(), 1);
    let plain_origin = Origin::default();
    let app = coding_app(&plain_origin, Backend::local(), Duration::ZERO, false);
    assert_eq!(send(&app, accepting(None)).await.text(), "id#1");
    assert_eq!(send(&app, accepting(Some("br"))).await.text(), "id#1");
    let picky = send(&app, accepting(Some("identity;q=0, gzip"))).await;
    assert_eq!(picky.text(), "gz#2");
    assert_eq!(
        send(&app, accepting(Some("identity;q=0, gzip")))
            .await
            .text(),
        "gz#2"
    );
    assert_eq!(plain_origin.calls(), 2);
}

/// A route that ignores `Vary` still never gives a coded body to a client
/// that did not accept its coding.
#[tokio::test]
async fn ignoring_vary_still_honours_the_coding() {
    let origin = Origin::default();
    let o = origin.clone();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(600))
        .ignore_vary(true);
    let app = Router::new()
        .route(
            "/z",
            get(move || {
                let (n, _running) = o.enter();
                async move {
                    http::Response::builder()
                        .header("content-encoding", "br")
                        .header("vary", "x-anything")
                        .body(Body::from(format!("br#{n}")))
                        .unwrap()
                }
            }),
        )
        .layer(guard);
    assert_eq!(send(&app, accepting(Some("br"))).await.text(), "br#1");
    assert_eq!(send(&app, accepting(Some("br, gzip"))).await.text(), "br#1");
    assert_eq!(send(&app, accepting(Some("gzip"))).await.text(), "br#2");
    assert_eq!(origin.calls(), 2);
}

const MODIFIED: &str = "Sun, 01 Nov 2026 00:00:00 GMT";
const BEFORE: &str = "Sat, 31 Oct 2026 00:00:00 GMT";
const AFTER: &str = "Mon, 02 Nov 2026 00:00:00 GMT";

/// `/p`: `v<call>` with `ETag: "v1"` and a `Last-Modified`, after `delay`;
/// `Cache-Control: private` when `private`.
fn validated_app(origin: &Origin, backend: Backend, delay: Duration, private: bool) -> Router {
    let origin = origin.clone();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
    Router::new()
        .route(
            "/p",
            get(move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(delay).await;
                    let mut response = http::Response::builder()
                        .header("etag", "\"v1\"")
                        .header("last-modified", MODIFIED);
                    if private {
                        response = response.header("cache-control", "private");
                    }
                    response.body(Body::from(format!("v{n}"))).unwrap()
                }
            }),
        )
        .layer(guard)
}

fn asking(method: &str, conditions: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::builder().method(method).uri("/p");
    for (name, value) in conditions {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

/// Requests and what each must get, against an entry `v1` with `ETag:
/// "v1"` and `Last-Modified: MODIFIED`: status and body.
/// A request (method, condition headers) and what it must get (status,
/// body).
type Case = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    u16,
    &'static str,
);

fn cases() -> Vec<Case> {
    vec![
        ("GET", vec![], 200, "v1"),
        ("GET", vec![("if-match", "\"v1\"")], 200, "v1"),
        ("GET", vec![("if-match", "\"x\", \"v1\"")], 200, "v1"),
        ("GET", vec![("if-match", "*")], 200, "v1"),
        ("GET", vec![("if-match", "\"other\"")], 412, ""),
        ("GET", vec![("if-match", "W/\"v1\"")], 412, ""),
        ("GET", vec![("if-match", "not a tag")], 412, ""),
        ("HEAD", vec![("if-match", "\"other\"")], 412, ""),
        ("GET", vec![("if-unmodified-since", BEFORE)], 412, ""),
        ("GET", vec![("if-unmodified-since", AFTER)], 200, "v1"),
        ("GET", vec![("if-unmodified-since", "garbage")], 200, "v1"),
        // If-Match speaks: If-Unmodified-Since is not read.
        (
            "GET",
            vec![("if-match", "\"v1\""), ("if-unmodified-since", BEFORE)],
            200,
            "v1",
        ),
        ("GET", vec![("if-none-match", "\"v1\"")], 304, ""),
        ("GET", vec![("if-none-match", "W/\"v1\"")], 304, ""),
        ("GET", vec![("if-none-match", "*")], 304, ""),
        ("HEAD", vec![("if-none-match", "\"v1\"")], 304, ""),
        ("GET", vec![("if-none-match", "\"other\"")], 200, "v1"),
        // Step 1 before step 3.
        (
            "GET",
            vec![("if-match", "\"other\""), ("if-none-match", "\"v1\"")],
            412,
            "",
        ),
        (
            "GET",
            vec![("if-match", "\"v1\""), ("if-none-match", "\"v1\"")],
            304,
            "",
        ),
        // If-None-Match speaks: If-Modified-Since is not read.
        (
            "GET",
            vec![("if-none-match", "\"other\""), ("if-modified-since", AFTER)],
            200,
            "v1",
        ),
        ("GET", vec![("if-modified-since", AFTER)], 304, ""),
        ("GET", vec![("if-modified-since", BEFORE)], 200, "v1"),
        (
            "GET",
            vec![
                ("if-unmodified-since", BEFORE),
                ("if-modified-since", AFTER),
            ],
            412,
            "",
        ),
        (
            "GET",
            vec![("range", "bytes=0-0"), ("if-range", "\"v1\"")],
            206,
            "v",
        ),
        (
            "GET",
            vec![("range", "bytes=0-0"), ("if-range", "\"old\"")],
            200,
            "v1",
        ),
        (
            "GET",
            vec![("range", "bytes=0-0"), ("if-range", "W/\"v1\"")],
            200,
            "v1",
        ),
        (
            "GET",
            vec![("range", "bytes=0-0"), ("if-match", "\"other\"")],
            412,
            "",
        ),
    ]
}

fn check(answer: &Answer, method: &str, conditions: &[(&str, &str)], status: u16, body: &str) {
    assert_eq!(
        (answer.status.as_u16(), answer.text().as_str()),
        (status, if method == "HEAD" { "" } else { body }),
        "{method} {conditions:?}"
    );
    if status == 412 {
        for name in ["cache-control", "etag", "expires"] {
            assert!(!answer.headers.contains_key(name), "a 412 with {name}");
        }
    }
}

async fn preconditions_are_evaluated_against_the_stored_entry(backend: Backend) {
    let origin = Origin::default();
    let app = validated_app(&origin, backend, Duration::ZERO, false);
    assert_eq!(send(&app, asking("GET", &[])).await.text(), "v1");
    for (method, conditions, status, body) in cases() {
        let answer = send(&app, asking(method, &conditions)).await;
        check(&answer, method, &conditions, status, body);
    }
    assert_eq!(origin.calls(), 1, "every answer came from the entry");
}

#[tokio::test]
async fn preconditions_are_evaluated_against_the_stored_entry_embedded() {
    preconditions_are_evaluated_against_the_stored_entry(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn preconditions_are_evaluated_against_the_stored_entry_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    preconditions_are_evaluated_against_the_stored_entry(redis_backend(&redis).await).await;
}

/// Every case at once on a cold key: one origin call, and each request,
/// the one that started it too, gets its own answer from the one response.
async fn each_waiter_of_a_miss_gets_its_own_answer(backend: Backend) {
    let origin = Origin::default();
    let app = validated_app(&origin, backend, Duration::from_millis(200), false);
    let tasks: Vec<_> = cases()
        .into_iter()
        .map(|(method, conditions, status, body)| {
            let app = app.clone();
            tokio::spawn(async move {
                let answer = send(&app, asking(method, &conditions)).await;
                check(&answer, method, &conditions, status, body);
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a waiter got another's answer");
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_waiter_of_a_miss_gets_its_own_answer_embedded() {
    each_waiter_of_a_miss_gets_its_own_answer(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_waiter_of_a_miss_gets_its_own_answer_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    each_waiter_of_a_miss_gets_its_own_answer(redis_backend(&redis).await).await;
}

/// An answer the cache may not share (`private`) goes to the request that
/// asked, which the origin answered without its preconditions (the layer
/// asks for the whole representation): they are evaluated against it all
/// the same. Each case on a fresh key.
#[tokio::test]
async fn an_answer_for_one_request_still_honours_its_preconditions() {
    for (method, conditions, status, body) in cases() {
        let origin = Origin::default();
        let app = validated_app(&origin, Backend::local(), Duration::ZERO, true);
        let answer = send(&app, asking(method, &conditions)).await;
        // Not from an entry: no range is cut from it.
        let (status, body) = match status {
            206 => (200, "v1"),
            _ => (status, body),
        };
        check(&answer, method, &conditions, status, body);
        assert_eq!(origin.calls(), 1);
    }
}

/// A stored answer other than a 2xx ignores every precondition (RFC 9110
/// §13.2.1): a 404 stays a 404.
#[tokio::test]
async fn preconditions_leave_a_stored_404_alone() {
    let origin = Origin::default();
    let o = origin.clone();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = Router::new()
        .route(
            "/p",
            get(move || {
                let (n, _running) = o.enter();
                async move {
                    http::Response::builder()
                        .status(404)
                        .header("etag", "\"v1\"")
                        .header("cache-control", "max-age=600")
                        .body(Body::from(format!("gone{n}")))
                        .unwrap()
                }
            }),
        )
        .layer(guard);
    assert_eq!(send(&app, asking("GET", &[])).await.status, 404);
    for conditions in [
        &[("if-match", "\"other\"")][..],
        &[("if-none-match", "\"v1\"")][..],
        &[("if-unmodified-since", BEFORE)][..],
    ] {
        let answer = send(&app, asking("GET", conditions)).await;
        assert_eq!(
            (answer.status.as_u16(), answer.text().as_str()),
            (404, "gone1"),
            "{conditions:?}"
        );
    }
    assert_eq!(origin.calls(), 1);
}

/// `Cache-Status` says `stored` only of what is stored: across many
/// variants of one URL (some in a slot, some in a lane of their own that
/// is never stored), every answer that says `stored` is a hit when asked
/// again, and every one that does not is asked of the origin again.
async fn stored_is_said_only_of_what_is_stored(backend: Backend) {
    let origin = Origin::default();
    let o = origin.clone();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
    let app = Router::new()
        .route(
            "/v",
            get(move |headers: HeaderMap| {
                let (n, _running) = o.enter();
                let value = headers
                    .get("foo")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                async move { ([("vary", "foo")], format!("{value} #{n}")) }
            }),
        )
        .layer(guard);
    let with_foo = |value: &str| {
        Request::get("/v")
            .header("foo", value)
            .body(Body::empty())
            .unwrap()
    };
    let (mut said_stored, mut said_not) = (0, 0);
    for i in 0..120 {
        let value = format!("value-{i}");
        let first = send(&app, with_foo(&value)).await;
        let member = first
            .headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let stored = member.split(';').any(|p| p.trim() == "stored");
        let before = origin.calls();
        let again = send(&app, with_foo(&value)).await;
        assert!(again.text().starts_with(&format!("{value} #")));
        let hit = origin.calls() == before;
        assert_eq!(
            stored, hit,
            "{value}: first said {member:?}, asked again hit: {hit}"
        );
        match stored {
            true => said_stored += 1,
            false => said_not += 1,
        }
    }
    eprintln!(
        "120 variants: {said_stored} said stored (and were), {said_not} did not (and were not)"
    );
    assert!(said_not > 0, "no variant took a lane of its own");
}

#[tokio::test]
async fn stored_is_said_only_of_what_is_stored_embedded() {
    stored_is_said_only_of_what_is_stored(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn stored_is_said_only_of_what_is_stored_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    stored_is_said_only_of_what_is_stored(redis_backend(&redis).await).await;
}

/// A body coded more times than any request could be selected by is never
/// stored (nor said to be): each request asks the origin.
#[tokio::test]
async fn a_body_with_too_many_codings_is_never_stored() {
    let origin = Origin::default();
    let o = origin.clone();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = Router::new()
        .route(
            "/z",
            get(move || {
                let (n, _running) = o.enter();
                async move {
                    http::Response::builder()
                        .header("content-encoding", "gzip, br, zstd, deflate, gzip")
                        .body(Body::from(format!("z#{n}")))
                        .unwrap()
                }
            }),
        )
        .layer(guard);
    for n in 1..=3 {
        let answer = send(&app, accepting(Some("*"))).await;
        assert_eq!(answer.text(), format!("z#{n}"));
        let member = answer
            .headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(!member.contains("stored"), "{member}");
    }
}
