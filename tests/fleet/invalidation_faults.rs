//! Fleet promises under real faults: invalidation with the circuit open,
//! after the subscriber lost its connection, and against a rebuild that was
//! already running elsewhere.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::instance;
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Origin};
use stampede_guard::Backend;

async fn backend(redis: &RedisServer, probe: Duration) -> Backend {
    Backend::redis_builder(&redis.url())
        .deadline(Duration::from_millis(50))
        .probe_interval(probe)
        .connect()
        .await
        .expect("redis backend")
}

/// Fails this backend's Redis calls until its circuit opens, by freezing
/// Redis under a request; then lets Redis answer again.
async fn open_the_circuit(redis: &RedisServer, app: &axum::Router, backend: &Backend) {
    redis.freeze();
    for i in 0..20 {
        send(app, get_req(&format!("/report/trip{i}"))).await;
        if !backend.stats().redis.expect("redis tier").available {
            break;
        }
    }
    assert!(
        !backend.stats().redis.unwrap().available,
        "the circuit opened"
    );
    // The first probe runs at once, and fails against the frozen server;
    // the next is a probe interval away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_reaches_redis_while_the_circuit_is_open() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    // A probe far in the future: the circuit stays open for the whole test.
    let a_backend = backend(&redis, Duration::from_secs(60)).await;
    let a = instance(a_backend.clone(), &origin, Duration::ZERO, |g| {
        g.ttl(Duration::from_secs(60))
    });
    let b = instance(
        backend(&redis, Duration::from_secs(60)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&b.app, get_req("/report")).await.text(), "v1");
    open_the_circuit(&redis, &a.app, &a_backend).await;

    a.guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis although the circuit is open");
    assert!(
        !a_backend.stats().redis.unwrap().available,
        "still open: the invalidation went past it"
    );
    let c = instance(
        backend(&redis, Duration::from_secs(60)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(Duration::from_secs(60)),
    );
    let after = send(&c.app, get_req("/report")).await;
    assert_ne!(after.text(), "v1", "Redis no longer holds the old value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_that_cannot_reach_redis_says_so() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(
        backend(&redis, Duration::from_secs(60)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&a.app, get_req("/report")).await.text(), "v1");
    redis.kill();
    let error = a
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect_err("Redis is gone");
    assert!(
        matches!(
            error.kind(),
            stampede_guard::ErrorKind::Unavailable | stampede_guard::ErrorKind::Timeout
        ),
        "{error}"
    );
    // This process dropped its own copy all the same.
    assert_eq!(send(&a.app, get_req("/report")).await.text(), "v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_under_idle_instances_their_copies_are_not_trusted() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(
        backend(&redis, Duration::from_millis(100)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(Duration::from_secs(60)),
    );
    let b = instance(
        backend(&redis, Duration::from_millis(100)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&a.app, get_req("/report")).await.text(), "v1");
    let cached = send(&b.app, get_req("/report")).await;
    assert_eq!((cached.text().as_str(), cached.x_cache()), ("v1", "HIT"));

    // Redis restarts empty while both instances are idle: B's subscriber is
    // gone, and whatever is invalidated before it is back is not heard.
    redis.restart();
    let mut b_answer = String::from("v1");
    for _ in 0..50 {
        if a.guard.invalidate(&get_req("/report")).await.is_ok() {
            b_answer = send(&b.app, get_req("/report")).await.text();
            if b_answer != "v1" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        b_answer, "v1",
        "B heard the invalidation, or dropped its copy once its subscription was back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_keys_is_reported_at_start_up() {
    let evicting =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let stats = backend(&evicting, Duration::from_millis(100)).await.stats();
    assert_eq!(
        stats.redis.unwrap().eviction_policy.as_deref(),
        Some("allkeys-lru")
    );
    let safe =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    let stats = backend(&safe, Duration::from_millis(100)).await.stats();
    assert_eq!(stats.redis.unwrap().eviction_policy, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_does_not_stretch_an_entrys_freshness() {
    use crate::common::proxy::Proxy;

    let redis = RedisServer::start();
    let origin = Origin::default();
    let ttl = Duration::from_millis(1000);
    let a = instance(
        backend(&redis, Duration::from_millis(100)).await,
        &origin,
        Duration::ZERO,
        |g| g.ttl(ttl),
    );
    // B reaches Redis through a link that can be frozen, with a deadline
    // long enough to wait out the freeze.
    let proxy = Proxy::start(redis.port()).await;
    let b_backend = Backend::redis_builder(&proxy.url())
        .deadline(Duration::from_secs(2))
        .connect()
        .await
        .expect("redis backend through the proxy");
    let b = instance(b_backend, &origin, Duration::ZERO, |g| g.ttl(ttl));

    let built = std::time::Instant::now();
    assert_eq!(send(&a.app, get_req("/report")).await.text(), "v1");
    // B asks while its replies are held: Redis answers at once ("fresh for
    // about a second"), the reply reaches B 600 ms later.
    proxy.freeze_replies();
    let asking = tokio::spawn({
        let app = b.app.clone();
        async move { send(&app, get_req("/report")).await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.thaw();
    let first = asking.await.unwrap();
    assert_eq!(first.text(), "v1");
    // Well after Redis's freshness ended (1 s after the build) but before a
    // freshness counted from the reply's arrival would (about 1.6 s), B
    // must not call its copy fresh.
    tokio::time::sleep_until((built + Duration::from_millis(1300)).into()).await;
    let later = send(&b.app, get_req("/report")).await;
    assert!(
        !(later.text() == "v1" && later.x_cache() == "HIT"),
        "B served v1 as fresh after Redis's freshness ended: {} {}",
        later.text(),
        later.x_cache()
    );
}
