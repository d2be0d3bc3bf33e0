//! For the Redis Cluster health tests: a cluster backend with a short
//! probe, the URLs whose entries live on a given node, and rounds of
//! concurrent requests counted in origin calls.

use std::time::Duration;

use stampede_guard::{Backend, RedisStats};

use super::cluster::Cluster;
use super::fleet::{event_subscribers, fleet_burst, Instance};
use super::redis::RedisServer;
use super::{get, Origin};

/// A cluster backend with `deadline` and a probe every 100 ms.
pub async fn connect(cluster: &Cluster, deadline: Duration) -> Backend {
    connect_with(
        Backend::redis_cluster_builder(cluster.urls())
            .deadline(deadline)
            .probe_interval(Duration::from_millis(100)),
    )
    .await
}

/// A cluster backend with `deadline`, a probe every 100 ms, and the other
/// time limits a loaded machine meets (see
/// [`super::fleet::roomy_backend_at`]): for bursts counted in origin calls.
pub async fn connect_roomy(cluster: &Cluster, deadline: Duration) -> Backend {
    connect_with(
        Backend::redis_cluster_builder(cluster.urls())
            .deadline(deadline)
            .connect_timeout(super::fleet::ROOMY_BURST)
            .outage_grace(super::fleet::ROOMY_BURST)
            .probe_interval(Duration::from_millis(100)),
    )
    .await
}

/// Connects `builder`, and waits (bounded) until the backend joined.
async fn connect_with(builder: stampede_guard::RedisBackendBuilder) -> Backend {
    let backend = builder.connect().await.expect("cluster backend");
    // On a loaded machine the first connect may outlast its timeout: the
    // backend then starts on its in-process tier and joins in the
    // background. These tests measure the joined fleet, so wait for it.
    let joined = std::time::Instant::now() + Duration::from_secs(30);
    while backend.stats().redis.is_none() {
        assert!(
            std::time::Instant::now() < joined,
            "the cluster backend never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend
}

/// The instance's Redis tier counters.
pub fn stats(instance: &Instance) -> RedisStats {
    instance.backend.stats().redis.expect("a redis tier")
}

/// A `/report/N` URL, not in `skip`, whose entry lives on `node` (the
/// node answers for its key rather than redirecting).
pub fn uri_on(instances: &[Instance], node: &RedisServer, skip: &[String]) -> String {
    (0..2048)
        .map(|i| format!("/report/{i}"))
        .filter(|uri| !skip.contains(uri))
        .find(|uri| {
            let key = instances[0].guard.key_for(&get(uri)).unwrap();
            let reply = node.raw(&["EXISTS", &format!("sg:{{{key}}}:v")]);
            !reply.starts_with("-MOVED")
        })
        .expect("a key on the node")
}

/// Lets every instance's entries (of `ttl`) expire, then sends `n`
/// concurrent requests for `uri` over the fleet. Returns the origin calls
/// it cost; every answer must be a 200.
pub async fn round(
    instances: &[Instance],
    origin: &Origin,
    uri: &str,
    n: usize,
    ttl: Duration,
) -> usize {
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let before = origin.calls();
    let answers = fleet_burst(instances, n, || get(uri)).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{uri}: {a:?}");
    }
    origin.calls() - before
}

/// The primary (its index in `cluster.nodes`) the instances' event
/// subscriptions are on: the one with the most subscribers.
pub fn subscribed_primary(cluster: &Cluster) -> usize {
    cluster
        .masters()
        .into_iter()
        .max_by_key(|&i| event_subscribers(&cluster.nodes[i]))
        .expect("a primary")
}
