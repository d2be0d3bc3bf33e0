//! The invalidation barrier waits for every live instance of the fleet, not
//! only for the subscribers `PUBLISH` reached: an instance whose subscriber
//! Redis dropped, or whose link is frozen, is waited for (at most one
//! subscription lease), an instance that died without a word holds an
//! invalidation up one lease at most, one that shut down cleanly not at
//! all, and forged membership entries neither hang nor crash anything.
#![cfg(feature = "redis")]

use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use crate::common::cluster::Cluster;
use crate::common::fleet::{backend_at, fleet, fleet_on, members, settled, wait_until_available};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
#[cfg(feature = "redis-cluster")]
use stampede_guard::Backend;
use stampede_guard::StampedeGuard;

/// Far more than one subscription lease: only a hang reaches it.
const HANG: Duration = Duration::from_secs(30);

fn ttl(guard: StampedeGuard) -> StampedeGuard {
    guard.ttl(Duration::from_secs(60))
}

/// Adds `member` to the membership with a score `ahead_ms` past Redis's
/// clock (a raw score if `raw` is given).
fn forge(redis: &RedisServer, member_lua: &str, ahead_ms: i64, raw: Option<&str>) {
    let score = match raw {
        Some(raw) => format!("'{raw}'"),
        None => format!(
            "string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + {ahead_ms})"
        ),
    };
    let script = format!(
        "local t = redis.call('TIME') return redis.call('ZADD', KEYS[1], {score}, {member_lua})"
    );
    assert_eq!(redis.raw(&["EVAL", &script, "1", "sg:members"]), ":1");
}

/// Waits (bounded) until the membership has `n` members.
async fn members_become(redis: &RedisServer, n: usize) -> Vec<String> {
    for _ in 0..300 {
        let now = members(redis);
        if now.len() == n {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the membership did not reach {n}: {:?}", members(redis));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_is_a_member_from_the_start() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 3, &origin, ttl).await;
    let names = members(&redis);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names
        .iter()
        .all(|n| n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit())));
    drop(instances);
}

/// `invalidate` (one URL) while Redis has just dropped the other instance's
/// subscriber: `PUBLISH` does not count it, the barrier still waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_waits_for_an_instance_whose_subscriber_was_killed() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, ttl).await;
    for round in 0..3 {
        let held = settled(&instances[1], "/report").await;
        assert!(redis
            .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .starts_with(':'));
        instances[0]
            .guard
            .invalidate(&get("/report"))
            .await
            .unwrap();
        let after = send(&instances[1].app, get("/report")).await;
        assert_ne!(after.text(), held, "round {round}: {}", after.x_cache());
        wait_until_available(&instances, Duration::from_secs(10)).await;
        members_become(&redis, 2).await;
    }
}

/// The other instance's whole link to Redis frozen (its subscriber hears
/// nothing, its PONGs stop) during `invalidate_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_all_waits_for_an_instance_whose_link_is_frozen() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = fleet_on(&redis, 1, &origin, ttl).await.remove(0);
    let proxy = Proxy::start(redis.port()).await;
    let b = crate::common::fleet::instance(
        backend_at(&proxy.url(), Duration::from_millis(500)).await,
        &origin,
        Duration::ZERO,
        ttl,
    );
    let held = settled(&b, "/report").await;
    assert_eq!(members(&redis).len(), 2);
    proxy.freeze();
    tokio::time::timeout(HANG, a.guard.invalidate_all())
        .await
        .expect("no hang")
        .unwrap();
    let after = send(&b.app, get("/report")).await;
    assert_ne!(after.text(), held, "{}", after.x_cache());
    proxy.thaw();
}

#[derive(Clone, Copy, Debug)]
enum Purge {
    Url,
    Tag,
    All,
}

async fn purge(guard: &StampedeGuard, how: Purge) -> Result<(), stampede_guard::Error> {
    match how {
        Purge::Url => guard.invalidate(&get("/report")).await,
        // `/report` carries no tag: only the barrier itself is under test.
        Purge::Tag => guard.invalidate_tag("report").await,
        Purge::All => guard.invalidate_all().await,
    }
}

