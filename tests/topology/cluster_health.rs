//! Redis Cluster: one bad shard costs only its own keys. With one primary
//! frozen, or killed, keys on a healthy primary keep their fleet
//! protection, the bad node's keys are served from the in-process tier
//! without asking Redis, and its circuit stays open (it does not flap)
//! until the node itself answers; and a slot migrated under cache load
//! reaches no client as an error.
#![cfg(feature = "redis-cluster")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::cluster::Cluster;
use crate::common::fleet::{fleet, keys_like, Instance};
use crate::common::monitor::holds_within;
use crate::common::redis::RedisServer;
use crate::common::shards::{connect, round, stats, subscribed_primary, uri_on};
use crate::common::{get as get_req, Origin};

const DEADLINE: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_millis(400);

/// Sends `uri` to each instance, one at a time, `n` times.
async fn each(instances: &[Instance], uri: &str, n: usize) {
    for _ in 0..n {
        for i in instances {
            let answer = crate::common::send(&i.app, get_req(uri)).await;
            assert_eq!(answer.status, 200, "{uri}: {answer:?}");
        }
    }
}

#[derive(PartialEq)]
enum Fault {
    /// SIGSTOP: the node keeps its port and answers nothing.
    Frozen,
    /// SIGKILL, and no replica to take over: dead for the whole test.
    Dead,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_costs_only_its_own_keys() {
    one_bad_primary(Fault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_costs_only_its_own_keys() {
    one_bad_primary(Fault::Dead).await;
}

async fn one_bad_primary(fault: Fault) {
    // No replicas, so a dead node stays dead (as before a failover
    // completes); and the other shards keep serving their slots meanwhile,
    // which Redis does only without full coverage required.
    let mut cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let origin = Origin::default();
    let instances = fleet(
        3,
        &origin,
        Duration::from_millis(150),
        || connect(&cluster, DEADLINE),
        // A short lease: a call left unanswered is released by its token,
        // retried (and counted) until the lease would have lapsed.
        |g| {
            g.ttl(TTL)
                .lease(Duration::from_secs(1))
                .wait_budget(Duration::from_secs(5))
        },
    )
    .await;
    // The healthy primary under test is the one the subscriptions are on
    // (losing the subscription is another fault, with tests of its own).
    let masters = cluster.masters();
    let healthy = subscribed_primary(&cluster);
    let bad = *masters.iter().find(|&&i| i != healthy).unwrap();
    let good_uri = uri_on(&instances, &cluster.nodes[healthy], &[]);
    let bad_uri = uri_on(&instances, &cluster.nodes[bad], &[]);

    // Healthy cluster: one origin call per expiry, fleet-wide, everywhere.
    for uri in [&good_uri, &bad_uri] {
        assert_eq!(round(&instances, &origin, uri, 9, TTL).await, 1, "{uri}");
    }

    match fault {
        Fault::Frozen => cluster.nodes[bad].freeze(),
        Fault::Dead => cluster.nodes[bad].kill(),
    }

    // The bad node's key still answers; after a few calls the circuit of
    // that node opens, on each instance. (Each try after the entry expired
    // from the instances' L1, so that it asks Redis.)
    for _ in 0..12 {
        if instances.iter().all(|i| stats(i).open_circuits > 0) {
            break;
        }
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        each(&instances, &bad_uri, 1).await;
    }
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert_eq!(s.open_circuits, 1, "instance {n}: {s:?}");
        assert_eq!(s.circuit_openings, 1, "instance {n}: {s:?}");
    }

    // The healthy primary's keys keep their fleet protection.
    for _ in 0..3 {
        assert_eq!(round(&instances, &origin, &good_uri, 9, TTL).await, 1);
    }
    // (Past the lease: the unanswered calls' releases are done.)
    tokio::time::sleep(Duration::from_millis(500)).await;

    // With its circuit open, the bad key is served without asking Redis
    // (no call, so no error and no deadline paid); many probe intervals
    // later (the probes went to the bad node itself) no circuit closed and
    // opened again.
    let errors: Vec<u64> = instances.iter().map(|i| stats(i).errors).collect();
    each(&instances, &bad_uri, 5).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    each(&instances, &bad_uri, 5).await;
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert_eq!(s.circuit_openings, 1, "instance {n} flapped: {s:?}");
        assert_eq!(s.open_circuits, 1, "instance {n}: {s:?}");
        assert!(!s.available);
        assert_eq!(s.errors, errors[n], "instance {n} asked a bad node: {s:?}");
    }
    if fault == Fault::Dead {
        return;
    }

    // The frozen node resumes: its own probe closes its circuit, and its
    // keys are protected fleet-wide again.
    cluster.nodes[bad].thaw();
    let closed = holds_within(Duration::from_secs(20), || {
        instances.iter().all(|i| stats(i).available)
    })
    .await;
    assert!(closed, "the thawed node's circuit closes");
    assert_eq!(round(&instances, &origin, &bad_uri, 9, TTL).await, 1);
    assert_eq!(round(&instances, &origin, &good_uri, 9, TTL).await, 1);
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert_eq!(s.circuit_openings, 1, "instance {n}: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_cache_load_fails_no_request() {
    let cluster = Cluster::start(3, 0);
    let origin = Origin::default();
    let instances = Arc::new(
        fleet(
            3,
            &origin,
            Duration::from_millis(50),
            || connect(&cluster, DEADLINE),
            |g| g.ttl(TTL).wait_budget(Duration::from_secs(5)),
        )
        .await,
    );
    let masters = cluster.masters();
    let (source, target) = (&cluster.nodes[masters[0]], &cluster.nodes[masters[1]]);
    let uri = uri_on(&instances, source, &[]);
    assert_eq!(round(&instances, &origin, &uri, 6, TTL).await, 1);
    let key = keys_like(source, "sg:{*").remove(0);
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &key])
        .trim_start_matches(':')
        .to_owned();
    let tag = key[..key.find('}').expect("a hash tag") + 1].to_owned();

