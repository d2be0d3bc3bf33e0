//! What an operator sees on a bad day: a Redis down from start-up, or
//! killed while the instance is idle, shows in the stats, the health, the
//! logs and the admin router's purge answers, from the first moment and
//! without traffic. States are polled under a limit only a hang reaches;
//! counts, not timings, are asserted.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::logs::Logs;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, Breaker, ErrorKind, RedisBackendBuilder, Status};
use tracing::Level;

/// Far more than any wait below needs: only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(30);

fn builder(url: &str) -> RedisBackendBuilder {
    Backend::redis_builder(url)
        .probe_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
        .deadline(Duration::from_secs(1))
}

/// A port nothing listens on: a server started and killed.
fn dead_port() -> RedisServer {
    let mut redis = RedisServer::start();
    redis.kill();
    redis
}

/// Polls `what` until it holds; panics past [`LIMIT`].
async fn until(what: &str, mut holds: impl FnMut() -> bool) {
    let limit = std::time::Instant::now() + LIMIT;
    while !holds() {
        assert!(std::time::Instant::now() < limit, "{what} within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_started_without_redis_has_redis_stats_from_construction() {
    let mut redis = dead_port();
    let backend = builder(&redis.url()).connect().await.expect("starts");
    let stats = backend
        .stats()
        .redis
        .expect("a Redis backend has Redis stats at once");
    assert_eq!(stats.address, format!("127.0.0.1:{}", redis.port()));
    assert!(!stats.connected && !stats.available, "{stats:?}");
    assert_eq!(stats.open_circuits, 1, "{stats:?}");
    assert_eq!(
        stats.circuit_openings, 1,
        "the start opened the circuit once"
    );
    assert_eq!(stats.outages, 1, "{stats:?}");
    assert!(
        stats.errors >= 1,
        "the failed attempt is counted: {stats:?}"
    );
    // More failed attempts in the background are counted as they come.
    let first = stats.errors;
    until("a background attempt counted", || {
        backend.stats().redis.expect("stats").errors > first
    })
    .await;
    let health = backend.health().redis.expect("a Redis backend");
    assert!(!health.connected && !health.reachable);

    redis.restart();
    until("the backend joined", || {
        backend.health().status == Status::Fleet
    })
    .await;
    let stats = backend.stats().redis.expect("stats");
    assert!(stats.connected && stats.available, "{stats:?}");
    assert_eq!(stats.open_circuits, 0, "{stats:?}");
    assert!(
        stats.circuit_openings >= 1 && stats.outages >= 1 && stats.errors > first,
        "what the start counted is kept: {stats:?}"
    );
}

/// Redis killed while nothing calls it: the supervisor finds the link
/// dropped and opens the circuit, so the health and the stats say so
/// without a request; a probe closes it once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_notices_that_redis_died() {
    let mut redis = RedisServer::start();
    let backend = builder(&redis.url()).connect().await.expect("connects");
    until("the backend is in the fleet", || {
        backend.health().status == Status::Fleet
    })
    .await;
    let before = backend.stats().redis.expect("stats");
    assert_eq!(before.circuit_openings, 0);

    redis.kill();
    until("the idle backend's circuit opened", || {
        let health = backend.health().redis.expect("a Redis backend");
        !health.reachable && matches!(health.breaker, Breaker::Open { circuits: 1 })
    })
    .await;
    let health = backend.health();
    assert_eq!(health.status, Status::Degraded);
    let state = health.redis.expect("a Redis backend");
    assert!(state.connected, "`connected` means it connected once");
    let stats = backend.stats().redis.expect("stats");
    assert!(!stats.available && stats.open_circuits == 1, "{stats:?}");
    assert_eq!(stats.circuit_openings, 1, "{stats:?}");
    assert!(stats.errors > before.errors, "{stats:?}");

    redis.restart();
    until("the backend is back in the fleet", || {
        backend.health().status == Status::Fleet
    })
    .await;
    let state = backend.health().redis.expect("a Redis backend");
    assert!(state.reachable && state.subscription_live && state.breaker == Breaker::Closed);
}

/// The start-up WARN and the outage lines name the Redis address, never
/// the password; a purge kept for Redis is logged with what was purged
/// (the URL, the tag) when it is kept and when it reaches Redis.
/// A current-thread runtime: every task runs on the thread that captures.
#[tokio::test]
async fn logs_name_the_redis_address_and_what_a_kept_purge_purged() {
    let (logs, _capturing) = Logs::capture();
    let mut redis = dead_port();
    let port = redis.port();
    let with_password = format!("redis://app:hunter2-secret@127.0.0.1:{port}/");
    let locked = builder(&with_password).connect().await.expect("starts");
    let start_up = logs.lines(Level::WARN, "redis cannot be reached at start-up");
    assert_eq!(start_up.len(), 1, "{:?}", logs.all());
    assert!(
        start_up[0].contains(&format!("redis=127.0.0.1:{port}")),
        "{start_up:?}"
    );
    drop(locked);

    let backend = builder(&redis.url()).connect().await.expect("starts");
    let guard = stampede_guard::StampedeGuard::new(backend.clone());
    let url = "https://shop.example/report?page=2";
    let purge = guard.invalidate_url(url).await.expect_err("not connected");
    assert!(purge.is_queued(), "{purge}");
    let tag = guard
        .invalidate_tag("spring-sale")
        .await
        .expect_err("not connected");
    assert!(tag.is_queued(), "{tag}");
    let kept = logs.lines(
        Level::WARN,
        "invalidation made before redis connected: kept",
    );
    assert!(
        kept.iter()
            .any(|l| l.contains(&format!("purged=url {url}"))),
        "{kept:?}"
    );
    assert!(
        kept.iter().any(|l| l.contains("purged=tag spring-sale")),
        "{kept:?}"
    );

    redis.restart();
    until("both kept purges reached redis", || {
        let reached = logs.lines(Level::INFO, "a pending invalidation reached redis");
        reached
            .iter()
            .any(|l| l.contains(&format!("purged=url {url}")))
            && reached.iter().any(|l| l.contains("purged=tag spring-sale"))
    })
    .await;
    until("the backend joined", || {
        backend.health().status == Status::Fleet
    })
    .await;

    redis.kill();
    until("the outage was logged", || {
        !logs.lines(Level::WARN, "redis unreachable").is_empty()
    })
    .await;
    let outage = logs.lines(Level::WARN, "redis unreachable");
    assert!(
        outage[0].contains(&format!("redis=127.0.0.1:{port}")),
        "{outage:?}"
    );
    let everything = format!("{:?}", logs.all());
    assert!(!everything.contains("hunter2"), "a password was logged");
}

/// A purge's error says whether it is kept: a URL's always (before the
/// join and during an outage), a tag's only before the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_error_says_whether_the_purge_is_kept() {
    let mut redis = dead_port();
    let backend = builder(&redis.url()).connect().await.expect("starts");
    let guard = stampede_guard::StampedeGuard::new(backend.clone());
    let url = guard
        .invalidate_url("https://shop.example/a")
        .await
        .expect_err("not connected");
    assert!(
        url.is_queued() && url.kind() == ErrorKind::Unavailable,
        "{url}"
    );
    let tag = guard.invalidate_tag("t").await.expect_err("not connected");
    assert!(tag.is_queued(), "{tag}");

    redis.restart();
    until("the backend joined", || {
        backend.health().status == Status::Fleet
    })
    .await;
    redis.kill();
    until("the circuit opened", || {
        !backend.health().redis.expect("redis").reachable
    })
    .await;
    let url = guard
        .invalidate_url("https://shop.example/b")
        .await
        .expect_err("redis is gone");
    assert!(
        url.is_queued(),
        "a URL's purge is kept during an outage: {url}"
    );
    let tag = guard.invalidate_tag("t").await.expect_err("redis is gone");
    assert!(
        !tag.is_queued(),
        "a tag's purge is not kept during an outage: {tag}"
    );
    let all = guard.invalidate_all().await.expect_err("redis is gone");
    assert!(!all.is_queued(), "{all}");
}

