//! Redis Cluster: the tier's own connections to each primary, attacked.
//! A slot that stays half-migrated under load must not turn every
//! redirected call into a new `CLUSTER SLOTS` (and a new connection), and
//! a primary frozen and resumed again and again must not leave connections
//! behind on it.
#![cfg(feature = "redis-cluster")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::fleet::{fleet, fleet_burst, keys_like};
use crate::common::redis::RedisServer;
use crate::common::shards::{connect, stats, uri_on};
use crate::common::{get as get_req, Origin};

const DEADLINE: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_millis(200);

fn info_number(node: &RedisServer, section: &str, field: &str) -> u64 {
    node.raw(&["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Connections the node accepted since it started.
fn accepted(cluster: &Cluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|n| info_number(n, "stats", "total_connections_received"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_migrated_slot_under_load_is_no_slot_map_storm() {
    let cluster = Cluster::start(3, 0);
    let origin = Origin::default();
    let instances = Arc::new(
        fleet(
            2,
            &origin,
            Duration::from_millis(20),
            || connect(&cluster, DEADLINE),
            |g| g.ttl(TTL).wait_budget(Duration::from_secs(2)),
        )
        .await,
    );
    let masters = cluster.masters();
    let (source, target) = (&cluster.nodes[masters[0]], &cluster.nodes[masters[1]]);
    let uri = uri_on(&instances, source, &[]);
    let answers = fleet_burst(&instances, 4, || get_req(&uri)).await;
    assert!(answers.iter().all(|a| a.status == 200));
    let key = keys_like(source, "sg:{*").remove(0);
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &key])
        .trim_start_matches(':')
        .to_owned();
    let tag = key[..key.find('}').expect("a hash tag") + 1].to_owned();
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
    // Half the entry moves: every script naming its keys meets TRYAGAIN.
    let value = keys_like(source, &format!("{tag}*"))
        .into_iter()
        .find(|k| k.ends_with(":v"))
        .expect("the entry's value");
    let port = target.port().to_string();
    assert_eq!(
        source.raw(&["MIGRATE", "127.0.0.1", &port, &value, "0", "5000"]),
        "+OK"
    );
    for node in &cluster.nodes {
        node.reset_stats();
    }
    let connections_before = accepted(&cluster);

    // Two seconds of load on the half-moved entry.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (instances, stop, uri) = (instances.clone(), stop.clone(), uri.clone());
        tokio::spawn(async move {
            let mut failed = 0;
            while !stop.load(Ordering::Relaxed) {
                let answers = fleet_burst(&instances, 8, || get_req(&uri)).await;
                failed += answers.iter().filter(|a| a.status != 200).count();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failed
        })
    };
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let failed = load.await.expect("the load ran");
    let seconds = started.elapsed().as_secs_f64();
    // (Less the three that this count itself opens.)
    let connections = accepted(&cluster) - connections_before - 3;
    let slot_reads = cluster.command_calls("cluster|slots");
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
    eprintln!(
        "{seconds:.1}s: {redirected} redirections, {slot_reads} CLUSTER SLOTS, \
         {connections} connections accepted, {failed} failed"
    );
    // The migration is finished: the keys the source still holds (a key
    // that was not on the target yet is served, and may be written, by
    // the source) move first, or the source refuses to give the slot up.
    crate::common::cluster::finish_migration(source, target, &slot);
    assert_eq!(failed, 0, "no request fails while the slot moves");
    assert!(redirected > 0, "the calls met the half-moved slot");
    // The map is re-read when a call meets a slot on the move, but not once
    // per redirected call: at most a few times per probe interval and
    // instance.
    let per_second = 2.0 * (1000.0 / 100.0) * 2.0;
    assert!(
        (slot_reads as f64) <= per_second * seconds,
        "{slot_reads} CLUSTER SLOTS in {seconds:.1}s from two instances"
    );
    // And each read is asked on the connection the tier keeps to the node
    // (docs/TOPOLOGY.md's connections per instance), not a new one per read:
    // a fleet re-reading the map would otherwise flood the nodes with
    // connections for as long as the slot moves.
    assert!(
        connections <= 2 * 3,
        "{connections} connections opened in {seconds:.1}s by two instances \
         ({slot_reads} CLUSTER SLOTS)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_frozen_and_resumed_again_and_again_keeps_no_extra_connections() {
    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let origin = Origin::default();
    let instances = fleet(
        1,
        &origin,
        Duration::from_millis(10),
        || connect(&cluster, DEADLINE),
        |g| g.ttl(TTL).wait_budget(Duration::from_millis(500)),
    )
    .await;
    let masters = cluster.masters();
    let victim = &cluster.nodes[masters[2]];
    let uri = uri_on(&instances, victim, &[]);
    let app = &instances[0].app;
    for _ in 0..3 {
        assert_eq!(crate::common::send(app, get_req(&uri)).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let clients = |n: &RedisServer| info_number(n, "clients", "connected_clients");
    let before = clients(victim);

    for cycle in 0..6 {
        victim.freeze();
        // Calls meet the frozen node (while connecting, or on the open
        // connection) until its circuit opens.
        let give_up = Instant::now() + Duration::from_secs(5);
        while stats(&instances[0]).open_circuits == 0 {
            assert!(Instant::now() < give_up, "cycle {cycle}: no circuit opened");
            tokio::time::sleep(TTL).await;
            let answer = crate::common::send(app, get_req(&uri)).await;
            assert_eq!(answer.status, 200, "cycle {cycle}: {answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        victim.thaw();
        let give_up = Instant::now() + Duration::from_secs(5);
        while stats(&instances[0]).open_circuits != 0 {
            assert!(
                Instant::now() < give_up,
                "cycle {cycle}: circuit stays open"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(TTL).await;
        assert_eq!(crate::common::send(app, get_req(&uri)).await.status, 200);
    }
    // Whatever was opened while the node was frozen is closed by now.
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut after = clients(victim);
    while after > before && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = clients(victim);
    }
    eprintln!("connected clients on the frozen node: {before} before, {after} after");
    assert!(
        after <= before,
        "{after} connections on the node after six freezes, {before} before"
    );
}

/// Moves `slot` from `source` to `target` completely: every key of the
/// slot migrated, then the slot given to the target on both nodes.
fn move_slot(source: &RedisServer, target: &RedisServer, slot: &str) {
    let id = |n: &RedisServer| n.raw(&["CLUSTER", "MYID"]);
    let (src, dst) = (id(source), id(target));
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        source.raw(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &dst]),
        "+OK"
    );
    crate::common::cluster::finish_migration(source, target, slot);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_away_during_a_rebuild_keeps_the_rebuild_exactly_once() {
    let cluster = Cluster::start(3, 0);
    let origin = Origin::default();
    let instances = Arc::new(
        fleet(
            3,
            &origin,
            Duration::from_millis(1500),
            || connect(&cluster, DEADLINE),
            |g| {
                g.ttl(Duration::from_secs(30))
                    .lease(Duration::from_secs(3))
                    .wait_budget(Duration::from_secs(8))
            },
        )
        .await,
    );
    let masters = cluster.masters();
    let (source, target) = (&cluster.nodes[masters[0]], &cluster.nodes[masters[1]]);
    let uri = uri_on(&instances, source, &[]);
    let key = instances[0].guard.key_for(&get_req(&uri)).unwrap();
    let tag = format!("sg:{{{key}}}");
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &format!("{tag}:v")])
        .trim_start_matches(':')
        .to_owned();
    // Every instance's connection to the source is open and in its map.
    let warm = (0..512)
        .map(|i| format!("/report/w{i}"))
        .find(|u| {
            let k = instances[0].guard.key_for(&get_req(u)).unwrap();
            !source
                .raw(&["EXISTS", &format!("sg:{{{k}}}:v")])
                .starts_with("-MOVED")
        })
        .unwrap();
    let _ = fleet_burst(&instances, 3, || get_req(&warm)).await;
    let before = origin.calls();

    let burst = {
        let (instances, uri) = (instances.clone(), uri.clone());
        tokio::spawn(async move { fleet_burst(&instances, 6, || get_req(&uri)).await })
    };
    // The lease is taken on the source; the whole slot moves meanwhile.
    let give_up = Instant::now() + Duration::from_secs(5);
    while source.raw(&["EXISTS", &format!("{tag}:l")]) != ":1" {
        assert!(Instant::now() < give_up, "no lease taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    move_slot(source, target, &slot);
    let answers = burst.await.expect("the burst ran");
    for a in &answers {
        assert_eq!(a.status, 200, "{a:?}");
    }
    assert_eq!(origin.calls() - before, 1, "one rebuild for the fleet");
    let texts: Vec<String> = answers.iter().map(|a| a.text()).collect();
    assert!(texts.iter().all(|t| *t == texts[0]), "{texts:?}");
    // The value is on the new owner, and no lease is left behind.
    assert_eq!(target.raw(&["EXISTS", &format!("{tag}:v")]), ":1");
    let give_up = Instant::now() + Duration::from_secs(5);
    while target.raw(&["EXISTS", &format!("{tag}:l")]) != ":0" {
        assert!(
            Instant::now() < give_up,
            "a lease was left on the new owner"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A later request from each instance is a hit, with no origin call.
    let calls = origin.calls();
    for i in instances.iter() {
        let a = crate::common::send(&i.app, get_req(&uri)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.text(), texts[0]);
    }
    assert_eq!(origin.calls(), calls);
    for i in instances.iter() {
        assert_eq!(
            stats(i).circuit_openings,
            0,
            "a moved slot opens no circuit"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_whose_slot_moves_away_is_released_and_its_tokens_keep_rising() {
    let cluster = Cluster::start(3, 0);
    let a = connect(&cluster, DEADLINE).await;
    let b = connect(&cluster, DEADLINE).await;
    let (la, lb) = (
        stampede_guard::Lock::new(a.clone()),
        stampede_guard::Lock::new(b.clone()),
    );
    let mut last = None;
    for round in 0..3 {
        let guard = la.acquire("stock").await.expect("acquired");
        let token = guard.fencing_token();
        if let Some(prev) = last {
            assert!(token > prev, "round {round}: {token:?} > {prev:?}");
        }
        // The lock's keys move to another primary while it is held.
        let masters = cluster.masters();
        let source = masters
            .iter()
            .map(|&i| &cluster.nodes[i])
            .find(|n| !keys_like(n, "sg:lock:*").is_empty())
            .expect("the lock's node");
        let target = masters
            .iter()
            .map(|&i| &cluster.nodes[i])
            .find(|n| n.port() != source.port())
            .unwrap();
        let key = keys_like(source, "sg:lock:*").remove(0);
        let slot = source
            .raw(&["CLUSTER", "KEYSLOT", &key])
            .trim_start_matches(':')
            .to_owned();
        move_slot(source, target, &slot);
        assert!(
            lb.try_acquire("stock").await.expect("no error").is_none(),
            "round {round}: the moved hold still excludes"
        );
        assert!(guard.release().await.expect("released"), "round {round}");
        let other = lb
            .try_acquire("stock")
            .await
            .expect("no error")
            .expect("free once released");
        assert!(other.fencing_token() > token, "round {round}");
        last = Some(other.fencing_token());
        assert!(other.release().await.unwrap());
    }
    for backend in [&a, &b] {
        let s = backend.stats().redis.unwrap();
        assert_eq!(s.circuit_openings, 0);
    }
}
