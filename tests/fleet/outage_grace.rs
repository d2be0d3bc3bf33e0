//! A Redis outage under load: every instance keeps serving its in-process
//! tier and coalescing its own misses, for the outage grace past the
//! subscription lease; it rejoins the fleet when Redis is back. And the
//! case the grace is a bound for: one instance cut off from a Redis the
//! others still reach, while another invalidates.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::{
    backend_with_grace, fleet, fleet_burst, graced_instance, settled, wait_for_status, Instance,
};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
use stampede_guard::{StampedeGuard, Status};

/// Far more than any wait below needs: only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(30);

/// A grace far longer than the test runs, so what it shows does not
/// depend on how fast the machine is.
const LONG_GRACE: Duration = Duration::from_secs(600);

/// Keys warm before the outage.
const KEYS: usize = 20;

/// The backends' call deadline.
const DEADLINE: Duration = Duration::from_millis(500);

fn ttl(guard: StampedeGuard) -> StampedeGuard {
    guard.ttl(Duration::from_secs(60))
}

/// Every warm key, requested `per_key` times over the fleet at once.
async fn all_keys(instances: &[Instance], per_key: usize) {
    let mut answers = Vec::new();
    for k in 0..KEYS {
        answers.extend(fleet_burst(instances, per_key, || get(&format!("/report?k={k}"))).await);
    }
    assert!(
        answers.iter().all(|a| a.status == 200),
        "every request answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_costs_no_origin_call_for_warm_keys_within_the_grace() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let url = redis.url();
    let instances = fleet(
        2,
        &origin,
        Duration::from_millis(20),
        || backend_with_grace(&url, DEADLINE, LONG_GRACE),
        ttl,
    )
    .await;
    wait_for_status(&instances.iter().collect::<Vec<_>>(), Status::Fleet).await;
    all_keys(&instances, 4).await;
    assert_eq!(origin.calls(), KEYS, "one rebuild per key for the fleet");

    redis.kill();
    // Load until both instances know Redis is gone, then for longer than
    // the subscription lease (3 s) and its keepalives: the moments at
    // which the in-process tier used to be dropped.
    let refs: Vec<&Instance> = instances.iter().collect();
    let until = std::time::Instant::now() + LIMIT;
    while !refs
        .iter()
        .all(|i| i.backend.health().status == Status::Degraded)
    {
        assert!(std::time::Instant::now() < until, "the outage was noticed");
        all_keys(&instances, 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..25 {
        all_keys(&instances, 2).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        origin.calls(),
        KEYS,
        "warm keys served from each instance's in-process tier during the outage"
    );
    let subscription_live = refs.iter().any(|i| {
        i.backend
            .health()
            .redis
            .is_some_and(|r| r.subscription_live)
    });
    assert!(!subscription_live, "the subscription was seen to be lost");

    // A cold key: each instance coalesces its own misses.
    let before = origin.calls();
    let answers = fleet_burst(&instances, 100, || get("/report?cold")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls() - before, 2, "one rebuild per instance");

    // No invalidation can return `Ok` while Redis is gone: it fails (and is
    // kept, to be retried once Redis is back).
    let purge = tokio::time::timeout(LIMIT, instances[0].guard.invalidate(&get("/report?k=0")))
        .await
        .expect("no hang");
    assert!(purge.is_err(), "an invalidation during the outage fails");

    redis.restart();
    wait_for_status(&refs, Status::Fleet).await;
    // Rejoined: the in-process tier was dropped once (what was missed is
    // not served past the rejoin), and the fleet shares its rebuilds again.
    let before = origin.calls();
    all_keys(&instances, 4).await;
    assert!(
        origin.calls() - before <= KEYS,
        "at most one rebuild per key for the fleet after the rejoin, got {}",
        origin.calls() - before
    );
    let before = origin.calls();
    let answers = fleet_burst(&instances, 100, || get("/report?after")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls() - before, 1, "one rebuild for the fleet");
}

/// `b` reaches Redis through a link that freezes; `a` invalidates while
/// it is frozen. The invalidation returns `Ok` once `b`'s membership has
/// lapsed; with a grace, `b` still serves what it held (for at most the
/// lease plus the grace), and when its link is back it drops it.
async fn partitioned(grace: Duration) -> (String, String, String) {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = graced_instance(&redis.url(), grace, &origin, Duration::ZERO, ttl).await;
    let proxy = Proxy::start(redis.port()).await;
    let b = graced_instance(&proxy.url(), grace, &origin, Duration::ZERO, ttl).await;
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    assert_eq!(
        held,
        settled(&a, "/report").await,
        "one value for the fleet"
    );

    proxy.freeze();
    tokio::time::timeout(LIMIT, a.guard.invalidate(&get("/report")))
        .await
        .expect("no hang")
        .expect("the invalidation reached redis");
    let after_purge = send(&b.app, get("/report")).await;
    assert_eq!(after_purge.status, 200);

    proxy.thaw();
    wait_for_status(&[&b], Status::Fleet).await;
    let rejoined = send(&b.app, get("/report")).await;
    (held, after_purge.text(), rejoined.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_instance_serves_what_it_held_within_the_grace_and_drops_it_on_rejoin() {
    let (held, after_purge, rejoined) = partitioned(LONG_GRACE).await;
    assert_eq!(
        after_purge, held,
        "served from its in-process tier, within the grace"
    );
    assert_ne!(rejoined, held, "not served past the rejoin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_a_partitioned_instance_keeps_the_barrier() {
    let (held, after_purge, rejoined) = partitioned(Duration::ZERO).await;
    assert_ne!(
        after_purge, held,
        "nothing read before the purge once it returned"
    );
    assert_ne!(rejoined, held);
}
