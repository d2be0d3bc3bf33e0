//! The fleet on a primary found through Sentinel. The primary is killed
//! while the fleet serves; the sentinel promotes the replica; the instances
//! follow it. The rebuild lease taken on the old primary is lost on the new
//! one (it lapses during the failover), a second holder rebuilds, and the
//! first holder's late commit is refused by the fence.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::cluster::wait_replicated;
use crate::common::fleet::{fleet, fleet_burst, wait_until_available, wait_until_fleet};
use crate::common::sentinel::SentinelSetup;
use crate::common::{get as get_req, send, Origin, ROOMY_DEADLINE};
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Notify;

async fn connect(setup: &SentinelSetup) -> Backend {
    connect_with(setup, Duration::from_millis(50)).await
}

async fn connect_with(setup: &SentinelSetup, deadline: Duration) -> Backend {
    Backend::redis_builder(&setup.url())
        .deadline(deadline)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("backend through sentinel")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_the_service_going_and_fences_the_stale_holder() {
    let mut setup = SentinelSetup::start();
    let setup_ref = &setup;

    // The load: three instances on ordinary keys. Their origin calls are
    // counted exactly, so their deadline is one a loaded machine meets (the
    // dead primary refuses connections at once). The stalled holder below
    // keeps 50 ms: its lease (600 ms) is counted from a deadline before it
    // was granted.
    let load = Origin::default();
    let instances = fleet(
        3,
        &load,
        Duration::from_millis(20),
        || connect_with(setup_ref, ROOMY_DEADLINE),
        |g| g.ttl(Duration::from_secs(60)),
    )
    .await;
    wait_until_fleet(&instances, Duration::from_secs(20)).await;
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(
        load.calls(),
        1,
        "one origin call through the sentinel's primary"
    );
    assert!(answers.iter().all(|a| a.text() == "v1"));

    // A holder, A, takes the rebuild lease of /slow on the primary and stalls.
    let slow = Origin::default();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let handler = {
        let slow = slow.clone();
        let entered = entered.clone();
        let release = release.clone();
        move || {
            let slow = slow.clone();
            let entered = entered.clone();
            let release = release.clone();
            async move {
                let (n, _running) = slow.enter();
                if n == 1 {
                    entered.notify_one();
                    release.notified().await;
                }
                format!("v{n}")
            }
        }
    };
    let app = |backend: &Backend| {
        // A short lease: it lapses on the new primary while the old one is
        // gone and its holder cannot renew it.
        let guard = StampedeGuard::new(backend.clone())
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_millis(600));
        (
            Router::new().route("/slow", get(handler.clone()).layer(guard.clone())),
            guard,
        )
    };
    let a_backend = connect(&setup).await;
    let b_backend = connect(&setup).await;
    let (app_a, guard_a) = app(&a_backend);
    let (app_b, _) = app(&b_backend);
    let stalled = {
        let app_a = app_a.clone();
        tokio::spawn(async move { send(&app_a, get_req("/slow")).await })
    };
    entered.notified().await;
    let key = guard_a.key_for(&get_req("/slow")).unwrap();
    let lease = format!("sg:{{{key}}}:l");
    // The lease and its fencing number have reached the replica.
    wait_replicated(&setup.primary, Duration::from_secs(10));
    assert_eq!(setup.replica.raw(&["EXISTS", &lease]), ":1");

    // The primary dies. Requests keep being answered throughout.
    setup.primary.kill();
    let mut round = 0;
    while !(setup.sentinel().primary_port() == Some(setup.replica.port())
        && setup
            .replica
            .raw(&["INFO", "replication"])
            .contains("role:master"))
    {
        let answers = fleet_burst(&instances, 30, || {
            get_req(&format!("/report/during-{round}"))
        })
        .await;
        assert!(
            answers.iter().all(|a| a.status == 200),
            "served during failover"
        );
        round += 1;
        assert!(round < 400, "the sentinel did not promote the replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    setup.wait_for_promotion(Duration::from_secs(10));

    // A's lease is gone from the new primary (it could not be renewed).
    for _ in 0..100 {
        if setup.replica.raw(&["EXISTS", &lease]) == ":0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(setup.replica.raw(&["EXISTS", &lease]), ":0", "lease lost");

    // Every instance follows the new primary.
    wait_until_available(&instances, Duration::from_secs(20)).await;
    let probe_a = [crate::common::fleet::instance(
        a_backend.clone(),
        &Origin::default(),
        Duration::ZERO,
        |g| g,
    )];
    let probe_b = [crate::common::fleet::instance(
        b_backend.clone(),
        &Origin::default(),
        Duration::ZERO,
        |g| g,
    )];
    // A and B were idle: their next calls find the old primary gone and
    // make them follow. Ask until a call on a new key goes through cleanly.
    for (n, probe) in [&probe_a, &probe_b].into_iter().enumerate() {
        let mut healthy = false;
        for i in 0..100 {
            let errors = probe[0].backend.stats().redis.unwrap().errors;
            send(&probe[0].app, get_req(&format!("/report/wake-{n}-{i}"))).await;
            let stats = probe[0].backend.stats().redis.unwrap();
            if stats.available && stats.errors == errors {
                healthy = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(healthy, "instance {n} follows the new primary");
    }

    // B takes the free lease on the new primary and rebuilds.
    let b = send(&app_b, get_req("/slow")).await;
    assert_eq!(b.text(), "v2", "B rebuilt once the lease was lost");
    // A wakes up late. Its write never lands: either the fence refuses its
    // commit, or its flight was already detached when its subscription came
    // back after the failover (messages may have been missed), and it does
    // not try to commit at all.
    release.notify_one();
    let a = stalled.await.unwrap();
    assert_eq!(a.text(), "v1", "A's own client still gets A's answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        a_backend.stats().redis.unwrap().fenced_writes <= 1,
        "at most A's one stale write was refused"
    );
    // Everyone sees B's value; one extra rebuild in all.
    let c = connect(&setup).await;
    let (app_c, _) = app(&c);
    let answer = send(&app_c, get_req("/slow")).await;
    assert_eq!((answer.text().as_str(), answer.x_cache()), ("v2", "HIT"));
    assert_eq!(slow.calls(), 2);

    // Fleet-wide protection is back on the new primary, once every
    // instance's subscription is.
    wait_until_fleet(&instances, Duration::from_secs(20)).await;
    let before = load.calls();
    let answers = fleet_burst(&instances, 300, || get_req("/report/after")).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(
        load.calls() - before,
        1,
        "one origin call per cold key again"
    );
}