/// The admin router answers `202 Accepted` for a purge the backend kept to
/// make once Redis answers, `503` for one it did not keep.
#[cfg(feature = "admin")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_purges_answer_202_when_kept_and_503_when_not() {
    use axum::body::Body;
    use http::{Request, StatusCode};

    let purge = |path: &str, body: &str| {
        Request::post(format!("/admin{path}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let mut redis = dead_port();
    let backend = builder(&redis.url()).connect().await.expect("starts");
    let guard = stampede_guard::StampedeGuard::new(backend.clone());
    let app = axum::Router::new().nest("/admin", stampede_guard::Admin::new(guard).router());
    let url_body = r#"{"url":"https://shop.example/report"}"#;

    // Before the first connection every purge is kept.
    let answer = crate::common::send(&app, purge("/purge/url", url_body)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text());
    assert!(
        answer.text().contains(r#""queued":"url""#),
        "{}",
        answer.text()
    );
    let answer = crate::common::send(&app, purge("/purge/tag", r#"{"tag":"sale"}"#)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text());
    assert!(
        answer.text().contains(r#""queued":"tag""#),
        "{}",
        answer.text()
    );
    let stats = crate::common::send(
        &app,
        Request::get("/admin/stats").body(Body::empty()).unwrap(),
    )
    .await;
    assert!(
        stats.text().contains(r#""connected":false"#)
            && stats.text().contains(r#""open_circuits":1"#),
        "the stats name the outage, not null: {}",
        stats.text()
    );

    redis.restart();
    until("the backend joined", || {
        backend.health().status == Status::Fleet
    })
    .await;
    let answer = crate::common::send(&app, purge("/purge/all", "")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());

    redis.kill();
    until("the circuit opened", || {
        !backend.health().redis.expect("redis").reachable
    })
    .await;
    // During an outage a URL's purge is kept, a tag's is not.
    let answer = crate::common::send(&app, purge("/purge/url", url_body)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.text());
    let answer = crate::common::send(&app, purge("/purge/tag", r#"{"tag":"sale"}"#)).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.text()
    );
    assert!(
        answer.text().contains(r#""error":{"kind":"#),
        "{}",
        answer.text()
    );
}
