//! Redis Cluster, per-primary health through a failover: a primary is
//! frozen (SIGSTOP) until its replica takes its slots over. The promise
//! (docs/TOPOLOGY.md "Health per primary"): the slot map follows, the old
//! address's open circuit leaves with it, and the promoted slots' keys
//! regain fleet-wide protection (one origin call per expiry), also once
//! the old primary resumes as a replica; healthy shards never pay.
#![cfg(feature = "redis-cluster")]

use std::time::{Duration, Instant};

use crate::common::cluster::{wait_replicated, Cluster};
use crate::common::fleet::fleet;
use crate::common::shards::{connect, round, stats, subscribed_primary, uri_on};
use crate::common::Origin;

const DEADLINE: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_takes_the_slots_and_the_fleet_protection_back() {
    let cluster = Cluster::start(3, 1);
    let origin = Origin::default();
    let instances = fleet(
        3,
        &origin,
        Duration::from_millis(100),
        || connect(&cluster, DEADLINE),
        |g| {
            g.ttl(TTL)
                .lease(Duration::from_secs(1))
                .wait_budget(Duration::from_secs(5))
        },
    )
    .await;
    let masters = cluster.masters();
    let sub = subscribed_primary(&cluster);
    let victim = *masters.iter().find(|&&i| i != sub).unwrap();
    let good_uri = uri_on(&instances, &cluster.nodes[sub], &[]);
    let moved_uri = uri_on(&instances, &cluster.nodes[victim], &[]);
    for uri in [&good_uri, &moved_uri] {
        assert_eq!(round(&instances, &origin, uri, 9, TTL).await, 1, "{uri}");
    }

    wait_replicated(&cluster.nodes[victim], Duration::from_secs(10));
    cluster.nodes[victim].freeze();
    // Requests for both keys while the replica is promoted: the frozen
    // node's circuits open; the healthy key stays shared.
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut good_calls = Vec::new();
    while cluster.masters().len() < 3 {
        assert!(Instant::now() < give_up, "no replica promoted");
        good_calls.push(round(&instances, &origin, &good_uri, 9, TTL).await);
        let _ = round(&instances, &origin, &moved_uri, 9, TTL).await;
    }
    cluster.wait_until_ok(Duration::from_secs(20));
    assert!(
        good_calls.iter().all(|&c| c == 1),
        "healthy key, calls per window during the failover: {good_calls:?}"
    );

    // The old address leaves the map with its circuit: nothing stays open,
    // and the promoted slots are shared fleet-wide again.
    let give_up = Instant::now() + Duration::from_secs(10);
    while instances.iter().any(|i| stats(i).open_circuits > 0) {
        assert!(
            Instant::now() < give_up,
            "a circuit of the old primary stays open: {:?}",
            instances.iter().map(stats).collect::<Vec<_>>()
        );
        let _ = round(&instances, &origin, &moved_uri, 3, TTL).await;
    }
    // The first call of each instance may still find the old primary (the
    // documented cost: a call per instance that waits its deadline); from
    // then on the promoted slots are shared.
    assert!(round(&instances, &origin, &moved_uri, 9, TTL).await <= 3);
    let openings: Vec<u64> = instances
        .iter()
        .map(|i| stats(i).circuit_openings)
        .collect();
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(round(&instances, &origin, &moved_uri, 9, TTL).await);
        after.push(round(&instances, &origin, &good_uri, 9, TTL).await);
    }
    assert!(
        after.iter().all(|&c| c == 1),
        "after the failover: {after:?}"
    );

    // The old primary resumes (and becomes a replica): no circuit opens
    // again, and both keys stay shared.
    cluster.nodes[victim].thaw();
    let give_up = Instant::now() + Duration::from_secs(20);
    while !cluster.nodes[victim]
        .raw(&["INFO", "replication"])
        .contains("role:slave")
    {
        assert!(Instant::now() < give_up, "the old primary never rejoined");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut resumed = Vec::new();
    for _ in 0..3 {
        resumed.push(round(&instances, &origin, &moved_uri, 9, TTL).await);
        resumed.push(round(&instances, &origin, &good_uri, 9, TTL).await);
    }
    assert!(
        resumed.iter().all(|&c| c == 1),
        "after the resume: {resumed:?}"
    );
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert_eq!(s.open_circuits, 0, "instance {n}: {s:?}");
        assert_eq!(
            s.circuit_openings, openings[n],
            "instance {n} reopened: {s:?}"
        );
    }
}
