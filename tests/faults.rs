//! Redis failing, slow or gone never takes the service down: it degrades to
//! in-process protection and recovers when Redis does.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use common::redis::RedisServer;
use common::{get as get_req, send, Answer, Origin};
use stampede_guard::{Backend, StampedeGuard};

struct Instance {
    backend: Backend,
    app: Router,
}

async fn instance(
    redis: &RedisServer,
    origin: &Origin,
    delay: Duration,
    ttl: Duration,
) -> Instance {
    let backend = Backend::redis_builder(&redis.url())
        .deadline(Duration::from_millis(50))
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("redis backend");
    let origin = origin.clone();
    let app = Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(delay).await;
                format!("v{n}")
            }
        })
        .layer(StampedeGuard::new(backend.clone()).ttl(ttl)),
    );
    Instance { backend, app }
}

async fn fleet(
    redis: &RedisServer,
    origin: &Origin,
    delay: Duration,
    ttl: Duration,
) -> Vec<Instance> {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(instance(redis, origin, delay, ttl).await);
    }
    v
}

async fn burst(instances: &[Instance], n: usize, uri: &str) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = instances[i % instances.len()].app.clone();
            let uri = uri.to_owned();
            tokio::spawn(async move { send(&app, get_req(&uri)).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request"));
    }
    out
}

async fn wait_until_available(instances: &[Instance]) {
    for _ in 0..200 {
        if instances
            .iter()
            .all(|i| i.backend.stats().redis.is_some_and(|r| r.available))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the circuit did not close after Redis came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_then_restarted_redis_degrades_to_local_protection_and_recovers() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet(
        &redis,
        &origin,
        Duration::from_millis(20),
        Duration::from_millis(200),
    )
    .await;

    // Load before, during and after the outage: every request succeeds.
    let mut answers = Vec::new();
    for round in 0..6 {
        if round == 2 {
            redis.kill();
        }
        answers.extend(burst(&instances, 150, &format!("/report?k={}", round % 3)).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answers.iter().all(|a| a.status == 200),
        "no request failed while Redis was down"
    );
    assert!(
        instances
            .iter()
            .any(|i| !i.backend.stats().redis.unwrap().available),
        "the circuit opened"
    );
    // While Redis is down each instance still coalesces its own requests.
    let before = origin.calls();
    burst(&instances, 300, "/report?down").await;
    assert_eq!(
        origin.calls() - before,
        3,
        "one rebuild per instance, not a herd"
    );

    redis.restart();
    wait_until_available(&instances).await;
    // Fleet-wide protection is back: one rebuild for the whole fleet.
    let before = origin.calls();
    let answers = burst(&instances, 600, "/report?after").await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls() - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_costs_at_most_the_deadline() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet(
        &redis,
        &origin,
        Duration::from_millis(50),
        Duration::from_secs(60),
    )
    .await;
    redis.freeze();
    // Every request completes while Redis is still frozen: none waits on it
    // longer than the deadline (the harness bounds each with a generous
    // timeout only to turn a hang into a failure).
    let answers = tokio::time::timeout(Duration::from_secs(20), burst(&instances, 300, "/report"))
        .await
        .expect("requests finished while Redis was frozen");
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(
        origin.calls(),
        3,
        "each instance rebuilt once for its own requests"
    );
    let errors: u64 = instances
        .iter()
        .map(|i| i.backend.stats().redis.unwrap().errors)
        .sum();
    assert!(errors >= 3, "the frozen calls were cut off by the deadline");
    redis.thaw();
    wait_until_available(&instances).await;
}
