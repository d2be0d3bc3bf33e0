//! The `Date` of what the layer forwards and stores (RFC 9110 §6.6.1): an
//! origin answer without a valid one gets the time it was received, once;
//! the stored copy keeps it, so hits (HEAD, `304`, ranges, another
//! instance's) show that date, never the time of the hit; a `304` that
//! renews an entry brings its own (RFC 9111 §4.3.4).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::{send, Answer};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{CACHE_CONTROL, DATE, ETAG, IF_NONE_MATCH, IF_RANGE, LAST_MODIFIED, RANGE};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

fn date_of(answer: &Answer) -> String {
    let lines: Vec<_> = answer.headers.get_all(DATE).iter().collect();
    assert_eq!(lines.len(), 1, "one Date line: {:?}", answer.headers);
    let text = lines[0].to_str().expect("ascii").to_owned();
    httpdate::parse_http_date(&text).expect("a valid HTTP-date");
    text
}

/// Waits until the clock's HTTP-date is at least two seconds past `date`:
/// a date stamped from now would differ from it.
async fn until_two_seconds_after(date: &str) {
    let date = httpdate::parse_http_date(date).expect("a date");
    for _ in 0..600 {
        if SystemTime::now() >= date + Duration::from_secs(2) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the clock did not move past {date:?}");
}

fn request(method: Method, headers: &[(http::HeaderName, &str)]) -> Request<Body> {
    let mut r = Request::builder().method(method).uri("/doc");
    for (name, value) in headers {
        r = r.header(name, *value);
    }
    r.body(Body::empty()).unwrap()
}

/// `/doc`: `the body` with `headers` (made per call), counted.
fn app<F>(calls: &Arc<AtomicUsize>, guard: StampedeGuard, headers: F) -> Router
where
    F: Fn(usize) -> Vec<(http::HeaderName, HeaderValue)> + Clone + Send + Sync + 'static,
{
    let calls = calls.clone();
    let handler = move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut map = HeaderMap::new();
        for (name, value) in headers(n) {
            map.append(name, value);
        }
        async move { (map, "the body").into_response() }
    };
    Router::new().route("/doc", get(handler).layer(guard))
}

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60))
}

/// An answer without `Date` is dated when it arrives; every later answer
/// from the entry (GET, HEAD, a `304`, a range) carries that same date.
#[tokio::test]
async fn an_answer_without_a_date_keeps_the_one_it_was_received_at() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls, guard(), |_| {
        vec![(ETAG, HeaderValue::from_static("\"d1\""))]
    });
    let miss = send(&app, request(Method::GET, &[])).await;
    let received = date_of(&miss);
    until_two_seconds_after(&received).await;
    let hit = send(&app, request(Method::GET, &[])).await;
    let head = send(&app, request(Method::HEAD, &[])).await;
    let not_modified = send(&app, request(Method::GET, &[(IF_NONE_MATCH, "\"d1\"")])).await;
    let range = send(&app, request(Method::GET, &[(RANGE, "bytes=0-2")])).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "all from the entry");
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    assert_eq!(range.status, StatusCode::PARTIAL_CONTENT);
    for (what, answer) in [
        ("hit", &hit),
        ("HEAD", &head),
        ("304", &not_modified),
        ("206", &range),
    ] {
        assert_eq!(date_of(answer), received, "{what}");
    }
}

/// An invalid `Date` (or two) is replaced by the time the answer arrived:
/// no cache downstream reads an age from it.
#[tokio::test]
async fn an_invalid_date_is_replaced_by_the_time_it_was_received() {
    for lines in [
        &["yesterday"][..],
        &[
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Mon, 07 Nov 1994 08:49:37 GMT",
        ],
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(&calls, guard().respect_cache_control(true), move |_| {
            let mut h = vec![(CACHE_CONTROL, HeaderValue::from_static("max-age=60"))];
            h.extend(lines.iter().map(|l| (DATE, HeaderValue::from_static(l))));
            h
        });
        let miss = send(&app, request(Method::GET, &[])).await;
        let received = date_of(&miss);
        assert!(!lines.contains(&received.as_str()), "{lines:?}");
        let hit = send(&app, request(Method::GET, &[])).await;
        assert_eq!(date_of(&hit), received, "{lines:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{lines:?}: stored as fresh"
        );
    }
}

