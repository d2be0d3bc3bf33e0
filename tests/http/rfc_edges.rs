//! RFC 9111 attacks: numbers from headers (Age, Expires against Date),
//! Cache-Control spellings, conditional requests answered from the cache,
//! revalidation with a 304 that names another representation, waiters at
//! the end of their budget, and unsafe methods (relative and cross-host
//! locations, nested routers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::driver::{counted_app, slow_app};
use crate::common::{burst, get as get_req, local_guard, request_with, send, Answer, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{
    CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, SET_COOKIE,
};
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard, WaitTimeout};

fn date(t: SystemTime) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap()
}

/// `/report` answering `v<call>` with `headers` (made per call).
fn app_with<F>(origin: &Origin, guard: StampedeGuard, headers: F) -> Router
where
    F: Fn() -> Vec<(&'static str, HeaderValue)> + Clone + Send + Sync + 'static,
{
    counted_app(origin, guard, move |n| {
        let headers = headers();
        async move {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.append(k, v);
            }
            (map, format!("v{n}")).into_response()
        }
    })
}

// ---------------------------------------------------------------------------
// Numbers from headers.
// ---------------------------------------------------------------------------

/// RFC 9111 §1.2.2: a delta-seconds too large to represent is 2^31. An
/// `Age` past the lifetime makes the answer stale on arrival: not stored.
/// A larger one (past u64) must not be read as zero, i.e. as brand new.
#[tokio::test]
async fn an_age_too_large_to_parse_is_never_taken_for_zero() {
    for respect in [true, false] {
        for age in ["100", "18446744073709551616", "99999999999999999999999999"] {
            let origin = Origin::default();
            let app = app_with(
                &origin,
                local_guard().respect_cache_control(respect),
                move || {
                    vec![
                        ("cache-control", HeaderValue::from_static("max-age=60")),
                        ("age", HeaderValue::from_static(age)),
                    ]
                },
            );
            send(&app, get_req("/report")).await;
            let second = send(&app, get_req("/report")).await;
            assert_eq!(
                second.text(),
                "v2",
                "Age: {age} (respect {respect}) was stored as fresh ({})",
                second.x_cache()
            );
        }
    }
}

/// RFC 9111 §4.2.1 and §4.2.3: `Expires` minus `Date` is the lifetime, and
/// the age starts at `now - Date` (apparent age). An answer dated an hour
/// ago that expires in two seconds is fresh for two seconds, not an hour.
#[tokio::test]
async fn an_expires_counted_from_an_old_date_ends_when_it_says() {
    let origin = Origin::default();
    let app = app_with(&origin, local_guard().respect_cache_control(true), || {
        let now = SystemTime::now();
        vec![
            ("date", date(now - Duration::from_secs(3600))),
            ("expires", date(now + Duration::from_secs(2))),
        ]
    });
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let after = send(&app, get_req("/report")).await;
    assert_eq!(
        after.text(),
        "v2",
        "served past its Expires ({}, Age {:?})",
        after.x_cache(),
        after.headers.get("age")
    );
}

/// RFC 9111 §4.2.3: an `Age` counts from when the request was sent, not
/// from when the answer arrived. An answer that took two seconds to come
/// with `Age: 10` and `max-age=12` is stale on arrival: not stored.
#[tokio::test]
async fn an_age_counts_from_when_the_request_was_sent() {
    let origin = Origin::default();
    let app = counted_app(
        &origin,
        local_guard().respect_cache_control(true),
        |n| async move {
            tokio::time::sleep(Duration::from_millis(2100)).await;
            let mut map = HeaderMap::new();
            map.insert("cache-control", HeaderValue::from_static("max-age=12"));
            map.insert("age", HeaderValue::from_static("10"));
            (map, format!("v{n}")).into_response()
        },
    );
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    let second = send(&app, get_req("/report")).await;
    assert_eq!(
        (second.text().as_str(), origin.calls()),
        ("v2", 2),
        "stored as fresh ({}, Age {:?})",
        second.x_cache(),
        second.headers.get("age")
    );
}

