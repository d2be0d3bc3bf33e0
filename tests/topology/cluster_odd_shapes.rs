//! Redis Cluster, slot maps and nodes of odd shapes: a cluster whose
//! `CLUSTER SLOTS` names no host (`cluster-preferred-endpoint-type
//! unknown-endpoint`, as behind a load balancer) must keep one circuit per
//! primary all the same, and a seed that answers garbage must neither
//! panic nor hang the backend.
#![cfg(feature = "redis-cluster")]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::fleet::fleet;
use crate::common::shards::{round, stats, subscribed_primary, uri_on};
use crate::common::{get as get_req, send, Origin};
use stampede_guard::Backend;

const TTL: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_map_without_hosts_still_has_a_circuit_per_primary() {
    let cluster = Cluster::start_with(
        3,
        0,
        &[
            "--cluster-require-full-coverage",
            "no",
            "--cluster-preferred-endpoint-type",
            "unknown-endpoint",
        ],
    );
    let reply = cluster.nodes[0].raw(&["CLUSTER", "SLOTS"]);
    assert!(reply.starts_with('*'), "{reply}");
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .deadline(Duration::from_millis(500))
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let origin = Origin::default();
    let instances = fleet(2, &origin, Duration::from_millis(100), connect, |g| {
        g.ttl(TTL)
            .lease(Duration::from_secs(1))
            .wait_budget(Duration::from_secs(5))
    })
    .await;
    let masters = cluster.masters();
    let healthy = subscribed_primary(&cluster);
    let bad = *masters.iter().find(|&&i| i != healthy).unwrap();
    let good_uri = uri_on(&instances, &cluster.nodes[healthy], &[]);
    let bad_uri = uri_on(&instances, &cluster.nodes[bad], &[]);
    for uri in [&good_uri, &bad_uri] {
        assert_eq!(round(&instances, &origin, uri, 6, TTL).await, 1, "{uri}");
    }

    cluster.nodes[bad].freeze();
    for _ in 0..12 {
        if instances.iter().all(|i| stats(i).open_circuits > 0) {
            break;
        }
        tokio::time::sleep(TTL + Duration::from_millis(50)).await;
        for i in &instances {
            assert_eq!(send(&i.app, get_req(&bad_uri)).await.status, 200);
        }
    }
    assert!(instances.iter().all(|i| stats(i).open_circuits == 1));
    // The healthy primary's key is still shared by the fleet: its circuit
    // is not the frozen one's.
    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push(round(&instances, &origin, &good_uri, 6, TTL).await);
    }
    cluster.nodes[bad].thaw();
    assert_eq!(calls, [1, 1, 1], "healthy key, calls per window");
}

/// A "node" that answers every connection with bytes that are no RESP.
fn garbage_node() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(b"\x00\xff?garbage{}\r\n*-9\r\n").is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_answering_garbage_neither_panics_nor_hangs() {
    let cluster = Cluster::start(3, 0);
    let mut seeds = vec![format!("redis://127.0.0.1:{}/", garbage_node())];
    seeds.extend(cluster.urls());
    let started = Instant::now();
    let backend = Backend::redis_cluster_builder(seeds)
        .deadline(Duration::from_millis(300))
        .connect_timeout(Duration::from_secs(2))
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await;
    assert!(started.elapsed() < Duration::from_secs(15), "connect hung");
    // Whether it connected through the other seeds or refused, it must
    // serve: with it, requests are shared; garbage alone is an error.
    if let Ok(backend) = backend {
        let origin = Origin::default();
        let i = crate::common::fleet::instance(backend, &origin, Duration::ZERO, |g| g);
        for _ in 0..3 {
            assert_eq!(send(&i.app, get_req("/report/1")).await.status, 200);
        }
        assert_eq!(origin.calls(), 1);
    }
    let only = Backend::redis_cluster_builder([format!("redis://127.0.0.1:{}/", garbage_node())])
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(only.is_err(), "garbage is no cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_owned_by_nobody_opens_one_circuit_that_does_not_flap() {
    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .deadline(Duration::from_millis(500))
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let origin = Origin::default();
    let configure = |g: stampede_guard::StampedeGuard| g.ttl(TTL);
    let probe = crate::common::fleet::instance(connect().await, &origin, Duration::ZERO, configure);
    // A URL whose slot every node forgets (`CLUSTER DELSLOTS`): nobody's.
    let orphan = "/report/orphan";
    let key = probe.guard.key_for(&get_req(orphan)).unwrap();
    let slot = cluster.nodes[0]
        .raw(&["CLUSTER", "KEYSLOT", &format!("sg:{{{key}}}:v")])
        .trim_start_matches(':')
        .to_owned();
    // (Gossip from a node that still names the owner may bring it back:
    // forget it again everywhere until every node agrees.)
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        for node in &cluster.nodes {
            let _ = node.raw(&["CLUSTER", "DELSLOTS", &slot]);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if cluster.nodes.iter().all(|n| {
            n.raw(&["CLUSTER", "INFO"])
                .contains("cluster_slots_assigned:16383")
        }) {
            break;
        }
        assert!(Instant::now() < give_up, "the slot stays assigned");
    }
    let instances = fleet(2, &origin, Duration::from_millis(50), connect, configure).await;
    let good = uri_on(&instances, &cluster.nodes[0], &[]);

    // Requests for the orphan over many probe intervals: served (from the
    // origin, locally), one circuit opened per instance, and not again and
    // again by probes that find some other node answering.
    for _ in 0..8 {
        for i in &instances {
            assert_eq!(send(&i.app, get_req(orphan)).await.status, 200);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert!(s.circuit_openings <= 1, "instance {n} flapped: {s:?}");
    }
    assert!(
        instances.iter().any(|i| stats(i).errors > 0),
        "the orphan's slot was refused"
    );
    assert!(
        cluster.nodes.iter().all(|n| n
            .raw(&["CLUSTER", "INFO"])
            .contains("cluster_slots_assigned:16383")),
        "the slot stayed nobody's throughout"
    );
    // Every other slot keeps its fleet protection.
    for _ in 0..2 {
        assert_eq!(round(&instances, &origin, &good, 6, TTL).await, 1);
    }
}
