//! Redis Cluster with one shard stalled: its primary paused (`CLIENT PAUSE
//! … ALL`: connections accepted, nothing answered, the cluster bus still
//! healthy) or frozen (SIGSTOP), whichever of the fleet's fixed keys (the
//! event channel, the membership, the invalidation table) its slots hold.
//! Many keys over every slot, asked concurrently from two instances, window
//! after window: the healthy shards' keys cost one origin call per key per
//! window and their primaries' circuits never open; the stalled shard's
//! keys are protected in each process (at most one call per key per
//! instance per window).
#![cfg(feature = "redis-cluster")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::StampedeGuard;

use crate::common::cluster::Cluster;
use crate::common::fleet::Instance;
use crate::common::shards::connect;
use crate::common::{get as get_req, send};

const DEADLINE: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_millis(400);
const INSTANCES: usize = 2;
/// Requests per key per window, round-robin over the instances.
const PER_KEY: usize = 4;

/// Origin calls per path.
#[derive(Clone, Default)]
struct PerPath(Arc<Mutex<HashMap<String, usize>>>);

impl PerPath {
    fn snapshot(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

async fn instance(cluster: &Cluster, calls: &PerPath) -> Instance {
    let backend = connect(cluster, DEADLINE).await;
    let guard = StampedeGuard::new(backend.clone())
        .ttl(TTL)
        .lease(Duration::from_secs(1))
        .wait_budget(Duration::from_secs(5));
    let calls = calls.clone();
    let handler = move |Path(id): Path<String>| {
        let calls = calls.clone();
        async move {
            *calls
                .0
                .lock()
                .unwrap()
                .entry(format!("/report/{id}"))
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            format!("v{id}")
        }
    };
    let app = Router::new().route("/report/{id}", get(handler).layer(guard.clone()));
    Instance {
        backend,
        guard,
        app,
    }
}

#[derive(Clone, Copy, Debug)]
enum Stall {
    /// `CLIENT PAUSE … ALL`.
    Paused,
    /// SIGSTOP.
    Frozen,
}

/// When the second instance starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Before the stall, like the first.
    BothBefore,
    /// While the shard is stalled: it connects to the cluster's other
    /// primaries, reads the slot map from one of them, and joins the fleet
    /// for their keys.
    OneDuring,
}

/// The fixed key whose slot the stalled primary serves.
#[derive(Clone, Copy, Debug)]
enum Holding {
    Channel,
    Members,
    Table,
}

impl Holding {
    fn key(self) -> &'static str {
        match self {
            Holding::Channel => "sg:events",
            Holding::Members => "sg:members",
            Holding::Table => "sg:tags",
        }
    }
}

/// The primary (index into `cluster.nodes`) that serves `key`'s slot.
fn primary_of(cluster: &Cluster, masters: &[usize], key: &str) -> usize {
    masters
        .iter()
        .copied()
        .find(|&i| !cluster.nodes[i].raw(&["EXISTS", key]).starts_with("-MOVED"))
        .expect("a primary serves the slot")
}