/// RFC 9111 §5.3: with `max-age` (or, for a shared cache, `s-maxage`) the
/// `Expires` field is ignored, even an invalid or past one, whether the
/// route follows the origin's freshness or keeps its own.
#[tokio::test]
async fn max_age_and_s_maxage_silence_expires() {
    for respect in [true, false] {
        for cc in ["max-age=60", "s-maxage=60", "max-age=0, s-maxage=60"] {
            for expires in ["0", "Thu, 01 Jan 1970 00:00:00 GMT"] {
                let origin = Origin::default();
                let app = app_with(
                    &origin,
                    local_guard().respect_cache_control(respect),
                    move || {
                        vec![
                            ("cache-control", HeaderValue::from_static(cc)),
                            ("expires", HeaderValue::from_static(expires)),
                        ]
                    },
                );
                send(&app, get_req("/report")).await;
                let second = send(&app, get_req("/report")).await;
                assert_eq!(
                    (second.text().as_str(), origin.calls()),
                    ("v1", 1),
                    "{cc}, Expires: {expires} (respect {respect})"
                );
            }
        }
    }
}

/// Huge numbers anywhere never panic, and a huge max-age still stores.
#[tokio::test]
async fn huge_numbers_in_every_header_never_panic() {
    let origin = Origin::default();
    let app = app_with(&origin, local_guard().respect_cache_control(true), || {
        vec![
            (
                "cache-control",
                HeaderValue::from_static(
                    "max-age=99999999999999999999999, stale-while-revalidate=99999999999999999999, stale-if-error=18446744073709551615",
                ),
            ),
            ("expires", HeaderValue::from_static("Fri, 31 Dec 9999 23:59:59 GMT")),
            ("date", HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT")),
        ]
    });
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    let hit = send(&app, get_req("/report")).await;
    assert_eq!(hit.text(), "v1");
    assert_eq!(hit.x_cache(), "HIT");
    // And on the request side.
    let odd = request_with(
        "GET",
        "/report",
        &[
            ("if-modified-since", "Fri, 31 Dec 9999 23:59:59 GMT"),
            ("cache-control", "max-age=99999999999999999999999"),
            ("content-length", "00000000000000000000000000"),
        ],
    );
    // The stored Date (1970) is before the condition's date: a 304 is right.
    let answer = send(&app, odd).await;
    assert!(
        answer.status == StatusCode::OK || answer.status == StatusCode::NOT_MODIFIED,
        "{:?}",
        answer.status
    );
}

// ---------------------------------------------------------------------------
// Cache-Control spellings.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn per_user_answers_in_any_spelling_are_never_stored() {
    let spellings: [&[&[u8]]; 12] = [
        &[b"max-age=60", b"no-store"],
        &[b"max-age=60", b"PRIVATE"],
        &[b"public,,no-cache"],
        &[b"max-age=60 ,\tno-store"],
        &[b"no-cache=\"set-cookie\", no-cache, max-age=60"],
        &[b"private=\"x y\", max-age=60"],
        &[b"max-age=60;private"],
        &[b"max-age=60,private;x"],
        &[b"max-age=60, \"no-store\""],
        &[b"max-age=60, no-store=1"],
        &[b"max-age=60,  ", b"  ,no-cache  "],
        &[b"max-age=60, x=\"a\\\"b\", private"],
    ];
    for lines in spellings {
        let origin = Origin::default();
        let app = counted_app(
            &origin,
            local_guard()
                .respect_cache_control(true)
                .hit_for_miss(Duration::ZERO),
            move |n| async move {
                let mut map = HeaderMap::new();
                for line in lines {
                    map.append(CACHE_CONTROL, HeaderValue::from_bytes(line).unwrap());
                }
                (map, format!("v{n}")).into_response()
            },
        );
        send(&app, get_req("/report")).await;
        let second = send(&app, get_req("/report")).await;
        assert_eq!(second.text(), "v2", "{lines:?} was stored");
    }
}

/// s-maxage and proxy-revalidate, however written, forbid serving stale.
#[tokio::test]
async fn revalidation_directives_in_any_spelling_forbid_stale() {
    for line in [
        "max-age=1;proxy-revalidate",
        "S-MAXAGE=1",
        "max-age=1 must-revalidate",
        "stale-while-revalidate=60, s-maxage=1",
    ] {
        let origin = Origin::default();
        let app = app_with(
            &origin,
            local_guard()
                .respect_cache_control(true)
                .stale_while_revalidate(Duration::from_secs(60)),
            move || vec![("cache-control", HeaderValue::from_static(line))],
        );
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let after = send(&app, get_req("/report")).await;
        assert_ne!(after.x_cache(), "STALE", "{line}: served stale");
        assert_eq!(after.text(), "v2", "{line}");
    }
}

