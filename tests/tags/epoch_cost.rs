//! The cost of a lost tag table for a fleet: after the table is deleted
//! (as an eviction or a `FLUSHDB` of it alone would), one instance starts a
//! new epoch; the other must not keep rejecting its entries (a livelock of
//! misses), nor the reverse: each key costs the fleet one origin call.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::fleet_on;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
use stampede_guard::StampedeGuard;

fn tagged(guard: StampedeGuard) -> StampedeGuard {
    guard
        .ttl(Duration::from_secs(60))
        .tags(|req| vec![format!("id:{}", req.uri.path())])
}

async fn a_lost_table_costs_one_origin_call_per_key(purge_after: bool) {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, tagged).await;
    // Both instances have read the table and hold an epoch.
    for instance in &instances {
        send(&instance.app, get("/report/warm")).await;
    }
    assert_eq!(redis.raw(&["DEL", "sg:tags"]), ":1");
    if purge_after {
        // The purge writes a field into a table that has no epoch: the next
        // read of it starts a new one, on whichever instance reads first.
        instances[1].guard.invalidate_all().await.unwrap();
    }
    let calls = origin.calls();
    for round in 0..3 {
        for i in 0..10 {
            let uri = format!("/report/{round}-{i}");
            // Alternate which instance builds first.
            let (first, second) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            let built = send(&instances[first].app, get(&uri)).await.text();
            let read = send(&instances[second].app, get(&uri)).await.text();
            assert_eq!(read, built, "{uri}: the second instance rebuilt");
        }
    }
    // One rebuild per key, plus at most one per instance while it learns
    // the new epoch.
    let spent = origin.calls() - calls;
    assert!(spent <= 30 + 2, "{spent} origin calls for 30 keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_table_costs_one_origin_call_per_key_for_the_fleet() {
    a_lost_table_costs_one_origin_call_per_key(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_into_a_lost_table_costs_one_origin_call_per_key() {
    a_lost_table_costs_one_origin_call_per_key(true).await;
}
