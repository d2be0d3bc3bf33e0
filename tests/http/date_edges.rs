//! `Date` and `Age` at their edges (RFC 9110 §6.6.1, RFC 9111 §4.2.3):
//! an origin whose clock is off, a `Date` far in the future or the past,
//! repeated `Date` lines, the obsolete forms, an `Age` beside a `Date`, a
//! `304` older than the stored response. Counted as origin calls and read
//! from the answers' headers; no count depends on the wall clock (every
//! lifetime is minutes, every request made within a second).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::{send, Answer};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{AGE, DATE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

fn doc() -> Request<Body> {
    Request::get("/doc").body(Body::empty()).unwrap()
}

fn dates(answer: &Answer) -> Vec<String> {
    answer
        .headers
        .get_all(DATE)
        .iter()
        .map(|v| v.to_str().unwrap_or("?").to_owned())
        .collect()
}

/// `/doc` answering `headers` on every call, counted.
fn app(
    calls: &Arc<AtomicUsize>,
    guard: StampedeGuard,
    headers: Vec<(HeaderName, String)>,
) -> Router {
    let calls = calls.clone();
    let handler = move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut map = HeaderMap::new();
        for (name, value) in &headers {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        async move { (map, format!("v{n}")).into_response() }
    };
    Router::new().route("/doc", get(handler).layer(guard))
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// Three requests to a route with a 10-minute ttl, the origin sending
/// `headers`: how many origin calls, and the answers.
async fn three(guard: StampedeGuard, headers: Vec<(HeaderName, String)>) -> (usize, Vec<Answer>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls, guard, headers);
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(send(&app, doc()).await);
    }
    (calls.load(Ordering::SeqCst), answers)
}

fn route_ttl() -> StampedeGuard {
    StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600))
}

/// An origin whose clock runs a minute behind (a `Date` 60 s in the past)
/// with no `Cache-Control`, on a route with a 10-minute ttl: its answers
/// are stored for the route's ttl less that minute at most; the next two
/// requests are hits.
#[tokio::test]
async fn an_origin_clock_a_minute_behind_still_gets_the_routes_ttl() {
    let behind = http_date(SystemTime::now() - Duration::from_secs(60));
    let (calls, answers) = three(route_ttl(), vec![(DATE, behind.clone())]).await;
    assert_eq!(
        calls,
        1,
        "{:?}",
        answers.iter().map(Answer::x_cache).collect::<Vec<_>>()
    );
    for answer in &answers {
        assert_eq!(dates(answer), [behind.as_str()], "the origin's Date, kept");
    }
}

/// An origin whose clock runs an hour behind, on a route with a 10-minute
/// ttl: by RFC 9111 §4.2.3 its answers arrive an hour old (apparent age).
///
/// Measured: 3 origin calls for 3 sequential requests; nothing is served
/// from the cache while the origin's clock is more than the route's ttl
/// behind. The route's own ttl is judged against the age computed from the
/// origin's `Date` (`initial_age`, src/http/rfc/cache_control.rs:402-405,
/// `apparent` from `date_of`), so a skewed origin clock turns the whole
/// route into pass-through: one origin call per request (coalesced only
/// while one runs). RFC 9111 §4.2.3 allows the age; it is recorded here as
/// what an operator's `ttl` does not promise, not as a wrong answer.
#[tokio::test]
#[ignore = "an origin clock behind by more than the route's ttl makes the route store nothing (3 calls for 3 requests)"]
async fn an_origin_clock_an_hour_behind_costs_one_call_per_request() {
    let behind = http_date(SystemTime::now() - Duration::from_secs(3600));
    let (calls, answers) = three(route_ttl(), vec![(DATE, behind)]).await;
    assert_eq!(
        calls,
        1,
        "{:?}",
        answers.iter().map(Answer::x_cache).collect::<Vec<_>>()
    );
}

/// A `Date` far in the future (an origin clock years ahead) and one far in
/// the past (1970, 1900 is not an HTTP-date year the parser refuses): kept
/// as sent, each hit shows it, and a future `Date` does not make the entry
/// younger than zero (`Age` never negative, never huge).
#[tokio::test]
async fn dates_far_away_are_kept_and_age_stays_sane() {
    for date in [
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Thu, 01 Jan 2099 00:00:00 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
    ] {
        let guard = route_ttl();
        let (calls, answers) = three(guard, vec![(DATE, date.to_owned())]).await;
        for answer in &answers {
            assert_eq!(dates(answer), [date.to_owned()], "{date}");
            if let Some(age) = answer.headers.get(AGE) {
                let age: u64 = age.to_str().unwrap().parse().unwrap();
                assert!(age <= 2_147_483_648, "{date}: Age {age}");
            }
        }
        // A far-past Date makes every answer stale on arrival (RFC 9111
        // §4.2.3): the count is only checked for the future ones.
        if date.contains("99") {
            assert_eq!(calls, 1, "{date}: a future Date is age 0");
            assert_eq!(answers[2].headers.get(AGE).unwrap(), "0", "{date}");
        }
    }
}

