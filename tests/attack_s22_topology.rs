//! Cluster and Sentinel under real faults, a second look: what each
//! topology promises in docs/TOPOLOGY.md, attacked on real processes.
//!
//! - A synced lock on a cluster asks only its own shard's replicas: a
//!   replica frozen on another shard does not fail it.
#![cfg(feature = "redis-cluster")]

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::fleet::keys_like;
use common::redis::RedisServer;
use common::ROOMY_DEADLINE;
use stampede_guard::{Backend, Lock};

async fn connect(cluster: &Cluster) -> Backend {
    Backend::redis_cluster_builder(cluster.urls())
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("cluster backend")
}

/// The primary (index into `cluster.nodes`) that holds lock `name`: the
/// lock is taken, its key looked for, and the lock given back.
async fn node_of_lock(cluster: &Cluster, lock: &Lock, name: &str) -> usize {
    let guard = lock.acquire(name).await.expect("acquired");
    let node = cluster
        .masters()
        .into_iter()
        .find(|&i| !keys_like(&cluster.nodes[i], "sg:lock:*:l").is_empty())
        .expect("the lock's primary");
    assert!(guard.release().await.expect("released"));
    node
}

/// The replica of `primary` among the cluster's nodes.
fn replica_of<'a>(cluster: &'a Cluster, primary: &RedisServer) -> &'a RedisServer {
    let info = primary.raw(&["INFO", "replication"]);
    let port: u16 = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("port=")))
        .and_then(|p| p.trim().parse().ok())
        .expect("a replica");
    cluster
        .nodes
        .iter()
        .find(|n| n.port() == port)
        .expect("the replica is one of the nodes")
}

/// A synced lock waits for its own shard's replicas, not for every
/// shard's: with another shard's replica frozen (its primary has writes of
/// this instance the replica has not acknowledged), a synced acquisition
/// of a lock on a healthy shard succeeds, and its hold is on its own
/// replica when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_on_another_shard_does_not_fail_a_synced_lock() {
    let cluster = Cluster::start(3, 1);
    let backend = connect(&cluster).await;
    let plain = Lock::new(backend.clone());
    let synced = Lock::new(backend)
        .lease(Duration::from_secs(30))
        .synced(1, Duration::from_millis(500));

    // Two locks on two different primaries.
    let here = node_of_lock(&cluster, &plain, "here").await;
    let mut there = None;
    for i in 0..64 {
        let name = format!("there-{i}");
        let node = node_of_lock(&cluster, &plain, &name).await;
        if node != here {
            there = Some((name, node));
            break;
        }
    }
    let (there, there_node) = there.expect("a lock on another primary");

    // Healthy: the synced lock is acknowledged.
    let guard = synced.acquire("here").await.expect("acknowledged");
    assert!(guard.release().await.expect("released"));

    // The other shard's replica stops acknowledging, and the instance
    // writes there (a lock taken and given back on that shard).
    let frozen = replica_of(&cluster, &cluster.nodes[there_node]);
    frozen.freeze();
    let guard = plain.acquire(&there).await.expect("a plain lock there");
    assert!(guard.release().await.expect("released"));

    let own_replica = replica_of(&cluster, &cluster.nodes[here]);
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut failures = Vec::new();
    for round in 0..3 {
        match synced.acquire("here").await {
            Ok(guard) => {
                // WAIT returned: the hold is on the shard's own replica.
                assert_eq!(
                    keys_like(own_replica, "sg:lock:*:l").len(),
                    1,
                    "round {round}: the acknowledged hold is on the lock's replica"
                );
                assert!(guard.release().await.expect("released"));
            }
            Err(e) => failures.push(format!("round {round}: {e}")),
        }
        assert!(Instant::now() < give_up);
    }
    frozen.thaw();
    assert!(
        failures.is_empty(),
        "a frozen replica on another shard failed synced acquisitions of a healthy shard's lock: {failures:?}"
    );
}