async fn one_stalled_shard(stall: Stall, holding: Holding, start: Start) {
    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let calls = PerPath::default();
    let mut instances = vec![instance(&cluster, &calls).await];
    if let Start::BothBefore = start {
        instances.push(instance(&cluster, &calls).await);
    }
    let masters = cluster.masters();
    let bad = primary_of(&cluster, &masters, holding.key());
    let bad_port = cluster.nodes[bad].port();
    // Many keys over every slot; each by the primary that serves it.
    let uris: Vec<(String, usize)> = (0..48)
        .map(|i| {
            let uri = format!("/report/{i}");
            let key = instances[0].guard.key_for(&get_req(&uri)).unwrap();
            let node = primary_of(&cluster, &masters, &format!("sg:{{{key}}}:v"));
            (uri, node)
        })
        .collect();
    for &m in &masters {
        assert!(
            uris.iter().filter(|(_, n)| *n == m).count() >= 5,
            "keys on every primary: {uris:?}"
        );
    }

    // Healthy: one call per key per window.
    let healthy = window(&instances, &calls, &uris).await;
    assert!(
        healthy.iter().all(|(.., n)| *n == 1),
        "healthy cluster: {healthy:?}"
    );

    match stall {
        // Longer than the rest of the test: it ends with the cluster.
        Stall::Paused => {
            let reply = cluster.nodes[bad].raw(&["CLIENT", "PAUSE", "120000", "ALL"]);
            assert_eq!(reply, "+OK");
        }
        Stall::Frozen => cluster.nodes[bad].freeze(),
    }
    if let Start::OneDuring = start {
        instances.push(instance(&cluster, &calls).await);
    }
    let mut windows = Vec::new();
    for _ in 0..6 {
        windows.push(window(&instances, &calls, &uris).await);
    }
    let report: Vec<_> = instances.iter().map(|i| i.backend.stats().redis).collect();
    let health: Vec<_> = instances.iter().map(|i| i.backend.health()).collect();
    if let Stall::Frozen = stall {
        cluster.nodes[bad].thaw();
    }
    let off: usize = windows
        .iter()
        .flatten()
        .filter(|(_, node, n)| *node != bad && *n != 1)
        .count();
    let healthy_keys = uris.iter().filter(|(_, node)| *node != bad).count();
    eprintln!(
        "{stall:?} {holding:?} {start:?}: healthy keys off one call in {off} of {} key-windows",
        healthy_keys * windows.len()
    );

    for w in &windows {
        for (uri, node, n) in w {
            if *node == bad {
                assert!(
                    *n <= INSTANCES,
                    "{uri} on the stalled primary: {n} calls in a window (at most one per instance): {windows:?}"
                );
            } else {
                assert_eq!(
                    *n, 1,
                    "{uri} on a healthy primary: {n} calls in a window: {windows:?}\n{report:#?}"
                );
            }
        }
    }
    for (i, s) in report.iter().enumerate() {
        let s = s.as_ref().expect("every instance is connected");
        assert_eq!(s.nodes.len(), 3, "instance {i} knows every primary: {s:?}");
        for node in &s.nodes {
            let port: u16 = node.address.rsplit(':').next().unwrap().parse().unwrap();
            if port == bad_port {
                assert!(node.open, "instance {i}: {s:?}");
                assert_eq!(node.circuit_openings, 1, "instance {i}: {s:?}");
            } else {
                assert!(!node.open, "instance {i}: {s:?}");
                assert_eq!(node.circuit_openings, 0, "instance {i}: {s:?}");
            }
        }
        assert_eq!(s.circuit_openings, 1, "instance {i}: {s:?}");
        assert_eq!(s.open_circuits, 1, "instance {i}: {s:?}");
        let redis = health[i].redis.as_ref().expect("a redis tier");
        assert_eq!(
            redis.open_nodes,
            [format!("127.0.0.1:{bad_port}")],
            "instance {i}: {redis:?}"
        );
    }
}

/// One window: every instance's entries expire, then `PER_KEY` concurrent
/// requests per key (all keys at once), round-robin over the instances.
/// Returns each key's origin calls in it.
async fn window(
    instances: &[Instance],
    calls: &PerPath,
    uris: &[(String, usize)],
) -> Vec<(String, usize, usize)> {
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let before = calls.snapshot();
    let mut requests = tokio::task::JoinSet::new();
    for (uri, _) in uris {
        for n in 0..PER_KEY {
            let app = instances[n % instances.len()].app.clone();
            let request = get_req(uri);
            requests.spawn(async move { send(&app, request).await });
        }
    }
    while let Some(answer) = requests.join_next().await {
        let answer = answer.expect("a request task");
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let after = calls.snapshot();
    uris.iter()
        .map(|(uri, node)| {
            let n = after.get(uri).copied().unwrap_or(0) - before.get(uri).copied().unwrap_or(0);
            (uri.clone(), *node, n)
        })
        .collect()
}

/// The stalled shard holds the fleet's membership: every instance's
/// renewal fails (so its in-process tier is trusted no longer; see
/// `cluster_promises.rs`), yet the other shards' keys keep their fleet
/// lease, on the instance that started during the stall too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_membership_primary_costs_only_its_own_keys() {
    one_stalled_shard(Stall::Paused, Holding::Members, Start::OneDuring).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_membership_primary_costs_only_its_own_keys() {
    one_stalled_shard(Stall::Frozen, Holding::Members, Start::OneDuring).await;
}

/// The stalled shard holds the event channel: the subscriptions are lost
/// (a gap, the in-process tier dropped), yet the other shards' keys keep
/// their fleet lease, on the instance that started during the stall too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscription_primary_costs_only_its_own_keys() {
    one_stalled_shard(Stall::Paused, Holding::Channel, Start::OneDuring).await;
}

/// The stalled shard holds the invalidation table: instances that loaded
/// it before keep the fleet lease for the other shards' keys. (One that
/// starts during the stall cannot load it, and admits no entry read from
/// Redis until it can: an entry's tag generations cannot be checked
/// without the table. See docs/TOPOLOGY.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_table_primary_costs_only_its_own_keys() {
    one_stalled_shard(Stall::Paused, Holding::Table, Start::BothBefore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_table_primary_costs_only_its_own_keys() {
    one_stalled_shard(Stall::Frozen, Holding::Table, Start::BothBefore).await;
}
