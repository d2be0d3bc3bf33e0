//! Attacks on the refusal of locks on a server that may evict their keys:
//! the policy changed at runtime with the link up, every evicting policy
//! and a tiny `maxmemory`, a failover to a replica with another policy (a
//! waiter queued across it included), a cluster primary that dropped its
//! links, and a cluster slot moved to an evicting primary under a client
//! whose slot map still names the old owner.
#![cfg(feature = "redis")]

use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use crate::common::lock::a_lock_held_on;
use crate::common::lock::{backend, held_locks, lock_on_a_server_turned_evicting, turn_evicting};
use crate::common::redis::RedisServer;
use crate::common::ROOMY_DEADLINE;
use stampede_guard::{Lock, LockError};

/// Tries `name` until it is refused as on an evicting server, at most
/// `tries` times (a lock taken meanwhile is released and counted).
/// Returns how many acquisitions were granted, and whether one was refused.
async fn granted_before_refusal(lock: &Lock, name: &str, tries: usize) -> (usize, bool) {
    let mut granted = 0;
    for _ in 0..tries {
        match lock.try_acquire(name).await {
            Err(LockError::EvictingServer { .. }) => return (granted, true),
            Ok(Some(guard)) => {
                granted += 1;
                let _ = guard.release().await;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (granted, false)
}

/// A backend through the setup's Sentinel, probing a lost link every 100 ms.
async fn sentinel_backend(
    setup: &crate::common::sentinel::SentinelSetup,
) -> stampede_guard::Backend {
    stampede_guard::Backend::redis_builder(&setup.url())
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("sentinel backend")
}

#[tokio::test]
async fn a_policy_set_at_runtime_refuses_the_next_locks() {
    let (_redis, _backend, lock) = lock_on_a_server_turned_evicting().await;
    // No reconnect: 50 acquisitions over a second, the server now evicting.
    let (granted, refused) = granted_before_refusal(&lock, "stock", 50).await;
    assert!(
        refused && granted == 0,
        "{granted} locks granted on a server whose policy is allkeys-lru"
    );
}

#[tokio::test]
async fn every_evicting_policy_and_a_tiny_limit_refuse_locks() {
    for policy in [
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
    ] {
        for limit in ["1", "1mb"] {
            let redis = RedisServer::start_with(&["--maxmemory-policy", policy]);
            // Set after start: a tiny limit refuses nothing the harness needs.
            assert_eq!(redis.raw(&["CONFIG", "SET", "maxmemory", limit]), "+OK");
            let backend = backend(&redis.url(), ROOMY_DEADLINE).await;
            let refused = Lock::new(backend).try_acquire("stock").await;
            assert!(
                matches!(&refused, Err(LockError::EvictingServer { policy: p, .. }) if p == policy),
                "{policy} {limit}: {refused:?}"
            );
            assert_eq!(held_locks(&redis), ":0", "{policy} {limit}");
        }
    }
}

/// Opted in on a server that evicts every key at once (`maxmemory 1`,
/// `allkeys-random`): the hold is gone after each write. Each holder learns
/// it lost, and 40 acquisitions by two owners give strictly rising tokens.
#[tokio::test]
async fn opted_in_on_a_server_that_keeps_nothing_tokens_still_rise() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "allkeys-random"]);
    assert_eq!(redis.raw(&["CONFIG", "SET", "maxmemory", "1"]), "+OK");
    let a = backend(&redis.url(), ROOMY_DEADLINE).await;
    let b = backend(&redis.url(), ROOMY_DEADLINE).await;
    let lease = Duration::from_millis(900);
    let locks = [
        Lock::new(a).lease(lease).allow_evicting_server(true),
        Lock::new(b).lease(lease).allow_evicting_server(true),
    ];
    let mut tokens = Vec::new();
    let mut overlapping = 0;
    for n in 0..40 {
        let first = locks[n % 2]
            .try_acquire("stock")
            .await
            .expect("redis answers")
            .expect("the evicted hold is free");
        tokens.push(first.fencing_token());
        // The other owner takes it too (its key was evicted): the first
        // must learn it lost before long.
        if let Ok(Some(second)) = locks[(n + 1) % 2].try_acquire("stock").await {
            overlapping += 1;
            tokens.push(second.fencing_token());
            let mut lost = false;
            for _ in 0..500 {
                if first.is_lost() {
                    lost = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(lost, "round {n}: the first holder never learned it lost");
            let _ = second.release().await;
        }
        let _ = first.release().await;
    }
    assert!(overlapping > 0, "redis evicted no hold");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens repeat or fall: {tokens:?}"
    );
}

/// The replica that Sentinel promotes evicts (`allkeys-lru`), the old
/// primary does not. After the failover, locks are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_evicting_replica_refuses_locks() {
    use crate::common::sentinel::{SentinelSetup, SERVICE};

    let setup = SentinelSetup::start();
    turn_evicting(&setup.replica, "64mb", "allkeys-lru");
    let backend = sentinel_backend(&setup).await;
    let lock = Lock::new(backend.clone());
    let guard = lock.acquire("stock").await.expect("the primary keeps keys");
    assert!(guard.release().await.expect("released"));

    assert!(setup
        .sentinel()
        .raw(&["SENTINEL", "FAILOVER", SERVICE])
        .contains("+OK"));
    setup.wait_for_promotion(Duration::from_secs(30));
    // Every lock granted after the promotion is one on the evicting server.
    let mut granted_on_replica = 0;
    let mut refused = false;
    for _ in 0..500 {
        match lock.try_acquire("stock").await {
            Err(LockError::EvictingServer { policy, .. }) => {
                assert_eq!(policy, "allkeys-lru");
                refused = true;
                break;
            }
            Ok(Some(guard)) => {
                if held_locks(&setup.replica) == ":1" {
                    granted_on_replica += 1;
                }
                let _ = guard.release().await;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "never refused after the failover");
    assert_eq!(
        granted_on_replica, 0,
        "locks granted on the evicting new primary"
    );
}

/// A lock's slot is moved (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE)
/// from a primary that keeps every key to one that evicts, with the
/// client's links up and its slot map naming the old owner. The next
/// acquisition must be refused, not granted on the evicting primary.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_to_an_evicting_primary_refuses_the_next_lock() {
    use crate::common::cluster::{finish_migration, Cluster};

    let cluster = Cluster::start(3, 0);
    let (keeper, evicting) = (&cluster.nodes[0], &cluster.nodes[2]);
    turn_evicting(evicting, "64mb", "allkeys-lru");
    let backend = crate::common::shards::connect(&cluster, ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone());
    // A lock served by the keeper.
    let name = a_lock_held_on(&lock, keeper).await;
    // Its slot, from its fence counter (which outlives the hold).
    let counter = keeper.raw(&[
        "EVAL",
        "return redis.call('KEYS', ARGV[1])[1]",
        "0",
        "sg:lock:*:n",
    ]);
    assert!(!counter.is_empty(), "the lock's fence counter");
    let slot = keeper.raw(&["CLUSTER", "KEYSLOT", &counter]);
    let slot = slot.trim_start_matches(':').to_owned();

    let (src, dst) = (
        keeper.raw(&["CLUSTER", "MYID"]),
        evicting.raw(&["CLUSTER", "MYID"]),
    );
    assert_eq!(
        evicting.raw(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        keeper.raw(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst]),
        "+OK"
    );
    finish_migration(keeper, evicting, &slot);
    for node in &cluster.nodes {
        let _ = node.raw(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst]);
    }
    cluster.wait_until_ok(Duration::from_secs(20));

    // 20 tries, 20 ms apart: each granted one is a hold on the evicting
    // primary.
    let mut granted = 0;
    let mut first_refusal = None;
    for n in 0..20 {
        match lock.try_acquire(&name).await {
            Ok(Some(guard)) => {
                assert_eq!(held_locks(evicting), ":1", "try {n}");
                granted += 1;
                let _ = guard.release().await;
            }
            Err(LockError::EvictingServer { .. }) => {
                first_refusal.get_or_insert(n);
            }
            other => panic!("try {n}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        granted, 0,
        "locks granted on the evicting primary after the move (first refusal at try {first_refusal:?})"
    );
}

/// A cluster primary is SIGKILLed; its replica, which evicts
/// (`allkeys-lru`), takes its slots. A lock on those slots must be refused
/// there.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_to_an_evicting_replica_refuses_its_locks() {
    use crate::common::cluster::{wait_replicated, Cluster};

    let mut cluster = Cluster::start(3, 1);
    let victim = cluster.masters()[0];
    let victim_port = format!("master_port:{}", cluster.nodes[victim].port());
    let replica = (0..cluster.nodes.len())
        .find(|&i| {
            cluster.nodes[i]
                .raw(&["INFO", "replication"])
                .contains(&victim_port)
        })
        .expect("the victim's replica");
    let evicting = &cluster.nodes[replica];
    turn_evicting(evicting, "64mb", "allkeys-lru");
    let backend = crate::common::shards::connect(&cluster, ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone());
    let name = a_lock_held_on(&lock, &cluster.nodes[victim]).await;
    wait_replicated(&cluster.nodes[victim], Duration::from_secs(10));
    cluster.nodes[victim].kill();
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while !cluster.nodes[replica]
        .raw(&["INFO", "replication"])
        .contains("role:master")
    {
        assert!(std::time::Instant::now() < give_up, "no promotion");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.wait_until_ok(Duration::from_secs(20));
    let evicting = &cluster.nodes[replica];
    let (mut granted, mut refused) = (0, false);
    for _ in 0..300 {
        match lock.try_acquire(&name).await {
            Err(LockError::EvictingServer { policy, .. }) => {
                assert_eq!(policy, "allkeys-lru");
                refused = true;
                break;
            }
            Ok(Some(guard)) => {
                if held_locks(evicting) == ":1" {
                    granted += 1;
                }
                let _ = guard.release().await;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(granted, 0, "locks granted on the promoted evicting replica");
    assert!(refused, "never refused after the promotion");
}

/// On a cluster, the primary that serves a lock (not the one holding the
/// instance's event subscription) turns evicting and drops every client
/// connection (`CLIENT KILL TYPE normal`), a loss the next acquisition
/// finds by itself: not one lock is granted on it after the change.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_that_dropped_its_links_is_read_again() {
    use crate::common::cluster::Cluster;

    let cluster = Cluster::start(3, 0);
    let backend = crate::common::shards::connect(&cluster, ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone());
    // A primary without the instance's subscription.
    let subscribed = |i: usize| {
        cluster.nodes[i]
            .raw(&["CLIENT", "LIST", "TYPE", "pubsub"])
            .contains("id=")
    };
    let target = (0..3).find(|&i| !subscribed(i)).expect("a node without it");
    let node = &cluster.nodes[target];
    let name = a_lock_held_on(&lock, node).await;
    turn_evicting(node, "64mb", "allkeys-lru");
    let killed = node.raw(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed.starts_with(':'), "{killed}");
    let (granted, refused) = granted_before_refusal(&lock, &name, 100).await;
    eprintln!("granted {granted} before the refusal");
    assert!(refused, "{granted} locks granted after the links were lost");
    assert_eq!(granted, 0, "locks granted on the evicting primary");
}

/// The server keeps every key when the instance connects; its policy is
/// then set to `allkeys-lru` (no reconnect) and memory filled until a held
/// lock's key is evicted. With the default (no opt-in), a second owner in
/// the same process must not get the lock while the first still holds it.
#[tokio::test]
async fn a_runtime_policy_switch_and_an_eviction_do_not_give_the_lock_twice() {
    let redis = RedisServer::start();
    let backend = backend(&redis.url(), ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone()).lease(Duration::from_secs(6));
    let first = lock.acquire("stock").await.expect("noeviction");
    turn_evicting(&redis, "4mb", "allkeys-lru");
    let fill = "for i = 1, 100 do \
                redis.call('SET', 'filler:' .. ARGV[1] .. ':' .. i, string.rep('x', 1024)) \
                end return 1";
    let mut batch = 0;
    while held_locks(&redis) != ":0" {
        assert!(batch < 20_000, "redis kept the hold");
        assert_eq!(redis.raw(&["EVAL", fill, "0", &batch.to_string()]), ":1");
        batch += 1;
    }
    let second = lock.try_acquire("stock").await;
    let both = matches!(&second, Ok(Some(_))) && !first.is_lost();
    if let Ok(Some(guard)) = second {
        let _ = guard.release().await;
    }
    assert!(
        !both,
        "two guards hold the lock at once (evicted after {batch} batches)"
    );
}

/// A waiter queues behind a holder on a primary that keeps every key;
/// Sentinel then promotes a replica that evicts, and the holder releases
/// once the old primary is demoted. The waiter must not be handed the lock
/// on the evicting server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_across_a_failover_to_an_evicting_replica_is_refused() {
    use crate::common::sentinel::{SentinelSetup, SERVICE};

    let setup = SentinelSetup::start();
    turn_evicting(&setup.replica, "64mb", "allkeys-lru");
    let (a, b) = (
        sentinel_backend(&setup).await,
        sentinel_backend(&setup).await,
    );
    let holder = Lock::new(a)
        .lease(Duration::from_secs(2))
        .acquire("stock")
        .await
        .expect("the primary keeps keys");
    let waiter = tokio::spawn(async move {
        Lock::new(b)
            .wait_budget(Duration::from_secs(40))
            .acquire("stock")
            .await
    });
    // The waiter is queued on the primary.
    let mut queued = false;
    for _ in 0..200 {
        if crate::common::lock::over_keys(&setup.primary, "sg:lock:*:q", "n = n + 1") != ":0" {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(queued, "the waiter queued");
    assert!(setup
        .sentinel()
        .raw(&["SENTINEL", "FAILOVER", SERVICE])
        .contains("+OK"));
    setup.wait_for_promotion(Duration::from_secs(30));
    // The old primary takes writes until the sentinels demote it: released
    // after that, the lock is free only on the evicting new primary.
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while !setup
        .primary
        .raw(&["INFO", "replication"])
        .contains("role:slave")
    {
        assert!(std::time::Instant::now() < give_up, "never demoted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = holder.release().await;
    let outcome = waiter.await.unwrap();
    // Refused, or failed in the failover: anything but a hold there. (A
    // hold the old primary granted while it still was one, its holder
    // lapsed in the switch, is not: it must then be reported lost.)
    match outcome {
        Err(_) => {}
        Ok(guard) => {
            let fence = guard.fencing_token();
            let hold = setup.replica.raw(&[
                "EVAL",
                "local k = redis.call('KEYS', ARGV[1])[1] \
                 return k and redis.call('HGET', k, 'fence') or ''",
                "0",
                "sg:lock:*:l",
            ]);
            assert_ne!(
                hold,
                format!("{}", fence.0),
                "the waiter holds the lock on the evicting new primary"
            );
            let mut lost = false;
            for _ in 0..1_000 {
                if guard.is_lost() {
                    lost = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(lost, "a hold granted by the demoted primary is never lost");
        }
    }
}
