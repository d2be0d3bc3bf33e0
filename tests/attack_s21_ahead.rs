//! Attacks on lease-based refresh-ahead: what a background refresh may
//! store and serve (RFC 9111), the barrier of a purge during a refresh, a
//! failing origin and a frozen Redis under a refreshing fleet, margins that
//! are huge, and a rebuild time measured wrongly. Counts and behaviour only;
//! no latency is asserted.
#![cfg(feature = "redis")]

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use common::fleet::{backend_at, keys_like};
use common::proxy::Proxy;
use common::redis::RedisServer;
use common::{get as get_req, send, tally, Answer, Origin};
use http::{header, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

const TTL: Duration = Duration::from_millis(600);
const FLOOR: Duration = Duration::from_millis(200);

/// What the origin answers from now on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reply {
    Good,
    NoStore,
    Private,
    SetCookie,
    Unavailable,
    /// A 200 whose body is 64 KiB.
    Huge,
    /// A 503 marked `no-store`.
    UnavailableNoStore,
    /// `Vary: Accept-Language`, the body naming the language asked for.
    VaryLanguage,
    /// A 200 whose body names the request's credentials and cookie, with
    /// no `Cache-Control` (an origin that trusts its shared cache).
    Personal,
}

/// An origin whose answer and delay the test changes as it goes.
#[derive(Clone)]
struct Scripted {
    origin: Origin,
    reply: Arc<Mutex<Reply>>,
    delay_ms: Arc<AtomicU64>,
    done: Arc<AtomicUsize>,
    /// When each origin call began.
    began: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    fn new(delay: Duration) -> Self {
        Scripted {
            origin: Origin::default(),
            reply: Arc::new(Mutex::new(Reply::Good)),
            delay_ms: Arc::new(AtomicU64::new(delay.as_millis() as u64)),
            done: Arc::new(AtomicUsize::new(0)),
            began: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn set(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.origin.calls()
    }

    /// Waits (bounded) until `n` origin calls have finished.
    async fn finished(&self, n: usize) {
        let started = Instant::now();
        while self.done.load(Ordering::SeqCst) < n {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{n} origin calls did not finish"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn app(&self, guard: &StampedeGuard) -> Router {
        let me = self.clone();
        let handler = move |headers: http::HeaderMap| {
            let me = me.clone();
            async move {
                let (n, _running) = me.origin.enter();
                me.began.lock().unwrap().push(Instant::now());
                let reply = *me.reply.lock().unwrap();
                let delay = me.delay_ms.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                me.done.fetch_add(1, Ordering::SeqCst);
                let language = headers
                    .get(header::ACCEPT_LANGUAGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                let who = |name: header::HeaderName| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let body = match reply {
                    Reply::VaryLanguage => format!("v{n}-{language}"),
                    Reply::Personal => {
                        format!("v{n}-{}{}", who(header::AUTHORIZATION), who(header::COOKIE))
                    }
                    _ => format!("v{n}"),
                };
                let response: Response = match reply {
                    Reply::Good | Reply::Personal => body.into_response(),
                    Reply::Huge => format!("{body}{}", "x".repeat(64 * 1024)).into_response(),
                    Reply::NoStore => ([(header::CACHE_CONTROL, "no-store")], body).into_response(),
                    Reply::Private => {
                        ([(header::CACHE_CONTROL, "private, max-age=60")], body).into_response()
                    }
                    Reply::SetCookie => {
                        ([(header::SET_COOKIE, "session=victim")], body).into_response()
                    }
                    Reply::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, body).into_response(),
                    Reply::UnavailableNoStore => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CACHE_CONTROL, "no-store")],
                        body,
                    )
                        .into_response(),
                    Reply::VaryLanguage => {
                        ([(header::VARY, "accept-language")], body).into_response()
                    }
                };
                response
            }
        };
        Router::new().route("/report", get(handler).layer(guard.clone()))
    }
}