/// The sharpest case: Redis dropped the other instance's subscriber, and
/// that instance cannot tell yet (its link holds the close, as a stalled
/// network would). `PUBLISH` does not count it; it still trusts its L1 for
/// the rest of its lease. The purge waits for it all the same: once it
/// returns, that instance no longer serves what it held.
async fn waits_for_an_instance_that_does_not_know_redis_dropped_it(how: Purge) {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = fleet_on(&redis, 1, &origin, ttl).await.remove(0);
    let proxy = Proxy::start(redis.port()).await;
    let b = crate::common::fleet::instance(
        backend_at(&proxy.url(), Duration::from_millis(500)).await,
        &origin,
        Duration::ZERO,
        ttl,
    );
    let held = settled(&b, "/report").await;
    proxy.freeze_closes_too();
    assert!(redis
        .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .starts_with(':'));
    tokio::time::timeout(HANG, purge(&a.guard, how))
        .await
        .expect("no hang")
        .unwrap();
    if let Purge::Tag = how {
        // Nothing of b's is tagged `report`; what is under test is that the
        // purge waited: b's subscription lease has lapsed by now.
        let stats = b.backend.stats();
        let after = send(&b.app, get("/report")).await;
        assert_ne!(after.x_cache(), "HIT", "{stats:?}");
    } else {
        let after = send(&b.app, get("/report")).await;
        assert_ne!(after.text(), held, "{}", after.x_cache());
    }
    proxy.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_waits_for_an_instance_redis_dropped_unbeknown_to_it() {
    waits_for_an_instance_that_does_not_know_redis_dropped_it(Purge::Url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_tag_waits_for_an_instance_redis_dropped_unbeknown_to_it() {
    waits_for_an_instance_that_does_not_know_redis_dropped_it(Purge::Tag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_all_waits_for_an_instance_redis_dropped_unbeknown_to_it() {
    waits_for_an_instance_that_does_not_know_redis_dropped_it(Purge::All).await;
}

/// An instance that died without leaving (its entry stays until its lease
/// ends): the invalidation returns Ok, and the live instances serve the new
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_died_holds_an_invalidation_at_most_one_lease() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, ttl).await;
    let held = settled(&instances[1], "/report").await;
    forge(&redis, "'00000000deadbeef'", 3_000, None);
    assert_eq!(members(&redis).len(), 3);
    tokio::time::timeout(HANG, instances[0].guard.invalidate(&get("/report")))
        .await
        .expect("waits one lease at most")
        .unwrap();
    let calls = origin.calls();
    for instance in &instances {
        assert_ne!(send(&instance.app, get("/report")).await.text(), held);
    }
    assert_eq!(origin.calls(), calls + 1, "one rebuild for the fleet");
}

/// A clean shutdown leaves the membership: nobody waits for it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_leaves_the_membership() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let mut instances = fleet_on(&redis, 3, &origin, ttl).await;
    let before = members_become(&redis, 3).await;
    let gone = instances.pop().unwrap();
    drop(gone);
    let after = members_become(&redis, 2).await;
    assert!(after.iter().all(|m| before.contains(m)));
    instances[0]
        .guard
        .invalidate(&get("/report"))
        .await
        .unwrap();
    // Renewals may reorder them (the set is sorted by lease end).
    let mut now = members(&redis);
    let mut after = after;
    now.sort();
    after.sort();
    assert_eq!(now, after, "the survivors stay members");
}

/// Foreign bytes, scores no instance writes (huge, infinite), and a
/// well-formed stranger that never acknowledges: no panic, no hang, and the
/// impossible scores are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_members_neither_hang_nor_crash_an_invalidation() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, ttl).await;
    let held = settled(&instances[1], "/report").await;
    forge(
        &redis,
        "'junk' .. string.char(255, 0, 10)",
        0,
        Some("1e300"),
    );
    forge(&redis, "'0123456789abcdef'", 0, Some("+inf"));
    forge(&redis, "'fedcba9876543210'", 2_000, None);
    forge(&redis, "string.rep('x', 100000)", 2_000, None);
    assert_eq!(members(&redis).len(), 6);
    for purge in 0..2 {
        let done = tokio::time::timeout(HANG, instances[0].guard.invalidate_all()).await;
        done.expect("no hang").unwrap();
        assert_ne!(
            send(&instances[1].app, get("/report")).await.text(),
            held,
            "purge {purge}"
        );
    }
    let left = members(&redis);
    assert!(!left.iter().any(|m| m == "0123456789abcdef"), "{left:?}");
    assert!(!left.iter().any(|m| m.starts_with("junk")), "{left:?}");
}

/// More members than an invalidation waits for by name (a flood of forged
/// entries): it cannot know who is left out, so it waits one whole lease
/// and returns Ok; the live instance serves the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_members_costs_one_lease_not_the_barrier() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, ttl).await;
    let held = settled(&instances[1], "/report").await;
    let flood = "local t = redis.call('TIME') \
        local s = tonumber(t[1]) * 1000 + 2000 \
        for i = 1, 5000 do redis.call('ZADD', KEYS[1], s, string.format('%016x', i)) end \
        return 1";
    assert_eq!(redis.raw(&["EVAL", flood, "1", "sg:members"]), ":1");
    tokio::time::timeout(HANG, instances[0].guard.invalidate(&get("/report")))
        .await
        .expect("no hang")
        .unwrap();
    assert_ne!(send(&instances[1].app, get("/report")).await.text(), held);
}

/// The same barrier on a cluster: the membership has its own slot, and the
/// instance whose subscriber was killed is waited for.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_barrier_waits_for_a_killed_subscriber() {
    let cluster = Cluster::start(3, 0);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .deadline(Duration::from_millis(500))
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let origin = Origin::default();
    let instances = fleet(2, &origin, Duration::ZERO, connect, ttl).await;
    for round in 0..2 {
        let held = settled(&instances[1], "/report").await;
        for node in &cluster.nodes {
            node.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        }
        if round == 0 {
            instances[0]
                .guard
                .invalidate(&get("/report"))
                .await
                .unwrap();
        } else {
            instances[0].guard.invalidate_tag("any").await.unwrap();
            instances[0].guard.invalidate_all().await.unwrap();
        }
        let after = send(&instances[1].app, get("/report")).await;
        assert_ne!(after.text(), held, "round {round}: {}", after.x_cache());
        wait_until_available(&instances, Duration::from_secs(10)).await;
    }
}

/// Behind Sentinel: the members live on the primary, and the barrier waits
/// for an instance whose subscriber the primary dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_barrier_waits_for_a_killed_subscriber() {
    let setup = crate::common::sentinel::SentinelSetup::start();
    let url = setup.url();
    let connect = || backend_at(&url, Duration::from_millis(500));
    let origin = Origin::default();
    let instances = fleet(2, &origin, Duration::ZERO, connect, ttl).await;
    assert_eq!(members(&setup.primary).len(), 2);
    let held = settled(&instances[1], "/report").await;
    assert!(setup
        .primary
        .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .starts_with(':'));
    instances[0]
        .guard
        .invalidate(&get("/report"))
        .await
        .unwrap();
    let after = send(&instances[1].app, get("/report")).await;
    assert_ne!(after.text(), held, "{}", after.x_cache());
}
