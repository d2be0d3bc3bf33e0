//! Redis Cluster, per-primary health under two bad shards at once: one
//! primary frozen (SIGSTOP) and another killed (SIGKILL), five primaries
//! without replicas, three instances. The promise (one bad shard
//! costs only its own keys; docs/TOPOLOGY.md "Health per primary"): healthy keys
//! keep one origin call per expiry for the fleet, each bad node's keys cost
//! at most one call per instance per expiry, each bad node's circuit opens
//! once per instance and stays open (no flapping), and no Redis call is made
//! for an open circuit's keys.
#![cfg(feature = "redis-cluster")]

use std::time::Duration;

use crate::common::cluster::Cluster;
use crate::common::shards::{connect, round, stats, subscribed_primary, uri_on};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::common::fleet::{fleet_burst, Instance};
use crate::common::{get as get_req, Origin};
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::{RedisStats, StampedeGuard};

/// Origin calls per path, besides the total.
#[derive(Clone, Default)]
struct PerPath(Arc<Mutex<HashMap<String, usize>>>);

impl PerPath {
    fn snapshot(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

/// An instance whose `/report/{id}` counts its calls in `origin` and `calls`.
async fn instance(cluster: &Cluster, origin: &Origin, calls: &PerPath) -> Instance {
    let backend = connect(cluster, DEADLINE).await;
    let guard = StampedeGuard::new(backend.clone())
        .ttl(TTL)
        .lease(Duration::from_secs(1))
        .wait_budget(Duration::from_secs(5));
    let (origin, calls) = (origin.clone(), calls.clone());
    let handler = move |Path(id): Path<String>| {
        let (origin, calls) = (origin.clone(), calls.clone());
        async move {
            let (n, _running) = origin.enter();
            *calls
                .0
                .lock()
                .unwrap()
                .entry(format!("/report/{id}"))
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(150)).await;
            format!("v{n}")
        }
    };
    let app = Router::new().route("/report/{id}", get(handler).layer(guard.clone()));
    Instance {
        backend,
        guard,
        app,
    }
}

const DEADLINE: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_and_a_dead_primary_cost_only_their_own_keys() {
    let mut cluster = Cluster::start_with(5, 0, &["--cluster-require-full-coverage", "no"]);
    let origin = Origin::default();
    let calls = PerPath::default();
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(instance(&cluster, &origin, &calls).await);
    }
    let masters = cluster.masters();
    // The subscription's node stays healthy (losing it is another fault).
    let sub = subscribed_primary(&cluster);
    let others: Vec<usize> = masters.iter().copied().filter(|&i| i != sub).collect();
    let (frozen, dead, healthy) = (others[0], others[1], others[2]);
    let good = [
        uri_on(&instances, &cluster.nodes[sub], &[]),
        uri_on(&instances, &cluster.nodes[healthy], &[]),
    ];
    let bad = [
        uri_on(&instances, &cluster.nodes[frozen], &[]),
        uri_on(&instances, &cluster.nodes[dead], &[]),
    ];
    for uri in good.iter().chain(&bad) {
        assert_eq!(round(&instances, &origin, uri, 9, TTL).await, 1, "{uri}");
    }

    cluster.nodes[frozen].freeze();
    cluster.nodes[dead].kill();

    // Load on every key at once, window after window: the bad keys open
    // their nodes' circuits while the healthy keys are hammered.
    let mut windows = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        let before = calls.snapshot();
        let (a, b, c, d) = tokio::join!(
            fleet_burst(&instances, 9, || get_req(&good[0])),
            fleet_burst(&instances, 9, || get_req(&good[1])),
            fleet_burst(&instances, 9, || get_req(&bad[0])),
            fleet_burst(&instances, 9, || get_req(&bad[1])),
        );
        for answer in a.iter().chain(&b).chain(&c).chain(&d) {
            assert_eq!(answer.status, 200, "{answer:?}");
        }
        let after = calls.snapshot();
        let per: Vec<usize> = good
            .iter()
            .chain(&bad)
            .map(|u| after.get(u).copied().unwrap_or(0) - before.get(u).copied().unwrap_or(0))
            .collect();
        windows.push(per);
    }
    // Healthy keys: one call per expiry, fleet-wide, in every window. A bad
    // key: at most one call per instance per expiry, never per request.
    for w in &windows {
        assert!(
            w[0] == 1 && w[1] == 1 && w[2] <= 3 && w[3] <= 3,
            "calls per window (good, good, frozen, dead): {windows:?}"
        );
    }
    let opened: Vec<RedisStats> = instances.iter().map(stats).collect();
    for (n, s) in opened.iter().enumerate() {
        assert_eq!(s.open_circuits, 2, "instance {n}: {s:?}");
        assert_eq!(s.circuit_openings, 2, "instance {n} flapped: {s:?}");
    }
    // Open circuits: no Redis call for the bad keys, no flapping, over many
    // probe intervals; the healthy keys are still shared.
    let errors: Vec<u64> = instances.iter().map(|i| stats(i).errors).collect();
    for _ in 0..3 {
        for uri in &bad {
            assert!(round(&instances, &origin, uri, 9, TTL).await <= 3);
        }
        for uri in &good {
            assert_eq!(round(&instances, &origin, uri, 9, TTL).await, 1, "{uri}");
        }
    }
    for (n, i) in instances.iter().enumerate() {
        let s = stats(i);
        assert_eq!(s.circuit_openings, 2, "instance {n} flapped: {s:?}");
        assert_eq!(s.open_circuits, 2, "instance {n}: {s:?}");
        assert_eq!(s.errors, errors[n], "instance {n} asked a bad node: {s:?}");
    }
    cluster.nodes[frozen].thaw();
}
