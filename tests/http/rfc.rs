//! RFC 9111 and 9110 semantics as a cache-poisoning attacker or an RFC
//! reader would test them: Cache-Control that is not comma-separated or not
//! parseable, revalidation directives, Expires, a request's no-store, and
//! conditional requests. (The requests waiting on a rebuild: in
//! `http_rfc_waiters`.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::driver::{counted_app, headers_app};
use crate::common::{get as get_req, local_guard, request_with, send, tally, Answer, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

fn http_date(t: SystemTime) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap()
}

// ---------------------------------------------------------------------------
// 1. Cache-Control parsing fails safe.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn per_user_answers_with_loose_separators_are_never_stored() {
    let lines: [&[u8]; 8] = [
        b"private; max-age=600",
        b"max-age=600 private",
        b"max-age=600\tno-store",
        b"public;no-cache",
        b"max-age=600, Private",
        // Not a directive list at all: an open quote, garbage, bad UTF-8.
        b"max-age=600, private=\"x",
        b"max-age=600, <script>",
        b"max-age=600, \xff\xfe",
    ];
    for line in lines {
        for respect in [false, true] {
            let origin = Origin::default();
            let value = HeaderValue::from_bytes(line).unwrap();
            let app = headers_app(
                &origin,
                local_guard()
                    .respect_cache_control(respect)
                    .hit_for_miss(Duration::ZERO),
                vec![("cache-control", value)],
            );
            let a = send(&app, get_req("/report")).await;
            let b = send(&app, get_req("/report")).await;
            assert_eq!(
                (a.text().as_str(), b.text().as_str()),
                ("v1", "v2"),
                "{:?} (respect {respect}) must not be stored",
                String::from_utf8_lossy(line)
            );
            assert_eq!(origin.calls(), 2);
        }
    }
}

// ---------------------------------------------------------------------------
// 2. must-revalidate, proxy-revalidate, s-maxage: never stale.
// ---------------------------------------------------------------------------

const TTL: Duration = Duration::from_millis(200);

/// A route with generous stale windows whose origin sends `directive` and,
/// while `failing` is set, answers 500.
fn revalidating_app(origin: &Origin, failing: &Arc<AtomicBool>, directive: &'static str) -> Router {
    let failing = failing.clone();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .stale_while_revalidate(Duration::from_secs(60))
        .stale_if_error(Duration::from_secs(60));
    counted_app(origin, guard, move |n| {
        let failing = failing.clone();
        async move {
            if failing.load(Ordering::SeqCst) {
                return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
            }
            ([("cache-control", directive)], format!("v{n}")).into_response()
        }
    })
}

#[tokio::test]
async fn must_revalidate_forbids_stale_even_when_the_route_ignores_cache_control() {
    for directive in [
        "must-revalidate",
        "proxy-revalidate",
        "s-maxage=1",
        "public; must-revalidate",
    ] {
        let origin = Origin::default();
        let failing = Arc::new(AtomicBool::new(false));
        let app = revalidating_app(&origin, &failing, directive);
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        // After the ttl, nobody gets the old copy: a rebuild, shared.
        let answers = crate::common::burst(&app, 10, || get_req("/report")).await;
        assert_eq!(tally(&answers, "STALE"), 0, "{directive}");
        assert!(answers.iter().all(|a| a.text() == "v2"), "{directive}");
        // And an origin error after expiry is the failure, not the copy.
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        failing.store(true, Ordering::SeqCst);
        let answers = crate::common::burst(&app, 5, || get_req("/report")).await;
        for a in &answers {
            assert_ne!(a.x_cache(), "STALE", "{directive}");
            assert!(a.status.is_server_error(), "{directive}: {a:?}");
            assert_ne!(a.text(), "v2", "{directive}");
        }
    }
}

#[tokio::test]
async fn without_the_directive_the_same_route_serves_stale() {
    // The control for the test above: the windows do work.
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let app = revalidating_app(&origin, &failing, "public");
    send(&app, get_req("/report")).await;
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let a = send(&app, get_req("/report")).await;
    assert_eq!((a.x_cache(), a.text().as_str()), ("STALE", "v1"));
}

