//! Attacks on lease-based refresh-ahead in a fleet on real Redis: a purge
//! or tag purge during a refresh, a failing origin and the fleet's failure
//! marker, Redis frozen, a refresh slower than the freshness left, and the
//! lease holder cut off mid-refresh. Counts and behaviour only; no latency
//! is asserted.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::fleet::{backend_at, keys_like};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::scripted::{traffic, until_calls, Reply, Scripted};
use crate::common::{get as get_req, send, tally};
use axum::Router;
use http::StatusCode;
use stampede_guard::StampedeGuard;

const TTL: Duration = Duration::from_millis(600);
const FLOOR: Duration = Duration::from_millis(200);

/// A purge during a refresh keeps its barrier: the refresh started before
/// the purge stores nothing, and once the purge returned, no instance
/// serves the purged entry or the refresh's pre-purge value.
#[tokio::test]
async fn a_purge_during_a_refresh_keeps_its_barrier_across_the_fleet() {
    purge_during_a_refresh(false).await;
}

/// A tag purge during a refresh keeps its barrier too: once
/// `invalidate_tag` returned, no instance serves the purged entry or the
/// value of the refresh begun before it.
#[tokio::test]
async fn a_tag_purge_during_a_refresh_keeps_its_barrier_across_the_fleet() {
    purge_during_a_refresh(true).await;
}

/// Two instances on one Redis refresh `/report` (tagged `reports`) slowly;
/// the second purges it (by URL, or by tag) while the first's refresh runs.
async fn purge_during_a_refresh(by_tag: bool) {
    let redis = RedisServer::start();
    let s = Scripted::new(Duration::from_millis(20));
    let mut guards = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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
    // The refresh is slow: it is still running when the purge returns.
    s.delay(Duration::from_millis(400));
    let before = until_calls(&s, &apps[0], 2).await;
    assert!(before.iter().all(|a| a.text() == "v1"));
    if by_tag {
        guards[1]
            .invalidate_tag("reports")
            .await
            .expect("invalidate_tag");
    } else {
        guards[1]
            .invalidate(&get_req("/report"))
            .await
            .expect("invalidate");
    }
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
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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
    let newcomer = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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
            let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
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

/// Redis pauses its writers (`CLIENT PAUSE WRITE`) through the refresh
/// margin and past the expiry: the lease and the commit stall, reads go on.
/// Requests keep being answered, and the origin is not stampeded.
#[tokio::test]
async fn redis_pausing_writes_through_the_margin_degrades_without_a_stampede() {
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
    tokio::time::sleep(TTL - FLOOR - Duration::from_millis(50)).await;
    assert_eq!(
        redis.raw(&["CLIENT", "PAUSE", "1000", "WRITE"]).trim(),
        "+OK"
    );
    let started = Instant::now();
    let answers = traffic(&apps, Duration::from_millis(1200)).await;
    let elapsed = started.elapsed();
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
