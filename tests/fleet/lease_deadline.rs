//! A rebuild lease's validity counts from when the request that took it
//! was sent, not from one deadline before the reply: with a backend
//! deadline at or above the lease (a generous deadline and a short lease,
//! both legitimate), every lease counted as over as soon as it was taken,
//! no renewal was attempted, and every instance rebuilt the key.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::{fleet, fleet_burst};
use crate::common::redis::RedisServer;
use crate::common::{get, Origin};
use stampede_guard::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_above_the_lease_still_rebuilds_once_for_the_fleet() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let connect = || async {
        Backend::redis_builder(&redis.url())
            .deadline(Duration::from_secs(1))
            .connect()
            .await
            .expect("redis backend")
    };
    // The origin takes twice the lease: the lease must be renewed, by a
    // watchdog that believes it holds it.
    let instances = fleet(3, &origin, Duration::from_millis(400), connect, |g| {
        g.ttl(Duration::from_secs(30))
            .lease(Duration::from_millis(200))
            .wait_budget(Duration::from_secs(5))
    })
    .await;
    for round in 0..3 {
        let uri = format!("/report/{round}");
        let answers = fleet_burst(&instances, 12, || get(&uri)).await;
        assert!(answers.iter().all(|a| a.status == 200), "round {round}");
        assert_eq!(
            origin.calls(),
            round + 1,
            "one origin call for the fleet in round {round}"
        );
    }
}