/// A request's `no-store`, however written, keeps its answer out (on a
/// route that follows request directives).
#[tokio::test]
async fn a_request_no_store_in_any_spelling_stores_nothing() {
    for line in ["NO-STORE", "max-age=0;no-store", "no-cache no-store"] {
        let origin = Origin::default();
        let guard = local_guard().respect_request_cache_control(true);
        let app = app_with(&origin, guard, Vec::new);
        let first = send(
            &app,
            request_with("GET", "/report", &[("cache-control", line)]),
        )
        .await;
        assert_eq!(first.x_cache(), "BYPASS", "{line}");
        assert_eq!(send(&app, get_req("/report")).await.text(), "v2", "{line}");
    }
}

// ---------------------------------------------------------------------------
// Conditional requests answered from the cache.
// ---------------------------------------------------------------------------

fn assert_304(a: &Answer, what: &str) {
    assert_eq!(a.status, StatusCode::NOT_MODIFIED, "{what}");
    assert!(a.body.is_empty(), "{what}: a 304 has no body");
    assert!(a.headers.get(CONTENT_TYPE).is_none(), "{what}");
    assert!(a.headers.get(SET_COOKIE).is_none(), "{what}");
    assert_eq!(a.headers[ETAG], "W/\"a,b\"", "{what}");
    assert_eq!(a.headers["vary"], "x-lang", "{what}");
    assert_eq!(a.headers[CACHE_CONTROL], "max-age=60", "{what}");
}