/// Two `Date` lines, equal or not, and the obsolete forms: one valid
/// `Date` line in every answer, the same on the miss and the hits.
#[tokio::test]
async fn repeated_and_obsolete_dates_give_one_date_the_same_on_every_hit() {
    let now = SystemTime::now();
    let imf = http_date(now);
    let cases: Vec<Vec<(HeaderName, String)>> = vec![
        vec![(DATE, imf.clone()), (DATE, imf.clone())],
        vec![
            (DATE, imf.clone()),
            (DATE, http_date(now - Duration::from_secs(5))),
        ],
        vec![(DATE, "Sunday, 06-Nov-94 08:49:37 GMT".to_owned())],
        vec![(DATE, "Sun Nov  6 08:49:37 1994".to_owned())],
        vec![(
            DATE,
            "Sun, 06 Nov 1994 08:49:37 GMT, Mon, 07 Nov 1994 08:49:37 GMT".to_owned(),
        )],
        vec![(DATE, "yesterday".to_owned())],
        vec![(DATE, String::new())],
    ];
    for headers in cases {
        let (_, answers) = three(route_ttl(), headers.clone()).await;
        let first = dates(&answers[0]);
        assert_eq!(first.len(), 1, "{headers:?}: {first:?}");
        assert!(
            httpdate::parse_http_date(&first[0]).is_ok()
                || first[0].contains("-94")
                || first[0].starts_with("Sun Nov"),
            "{headers:?}: {first:?} is a date"
        );
        for answer in &answers[1..] {
            assert_eq!(
                dates(answer),
                first,
                "{headers:?}: the hit's Date is the miss's"
            );
        }
    }
}

/// An `Age` from the origin beside a current `Date`, on a route with a
/// 10-minute ttl: 30 s of age leave the entry fresh, its hits count on
/// from 30.
#[tokio::test]
async fn an_origin_age_beside_a_date_counts_from_it() {
    let headers = vec![(DATE, http_date(SystemTime::now())), (AGE, "30".to_owned())];
    let (calls, answers) = three(route_ttl(), headers).await;
    assert_eq!(calls, 1);
    for answer in &answers[1..] {
        let age: u64 = answer.headers[AGE].to_str().unwrap().parse().unwrap();
        assert!((30..600).contains(&age), "Age {age}");
    }
}

/// If-Modified-Since against an entry whose `Date` was stamped (the
/// origin sent none, nor `Last-Modified`): a client that has a copy from
/// before the entry was received gets the entry (200), never a 304.
#[tokio::test]
async fn if_modified_since_before_a_stamped_date_is_a_full_answer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls, route_ttl(), vec![]);
    let first = send(&app, doc()).await;
    let stamped = httpdate::parse_http_date(&dates(&first)[0]).unwrap();
    let before = http_date(stamped - Duration::from_secs(10));
    let answer = send(
        &app,
        Request::get("/doc")
            .header(IF_MODIFIED_SINCE, before)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.text(), "v1");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A `304` whose `Date` is an hour older than the stored response's (RFC
/// 9111 §4.3.4: its fields replace the stored ones) renews an entry of a
/// route with a 5 s ttl once it went stale; the three requests right after
/// the renewal are hits of the renewed entry, as they are when the `304`
/// carries the current time.
async fn requests_after_a_304_dated(offset: Duration) -> (usize, Vec<String>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move |headers: HeaderMap| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut out = HeaderMap::new();
            out.insert(ETAG, HeaderValue::from_static("\"r1\""));
            let date = http_date(SystemTime::now() - offset);
            match headers.contains_key(IF_NONE_MATCH) {
                true => {
                    out.insert(DATE, HeaderValue::from_str(&date).unwrap());
                    (StatusCode::NOT_MODIFIED, out).into_response()
                }
                false => (out, format!("v{n}")).into_response(),
            }
        }
    };
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(5));
    let app = Router::new().route("/doc", get(handler).layer(guard));
    assert_eq!(send(&app, doc()).await.text(), "v1");
    // Polled until the entry went stale and was renewed by one 304.
    for _ in 0..400 {
        if calls.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            send(&app, doc()).await.text(),
            "v1",
            "renewed, not replaced"
        );
    }
    let after = calls.load(Ordering::SeqCst);
    assert_eq!(after, 2);
    let mut states = Vec::new();
    for _ in 0..3 {
        let answer = send(&app, doc()).await;
        assert_eq!(dates(&answer).len(), 1);
        states.push(format!("{} {}", answer.x_cache(), answer.text()));
    }
    (calls.load(Ordering::SeqCst) - after, states)
}

#[tokio::test]
async fn a_current_304_renews_the_entry_for_the_routes_ttl() {
    let (revalidations, states) = requests_after_a_304_dated(Duration::ZERO).await;
    assert_eq!(revalidations, 0, "{states:?}");
}

/// Measured: after the renewal by a `304` dated an hour back, the next
/// request is a full, unconditional origin call (`MISS v3`, then `HIT v3`
/// twice: 1 origin call where 0 are promised, and the stored body
/// replaced). The renewal's age is the 304's own apparent age (`renew`,
/// src/http/revalidate.rs:96, through `initial_age`,
/// src/http/rfc/cache_control.rs:402-405), an hour, above the route's 5 s
/// ttl: the renewed entry is born expired and dropped with its
/// validators, so the next request cannot even revalidate. The same
/// entry renewed by a `304` with the current `Date` is kept (the test
/// above: 0 calls).
#[tokio::test]
#[ignore = "a 304 dated an hour back drops the renewed entry: the next request is a full origin call (1, not 0)"]
async fn a_304_older_than_the_stored_response_leaves_the_entry_renewed() {
    let (revalidations, states) = requests_after_a_304_dated(Duration::from_secs(3600)).await;
    assert_eq!(revalidations, 0, "{states:?}");
}
