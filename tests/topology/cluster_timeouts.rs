//! Redis Cluster: the tier's own connections to the primaries keep the
//! backend's time limits. A node that answers within the configured
//! deadline (here paused for less than it with `CLIENT PAUSE`) is a node
//! that answers: no call fails, no circuit opens, and the fleet still
//! shares one rebuild, as on one server.
#![cfg(feature = "redis-cluster")]

use std::time::Duration;

use crate::common::cluster::Cluster;
use crate::common::fleet::{fleet, fleet_burst};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, Origin};
use stampede_guard::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_slower_than_half_a_second_but_within_the_deadline_is_no_failure() {
    let cluster = Cluster::start(3, 0);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            // A deadline for a slow network: generous, and documented as
            // each call's limit.
            .deadline(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(3))
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let origin = Origin::default();
    let instances = fleet(3, &origin, Duration::from_millis(20), connect, |g| {
        g.ttl(Duration::from_millis(200))
            .wait_budget(Duration::from_secs(8))
    })
    .await;
    let node: &RedisServer = &cluster.nodes[cluster.masters()[0]];
    let uri = (0..512)
        .map(|i| format!("/report/{i}"))
        .find(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            !node
                .raw(&["EXISTS", &format!("sg:{{{key}}}:v")])
                .starts_with("-MOVED")
        })
        .expect("a key on the node");
    for a in fleet_burst(&instances, 3, || get_req(&uri)).await {
        assert_eq!(a.status, 200);
    }
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = origin.calls();
        // The node holds every client's commands for 1.2 s, well within
        // the 3 s deadline.
        assert_eq!(node.raw(&["CLIENT", "PAUSE", "1200", "ALL"]), "+OK");
        let answers = fleet_burst(&instances, 6, || get_req(&uri)).await;
        for a in &answers {
            assert_eq!(a.status, 200, "{a:?}");
        }
        assert_eq!(
            origin.calls() - before,
            1,
            "round {round}: one rebuild for the fleet"
        );
    }
    for (n, i) in instances.iter().enumerate() {
        let s = i.backend.stats().redis.unwrap();
        assert_eq!(s.errors, 0, "instance {n}: no call failed");
        assert_eq!(s.circuit_openings, 0, "instance {n}: no circuit opened");
    }
}