/// Sequential requests every 10 ms for `span`.
async fn traffic(apps: &[Router], span: Duration) -> Vec<Answer> {
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut i = 0;
    while started.elapsed() < span {
        answers.push(send(&apps[i % apps.len()], get_req("/report")).await);
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    answers
}

/// Waits (bounded) until the origin was called `n` times, sending requests
/// to `app` meanwhile; the answers.
async fn until_calls(s: &Scripted, app: &Router, n: usize) -> Vec<Answer> {
    let started = Instant::now();
    let mut answers = Vec::new();
    while s.calls() < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the origin was not called {n} times"
        );
        answers.push(send(app, get_req("/report")).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    answers
}

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

/// A purge during a refresh keeps its barrier: the refresh started before
/// the purge stores nothing, and once the purge returned, no instance
/// serves the purged entry or the refresh's pre-purge value.
#[tokio::test]
async fn a_purge_during_a_refresh_keeps_its_barrier_across_the_fleet() {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(20));
    let mut guards = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
        guards.push(
            StampedeGuard::new(backend)
                .ttl(TTL)
                .refresh_ahead(2.0, FLOOR),
        );
    }
    let apps: Vec<Router> = guards.iter().map(|g| s.app(g)).collect();
    assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
    assert_eq!(send(&apps[1], get_req("/report")).await.text(), "v1");
    // The refresh is slow: it is still running when the purge returns.
    s.delay(Duration::from_millis(400));
    let before = until_calls(&s, &apps[0], 2).await;
    assert!(before.iter().all(|a| a.text() == "v1"));
    guards[1]
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidate");
    s.delay(Duration::from_millis(20));
    let mut after = Vec::new();
    for app in &apps {
        after.push(send(app, get_req("/report")).await);
    }
    s.finished(2).await;
    for app in &apps {
        after.push(send(app, get_req("/report")).await);
    }
    for a in &after {
        assert_ne!(a.text(), "v1", "the purged entry was served");
        assert_ne!(
            a.text(),
            "v2",
            "the refresh begun before the purge was served after it ({})",
            a.x_cache()
        );
    }
}

/// A failing origin during the refresh margin: each instance tries at most
/// once per half margin, so the fleet's calls are bounded by the instances
/// and the margin, not by the requests; every request before the expiry is
/// served the fresh entry.
#[tokio::test]
async fn a_failing_refresh_is_not_retried_by_every_request_in_the_fleet() {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(10));
    let ttl = Duration::from_millis(1500);
    let floor = Duration::from_millis(600);
    let mut apps = Vec::new();
    for _ in 0..3 {
        let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend)
            .ttl(ttl)
            .refresh_ahead(2.0, floor);
        apps.push(s.app(&guard));
    }
    let filled = Instant::now();
    assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
    s.set(Reply::Unavailable);
    // Up to the margin, then through most of it.
    tokio::time::sleep(ttl - floor).await;
    let started = Instant::now();
    let answers = traffic(&apps, floor / 2).await;
    let window = started.elapsed();
    let in_time = filled.elapsed() < ttl;
    let calls = s.calls() - 1;
    let began: Vec<_> = s.began.lock().unwrap()[1..]
        .iter()
        .map(|t| t.saturating_duration_since(started))
        .collect();
    eprintln!("failing refreshes began at {began:?}");
    eprintln!(
        "{calls} failing refreshes for {} requests in {window:?}",
        answers.len()
    );
    // Per instance: one try per half margin (300 ms) in the window, and one
    // more at its start.
    let half = floor / 2;
    let per_instance = 1 + (window.as_secs_f64() / half.as_secs_f64()).ceil() as usize;
    assert!(calls >= 1, "a refresh was tried");
    assert!(
        calls <= 3 * per_instance,
        "{calls} origin calls for {} requests: at most {} expected",
        answers.len(),
        3 * per_instance
    );
    if in_time {
        assert_eq!(tally(&answers, "HIT"), answers.len());
        assert!(answers.iter().all(|a| a.text() == "v1"));
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
            answers.extend(common::burst(&app, 8, || get_req("/report")).await);
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

/// Redis frozen during the refreshes: requests keep being answered, the
/// origin is not stampeded (each instance at most about once per period).
#[tokio::test]
async fn a_frozen_redis_during_refreshes_degrades_without_a_stampede() {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(20));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), Duration::from_millis(100)).await;
        let guard = StampedeGuard::new(backend)
            .ttl(TTL)
            .refresh_ahead(2.0, FLOOR);
        apps.push(s.app(&guard));
    }
    assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
    send(&apps[1], get_req("/report")).await;
    redis.freeze();
    let started = Instant::now();
    let answers = traffic(&apps, Duration::from_millis(1500)).await;
    let elapsed = started.elapsed();
    redis.thaw();
    assert!(answers.iter().all(|a| a.status == StatusCode::OK));
    let per_instance = 3 + (elapsed.as_secs_f64() / (TTL - FLOOR).as_secs_f64()).ceil() as usize;
    eprintln!(
        "{} calls for {} requests in {elapsed:?}",
        s.calls(),
        answers.len()
    );
    assert!(
        s.calls() <= 2 * per_instance,
        "{} calls, at most {}",
        s.calls(),
        2 * per_instance
    );
}

