//! Redis Cluster, what a lease holder is owed while its key's circuit is
//! open: a commit or a release is never skipped because the circuit is
//! open. One instance's circuit for a primary opens during a
//! `CLIENT PAUSE` of that node and stays open (a long probe interval)
//! after the node answers again. A's connect timeout is short, so the
//! first probe, which the opening starts once the supervisor is free,
//! runs and fails while the node is still paused; a rebuild that holds a lease on that node
//! meanwhile must keep its lease, commit its value, and leave no lease
//! behind, so another instance waiting for it makes no origin call.
#![cfg(feature = "redis-cluster")]

use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::fleet::{event_subscribers, instance, keys_like, Instance};
use crate::common::redis::RedisServer;
use crate::common::shards::stats;
use crate::common::{get as get_req, send, Origin};
use stampede_guard::Backend;

/// A `/report/N` URL whose entry lives on `node`.
fn uris_on(instances: &[Instance], node: &RedisServer, n: usize) -> Vec<String> {
    (0..4096)
        .map(|i| format!("/report/{i}"))
        .filter(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            let reply = node.raw(&["EXISTS", &format!("sg:{{{key}}}:v")]);
            !reply.starts_with("-MOVED")
        })
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_keeps_renews_and_commits_its_lease_past_an_open_circuit() {
    let cluster = Cluster::start(3, 0);
    let origin = Origin::default();
    let configure = |g: stampede_guard::StampedeGuard| {
        g.ttl(Duration::from_secs(30))
            .lease(Duration::from_millis(3000))
            .wait_budget(Duration::from_secs(5))
    };
    let delay = Duration::from_millis(5000);
    // A: a short deadline and a probe so slow that its circuit stays open
    // long after the node answers again. A connection to a paused node
    // waits for the pause's end: the connect timeout keeps the supervisor
    // (which opens connections to the primaries after reading the slot
    // map) from being held up that long, so its first probe comes while
    // the node is still paused.
    let a = Backend::redis_cluster_builder(cluster.urls())
        .deadline(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_secs(10))
        .connect()
        .await
        .expect("cluster backend");
    let b = Backend::redis_cluster_builder(cluster.urls())
        .deadline(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("cluster backend");
    let instances = vec![
        instance(a, &origin, delay, configure),
        instance(b, &origin, delay, configure),
    ];
    let masters = cluster.masters();
    // Not the subscription's node: pausing it is no lost subscription.
    let node = *masters
        .iter()
        .min_by_key(|&&i| event_subscribers(&cluster.nodes[i]))
        .unwrap();
    let uris = uris_on(&instances, &cluster.nodes[node], 4);
    let (key_uri, others) = (uris[0].clone(), uris[1..].to_vec());

    // A starts the rebuild of the key and holds its lease.
    let started = Instant::now();
    let app = instances[0].app.clone();
    let uri = key_uri.clone();
    let leader = tokio::spawn(async move { send(&app, get_req(&uri)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(origin.calls(), 1, "A rebuilds");

    // The node stops answering for 1.5 s (half the lease; the lease's
    // renewal a third of a lease in may fail, the next one does not); A's
    // calls for other keys on it time out and open A's circuit for that
    // node. (`CLIENT UNPAUSE` would not end it sooner: Redis 7.0 releases
    // the clients the pause holds only when its time is up.)
    assert_eq!(
        cluster.nodes[node].raw(&["CLIENT", "PAUSE", "1500", "ALL"]),
        "+OK"
    );
    let side: Vec<_> = others
        .iter()
        .map(|uri| {
            let (app, uri) = (instances[0].app.clone(), uri.clone());
            tokio::spawn(async move { send(&app, get_req(&uri)).await })
        })
        .collect();
    let give_up = Instant::now() + Duration::from_secs(3);
    while stats(&instances[0]).open_circuits == 0 {
        assert!(Instant::now() < give_up, "A's circuit did not open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // After the pause, while A still rebuilds: B asks for the key.
    tokio::time::sleep(Duration::from_millis(2000).saturating_sub(started.elapsed())).await;
    assert!(started.elapsed() < delay, "B asks while A rebuilds");
    let waiter = send(&instances[1].app, get_req(&key_uri)).await;
    let leader = leader.await.expect("leader");
    for s in side {
        assert_eq!(s.await.expect("side request").status, 200);
    }
    assert_eq!(leader.status, 200);
    assert_eq!(waiter.status, 200);
    assert_eq!(
        stats(&instances[0]).open_circuits,
        1,
        "A's circuit was open throughout"
    );
    // One origin call for the key (the leader's) plus one per side request.
    assert_eq!(
        (waiter.text(), origin.calls()),
        (leader.text(), 1 + others.len()),
        "B waited for A's rebuild"
    );
    let key = instances[0].guard.key_for(&get_req(&key_uri)).unwrap();
    let left = keys_like(&cluster.nodes[node], &format!("sg:{{{key}}}:*"));
    assert!(
        left.iter().any(|k| k.ends_with(":v")),
        "committed: {left:?}"
    );
    assert!(
        !left.iter().any(|k| k.ends_with(":l")),
        "lease left: {left:?}"
    );
}