// ---------------------------------------------------------------------------
// 3. Expires.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn expires_sets_the_lifetime_and_a_past_one_is_never_stored() {
    let now = SystemTime::now();
    let respect = || {
        local_guard()
            .ttl(Duration::ZERO)
            .respect_cache_control(true)
    };
    // A future Expires with the origin's Date: stored for that long.
    let origin = Origin::default();
    let app = headers_app(
        &origin,
        respect(),
        vec![
            ("date", http_date(now)),
            ("expires", http_date(now + Duration::from_secs(3600))),
        ],
    );
    send(&app, get_req("/report")).await;
    assert_eq!(send(&app, get_req("/report")).await.x_cache(), "HIT");
    assert_eq!(origin.calls(), 1);

    // A lifetime counted from the origin's Date, not from arrival: an answer
    // dated an hour ago that expired half an hour ago is stale on arrival.
    let expired = vec![
        vec![("expires", HeaderValue::from_static("0"))],
        vec![(
            "expires",
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
        )],
        vec![("expires", http_date(now - Duration::from_secs(60)))],
        vec![
            ("date", http_date(now - Duration::from_secs(3600))),
            ("expires", http_date(now - Duration::from_secs(1800))),
        ],
    ];
    for headers in expired {
        for guard in [respect(), local_guard()] {
            let origin = Origin::default();
            let app = headers_app(&origin, guard.hit_for_miss(Duration::ZERO), headers.clone());
            let a = send(&app, get_req("/report")).await;
            let b = send(&app, get_req("/report")).await;
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(
                (a.text().as_str(), b.text().as_str()),
                ("v1", "v2"),
                "{headers:?}"
            );
        }
    }

    // max-age wins over Expires.
    let origin = Origin::default();
    let app = headers_app(
        &origin,
        respect(),
        vec![
            ("expires", HeaderValue::from_static("0")),
            ("cache-control", HeaderValue::from_static("max-age=3600")),
        ],
    );
    send(&app, get_req("/report")).await;
    assert_eq!(send(&app, get_req("/report")).await.x_cache(), "HIT");
}

// ---------------------------------------------------------------------------
// 4. A request's no-store, on a route that follows request directives.
// (The default, which does not: `request_directives`.)
// ---------------------------------------------------------------------------

fn following() -> StampedeGuard {
    local_guard().respect_request_cache_control(true)
}

#[tokio::test]
async fn a_request_with_no_store_is_answered_but_never_stored() {
    let origin = Origin::default();
    let app = headers_app(&origin, following(), vec![]);
    let a = send(
        &app,
        request_with("GET", "/report", &[("cache-control", "no-store")]),
    )
    .await;
    assert_eq!((a.x_cache(), a.text().as_str()), ("BYPASS", "v1"));
    let b = send(&app, get_req("/report")).await;
    assert_eq!((b.x_cache(), b.text().as_str()), ("MISS", "v2"));
    // no-cache, max-age=0 and Pragma: no-cache go to the origin on their
    // own, and leave the entry as it was.
    for (n, (name, value)) in [
        ("cache-control", "no-cache"),
        ("cache-control", "max-age=0"),
        ("pragma", "no-cache"),
    ]
    .into_iter()
    .enumerate()
    {
        let c = send(&app, request_with("GET", "/report", &[(name, value)])).await;
        let expected = format!("v{}", n + 3);
        assert_eq!((c.x_cache(), c.text()), ("BYPASS", expected), "{value}");
    }
    let d = send(&app, get_req("/report")).await;
    assert_eq!((d.x_cache(), d.text().as_str()), ("HIT", "v2"));
    assert_eq!(origin.calls(), 5);
}

#[tokio::test]
async fn a_no_store_request_neither_starves_nor_replaces_a_flight() {
    let origin = Origin::default();
    let app = counted_app(&origin, following(), |n| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("v{n}")
    });
    let waiters = crate::common::driver::spawn_requests(&app, 10);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lone = send(
        &app,
        request_with("GET", "/report", &[("cache-control", "no-store")]),
    )
    .await;
    assert_eq!((lone.x_cache(), lone.text().as_str()), ("BYPASS", "v2"));
    let texts = crate::common::driver::texts(waiters).await;
    assert!(texts.iter().all(|t| t == "v1"), "{texts:?}");
    let after = send(&app, get_req("/report")).await;
    assert_eq!((after.x_cache(), after.text().as_str()), ("HIT", "v1"));
    assert_eq!(origin.calls(), 2);
}

// ---------------------------------------------------------------------------
// 5. Conditional requests.
// ---------------------------------------------------------------------------

const LAST_MODIFIED: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