/// A refresh slower than the freshness left: once the entry expired, it is
/// not served as a fresh hit while the refresh runs, on any instance.
#[tokio::test]
async fn a_refresh_slower_than_the_freshness_left_never_serves_the_expired_entry_as_fresh() {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(20));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend)
            .ttl(TTL)
            .refresh_ahead(2.0, FLOOR);
        apps.push(s.app(&guard));
    }
    assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
    // v1 was stored before this instant: it is expired from `expired` on.
    let expired = Instant::now() + TTL;
    s.delay(Duration::from_millis(500));
    let started = Instant::now();
    let mut i = 0;
    let mut late = 0;
    while started.elapsed() < Duration::from_millis(1400) {
        let asked = Instant::now();
        let a = send(&apps[i % 2], get_req("/report")).await;
        i += 1;
        if asked > expired {
            late += 1;
            assert!(
                !(a.text() == "v1" && a.x_cache() == "HIT"),
                "the expired entry was served as a fresh hit during the refresh"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(late > 0, "traffic went past the expiry");
    s.finished(s.calls()).await;
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

/// The lease holder is cut off from Redis mid-refresh: the others keep
/// answering, one of them refreshes once the lease runs out, and the
/// holder's late commit, delivered when the link comes back, does not
/// overwrite the newer entry (fencing).
#[tokio::test]
async fn a_lease_holder_cut_off_mid_refresh_is_fenced_and_the_fleet_goes_on() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port()).await;
    let s = Scripted::new(Duration::from_millis(20));
    let configure = |g: StampedeGuard| {
        g.ttl(TTL)
            .refresh_ahead(2.0, FLOOR)
            .lease(Duration::from_millis(300))
    };
    let holder = configure(StampedeGuard::new(
        backend_at(&proxy.url(), Duration::from_millis(200)).await,
    ));
    let holder_app = s.app(&holder);
    let mut others = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
        others.push(s.app(&configure(StampedeGuard::new(backend))));
    }
    assert_eq!(send(&holder_app, get_req("/report")).await.text(), "v1");
    for app in &others {
        assert_eq!(send(app, get_req("/report")).await.text(), "v1");
    }
    // The holder starts the refresh (a slow one), then loses its link.
    s.delay(Duration::from_millis(400));
    until_calls(&s, &holder_app, 2).await;
    proxy.freeze();
    s.delay(Duration::from_millis(20));
    let answers = traffic(&others, Duration::from_millis(1200)).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::OK));
    assert!(
        answers.iter().any(|a| a.text() != "v1" && a.text() != "v2"),
        "the others refreshed once the holder's lease ran out"
    );
    s.finished(s.calls()).await;
    proxy.thaw();
    // Whatever the holder's late commit did, a newcomer reads no older
    // entry than the others' last refresh.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newest = answers.last().expect("answers").text();
    let newcomer = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
    let read = send(
        &s.app(&configure(StampedeGuard::new(newcomer))),
        get_req("/report"),
    )
    .await;
    assert_ne!(
        read.text(),
        "v2",
        "the cut-off holder's commit overwrote a newer entry"
    );
    let n = |t: &str| t.trim_start_matches('v').parse::<usize>().unwrap_or(0);
    assert!(
        n(&read.text()) >= n(&newest),
        "a newcomer read {} after the others served {newest}",
        read.text()
    );
    eprintln!("{} origin calls for {} answers", s.calls(), answers.len());
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

