//! Redis Cluster: a primary replaced at the same address. Restarted with
//! empty memory (same node), or reset into a new empty node that takes the
//! same slots: the tier's own connection and slot map for that address are
//! stale, yet fencing tokens issued afterwards exceed every earlier one,
//! and the fleet shares one rebuild per expiry again.
#![cfg(feature = "redis-cluster")]

use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::fleet::{fleet, fleet_burst, keys_like, Instance};
use crate::common::{get as get_req, Origin};
use stampede_guard::{Backend, FencingToken, Lock};

const TTL: Duration = Duration::from_millis(300);

async fn connect(cluster: &Cluster) -> Backend {
    Backend::redis_cluster_builder(cluster.urls())
        .deadline(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("cluster backend")
}

/// Takes and gives back the lock `n` times from each instance; the greatest token.
async fn tokens(locks: &[Lock], n: usize) -> FencingToken {
    let mut max = None;
    for _ in 0..n {
        for lock in locks {
            let guard = lock.acquire("stock").await.expect("acquired");
            let token = guard.fencing_token();
            if let Some(prev) = max {
                assert!(token > prev, "{token:?} > {prev:?}");
            }
            max = Some(token);
            assert!(guard.release().await.expect("released"));
        }
    }
    max.unwrap()
}

/// The first token each instance gets once the node is back (an instance
/// may still be on a connection or slot map from before the node left,
/// and answer "unavailable" for a moment): every one is above `before`.
/// The greatest of them.
async fn first_token_after(locks: &[Lock], before: FencingToken) -> FencingToken {
    let give_up = Instant::now() + Duration::from_secs(15);
    let mut greatest = before;
    for lock in locks {
        loop {
            if let Ok(Some(guard)) = lock.try_acquire("stock").await {
                let token = guard.fencing_token();
                assert!(guard.release().await.expect("released"));
                assert!(token > before, "{token:?} > {before:?}");
                if token > greatest {
                    greatest = token;
                }
                break;
            }
            assert!(Instant::now() < give_up, "the lock never came back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    greatest
}

/// Rounds until the fleet shares one rebuild of `uri` again; panics if it
/// never does, or if any answer is not a 200.
async fn shared_again(instances: &[Instance], origin: &Origin, uri: &str) {
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        let before = origin.calls();
        let answers = fleet_burst(instances, 6, || get_req(uri)).await;
        for a in &answers {
            assert_eq!(a.status, 200, "{a:?}");
        }
        if origin.calls() - before == 1 {
            return;
        }
        assert!(Instant::now() < give_up, "never shared again");
    }
}

fn lock_node(cluster: &Cluster) -> usize {
    *cluster
        .masters()
        .iter()
        .find(|&&i| !keys_like(&cluster.nodes[i], "sg:lock:*").is_empty())
        .expect("the lock's node")
}

async fn setup(cluster: &Cluster) -> (Vec<Instance>, Origin, Vec<Lock>, String) {
    let origin = Origin::default();
    let instances = fleet(
        2,
        &origin,
        Duration::from_millis(50),
        || connect(cluster),
        |g| g.ttl(TTL).wait_budget(Duration::from_secs(3)),
    )
    .await;
    let locks: Vec<Lock> = instances
        .iter()
        .map(|i| Lock::new(i.backend.clone()))
        .collect();
    let _ = tokens(&locks, 1).await;
    let node = &cluster.nodes[lock_node(cluster)];
    // A URL whose entry lives on the same node.
    let uri = (0..1024)
        .map(|i| format!("/report/{i}"))
        .find(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            !node
                .raw(&["EXISTS", &format!("sg:{{{key}}}:v")])
                .starts_with("-MOVED")
        })
        .expect("a key on the node");
    shared_again(&instances, &origin, &uri).await;
    (instances, origin, locks, uri)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_empty_at_its_address_never_reissues_a_token() {
    let mut cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let (instances, origin, locks, uri) = setup(&cluster).await;
    let before = tokens(&locks, 5).await;
    let victim = lock_node(&cluster);
    cluster.nodes[victim].restart();
    assert_eq!(cluster.nodes[victim].raw(&["DBSIZE"]), ":0", "empty");
    cluster.wait_until_ok(Duration::from_secs(20));
    let after = first_token_after(&locks, before).await;
    assert!(tokens(&locks, 2).await > after);
    shared_again(&instances, &origin, &uri).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_replaced_by_a_new_node_at_its_address_never_reissues_a_token() {
    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let (instances, origin, locks, uri) = setup(&cluster).await;
    let before = tokens(&locks, 5).await;
    let victim = &cluster.nodes[lock_node(&cluster)];
    let old_id = victim.raw(&["CLUSTER", "MYID"]);
    let mine = victim.raw(&["CLUSTER", "NODES"]);
    let ranges: Vec<(String, String)> = mine
        .lines()
        .find(|l| l.contains("myself"))
        .expect("its own line")
        .split_whitespace()
        .skip(8)
        .map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            (a.to_owned(), b.to_owned())
        })
        .collect();
    // The node at the same address becomes a new, empty node...
    assert_eq!(victim.raw(&["FLUSHALL"]), "+OK");
    assert_eq!(victim.raw(&["CLUSTER", "RESET", "HARD"]), "+OK");
    assert_ne!(victim.raw(&["CLUSTER", "MYID"]), old_id);
    // Meanwhile the tier's connection to the address is the new node's, and
    // its map still names it for the old slots: every request is answered.
    for _ in 0..5 {
        tokio::time::sleep(TTL).await;
        for a in fleet_burst(&instances, 4, || get_req(&uri)).await {
            assert_eq!(a.status, 200, "{a:?}");
        }
    }
    let others: Vec<_> = cluster
        .nodes
        .iter()
        .filter(|n| n.port() != victim.port())
        .collect();
    for n in &others {
        assert_eq!(n.raw(&["CLUSTER", "FORGET", &old_id]), "+OK");
    }
    // ...which takes the old node's slots and joins the cluster.
    for (a, b) in &ranges {
        assert_eq!(
            victim.raw(&["CLUSTER", "ADDSLOTSRANGE", a, b]),
            "+OK",
            "{a}-{b}"
        );
    }
    let port = others[0].port().to_string();
    let theirs = others[0].raw(&["CLUSTER", "NODES"]);
    let bus = theirs
        .lines()
        .find(|l| l.contains("myself"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|a| a.split_once('@'))
        .map(|(_, b)| b.split(',').next().unwrap_or(b).to_owned())
        .expect("a bus port");
    assert_eq!(
        victim.raw(&["CLUSTER", "MEET", "127.0.0.1", &port, &bus]),
        "+OK"
    );
    cluster.wait_until_ok(Duration::from_secs(20));
    let after = first_token_after(&locks, before).await;
    assert!(tokens(&locks, 2).await > after);
    shared_again(&instances, &origin, &uri).await;
    for i in &instances {
        let s = i.backend.stats().redis.unwrap();
        eprintln!("openings {} open {}", s.circuit_openings, s.open_circuits);
        assert_eq!(s.open_circuits, 0, "every circuit closed once rejoined");
    }
}

/// Lock calls are a key's calls too: with another primary frozen, and the
/// fleet's requests and an invalidation meeting it, the lock on a healthy
/// primary is taken and given back without an error, exclusively.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_a_healthy_primary_ignores_another_frozen_one() {
    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let (instances, _origin, locks, _) = setup(&cluster).await;
    let lock_at = lock_node(&cluster);
    let frozen = *cluster
        .masters()
        .iter()
        .find(|&&i| i != lock_at)
        .expect("another primary");
    let node = &cluster.nodes[frozen];
    let on_frozen = (0..1024)
        .map(|i| format!("/report/f{i}"))
        .find(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            !node
                .raw(&["EXISTS", &format!("sg:{{{key}}}:v")])
                .starts_with("-MOVED")
        })
        .expect("a key on the node");
    let _ = fleet_burst(&instances, 2, || get_req(&on_frozen)).await;
    let before = tokens(&locks, 1).await;
    node.freeze();
    let mut errors = Vec::new();
    let mut last = before;
    for round in 0..20 {
        // The frozen node's key, and now and then an invalidation of it.
        for a in fleet_burst(&instances, 2, || get_req(&on_frozen)).await {
            assert_eq!(a.status, 200, "{a:?}");
        }
        if round % 5 == 0 {
            let _ = instances[round % 2]
                .guard
                .invalidate(&get_req(&on_frozen))
                .await;
        }
        let (mine, other) = (&locks[round % 2], &locks[(round + 1) % 2]);
        match mine.try_acquire("stock").await {
            Ok(Some(guard)) => {
                assert!(guard.fencing_token() > last, "round {round}");
                last = guard.fencing_token();
                match other.try_acquire("stock").await {
                    Ok(None) => {}
                    Ok(Some(_)) => panic!("round {round}: two holders"),
                    Err(e) => errors.push(format!("round {round}: other: {e}")),
                }
                if let Err(e) = guard.release().await {
                    errors.push(format!("round {round}: release: {e}"));
                }
            }
            Ok(None) => errors.push(format!("round {round}: busy")),
            Err(e) => errors.push(format!("round {round}: acquire: {e}")),
        }
    }
    node.thaw();
    assert!(errors.is_empty(), "{} failures: {errors:?}", errors.len());
}