#[tokio::test]
async fn conditions_are_answered_from_the_cache_by_the_rfc() {
    let origin = Origin::default();
    let app = app_with(
        &origin,
        local_guard().vary([http::HeaderName::from_static("x-lang")]),
        || {
            vec![
                ("etag", HeaderValue::from_static("W/\"a,b\"")),
                (
                    "last-modified",
                    HeaderValue::from_static("Sun, 01 Nov 2026 00:00:00 GMT"),
                ),
                ("vary", HeaderValue::from_static("x-lang")),
                ("cache-control", HeaderValue::from_static("max-age=60")),
                ("content-type", HeaderValue::from_static("text/plain")),
            ]
        },
    );
    assert_eq!(send(&app, get_req("/report")).await.status, StatusCode::OK);
    for inm in [
        "\"a,b\"",
        "W/\"a,b\"",
        "\"x\", W/\"a,b\"",
        "*",
        " \"q\" ,, \"a,b\" ",
    ] {
        let a = send(
            &app,
            request_with("GET", "/report", &[("if-none-match", inm)]),
        )
        .await;
        assert_304(&a, inm);
        let head = Request::head("/report")
            .header(IF_NONE_MATCH, inm)
            .body(Body::empty())
            .unwrap();
        assert_304(&send(&app, head).await, inm);
    }
    for inm in [
        "\"a\"",
        "\"b\"",
        "a,b",
        "\"a,b",
        "W/\"a\", \"b\"",
        "*, \"a,b\"",
    ] {
        let a = send(
            &app,
            request_with("GET", "/report", &[("if-none-match", inm)]),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{inm}");
        assert_eq!(a.text(), "v1", "{inm}");
    }
    // If-Modified-Since: a later or equal date is a 304; an earlier one, a
    // list, or next to a non-matching If-None-Match, a 200.
    let a = send(
        &app,
        request_with(
            "GET",
            "/report",
            &[("if-modified-since", "Sun, 01 Nov 2026 00:00:00 GMT")],
        ),
    )
    .await;
    assert_304(&a, "ims equal");
    for (k, v) in [
        ("if-modified-since", "Sat, 31 Oct 2026 00:00:00 GMT"),
        (
            "if-modified-since",
            "Sun, 01 Nov 2026 00:00:00 GMT, Sun, 01 Nov 2026 00:00:00 GMT",
        ),
    ] {
        let a = send(&app, request_with("GET", "/report", &[(k, v)])).await;
        assert_eq!(a.status, StatusCode::OK, "{v}");
    }
    let a = send(
        &app,
        request_with(
            "GET",
            "/report",
            &[
                ("if-none-match", "\"zz\""),
                ("if-modified-since", "Mon, 02 Nov 2026 00:00:00 GMT"),
            ],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    // Another variant is not the client's: no 304 for it.
    let a = send(
        &app,
        request_with(
            "GET",
            "/report",
            &[("x-lang", "fr"), ("if-none-match", "*")],
        ),
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::NOT_MODIFIED,
        "a fresh miss answers its own 304"
    );
    assert_eq!(origin.calls(), 2);
}

// ---------------------------------------------------------------------------
// Revalidation: a 304 for another representation renews nothing.
// ---------------------------------------------------------------------------

/// The entry has only `Last-Modified`. The origin's representation has
/// changed (it now has `ETag: "v2"`), and a 304 arrives carrying that
/// strong validator: RFC 9111 §4.3.4 says no stored response has it, so
/// nothing is renewed. Renewing would attach `"v2"` to the old body, and the
/// cache would then tell a client that holds v2 that the old body is it.
#[tokio::test]
async fn a_304_with_a_strong_validator_the_entry_lacks_renews_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let handler = move |headers: HeaderMap| {
        let calls = c.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 1 {
                return ([(LAST_MODIFIED, "Sun, 01 Nov 2026 00:00:00 GMT")], "old").into_response();
            }
            if headers.contains_key(IF_MODIFIED_SINCE) || headers.contains_key(IF_NONE_MATCH) {
                return (StatusCode::NOT_MODIFIED, [(ETAG, "\"v2\"")]).into_response();
            }
            (
                [
                    (ETAG, "\"v2\""),
                    (LAST_MODIFIED, "Mon, 02 Nov 2026 00:00:00 GMT"),
                ],
                "new",
            )
                .into_response()
        }
    };
    let g = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(100))
        .stale_while_revalidate(Duration::from_secs(60));
    let app = Router::new().route("/doc", get(handler).layer(g));
    assert_eq!(send(&app, get_req("/doc")).await.text(), "old");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Stale: served, and refreshed in the background.
    send(&app, get_req("/doc")).await;
    for _ in 0..50 {
        if calls.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let a = send(&app, get_req("/doc")).await;
        if a.headers.get(ETAG).is_some_and(|t| t == "\"v2\"") {
            assert_eq!(
                a.text(),
                "new",
                "the old body was renewed under the new tag"
            );
        }
        let a = send(
            &app,
            request_with("GET", "/doc", &[("if-none-match", "\"v2\"")]),
        )
        .await;
        assert_ne!(
            (a.status, a.x_cache()),
            (StatusCode::NOT_MODIFIED, "HIT"),
            "a client holding v2 was told the old entry is v2"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

// ---------------------------------------------------------------------------
// Waiters at the end of their budget.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn waiters_whose_budget_ends_never_all_call_the_origin() {
    for on_timeout in [
        WaitTimeout::FailOpen,
        WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let origin = Origin::default();
        let finished = Arc::new(AtomicUsize::new(0));
        let app = slow_app(
            &origin,
            &finished,
            local_guard()
                .wait_budget(Duration::from_millis(100))
                .on_wait_timeout(on_timeout),
        );
        let answers = burst(&app, 20, || get_req("/report")).await;
        assert_eq!(
            origin.calls(),
            1,
            "{on_timeout:?}: a herd at the end of the wait"
        );
        assert!(answers
            .iter()
            .all(|a| a.text() == "v1" || a.status == StatusCode::SERVICE_UNAVAILABLE));
    }
}

/// An answer already older than its lifetime plus the stale windows (Age:
/// 1000 against max-age 60 and 60 s windows) is past every window on
/// arrival: it is never served stale afterwards, neither while revalidating
/// nor when the origin fails.
#[tokio::test]
async fn an_answer_older_than_its_windows_is_never_served_stale() {
    for respect in [true, false] {
        let origin = Origin::default();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = failing.clone();
        let app = counted_app(
            &origin,
            local_guard()
                .ttl(Duration::from_secs(60))
                .respect_cache_control(respect)
                .stale_while_revalidate(Duration::from_secs(60))
                .stale_if_error(Duration::from_secs(60)),
            move |n| {
                let failing = f.load(Ordering::SeqCst);
                async move {
                    if failing {
                        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
                    }
                    (
                        [
                            (
                                "cache-control",
                                "max-age=60, stale-while-revalidate=60, stale-if-error=60",
                            ),
                            ("age", "1000"),
                        ],
                        format!("v{n}"),
                    )
                        .into_response()
                }
            },
        );
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
        let second = send(&app, get_req("/report")).await;
        assert_ne!(
            second.x_cache(),
            "STALE",
            "respect {respect}: 940 s past freshness, served stale"
        );
        failing.store(true, Ordering::SeqCst);
        let failed = send(&app, get_req("/report")).await;
        assert_ne!(
            failed.x_cache(),
            "STALE",
            "respect {respect}: served stale-if-error"
        );
        assert!(
            !failed.text().starts_with('v'),
            "respect {respect}: {}",
            failed.text()
        );
    }
}
