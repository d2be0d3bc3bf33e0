//! Attacks on lease-based refresh-ahead, as an HTTP cache: what a
//! background refresh may store and serve (RFC 9111), what the request that
//! triggers it may leak, `Cache-Status` and `Age` while it runs, margins
//! that are huge, NaN or none, and a rebuild time measured wrongly. Counts
//! and behaviour only; no latency is asserted. The fleet's side is in
//! `tests/fleet/refresh_ahead.rs`.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::scripted::{traffic, Reply, Scripted};
use crate::common::{get as get_req, send, tally};
use http::{header, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

const TTL: Duration = Duration::from_millis(600);
const FLOOR: Duration = Duration::from_millis(200);

/// A refresh whose answer must not be shared (no-store, private, a 5xx)
/// is not stored: the entry it was refreshing keeps being served until it
/// expires, nothing cached carries the answer or its `Set-Cookie`.
#[tokio::test]
async fn a_refresh_answer_that_must_not_be_shared_is_neither_stored_nor_served() {
    for bad in [
        Reply::NoStore,
        Reply::Private,
        Reply::SetCookie,
        Reply::Unavailable,
    ] {
        let s = Scripted::new(Duration::from_millis(20));
        let guard = StampedeGuard::new(Backend::local())
            .ttl(TTL)
            .refresh_ahead(2.0, FLOOR);
        let app = s.app(&guard);
        let first = send(&app, get_req("/report")).await;
        assert_eq!(first.text(), "v1");
        s.set(bad);
        // Through the margin and past the expiry of v1.
        let answers = traffic(std::slice::from_ref(&app), TTL + FLOOR).await;
        assert!(s.calls() >= 2, "{bad:?}: the refresh ran");
        for a in &answers {
            let cached = a.x_cache() != "MISS";
            if cached && bad != Reply::SetCookie {
                assert_eq!(
                    a.text(),
                    "v1",
                    "{bad:?}: a cached answer ({}) is the refreshed entry",
                    a.x_cache()
                );
            }
            if cached {
                assert!(
                    a.headers.get(header::SET_COOKIE).is_none(),
                    "{bad:?}: a cached answer carries the origin's Set-Cookie"
                );
                assert_eq!(a.status, StatusCode::OK, "{bad:?}: a cached 5xx");
            }
        }
    }
}

/// Margins that are huge, from the multiple or the floor, neither panic
/// nor refresh on every request.
#[tokio::test]
async fn a_huge_multiple_or_floor_neither_panics_nor_refreshes_every_request() {
    for (multiple, floor) in [
        (f64::MAX, Duration::ZERO),
        (1e30, Duration::ZERO),
        (1.0, Duration::MAX),
        (f64::INFINITY, Duration::MAX),
    ] {
        let s = Scripted::new(Duration::from_millis(5));
        let guard = StampedeGuard::new(Backend::local())
            .ttl(TTL)
            .refresh_ahead(multiple, floor);
        let app = s.app(&guard);
        let mut answers = traffic(std::slice::from_ref(&app), Duration::from_millis(300)).await;
        // Concurrent hits on one entry: the second sees the try of the first.
        for _ in 0..5 {
            answers.extend(crate::common::burst(&app, 8, || get_req("/report")).await);
        }
        assert!(
            answers.iter().all(|a| a.status == StatusCode::OK),
            "({multiple}, {floor:?})"
        );
        // Each answer served from the cache; the origin is not asked once
        // per request.
        assert!(
            s.calls() <= answers.len() / 2,
            "({multiple}, {floor:?}): {} calls for {} requests",
            s.calls(),
            answers.len()
        );
    }
}

/// A first fill far slower than the rebuilds after it (a margin past the
/// ttl) costs one early refresh, not one per request: the next rebuild's
/// time sets the margin.
#[tokio::test]
async fn a_slow_first_fill_then_fast_rebuilds_settles_to_one_refresh_per_period() {
    let s = Scripted::new(Duration::from_millis(400));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .refresh_ahead(2.0, FLOOR);
    let app = s.app(&guard);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    s.delay(Duration::from_millis(20));
    let started = Instant::now();
    let answers = traffic(std::slice::from_ref(&app), Duration::from_secs(2)).await;
    let elapsed = started.elapsed();
    let most = 3 + (elapsed.as_secs_f64() / (TTL - FLOOR).as_secs_f64()).ceil() as usize;
    eprintln!(
        "{} calls for {} requests in {elapsed:?}",
        s.calls(),
        answers.len()
    );
    assert!(s.calls() <= most, "{} calls, at most {most}", s.calls());
    assert_eq!(tally(&answers, "MISS"), 0, "nobody waited for the origin");
}

/// A refresh whose answer newly varies on a request header is stored for
/// the variant of the request that triggered it, and never served to a
/// request of another variant.
#[tokio::test]
async fn a_refresh_that_starts_to_vary_serves_no_variant_to_another() {
    let s = Scripted::new(Duration::from_millis(20));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .refresh_ahead(2.0, FLOOR);
    let app = s.app(&guard);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    s.set(Reply::VaryLanguage);
    let started = Instant::now();
    let mut i = 0;
    let mut varied = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let language = ["fr", "en", "de"][i % 3];
        i += 1;
        let request = http::Request::get("/report")
            .header(header::ACCEPT_LANGUAGE, language)
            .body(axum::body::Body::empty())
            .unwrap();
        let a = send(&app, request).await;
        assert_eq!(a.status, StatusCode::OK);
        if a.headers.contains_key(header::VARY) {
            varied += 1;
            assert!(
                a.text().ends_with(&format!("-{language}")),
                "{language} was served {} ({})",
                a.text(),
                a.x_cache()
            );
        } else {
            assert_eq!(a.text(), "v1");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(varied > 0, "the varying answers were served");
}

/// The request that happens to trigger a refresh carries credentials or a
/// cookie: they must not end up in the entry every other request is served
/// (an authorized request is not answered from, nor refreshes, the shared
/// entry; a cookie is the origin's business, as on any fill, unless it
/// says `Vary: Cookie`, so only credentials are checked).
#[tokio::test]
async fn a_refresh_triggered_by_an_authorized_request_does_not_share_its_answer() {
    let s = Scripted::new(Duration::from_millis(20));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .refresh_ahead(2.0, FLOOR);
    let app = s.app(&guard);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    s.set(Reply::Personal);
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        // Mostly authorized requests, so that they are the ones that see
        // the entry enter its margin.
        let authorized = i % 4 != 3;
        i += 1;
        let mut request = http::Request::get("/report");
        if authorized {
            request = request.header(header::AUTHORIZATION, "Bearer alice");
        }
        let a = send(&app, request.body(axum::body::Body::empty()).unwrap()).await;
        assert_eq!(a.status, StatusCode::OK);
        if !authorized {
            assert!(
                !a.text().contains("alice"),
                "an anonymous request was served alice's answer ({})",
                a.x_cache()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// While a refresh runs, the entry's answers say what they are: a hit
/// (`x-cache` and the `Cache-Status` member agree), with a freshness left
/// of at least 0 and an `Age` within the ttl.
#[tokio::test]
async fn cache_status_and_age_stay_true_while_a_refresh_runs() {
    let ttl = Duration::from_secs(2);
    let s = Scripted::new(Duration::from_millis(20));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(ttl)
        .refresh_ahead(2.0, Duration::from_secs(1));
    let app = s.app(&guard);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    s.delay(Duration::from_millis(600));
    let answers = traffic(std::slice::from_ref(&app), Duration::from_millis(2500)).await;
    assert!(s.calls() >= 2, "the refresh ran");
    for a in &answers {
        assert_eq!(a.status, StatusCode::OK);
        let member = a
            .headers
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let age: u64 = a
            .headers
            .get(header::AGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if a.x_cache() == "HIT" {
            assert!(member.contains("; hit"), "a HIT says {member:?}");
            assert!(!member.contains("fwd="), "a HIT says {member:?}");
            let left = member
                .split("; ")
                .find_map(|p| p.strip_prefix("ttl="))
                .map(|n| n.parse::<i64>().expect("an integer ttl"));
            assert!(left.is_none_or(|n| n >= 0), "a fresh HIT says {member:?}");
            assert!(age <= ttl.as_secs(), "a fresh HIT is {age} s old");
        }
    }
}

/// A refresh whose body is over the route's cap is not stored: the entry it
/// was refreshing keeps being served while fresh, and no cached answer is
/// the oversized one.
#[tokio::test]
async fn a_refresh_body_over_the_cap_is_not_stored() {
    let s = Scripted::new(Duration::from_millis(20));
    let guard = StampedeGuard::new(Backend::local())
        .ttl(TTL)
        .max_body_bytes(16 * 1024)
        .refresh_ahead(2.0, FLOOR);
    let app = s.app(&guard);
    assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    s.set(Reply::Huge);
    let answers = traffic(std::slice::from_ref(&app), TTL + FLOOR).await;
    assert!(s.calls() >= 2, "the refresh ran");
    for a in &answers {
        assert_eq!(a.status, StatusCode::OK);
        if a.x_cache() != "MISS" {
            assert_eq!(
                a.text(),
                "v1",
                "a cached answer ({}) is oversized",
                a.x_cache()
            );
        }
    }
}

/// A multiple that is NaN or negative, with no floor, is a margin of 0:
/// no refresh ahead at all, and nothing breaks (the key is rebuilt on
/// expiry, once per ttl).
#[tokio::test]
async fn a_nan_or_negative_multiple_with_no_floor_refreshes_nothing_early() {
    for multiple in [f64::NAN, -1.0, 0.0] {
        let s = Scripted::new(Duration::from_millis(5));
        let guard = StampedeGuard::new(Backend::local())
            .ttl(TTL)
            .refresh_ahead(multiple, Duration::ZERO);
        let app = s.app(&guard);
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
        let answers = traffic(std::slice::from_ref(&app), Duration::from_millis(400)).await;
        assert_eq!(s.calls(), 1, "{multiple}: nothing refreshed ahead");
        assert!(answers
            .iter()
            .all(|a| a.text() == "v1" && a.x_cache() == "HIT"));
    }
}