/// A valid `Date` is the origin's, kept as sent, in any of the three forms
/// (one in the future gives no apparent age: the answer is stored fresh).
#[tokio::test]
async fn a_valid_date_is_kept_as_sent() {
    for sent in [
        "Sun, 06 Nov 2061 08:49:37 GMT",
        "Sunday, 06-Nov-61 08:49:37 GMT",
        "Sun Nov  6 08:49:37 2061",
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(&calls, guard(), move |_| {
            vec![(DATE, HeaderValue::from_static(sent))]
        });
        let miss = send(&app, request(Method::GET, &[])).await;
        let hit = send(&app, request(Method::GET, &[])).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{sent}");
        for answer in [&miss, &hit] {
            assert_eq!(date_of(answer), sent);
        }
    }
}

/// RFC 9110 §13.1.5 and §8.8.2.2: an `If-Range` date holds when it is the
/// stored `Last-Modified` and that is at least 60 s before the stored
/// `Date`: an origin that sends no `Date` still gets ranges for a
/// document modified an hour ago.
#[tokio::test]
async fn if_range_with_an_old_last_modified_gets_the_range_without_an_origin_date() {
    let modified = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(3600));
    let calls = Arc::new(AtomicUsize::new(0));
    let sent = HeaderValue::from_str(&modified).unwrap();
    let app = app(&calls, guard(), move |_| {
        vec![(LAST_MODIFIED, sent.clone())]
    });
    send(&app, request(Method::GET, &[])).await;
    let answer = send(
        &app,
        request(
            Method::GET,
            &[(RANGE, "bytes=0-2"), (IF_RANGE, modified.as_str())],
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(answer.text(), "the");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A `304` renews the entry's `Date` (RFC 9111 §4.3.4): its own when it
/// sends one, else the time it arrived; the renewed entry's hits show it.
#[tokio::test]
async fn a_304_renews_the_date() {
    for sent in [None, Some("Sun, 06 Nov 1994 08:49:37 GMT")] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let handler = move |headers: HeaderMap| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let mut out = HeaderMap::new();
                out.insert(ETAG, HeaderValue::from_static("\"r1\""));
                match headers.contains_key(IF_NONE_MATCH) {
                    true => {
                        if let Some(sent) = sent {
                            out.insert(DATE, HeaderValue::from_static(sent));
                        }
                        (StatusCode::NOT_MODIFIED, out).into_response()
                    }
                    false => (out, format!("v{n}")).into_response(),
                }
            }
        };
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_millis(100));
        let app = Router::new().route("/doc", get(handler).layer(guard));
        let first = send(&app, request(Method::GET, &[])).await;
        let first_date = date_of(&first);
        until_two_seconds_after(&first_date).await;
        let renewed = send(&app, request(Method::GET, &[])).await;
        assert_eq!(renewed.text(), "v1", "{sent:?}: renewed, not replaced");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{sent:?}");
        let renewed_date = date_of(&renewed);
        match sent {
            Some(sent) => assert_eq!(renewed_date, sent),
            None => assert!(
                httpdate::parse_http_date(&renewed_date).unwrap()
                    > httpdate::parse_http_date(&first_date).unwrap(),
                "{renewed_date} is not after {first_date}"
            ),
        }
    }
}

/// A response that passes the cache is forwarded with a `Date` too.
#[tokio::test]
async fn a_passed_answer_is_forwarded_with_a_date() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls, guard(), |_| {
        vec![(CACHE_CONTROL, HeaderValue::from_static("no-store"))]
    });
    let passed = send(&app, request(Method::GET, &[])).await;
    date_of(&passed);
    let post = Request::post("/doc").body(Body::empty()).unwrap();
    let unsafe_answer = send(&app, post).await;
    assert_eq!(unsafe_answer.status, StatusCode::METHOD_NOT_ALLOWED);
    date_of(&unsafe_answer);
    let private = request(Method::GET, &[(http::header::AUTHORIZATION, "Bearer x")]);
    date_of(&send(&app, private).await);
}

