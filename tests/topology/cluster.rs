//! The fleet on a real Redis Cluster started by the test: every script's
//! keys sit in one hash slot, entries spread over the primaries, wake-ups
//! and invalidations reach every instance whichever node it is attached to,
//! and the loss of a primary (its replica promoted) does not stop service.
#![cfg(feature = "redis-cluster")]

use std::time::Duration;

use crate::common::cluster::{wait_replicated, Cluster};
use crate::common::fleet::{fleet, fleet_burst, wait_until_available, wakeups};
use crate::common::{get as get_req, send, tally, Origin, ROOMY_DEADLINE};
use stampede_guard::{Backend, ErrorKind, Lock};

/// A backend whose deadline a loaded machine meets: these tests count
/// origin calls and round trips exactly, and a call missing the default
/// 50 ms falls back to local protection. (A killed node refuses
/// connections at once.)
async fn connect(cluster: &Cluster) -> Backend {
    Backend::redis_cluster_builder(cluster.urls())
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("cluster backend")
}

/// Settings for a node with the user `app` confined like the TLS tests' one,
/// plus the one command a cluster client needs to learn the slot map.
fn confined_user() -> Vec<&'static str> {
    let mut args = vec!["--user", "app", "on", ">app-secret", "+cluster|slots"];
    args.extend_from_slice(crate::common::tls::ACL_RULES);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_master_cluster_calls_the_origin_once_per_cold_key() {
    // Every instance connects as an ACL user confined to the namespace.
    let cluster = Cluster::start_with(3, 0, &confined_user());
    // Wrong credentials are a clear start-up error here too.
    let wrong = cluster.url_as("app:not-the-secret@");
    let attempt = Backend::redis(&wrong);
    let error = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("fails, does not hang")
        .expect_err("must not connect");
    let message = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(message.contains("authentication failed"), "{message}");
    assert!(!message.contains("not-the-secret"), "{message}");
    let origin = Origin::default();
    let n = std::sync::atomic::AtomicUsize::new(0);
    let cluster_ref = &cluster;
    let connect = || {
        let by_url = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 2;
        async move {
            if by_url {
                // One instance uses the URL form: the same cluster.
                Backend::redis(&cluster_ref.url_as("app:app-secret@"))
                    .await
                    .expect("cluster by URL")
            } else {
                let nodes = cluster_ref
                    .nodes
                    .iter()
                    .map(|n| format!("redis://app:app-secret@127.0.0.1:{}/", n.port()));
                Backend::redis_cluster_builder(nodes)
                    .deadline(ROOMY_DEADLINE)
                    .connect()
                    .await
                    .expect("cluster backend")
            }
        }
    };
    let instances = fleet(3, &origin, Duration::from_millis(200), connect, |g| {
        g.lease(Duration::from_secs(30))
            .ttl(Duration::from_secs(60))
    })
    .await;

    // One cold key, 300 requests over three instances: one origin call, and
    // the waiters are woken by the commit's publish (never by a timer).
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1, "one origin call for the whole fleet");
    assert!(answers.iter().all(|a| a.status == 200 && a.text() == "v1"));
    assert_eq!(tally(&answers, "MISS"), 1);
    let (by_message, by_timeout) = wakeups(&instances);
    assert_eq!(by_timeout, 0, "no waiter slept out a timer");
    assert!(by_message >= 1);

    // Many cold keys at once: one call each, and the entries spread over
    // every primary (each key's scripts ran on its own slot's node).
    let keys = 24;
    let i = std::sync::atomic::AtomicUsize::new(0);
    let answers = fleet_burst(&instances, keys * 10, || {
        let k = i.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % keys;
        get_req(&format!("/report/{k}"))
    })
    .await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls(), 1 + keys, "one call per key for the fleet");
    let spread = cluster.keys_per_master();
    assert_eq!(spread.len(), 3);
    assert!(
        spread.iter().all(|&k| k > 0),
        "keys on every primary: {spread:?}"
    );

    // A miss costs two scripts, a hit in Redis one, cluster-wide.
    let before = cluster.command_calls("evalsha");
    send(&instances[0].app, get_req("/report/fresh")).await;
    assert_eq!(cluster.command_calls("evalsha") - before, 2);
    let before = cluster.command_calls("evalsha");
    let hit = send(&instances[1].app, get_req("/report/fresh")).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_eq!(cluster.command_calls("evalsha") - before, 1);

    // An invalidation published on one node reaches every instance.
    let calls = origin.calls();
    instances[0]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;
    for instance in &instances[1..] {
        let answer = send(&instance.app, get_req("/report")).await;
        assert_eq!(answer.text(), format!("v{}", calls + 1));
    }
    assert_eq!(origin.calls(), calls + 1);
    // Confirmed by the others' acknowledgements, recorded on the node of
    // the purge's own set (not waited out for a lease).
    let stats = instances[0].backend.stats().redis.unwrap();
    assert_eq!(stats.unconfirmed_invalidations, 0);

    // The lock's scripts (five keys sharing the name's hash tag) run too.
    let lock = Lock::new(instances[2].backend.clone());
    let other = Lock::new(instances[0].backend.clone());
    let guard = lock
        .acquire("stock:sku-42")
        .await
        .expect("lock on a cluster");
    assert!(other.try_acquire("stock:sku-42").await.unwrap().is_none());
    let fence = guard.fencing_token();
    assert!(guard.release().await.unwrap());
    let next = other.acquire("stock:sku-42").await.unwrap();
    assert!(next.fencing_token() > fence);
    assert!(next.release().await.unwrap());

    for instance in &instances {
        assert_eq!(instance.backend.stats().redis.unwrap().errors, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_primary_keeps_the_service_going() {
    let mut cluster = Cluster::start(3, 1);
    let origin = Origin::default();
    let instances = fleet(
        3,
        &origin,
        Duration::from_millis(50),
        || connect(&cluster),
        |g| g.ttl(Duration::from_secs(60)),
    )
    .await;
    let keys = 12;
    let i = std::sync::atomic::AtomicUsize::new(0);
    let spread = || {
        let k = i.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % keys;
        get_req(&format!("/report/{k}"))
    };
    fleet_burst(&instances, keys * 5, spread).await;
    assert_eq!(origin.calls(), keys);

    // Kill one primary outright; its replica takes over after the node
    // timeout. Requests keep being answered all along.
    let victim = cluster.masters()[0];
    // Replication is asynchronous: make sure the replica has the entries,
    // so the test shows a loss-free failover (a write that had not reached
    // the replica would be lost with the primary, and rebuilt once).
    wait_replicated(&cluster.nodes[victim], Duration::from_secs(10));
    cluster.nodes[victim].kill();
    let mut round = 0;
    loop {
        let answers = fleet_burst(&instances, 30, || {
            get_req(&format!("/report/during-{round}"))
        })
        .await;
        assert!(
            answers.iter().all(|a| a.status == 200),
            "served during failover"
        );
        round += 1;
        let whole = cluster.nodes.iter().filter(|n| n.ping()).all(|n| {
            let info = n.raw(&["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
        });
        // Right after the kill the survivors still report the cluster ok
        // (they have not yet noticed): wait for the replica's promotion.
        if (whole && cluster.masters().len() == 3) || round > 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.wait_until_ok(Duration::from_secs(20));
    assert_eq!(cluster.masters().len(), 3, "a replica was promoted");

    // Once the clients have the new map, fleet-wide protection is back:
    // a cold key costs one origin call for the whole fleet again.
    let mut settled = false;
    for attempt in 0..100 {
        wait_until_available(&instances, Duration::from_secs(20)).await;
        let before = origin.calls();
        let uri = format!("/report/after-{attempt}");
        let answers = fleet_burst(&instances, 90, || get_req(&uri)).await;
        assert!(answers.iter().all(|a| a.status == 200));
        if origin.calls() - before == 1 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(settled, "one origin call per cold key after the failover");
    // And the waiters on the other instances are woken by the publish,
    // whichever node their subscription had been on.
    let (_, timeouts) = wakeups(&instances);
    let before = origin.calls();
    let answers = fleet_burst(&instances, 90, || get_req("/report/woken")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin.calls() - before, 1);
    assert_eq!(
        wakeups(&instances).1,
        timeouts,
        "no waiter slept out a timer"
    );
    // The promoted replica serves the old primary's entries.
    let before = origin.calls();
    let fresh = fleet(
        1,
        &origin,
        Duration::ZERO,
        || connect(&cluster),
        |g| g.ttl(Duration::from_secs(60)),
    )
    .await;
    let answers = fleet_burst(&fresh, keys, spread).await;
    assert!(
        answers.iter().all(|a| a.x_cache() == "HIT"),
        "{:?}",
        answers
            .iter()
            .map(|a| (a.x_cache(), a.text()))
            .collect::<Vec<_>>()
    );
    assert_eq!(origin.calls(), before, "no entry was lost with the primary");
}