fn validated_app(origin: &Origin) -> Router {
    headers_app(
        origin,
        local_guard().vary([HeaderName::from_static("accept-language")]),
        vec![
            ("etag", HeaderValue::from_static("\"a,b\"")),
            ("last-modified", HeaderValue::from_static(LAST_MODIFIED)),
            ("cache-control", HeaderValue::from_static("public")),
            (
                "expires",
                HeaderValue::from_static("Fri, 31 Dec 9999 23:59:59 GMT"),
            ),
            ("vary", HeaderValue::from_static("accept-language")),
            // Made now: a `Date` of 1994 would make the answer 30 years old
            // on arrival (RFC 9111 §4.2.3), past any lifetime.
            ("date", http_date(SystemTime::now())),
            ("content-location", HeaderValue::from_static("/report.txt")),
            ("content-type", HeaderValue::from_static("text/plain")),
            ("x-debug", HeaderValue::from_static("origin")),
        ],
    )
}

fn assert_not_modified(a: &Answer, what: &str) {
    assert_eq!(a.status, StatusCode::NOT_MODIFIED, "{what}");
    assert!(a.body.is_empty(), "{what}");
    for name in [
        "etag",
        "cache-control",
        "expires",
        "vary",
        "date",
        "last-modified",
        "content-location",
    ] {
        assert!(a.headers.contains_key(name), "{what}: a 304 carries {name}");
    }
    for name in ["content-type", "x-debug"] {
        assert!(
            !a.headers.contains_key(name),
            "{what}: a 304 does not carry {name}"
        );
    }
    // If present, Content-Length is the 200's (RFC 9110 §8.6), never 0.
    assert_eq!(a.headers["content-length"], "2", "{what}");
    assert_eq!(a.headers["etag"], "\"a,b\"");
}

#[tokio::test]
async fn if_modified_since_is_answered_from_the_cache() {
    let origin = Origin::default();
    let app = validated_app(&origin);
    let first = send(
        &app,
        request_with("GET", "/report", &[("if-modified-since", LAST_MODIFIED)]),
    )
    .await;
    assert_not_modified(&first, "the request that filled the entry");
    let later = send(
        &app,
        request_with(
            "GET",
            "/report",
            &[("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT")],
        ),
    )
    .await;
    assert_not_modified(&later, "a later date");
    let head = Request::head("/report")
        .header("if-modified-since", LAST_MODIFIED)
        .body(Body::empty())
        .unwrap();
    assert_not_modified(&send(&app, head).await, "HEAD");
    for (what, headers) in [
        (
            "an earlier date",
            vec![("if-modified-since", "Sat, 05 Nov 1994 00:00:00 GMT")],
        ),
        ("an invalid date", vec![("if-modified-since", "yesterday")]),
        (
            "two dates",
            vec![
                ("if-modified-since", LAST_MODIFIED),
                ("if-modified-since", LAST_MODIFIED),
            ],
        ),
        // If-None-Match decides when both are sent (RFC 9110 §13.1.3).
        (
            "a non-matching tag",
            vec![
                ("if-none-match", "\"other\""),
                ("if-modified-since", LAST_MODIFIED),
            ],
        ),
    ] {
        let a = send(&app, request_with("GET", "/report", &headers)).await;
        assert_eq!(
            (a.status, a.text().as_str()),
            (StatusCode::OK, "v1"),
            "{what}"
        );
        assert_eq!(a.headers["content-length"], "2", "{what}");
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn if_none_match_copes_with_commas_in_tags_stars_and_weak_tags() {
    let origin = Origin::default();
    let app = validated_app(&origin);
    send(&app, get_req("/report")).await;
    for inm in ["\"a,b\"", "W/\"a,b\"", "\"x\", \"a,b\"", "*"] {
        let a = send(
            &app,
            request_with("GET", "/report", &[("if-none-match", inm)]),
        )
        .await;
        assert_not_modified(&a, inm);
    }
    // A naive split at commas would find `"a` or `b"`; a malformed list
    // never matches.
    for inm in ["\"a", "b\"", "\"a,b", "a,b", "\"a,b\" \"c\"", "*, \"a,b\""] {
        let a = send(
            &app,
            request_with("GET", "/report", &[("if-none-match", inm)]),
        )
        .await;
        assert_eq!(
            (a.status, a.text().as_str()),
            (StatusCode::OK, "v1"),
            "{inm}"
        );
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn an_answer_stale_on_arrival_is_shared_with_its_waiters_but_not_stored() {
    let origin = Origin::default();
    let app = counted_app(
        &origin,
        local_guard().respect_cache_control(true),
        |n| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            ([("cache-control", "max-age=0")], format!("v{n}"))
        },
    );
    let answers = crate::common::burst(&app, 10, || get_req("/report")).await;
    assert!(answers.iter().all(|a| a.text() == "v1"));
    assert_eq!(origin.calls(), 1);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v2");
}
