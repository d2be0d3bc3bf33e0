//! Redis Cluster under faults, on real processes: a lock's slot migrated
//! while the lock is in use, and the node that holds the subscription
//! killed while an invalidation is published elsewhere.
#![cfg(feature = "redis-cluster")]

use std::time::Duration;

use crate::common::cluster::{wait_replicated, Cluster};
use crate::common::fleet::{event_subscribers, fleet, keys_like, wait_until_available};
use crate::common::redis::RedisServer;
use crate::common::shards::subscribed_primary;
use crate::common::{get as get_req, send, Origin, ROOMY_DEADLINE};
use stampede_guard::{Backend, Lock};

async fn connect(cluster: &Cluster) -> Backend {
    connect_with(cluster, Duration::from_millis(50)).await
}

async fn connect_with(cluster: &Cluster, deadline: Duration) -> Backend {
    Backend::redis_cluster_builder(cluster.urls())
        .deadline(deadline)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("cluster backend")
}

fn id_of(node: &RedisServer) -> String {
    node.raw(&["CLUSTER", "MYID"])
}

fn errors_of(node: &RedisServer, code: &str) -> u64 {
    let info = node.raw(&["INFO", "errorstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("errorstat_{code}:count=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_slot_migrates_under_load_never_fails_its_callers() {
    let cluster = Cluster::start(3, 0);
    // The migration, not the deadline, is what no caller may see: on a
    // loaded machine an acquisition meeting TRYAGAIN missed 50 ms.
    let a = Lock::new(connect_with(&cluster, ROOMY_DEADLINE).await)
        .wait_budget(Duration::from_secs(10));
    let b = Lock::new(connect_with(&cluster, ROOMY_DEADLINE).await)
        .wait_budget(Duration::from_secs(10));
    let first = a.acquire("stock").await.expect("lock");
    let mut last = first.fencing_token();
    assert!(first.release().await.unwrap());

    // Where the lock's keys live, and the other primary.
    let masters = cluster.masters();
    let (source, target) = {
        let holds = |&i: &usize| !keys_like(&cluster.nodes[i], "sg:lock:*").is_empty();
        let source = *masters.iter().find(|i| holds(i)).expect("the lock's node");
        let target = *masters
            .iter()
            .find(|&&i| i != source)
            .expect("another primary");
        (&cluster.nodes[source], &cluster.nodes[target])
    };
    let key = keys_like(source, "sg:lock:*").remove(0);
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &key])
        .trim_start_matches(':')
        .to_owned();
    let tag = &key[..key.find('}').expect("a hash tag") + 1];

    // Two instances take turns with the lock while its slot moves.
    let load = tokio::spawn(async move {
        let mut tokens = Vec::new();
        for round in 0..60 {
            let lock = if round % 2 == 0 { &a } else { &b };
            let guard = lock.acquire("stock").await.map_err(|e| e.to_string())?;
            tokens.push(guard.fencing_token());
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(guard.release().await.map_err(|e| e.to_string())?);
        }
        Ok::<_, String>((a, b, tokens))
    });
    let (src, dst) = (id_of(source), id_of(target));
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        source.raw(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst]),
        "+OK"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let port = target.port().to_string();
    for _ in 0..50 {
        let keys = keys_like(source, &format!("{tag}*"));
        if keys.is_empty() {
            break;
        }
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend(keys.iter().map(String::as_str));
        let reply = source.raw(&migrate);
        assert!(reply == "+OK" || reply == "+NOKEY", "{reply}");
    }
    for node in [target, source] {
        assert_eq!(
            node.raw(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst]),
            "+OK"
        );
    }
    assert!(
        errors_of(source, "TRYAGAIN") + errors_of(target, "TRYAGAIN") > 0,
        "the migration made the lock's scripts meet TRYAGAIN"
    );

    // No caller saw an error; the tokens kept rising; the lock is free and
    // usable at once afterwards (no queue place left behind).
    let (a, b, tokens) = load.await.unwrap().expect("no acquisition failed");
    for token in tokens {
        assert!(token > last, "{token:?} > {last:?}");
        last = token;
    }
    let guard = b.try_acquire("stock").await.unwrap().expect("free");
    assert!(a.try_acquire("stock").await.unwrap().is_none());
    assert!(guard.fencing_token() > last);
    assert!(guard.release().await.unwrap());
    assert!(!keys_like(target, &format!("{tag}*")).is_empty(), "moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_missed_while_the_subscribers_node_is_down_is_not_served() {
    let mut cluster = Cluster::start(3, 1);
    let origin = Origin::default();
    let instances = fleet(
        2,
        &origin,
        Duration::ZERO,
        || connect(&cluster),
        |g| g.ttl(Duration::from_secs(60)),
    )
    .await;
    // The node that holds the instances' subscriptions to the channel.
    let masters = cluster.masters();
    let victim = subscribed_primary(&cluster);
    assert!(
        event_subscribers(&cluster.nodes[victim]) > 0,
        "the subscriptions are on a primary"
    );
    // A URL whose entry lives on another node, read into both L1s.
    let uri = (0..64)
        .map(|i| format!("/report/{i}"))
        .find(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            let reply = cluster.nodes[victim].raw(&["EXISTS", &format!("sg:{{{key}}}:v")]);
            reply.starts_with("-MOVED")
        })
        .expect("a key on another node");
    let old = send(&instances[0].app, get_req(&uri)).await.text();
    assert_eq!(send(&instances[1].app, get_req(&uri)).await.text(), old);
    for node in masters.iter().filter(|&&i| i != victim) {
        wait_replicated(&cluster.nodes[*node], Duration::from_secs(10));
    }

    // The channel's node dies; the invalidation is published on another
    // node while the subscriptions are down, so nobody hears it.
    cluster.nodes[victim].kill();
    instances[0]
        .guard
        .invalidate(&get_req(&uri))
        .await
        .expect("the invalidation reached the entry's node");

    // Once the replica has taken over and the instances are back, neither
    // serves the value it held before the invalidation. (Right after the
    // kill the survivors still report the cluster ok: wait for three
    // primaries again.)
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while cluster.masters().len() < 3 {
        assert!(std::time::Instant::now() < give_up, "no replica promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_until_ok(Duration::from_secs(20));
    wait_until_available(&instances, Duration::from_secs(20)).await;
    for (n, instance) in instances.iter().enumerate() {
        let answer = send(&instance.app, get_req(&uri)).await;
        assert_ne!(
            answer.text(),
            old,
            "instance {n} served the invalidated value"
        );
    }
}
