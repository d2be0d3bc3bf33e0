//! Redis Cluster under real faults: the documented least-privilege user
//! through a synced lock and a primary's failover (nothing refused), a
//! fresh entry read from a slot on the move, and lock calls refused by a
//! migrating slot leaving nothing behind.
#![cfg(feature = "redis-cluster")]

use std::time::{Duration, Instant};

use crate::common::cluster::{wait_replicated, Cluster};
use crate::common::fleet::{fleet, keys_like};
use crate::common::{get as get_req, send, Origin};
use stampede_guard::{Backend, Lock};

/// What the live nodes refused (their `ACL LOG`), but `CONFIG GET` and
/// `INFO`: the reads of the eviction policy, documented as refused to this
/// user (the policy is then unknown).
fn refused(cluster: &Cluster) -> Vec<String> {
    let mut refused = Vec::new();
    for node in cluster.nodes.iter().filter(|n| n.ping()) {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &node.port().to_string(), "ACL", "LOG"])
            .output()
            .expect("redis-cli runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.windows(2) {
            if pair[0] == "object" && pair[1] != "info" && pair[1] != "config|get" {
                refused.push(pair[1].to_owned());
            }
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_needs_nothing_more_on_a_cluster_through_a_failover() {
    // Exactly the documented rules, plus the documented `+cluster|slots`.
    let mut args = vec!["--user", "app", "on", ">app-secret", "+cluster|slots"];
    args.extend_from_slice(crate::common::tls::ACL_RULES);
    let mut cluster = Cluster::start_with(3, 1, &args);
    let url = cluster.url_as("app:app-secret@");
    let connect = || async {
        Backend::redis_builder(&url)
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("the documented user connects")
    };
    let origin = Origin::default();
    let instances = fleet(2, &origin, Duration::ZERO, connect, |g| g).await;
    let synced = Lock::new(instances[0].backend.clone()).synced(1, Duration::from_millis(500));
    let plain = Lock::new(instances[1].backend.clone());

    let guard = synced
        .acquire("stock")
        .await
        .expect("a synced lock as the user");
    assert!(plain.try_acquire("stock").await.unwrap().is_none());
    let before = guard.fencing_token();
    assert!(guard.release().await.unwrap());
    for instance in &instances {
        assert_eq!(send(&instance.app, get_req("/report")).await.text(), "v1");
    }
    instances[0]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidation as the user");
    // On a cluster the message may cross the bus after the call returned
    // (docs/TOPOLOGY.md): the other instance drops its copy when it comes.
    let give_up = Instant::now() + Duration::from_secs(5);
    while send(&instances[1].app, get_req("/report")).await.text() == "v1" {
        assert!(Instant::now() < give_up, "the invalidation never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        refused(&cluster),
        Vec::<String>::new(),
        "refused before the failover"
    );

    // The primary that holds the lock dies; its replica takes over.
    let masters = cluster.masters();
    let victim = *masters
        .iter()
        .find(|&&i| !keys_like(&cluster.nodes[i], "sg:lock:*").is_empty())
        .expect("the lock's node");
    wait_replicated(&cluster.nodes[victim], Duration::from_secs(10));
    cluster.nodes[victim].kill();
    let give_up = Instant::now() + Duration::from_secs(20);
    while cluster.masters().len() < 3 {
        assert!(Instant::now() < give_up, "no replica promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_until_ok(Duration::from_secs(20));

    // As the user, after the failover: the plain lock, tokens rising, the
    // cache and an invalidation; and no command of the crate was refused.
    let give_up = Instant::now() + Duration::from_secs(20);
    let after = loop {
        if let Ok(Some(guard)) = plain.try_acquire("stock").await {
            let token = guard.fencing_token();
            assert!(guard.release().await.unwrap());
            break token;
        }
        assert!(Instant::now() < give_up, "no lock after the failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(after > before, "{after:?} > {before:?}");
    let give_up = Instant::now() + Duration::from_secs(20);
    while instances[0]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < give_up,
            "no invalidation after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        refused(&cluster),
        Vec::<String>::new(),
        "refused after the failover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_entry_is_read_while_its_slot_is_migrating() {
    let cluster = Cluster::start(3, 0);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let origin = Origin::default();
    let instances = fleet(4, &origin, Duration::ZERO, connect, |g| {
        g.ttl(Duration::from_secs(60))
    })
    .await;
    let uri = "/report/migrating";
    assert_eq!(send(&instances[0].app, get_req(uri)).await.text(), "v1");

    // The entry's slot starts migrating to another primary; none of its
    // keys has moved yet, so its node still serves them.
    let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
    let value = format!("sg:{{{key}}}:v");
    let masters = cluster.masters();
    let owns = |i: &usize| cluster.nodes[*i].raw(&["EXISTS", &value]) == ":1";
    let source = &cluster.nodes[*masters.iter().find(|i| owns(i)).expect("owner")];
    let target = &cluster.nodes[*masters.iter().find(|i| !owns(i)).expect("other")];
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &value])
        .trim_start_matches(':')
        .to_owned();
    let (src, dst) = (
        source.raw(&["CLUSTER", "MYID"]),
        target.raw(&["CLUSTER", "MYID"]),
    );
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        source.raw(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst]),
        "+OK"
    );

    // Instances that never read the entry: each finds it fresh in Redis.
    let mut texts = Vec::new();
    for instance in &instances[1..] {
        texts.push(send(&instance.app, get_req(uri)).await.text());
    }
    let calls = origin.calls();
    for node in [source, target] {
        assert_eq!(node.raw(&["CLUSTER", "SETSLOT", &slot, "STABLE"]), "+OK");
    }
    assert_eq!(calls, 1, "a fresh entry cost an origin call per instance");
    assert!(texts.iter().all(|t| t == "v1"), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_calls_refused_by_a_migrating_slot_leave_nothing_behind() {
    let cluster = Cluster::start(3, 0);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("cluster backend")
    };
    let a = Lock::new(connect().await).wait_budget(Duration::from_millis(300));
    let b = Lock::new(connect().await);
    let guard = a.acquire("stock").await.expect("lock");
    let before = guard.fencing_token();
    assert!(guard.release().await.unwrap());

    // The lock's slot starts migrating (its counters stay, its hold and
    // queue keys do not exist: every acquisition meets TRYAGAIN).
    let masters = cluster.masters();
    let owns = |i: &usize| !keys_like(&cluster.nodes[*i], "sg:lock:*").is_empty();
    let source = &cluster.nodes[*masters.iter().find(|i| owns(i)).expect("owner")];
    let target = &cluster.nodes[*masters.iter().find(|i| !owns(i)).expect("other")];
    let key = keys_like(source, "sg:lock:*").remove(0);
    let slot = source
        .raw(&["CLUSTER", "KEYSLOT", &key])
        .trim_start_matches(':')
        .to_owned();
    let (src, dst) = (
        source.raw(&["CLUSTER", "MYID"]),
        target.raw(&["CLUSTER", "MYID"]),
    );
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src]),
        "+OK"
    );
    assert_eq!(
        source.raw(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst]),
        "+OK"
    );

    // Tries without a budget, and acquisitions whose budget runs out while
    // the slot is on the move: none gets the lock, none hangs past its
    // budget by more than a deadline or two.
    for _ in 0..5 {
        if let Ok(Some(guard)) = b.try_acquire("stock").await {
            assert!(guard.release().await.unwrap());
        }
        let started = Instant::now();
        if let Ok(guard) = a.acquire("stock").await {
            assert!(guard.release().await.unwrap());
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "bounded by the budget"
        );
    }
    for node in [source, target] {
        assert_eq!(node.raw(&["CLUSTER", "SETSLOT", &slot, "STABLE"]), "+OK");
    }

    // The slot settles: the lock is free at once for either instance (no
    // hold or queue place left by the refused tries), and tokens rise.
    let guard = b
        .try_acquire("stock")
        .await
        .expect("asks")
        .expect("free at once after the migration");
    assert!(guard.fencing_token() > before, "tokens rise");
    assert!(a.try_acquire("stock").await.unwrap().is_none());
    assert!(guard.release().await.unwrap());
}