/// The layer's own answers are dated too (RFC 9110 §6.6.1 asks it of every
/// 4xx): a `412` from an entry or from an answer it could not share, and a
/// waiter's timeout answer.
#[tokio::test]
async fn the_layers_own_answers_are_dated() {
    for cache_control in ["max-age=60", "no-store"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(&calls, guard(), move |_| {
            vec![
                (ETAG, HeaderValue::from_static("\"d1\"")),
                (CACHE_CONTROL, HeaderValue::from_static(cache_control)),
            ]
        });
        send(&app, request(Method::GET, &[])).await;
        let failed = send(
            &app,
            request(Method::GET, &[(http::header::IF_MATCH, "\"other\"")]),
        )
        .await;
        assert_eq!(
            failed.status,
            StatusCode::PRECONDITION_FAILED,
            "{cache_control}"
        );
        date_of(&failed);
    }

    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (g, c) = (gate.clone(), calls.clone());
    let guard = StampedeGuard::new(Backend::local())
        .wait_budget(Duration::from_millis(50))
        .on_wait_timeout(stampede_guard::WaitTimeout::Respond(
            StatusCode::TOO_MANY_REQUESTS,
        ));
    let app = Router::new().route(
        "/doc",
        get(move || {
            let (gate, calls) = (g.clone(), c.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                "late"
            }
        })
        .layer(guard),
    );
    let a = app.clone();
    let starter = tokio::spawn(async move { send(&a, request(Method::GET, &[])).await });
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiter = send(&app, request(Method::GET, &[])).await;
    assert_eq!(waiter.status, StatusCode::TOO_MANY_REQUESTS);
    date_of(&waiter);
    gate.add_permits(1);
    date_of(&starter.await.unwrap());
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::redis::RedisServer;
    use crate::common::ROOMY_DEADLINE;

    async fn backend(redis: &RedisServer) -> Backend {
        Backend::redis_builder(&redis.url())
            .deadline(ROOMY_DEADLINE)
            .connect()
            .await
            .expect("redis backend")
    }

    /// Another instance reading the entry from Redis shows the date the
    /// first instance received it at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_instance_shows_the_date_the_first_one_received() {
        let redis = RedisServer::start();
        let calls = Arc::new(AtomicUsize::new(0));
        let first = app(
            &calls,
            StampedeGuard::new(backend(&redis).await).ttl(Duration::from_secs(60)),
            |_| Vec::new(),
        );
        let received = date_of(&send(&first, request(Method::GET, &[])).await);
        until_two_seconds_after(&received).await;
        let second = app(
            &calls,
            StampedeGuard::new(backend(&redis).await).ttl(Duration::from_secs(60)),
            |_| Vec::new(),
        );
        let hit = send(&second, request(Method::GET, &[])).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "from Redis");
        assert_eq!(date_of(&hit), received);
    }

    /// An entry stored without a `Date` (as older releases wrote them)
    /// still decodes and is served, dated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_entry_stored_without_a_date_is_served_dated() {
        let redis = RedisServer::start();
        let calls = Arc::new(AtomicUsize::new(0));
        let first = app(
            &calls,
            StampedeGuard::new(backend(&redis).await).ttl(Duration::from_secs(60)),
            |_| Vec::new(),
        );
        send(&first, request(Method::GET, &[])).await;
        // Renames the stored `date` field (same length: the entry still
        // parses), leaving an entry without one.
        let renamed = redis.raw(&[
            "EVAL",
            "local n = 0; for _, k in ipairs(redis.call('KEYS', '*:v')) do \
             local v = redis.call('GET', k); local i = string.find(v, '\\0\\4date', 1, true); \
             if i then redis.call('SET', k, string.sub(v, 1, i + 1) .. 'xate' .. string.sub(v, i + 6), 'KEEPTTL'); n = n + 1 end end; \
             return n",
            "0",
        ]);
        assert_eq!(renamed, ":1");
        let second = app(
            &calls,
            StampedeGuard::new(backend(&redis).await).ttl(Duration::from_secs(60)),
            |_| Vec::new(),
        );
        let hit = send(&second, request(Method::GET, &[])).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "from Redis");
        assert_eq!(
            hit.headers.get("xate").map(|_| ()),
            Some(()),
            "the entry read"
        );
        date_of(&hit);
    }
}