/// A refresh that fails with a server error, plain or `no-store`, leaves
/// the fleet's failure marker: while its backoff runs no other instance
/// calls the failing origin for the key (one call per backoff step for the
/// fleet, 250 ms doubling, not one per instance per half margin).
#[tokio::test]
async fn a_failed_refresh_backs_off_the_whole_fleet() {
    for bad in [Reply::Unavailable, Reply::UnavailableNoStore] {
        let redis = RedisServer::start();
        let s = Scripted::new(Duration::from_millis(10));
        let ttl = Duration::from_secs(3);
        let floor = Duration::from_millis(1500);
        let mut apps = Vec::new();
        for _ in 0..3 {
            let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
            let guard = StampedeGuard::new(backend)
                .ttl(ttl)
                .refresh_ahead(2.0, floor);
            apps.push(s.app(&guard));
        }
        assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
        s.set(bad);
        tokio::time::sleep(ttl - floor).await;
        let started = Instant::now();
        let answers = traffic(&apps, Duration::from_millis(1000)).await;
        let elapsed = started.elapsed();
        let calls = s.calls() - 1;
        let marker = keys_like(&redis, "*:x");
        eprintln!("{bad:?}: {calls} failing refreshes in {elapsed:?}, marker {marker:?}");
        assert!(calls >= 1, "{bad:?}: a refresh was tried");
        assert!(
            !marker.is_empty(),
            "{bad:?}: the failed refresh left no failure marker"
        );
        // One call, then one per backoff (250, 500 ms, ...) ended in time.
        let (mut most, mut spent, mut backoff) = (1, Duration::ZERO, Duration::from_millis(250));
        while spent + backoff <= elapsed {
            spent += backoff;
            backoff *= 2;
            most += 1;
        }
        assert!(
            calls <= most,
            "{bad:?}: {calls} failing calls, at most {most} for the fleet"
        );
        assert!(answers.iter().all(|a| a.status == StatusCode::OK));
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

/// A tag purge during a refresh keeps its barrier too: once
/// `invalidate_tag` returned, no instance serves the purged entry or the
/// value of the refresh begun before it.
#[tokio::test]
async fn a_tag_purge_during_a_refresh_keeps_its_barrier_across_the_fleet() {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(20));
    let mut guards = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), common::ROOMY_DEADLINE).await;
        guards.push(
            StampedeGuard::new(backend)
                .ttl(TTL)
                .refresh_ahead(2.0, FLOOR)
                .tags(|_| vec!["reports".to_owned()]),
        );
    }
    let apps: Vec<Router> = guards.iter().map(|g| s.app(g)).collect();
    assert_eq!(send(&apps[0], get_req("/report")).await.text(), "v1");
    assert_eq!(send(&apps[1], get_req("/report")).await.text(), "v1");
    s.delay(Duration::from_millis(400));
    until_calls(&s, &apps[0], 2).await;
    guards[1]
        .invalidate_tag("reports")
        .await
        .expect("invalidate_tag");
    s.delay(Duration::from_millis(20));
    let mut after = Vec::new();
    for app in &apps {
        after.push(send(app, get_req("/report")).await);
    }
    s.finished(2).await;
    for app in &apps {
        after.push(send(app, get_req("/report")).await);
    }
    for a in &after {
        assert_ne!(a.text(), "v1", "the purged entry was served");
        assert_ne!(
            a.text(),
            "v2",
            "the refresh begun before the tag purge was served after it ({})",
            a.x_cache()
        );
    }
}
