//! A service whose Redis is down (restarting, not there yet) when it starts
//! still starts: it answers with in-process protection, says so in its
//! health, and joins the fleet once Redis answers. A user who wants
//! fail-fast opts in; errors no retry can mend fail at start-up either way.
#![cfg(feature = "redis")]

use std::net::TcpListener;
use std::time::Duration;

use crate::common::fleet::{fleet_burst, instance, Instance};
use crate::common::redis::RedisServer;
use crate::common::{get, Origin};
use stampede_guard::{Backend, Breaker, ErrorKind, RedisBackendBuilder, Status};

/// Far more than any wait below needs: only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(30);

fn builder(url: &str) -> RedisBackendBuilder {
    Backend::redis_builder(url)
        .probe_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
}

fn ttl(guard: stampede_guard::StampedeGuard) -> stampede_guard::StampedeGuard {
    guard.ttl(Duration::from_secs(60))
}

/// Polls until every instance's health says it protects the fleet.
async fn wait_for_fleet(instances: &[&Instance]) {
    let until = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < until {
        if instances
            .iter()
            .all(|i| i.backend.health().status == Status::Fleet)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the backend did not join the fleet within {LIMIT:?}");
}

/// A port nothing listens on: a server started and killed.
fn dead_port() -> RedisServer {
    let mut redis = RedisServer::start();
    redis.kill();
    redis
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_started_without_redis_serves_locally_then_joins_the_fleet() {
    let mut redis = dead_port();
    let url = redis.url();
    let origin = Origin::default();
    let first = instance(
        builder(&url).connect().await.expect("starts without redis"),
        &origin,
        Duration::from_millis(100),
        ttl,
    );
    let health = first.backend.health();
    assert_eq!(health.status, Status::Degraded);
    let state = health.redis.expect("a redis backend");
    assert!(!state.connected && !state.reachable && !state.subscription_live);
    assert!(matches!(state.breaker, Breaker::Open { .. }));

    // No fleet-wide lock yet, and never a local one in its place.
    let lock = stampede_guard::Lock::new(first.backend.clone());
    let refused = lock.try_acquire("job").await.expect_err("no redis yet");
    assert!(matches!(refused, stampede_guard::LockError::Unavailable(_)));

    // Local protection: a burst on one key costs one origin call.
    let answers = fleet_burst(std::slice::from_ref(&first), 50, || get("/report?cold")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls(), 1, "one rebuild for 50 concurrent requests");

    redis.restart();
    wait_for_fleet(&[&first]).await;
    let state = first.backend.health().redis.expect("a redis backend");
    assert!(state.connected && state.reachable && state.subscription_live);
    assert_eq!(state.breaker, Breaker::Closed);
    let held = lock.try_acquire("job").await.expect("redis answers");
    assert!(held.is_some(), "the lock is taken in redis");
    drop(held);

    // Fleet coalescing is back: a second instance shares the first's
    // rebuild of a cold key.
    let second = instance(
        builder(&url).connect().await.expect("connects"),
        &origin,
        Duration::from_millis(100),
        ttl,
    );
    let both = [first, second];
    let before = origin.calls();
    let answers = fleet_burst(&both, 100, || get("/report?shared")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls() - before, 1, "one rebuild for the fleet");
}

/// Accepts connections and never answers, like a Redis frozen at start-up.
fn silent_listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    (listener, format!("redis://127.0.0.1:{port}/"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_accepts_and_never_answers_does_not_stop_the_start() {
    // The kernel completes the handshakes into the backlog: nothing is
    // ever read or answered.
    let (_listener, url) = silent_listener();
    let origin = Origin::default();
    let only = instance(
        builder(&url).connect().await.expect("starts anyway"),
        &origin,
        Duration::from_millis(100),
        ttl,
    );
    assert_eq!(only.backend.health().status, Status::Degraded);
    let answers = fleet_burst(std::slice::from_ref(&only), 30, || get("/report")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_is_an_opt_in() {
    let redis = dead_port();
    let refused = builder(&redis.url())
        .require_redis_at_start()
        .connect()
        .await
        .expect_err("no redis, fail-fast asked for");
    assert_eq!(refused.kind(), ErrorKind::Connect);

    let (_listener, url) = silent_listener();
    let silent = builder(&url)
        .require_redis_at_start()
        .connect()
        .await
        .expect_err("a silent redis, fail-fast asked for");
    assert_eq!(silent.kind(), ErrorKind::Timeout);

    let mut config = stampede_guard::RedisConfig::new(redis.url());
    config.require_redis_at_start = true;
    let from_config = Backend::from_config(config)
        .await
        .expect_err("fail-fast from the config");
    assert_eq!(from_config.kind(), ErrorKind::Connect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_no_retry_can_mend_still_fail_at_start_up() {
    let bad_url = Backend::redis("redis-nonsense://127.0.0.1:1")
        .await
        .expect_err("a malformed url");
    assert_eq!(bad_url.kind(), ErrorKind::InvalidConfig);

    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let url = format!("redis://:wrong@127.0.0.1:{}/", redis.port());
    let wrong = Backend::redis(&url).await.expect_err("a wrong password");
    assert_eq!(wrong.kind(), ErrorKind::Auth);
}
