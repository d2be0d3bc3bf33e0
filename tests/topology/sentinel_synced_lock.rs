//! `Lock::synced` behind Sentinel under real faults: an acquisition the
//! replicas did not acknowledge (too few of them, or the replica frozen)
//! must fail and leave the lock free at once for everybody else, and
//! fencing tokens handed out by synced acquisitions must keep rising across
//! two failovers in a row.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::cluster::wait_replicated;
use crate::common::lock::{first_hold, held_locks};
use crate::common::sentinel::SentinelSetup;
use stampede_guard::{FencingToken, Lock, LockError};

/// Runs `rounds` synced acquisitions that cannot be acknowledged; right
/// after each fails, another instance tries the lock. Returns how often it
/// found the lock still held by the failed acquisition.
async fn failed_acquisitions_leave_holds(synced: &Lock, other: &Lock, rounds: usize) -> usize {
    let mut left_behind = 0;
    for round in 0..rounds {
        match synced.acquire("sku").await {
            Err(LockError::Unavailable(_)) => {}
            other => panic!("round {round}: an unacknowledged acquisition must fail: {other:?}"),
        }
        match other
            .try_acquire("sku")
            .await
            .expect("the other instance asks")
        {
            Some(guard) => assert!(guard.release().await.unwrap()),
            None => left_behind += 1,
        }
    }
    left_behind
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_synced_acquisition_leaves_the_lock_free_at_once() {
    let setup = SentinelSetup::start();
    let mine = setup.probing_backend().await;
    let theirs = setup.probing_backend().await;
    let other = Lock::new(theirs);

    // WAIT answers fewer replicas than asked for: there is only one.
    let two = Lock::new(mine.clone())
        .lease(Duration::from_secs(30))
        .synced(2, Duration::from_millis(50));
    let held = failed_acquisitions_leave_holds(&two, &other, 10).await;
    assert_eq!(
        held, 0,
        "{held} of 10 failed acquisitions still held the lock"
    );

    // The replica is frozen: nothing acknowledges.
    setup.replica.freeze();
    let one = Lock::new(mine.clone())
        .lease(Duration::from_secs(30))
        .synced(1, Duration::from_millis(50));
    let held = failed_acquisitions_leave_holds(&one, &other, 10).await;
    setup.replica.thaw();
    assert_eq!(
        held, 0,
        "{held} of 10 failed acquisitions still held the lock"
    );
    assert_eq!(held_locks(&setup.primary), ":0");

    // Once the replica answers again, synced acquisitions succeed.
    let guard = one.acquire("sku").await.expect("acknowledged");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_tokens_keep_rising_across_two_failovers() {
    let mut setup = SentinelSetup::start();
    let backend = setup.probing_backend().await;
    let synced = Lock::new(backend.clone())
        .lease(Duration::from_secs(30))
        .synced(1, Duration::from_millis(500));
    let plain = Lock::new(backend.clone());

    let mut newest = FencingToken(0);
    for _ in 0..5 {
        let guard = synced.acquire("sku").await.expect("synced acquisition");
        newest = newest.max(guard.fencing_token());
        assert!(guard.release().await.unwrap());
    }
    // First failover: the primary dies right after a synced hold.
    setup.primary.kill();
    setup.wait_for_promotion(Duration::from_secs(20));
    let first = first_hold(&plain, "sku", Duration::from_secs(20)).await;
    assert!(first > newest, "after one failover: {first:?} > {newest:?}");
    newest = first;

    // The old primary comes back empty, as a replica of the new one.
    setup.primary.restart();
    let new_port = setup.replica.port().to_string();
    assert_eq!(
        setup.primary.raw(&["REPLICAOF", "127.0.0.1", &new_port]),
        "+OK"
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    while !setup
        .primary
        .raw(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < give_up, "the old primary did not resync");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Synced holds on the second primary, acknowledged by the first.
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut synced_holds = 0;
    while synced_holds < 5 {
        match synced.acquire("sku").await {
            Ok(guard) => {
                assert!(guard.fencing_token() > newest, "tokens rise");
                newest = guard.fencing_token();
                assert!(guard.release().await.unwrap());
                synced_holds += 1;
            }
            // The sentinel may not have seen the new replica yet.
            Err(_) => assert!(Instant::now() < give_up, "no synced hold"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_replicated(&setup.replica, Duration::from_secs(10));
    // Second failover: the second primary dies; the first is promoted back.
    setup.replica.kill();
    let give_up = Instant::now() + Duration::from_secs(30);
    while !(setup.sentinel().primary_port() == Some(setup.primary.port())
        && setup
            .primary
            .raw(&["INFO", "replication"])
            .contains("role:master"))
    {
        assert!(Instant::now() < give_up, "no second promotion");
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = first_hold(&plain, "sku", Duration::from_secs(20)).await;
    assert!(
        after > newest,
        "after two failovers: {after:?} > {newest:?}"
    );
}