    // Load: rounds of concurrent requests, each after the entry expired.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (instances, origin, stop, uri) =
            (instances.clone(), origin.clone(), stop.clone(), uri.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            let mut calls = 0;
            while !stop.load(Ordering::Relaxed) || rounds < 3 {
                calls += round(&instances, &origin, &uri, 6, TTL).await;
                rounds += 1;
            }
            (rounds, calls)
        })
    };
    let id = |n: &RedisServer| n.raw(&["CLUSTER", "MYID"]);
    let (src, dst) = (id(source), id(target));
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        source.raw(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst]),
        "+OK"
    );
    // Key by key, with pauses: scripts meet the slot half moved.
    let port = target.port().to_string();
    for _ in 0..200 {
        let keys = keys_like(source, &format!("{tag}*"));
        let Some(one) = keys.first() else { break };
        let reply = source.raw(&["MIGRATE", "127.0.0.1", &port, one, "0", "5000"]);
        assert!(reply == "+OK" || reply == "+NOKEY", "{reply}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    crate::common::cluster::finish_migration(source, target, &slot);
    stop.store(true, Ordering::Relaxed);
    let (rounds, calls) = load.await.expect("no request failed");
    let redirected: u64 = [source, target]
        .iter()
        .map(|n| {
            let info = n.raw(&["INFO", "errorstats"]);
            ["TRYAGAIN", "ASK", "MOVED"]
                .iter()
                .filter_map(|code| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(&format!("errorstat_{code}:count=")))
                        .and_then(|n| n.trim().parse::<u64>().ok())
                })
                .sum::<u64>()
        })
        .sum();
    assert!(redirected > 0, "the migration met the cache's calls");
    // One origin call per expiry, give or take the moment the slot moved.
    assert!(calls >= rounds, "{calls} calls in {rounds} rounds");
    assert!(calls <= rounds + 2, "{calls} calls in {rounds} rounds");
    // Afterwards the entry lives on the target, and is shared again.
    assert_eq!(round(&instances, &origin, &uri, 6, TTL).await, 1);
    assert!(!keys_like(target, &format!("{tag}*")).is_empty(), "moved");
}
