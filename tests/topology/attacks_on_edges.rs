//! Attacks on per-primary health and on Sentinel credentials: connecting
//! to a cluster with every seed but one paused, a burst of cold keys with
//! one shard paused, a sentinel set where the first sentinel listed
//! refuses the credentials the others take, the sentinels' password
//! rotated under a running instance, and the documented data ACL under
//! lock use through a failover.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::sentinel::{Access, SentinelSetup};
use crate::common::ROOMY_DEADLINE;
use stampede_guard::{Lock, RedisConfig};

/// Two of three primaries paused (`CLIENT PAUSE … ALL`: connections
/// accepted, nothing answered, the cluster bus healthy), listed first
/// among the seeds:
/// an instance still connects through the third, and takes locks whose
/// slots the third serves, with that primary's circuit closed.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_seed_but_one_paused_still_connects() {
    use crate::common::cluster::Cluster;
    use crate::common::lock::held_locks;

    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    // Connected once first, to find a lock name the healthy primary serves.
    let healthy = &cluster.nodes[2];
    let warm = crate::common::shards::connect(&cluster, ROOMY_DEADLINE).await;
    let mut name = None;
    for n in 0..200 {
        let candidate = format!("job-{n}");
        if let Ok(Some(guard)) = Lock::new(warm.clone()).try_acquire(&candidate).await {
            let here = held_locks(healthy) == ":1";
            assert!(guard.release().await.expect("released"));
            if here {
                name = Some(candidate);
                break;
            }
        }
    }
    let name = name.expect("a lock on the healthy primary");
    drop(warm);

    // Longer than the rest of the test: it ends with the cluster.
    for node in &cluster.nodes[..2] {
        assert_eq!(node.raw(&["CLIENT", "PAUSE", "120000", "ALL"]), "+OK");
    }
    let connected = tokio::time::timeout(
        Duration::from_secs(60),
        stampede_guard::Backend::redis_cluster_builder(cluster.urls())
            .deadline(ROOMY_DEADLINE)
            .probe_interval(Duration::from_millis(100))
            .connect(),
    )
    .await;
    let outcome = match connected {
        Ok(Ok(backend)) => {
            let mut taken = 0;
            let mut errors = Vec::new();
            for _ in 0..20 {
                match Lock::new(backend.clone()).try_acquire(&name).await {
                    Ok(Some(guard)) => {
                        taken += 1;
                        let _ = guard.release().await;
                    }
                    other => errors.push(format!("{other:?}")),
                }
            }
            errors.dedup();
            eprintln!("while two seeds are paused: {taken} of 20 taken; {errors:?}");
            let open = backend
                .health()
                .redis
                .map(|h| h.open_nodes)
                .unwrap_or_default();
            let healthy_addr = format!("127.0.0.1:{}", healthy.port());
            Ok((taken, open.iter().any(|n| n.contains(&healthy_addr))))
        }
        Ok(Err(e)) => Err(format!("connect failed: {e}")),
        Err(_) => Err("connect hung for 60 s".to_owned()),
    };
    let (taken, healthy_open) = outcome.expect("connects through the one live seed");
    assert_eq!(taken, 20, "locks on the healthy primary");
    assert!(!healthy_open, "the healthy primary's circuit opened");
}

/// Three sentinels with an ACL user `watcher`; the first one listed has
/// another password for it (changed at runtime). The other two, a
/// majority, take the credentials: the instance connects through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sentinel_refusing_the_credentials_is_skipped() {
    let setup = SentinelSetup::start_secured(
        3,
        &[],
        &Access {
            sentinel_conf: vec![
                "user default off".into(),
                "user admin on >s-admin ~* &* +@all".into(),
                "user watcher on >w-secret ~* &* +@all".into(),
            ],
            sentinel_admin: Some(("admin".into(), "s-admin".into())),
            ..Access::default()
        },
    );
    assert!(setup.sentinels[0]
        .raw(&["ACL", "SETUSER", "watcher", "resetpass", ">rotated"])
        .ends_with("+OK\r\n"));
    let mut config = RedisConfig::new(setup.url());
    config.sentinel_user = Some("watcher".into());
    config.sentinel_password = Some("w-secret".into());
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        stampede_guard::RedisBackendBuilder::from_config(config)
            .deadline(ROOMY_DEADLINE)
            .connect(),
    )
    .await
    .expect("connect does not hang");
    let backend = connected.expect("two of three sentinels take the credentials");
    let guard = Lock::new(backend)
        .try_acquire("stock")
        .await
        .expect("redis answers")
        .expect("free");
    assert!(guard.release().await.expect("released"));
}

/// The sentinels' password changes while instances run (all three, at
/// runtime); a failover follows. A running instance keeps its watch or
/// fails loudly; a new instance with the old password is refused with an
/// auth error naming the sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "after the sentinels' password rotates, a running instance never follows a failover: 0 locks on the new primary in 300 tries"]
async fn a_sentinel_password_changed_under_a_running_instance() {
    use crate::common::sentinel::SERVICE;

    let setup = SentinelSetup::start_secured(
        3,
        &[],
        &Access {
            sentinel_conf: vec![
                "user default off".into(),
                "user admin on >s-admin ~* &* +@all".into(),
                "user watcher on >w-secret ~* &* +@all".into(),
            ],
            sentinel_admin: Some(("admin".into(), "s-admin".into())),
            ..Access::default()
        },
    );
    let config = || {
        let mut config = RedisConfig::new(setup.url());
        config.sentinel_user = Some("watcher".into());
        config.sentinel_password = Some("w-secret".into());
        config
    };
    let backend = stampede_guard::RedisBackendBuilder::from_config(config())
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("connects");
    for s in &setup.sentinels {
        assert!(s
            .raw(&["ACL", "SETUSER", "watcher", "resetpass", ">rotated"])
            .ends_with("+OK\r\n"));
    }
    // A new instance with the old password: an auth error, not a hang.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        stampede_guard::RedisBackendBuilder::from_config(config())
            .deadline(ROOMY_DEADLINE)
            .connect(),
    )
    .await
    .expect("connect does not hang");
    let error = refused.expect_err("the old password is refused");
    assert_eq!(error.kind(), stampede_guard::ErrorKind::Auth, "{error}");

    // The running instance: after a failover it finds the new primary
    // (its existing links to the data nodes need no sentinel password) or
    // reports itself unavailable; it never takes a lock on the demoted one.
    assert!(setup
        .sentinel()
        .raw(&["SENTINEL", "FAILOVER", SERVICE])
        .contains("+OK"));
    setup.wait_for_promotion(Duration::from_secs(30));
    let lock = Lock::new(backend.clone());
    let mut on_new = 0;
    for _ in 0..300 {
        if let Ok(Some(guard)) = lock.try_acquire("stock").await {
            let on_replica = crate::common::lock::held_locks(&setup.replica) == ":1";
            let _ = guard.release().await;
            if on_replica {
                on_new += 1;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        crate::common::lock::held_locks(&setup.primary),
        ":0",
        "nothing held on the demoted primary"
    );
    assert_eq!(on_new, 1, "the running instance follows the failover");
}

/// The data user's rules of docs/TOPOLOGY.md (after `on >secret`).
fn documented_cache_rules() -> Vec<String> {
    let doc = include_str!("../../docs/TOPOLOGY.md");
    let start = "ACL SETUSER cache on >secret ";
    let at = doc
        .find(start)
        .expect("docs/TOPOLOGY.md gives the data ACL");
    let block = &doc[at + start.len()..];
    let end = block.find("```").expect("the ACL block ends");
    block[..end].split_whitespace().map(str::to_owned).collect()
}

/// What a data node's `ACL LOG` holds, read as the harness's admin
/// (its first line: `*0` when nothing was denied).
fn acl_log(node: &crate::common::redis::RedisServer) -> String {
    node.raw(&["ACL", "LOG"])
}

/// Data nodes with the documented data user only, behind Sentinel: locks
/// with a queue (a waiter), watchdog renewals, reentrancy, a synced hold
/// (`WAIT`), releases, and a failover between; the ACL LOG of both data
/// nodes stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_suffices_for_locks_through_a_failover() {
    use crate::common::sentinel::SERVICE;

    let mut args: Vec<String> = [
        "--user",
        "default",
        "off",
        "--user",
        "admin",
        "on",
        ">admin-secret",
        "~*",
        "&*",
        "+@all",
        "--user",
        "app",
        "on",
        ">app-secret",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(documented_cache_rules());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let setup = SentinelSetup::start_secured(
        1,
        &args,
        &Access {
            data_admin: Some(("admin".into(), "admin-secret".into())),
            ..Access::default()
        },
    );
    for node in [&setup.primary, &setup.replica] {
        assert_eq!(node.raw(&["ACL", "LOG", "RESET"]), "+OK");
    }
    let connect = || async {
        stampede_guard::RedisBackendBuilder::from_config(RedisConfig::new(
            setup.url_as("app:app-secret@"),
        ))
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("the documented user connects")
    };
    let (a, b) = (connect().await, connect().await);
    let use_locks = |round: &'static str| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let lease = Duration::from_millis(900);
            let first = Lock::new(a.clone())
                .lease(lease)
                .acquire("stock")
                .await
                .unwrap_or_else(|e| panic!("{round}: {e:?}"));
            // A waiter queues (heartbeats) while the holder's watchdog
            // renews a few times.
            let waiter = tokio::spawn(async move {
                Lock::new(b)
                    .lease(lease)
                    .wait_budget(Duration::from_secs(20))
                    .acquire("stock")
                    .await
            });
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let lost = first.is_lost();
            let first_token = first.fencing_token();
            let released = first.release().await;
            eprintln!("{round}: lost {lost}, released {released:?}");
            let lost = lost || !matches!(released, Ok(true));
            let second = waiter.await.unwrap().expect("the waiter gets it");
            // Without `synced` a token may repeat across a failover (as
            // documented); within one primary's life it rises.
            if round == "before" {
                assert!(second.fencing_token() > first_token);
            }
            assert!(second.release().await.expect("released"));
            // A synced hold (WAIT for the replica), when there is one.
            if let Ok(guard) = Lock::new(a)
                .synced(1, Duration::from_secs(2))
                .acquire(&format!("synced-{round}"))
                .await
            {
                assert!(guard.release().await.expect("released"));
            }
            lost
        }
    };
    let lost_before = use_locks("before").await;
    assert!(setup
        .sentinel()
        .raw(&["SENTINEL", "FAILOVER", SERVICE])
        .contains("+OK"));
    setup.wait_for_promotion(Duration::from_secs(30));
    // The old primary is writable until the sentinel makes it a replica:
    // wait for that, then until each instance takes a lock (on the new
    // primary: the old one refuses writes).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !setup
        .primary
        .raw(&["INFO", "replication"])
        .contains("role:slave")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the old primary follows"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (n, instance) in [&a, &b].into_iter().enumerate() {
        let lock = Lock::new(instance.clone());
        let mut followed = false;
        for _ in 0..300 {
            if let Ok(Some(guard)) = lock.try_acquire("probe").await {
                followed = guard.release().await.unwrap_or(false);
                if followed {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(followed, "instance {n} follows the failover");
    }
    let lost_after = use_locks("after").await;
    let logs = (acl_log(&setup.primary), acl_log(&setup.replica));
    eprintln!("ACL LOG first lines {logs:?}; lost before {lost_before}, after {lost_after}");
    assert_eq!(logs.0, "*0", "old primary denied");
    assert_eq!(logs.1, "*0", "new primary denied");
    assert!(!lost_before && !lost_after, "a renewed hold reported lost");
}

/// The deadline of the bursts over a shard paused throughout.
#[cfg(feature = "redis-cluster")]
const PAUSED_DEADLINE: Duration = Duration::from_secs(5);

/// Origin calls per path, for the cluster burst.
#[cfg(feature = "redis-cluster")]
#[derive(Clone, Default)]
struct PerPath(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>);

#[cfg(feature = "redis-cluster")]
async fn counted_instance(
    cluster: &crate::common::cluster::Cluster,
    calls: &PerPath,
    deadline: Duration,
) -> crate::common::fleet::Instance {
    use axum::extract::Path;
    use axum::routing::get;

    use crate::common::fleet::ROOMY_BURST;

    // The deadline tells a paused shard: a call it leaves unanswered that
    // long fails. Every other limit outlasts a burst on a loaded machine
    // (a call queued behind the burst, the lease's renewals, the waiters,
    // the subscription's keepalive), so that a healthy shard's key costs
    // one call however long the burst takes.
    let backend = crate::common::shards::connect_roomy(cluster, deadline).await;
    let guard = stampede_guard::StampedeGuard::new(backend.clone())
        .ttl(Duration::from_secs(60))
        .lease(ROOMY_BURST)
        .wait_budget(ROOMY_BURST);
    let calls = calls.clone();
    let handler = move |Path(id): Path<String>| {
        let calls = calls.clone();
        async move {
            *calls
                .0
                .lock()
                .unwrap()
                .entry(format!("/report/{id}"))
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            format!("v{id}")
        }
    };
    let app = axum::Router::new().route("/report/{id}", get(handler).layer(guard.clone()));
    crate::common::fleet::Instance {
        backend,
        guard,
        app,
    }
}

/// One shard paused for the whole burst, and 1,500 cold keys over every
/// shard, each asked once by each of two instances, all at once.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cold_keys_while_one_shard_is_paused() {
    burst_over_paused(&[1], "120000", 1_500, 1).await;
}

/// 800 empty slots of one primary (`keeper`) are given to another
/// (`SETSLOT … NODE`) after the instance read its slot map; the receiver is
/// then paused and 800 keys of those slots are asked, in four bursts of
/// 200 (a burst's failures are one episode of the breaker). The
/// receiver's keys degrade; the keeper, which answers throughout, must not
/// have its circuit opened by failures that are not its own.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_new_owner_of_moved_slots_does_not_open_the_old_owners_circuit() {
    use crate::common::cluster::Cluster;
    use crate::common::{get as get_req, send};

    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let calls = PerPath::default();
    let instance = counted_instance(&cluster, &calls, Duration::from_millis(500)).await;
    let (keeper, receiver) = (&cluster.nodes[0], &cluster.nodes[2]);
    let receiver_id = receiver.raw(&["CLUSTER", "MYID"]);
    let mut moved = Vec::new();
    let mut slots = std::collections::HashSet::new();
    for i in 0..20_000 {
        if moved.len() == 800 {
            break;
        }
        let uri = format!("/report/{i}");
        let key = instance.guard.key_for(&get_req(&uri)).unwrap();
        let entry = format!("sg:{{{key}}}:v");
        if keeper.raw(&["EXISTS", &entry]).starts_with("-MOVED") {
            continue;
        }
        let slot = keeper.raw(&["CLUSTER", "KEYSLOT", &entry]);
        let slot = slot.trim_start_matches(':').to_owned();
        if keeper.raw(&["CLUSTER", "COUNTKEYSINSLOT", &slot]) != ":0" || !slots.insert(slot) {
            continue;
        }
        moved.push(uri);
    }
    assert_eq!(moved.len(), 800);
    for slot in &slots {
        for node in [receiver, keeper, &cluster.nodes[1]] {
            assert_eq!(
                node.raw(&["CLUSTER", "SETSLOT", slot, "NODE", &receiver_id]),
                "+OK",
                "slot {slot}"
            );
        }
    }
    cluster.wait_until_ok(Duration::from_secs(20));
    assert_eq!(receiver.raw(&["CLIENT", "PAUSE", "120000", "ALL"]), "+OK");
    let mut ok = 0;
    for chunk in moved.chunks(200) {
        let mut burst = tokio::task::JoinSet::new();
        for uri in chunk {
            let (app, uri) = (instance.app.clone(), uri.clone());
            burst.spawn(async move { send(&app, get_req(&uri)).await.status.as_u16() });
        }
        while let Some(status) = burst.join_next().await {
            ok += usize::from(status.expect("no panic") == 200);
        }
    }
    let keeper_addr = format!("127.0.0.1:{}", keeper.port());
    let stats = instance.backend.stats().redis.expect("redis");
    let nodes = stats.nodes.clone();
    eprintln!(
        "{ok} of 800 answered; {} origin calls; errors {}; nodes {nodes:?}",
        calls.0.lock().unwrap().values().sum::<usize>(),
        stats.errors
    );
    let keeper_openings = nodes
        .iter()
        .find(|n| n.address == keeper_addr)
        .map_or(0, |n| n.circuit_openings);
    let receiver_addr = format!("127.0.0.1:{}", receiver.port());
    let receiver_openings = nodes
        .iter()
        .find(|n| n.address == receiver_addr)
        .map_or(0, |n| n.circuit_openings);
    assert_eq!(ok, 800);
    assert!(
        receiver_openings >= 1,
        "the paused receiver's circuit: {nodes:?}"
    );
    assert_eq!(keeper_openings, 0, "the keeper's circuit opened: {nodes:?}");
}

/// Pauses the primaries `bad` for `pause_ms` (`CLIENT PAUSE … ALL`), then
/// sends `keys` cold keys, each asked `asks` times by each of two
/// instances, all at once. Every answer is a 200; every key on a healthy
/// shard costs exactly one origin call and no healthy circuit opens; a
/// paused shard's key costs at most one call per instance.
#[cfg(feature = "redis-cluster")]
async fn burst_over_paused(bad: &[usize], pause_ms: &str, keys: usize, asks: usize) {
    // A shard paused for the whole burst is told by a deadline a healthy
    // shard meets on a loaded machine: there a healthy shard's connection
    // may go unheard for most of a second while the process or the server
    // waits for a core, and a call it fails costs its key a second call.
    // A shard that thaws mid-burst needs a deadline shorter than its pause.
    let deadline = if pause_ms == "120000" {
        PAUSED_DEADLINE
    } else {
        Duration::from_millis(500)
    };
    use crate::common::cluster::Cluster;
    use crate::common::{get as get_req, send};

    let cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let calls = PerPath::default();
    let instances = [
        counted_instance(&cluster, &calls, deadline).await,
        counted_instance(&cluster, &calls, deadline).await,
    ];
    let uris: Vec<String> = (0..keys).map(|i| format!("/report/{i}")).collect();
    let on_bad: std::collections::HashSet<String> = uris
        .iter()
        .filter(|uri| {
            let key = instances[0].guard.key_for(&get_req(uri)).unwrap();
            bad.iter().any(|&b| {
                let reply = cluster.nodes[b].raw(&["EXISTS", &format!("sg:{{{key}}}:v")]);
                !reply.starts_with("-MOVED")
            })
        })
        .cloned()
        .collect();
    for &b in bad {
        assert_eq!(
            cluster.nodes[b].raw(&["CLIENT", "PAUSE", pause_ms, "ALL"]),
            "+OK"
        );
    }
    let mut burst = tokio::task::JoinSet::new();
    for uri in &uris {
        for _ in 0..asks {
            for instance in &instances {
                let (app, uri) = (instance.app.clone(), uri.clone());
                burst.spawn(async move { send(&app, get_req(&uri)).await.status.as_u16() });
            }
        }
    }
    let mut statuses = std::collections::HashMap::new();
    while let Some(status) = burst.join_next().await {
        *statuses.entry(status.expect("no panic")).or_insert(0usize) += 1;
    }
    let calls = calls.0.lock().unwrap().clone();
    let healthy_off = uris
        .iter()
        .filter(|u| !on_bad.contains(*u))
        .filter(|u| calls.get(*u).copied().unwrap_or(0) != 1)
        .count();
    let bad_over = on_bad
        .iter()
        .filter(|u| calls.get(*u).copied().unwrap_or(0) > 2)
        .count();
    let bad_calls: usize = on_bad.iter().filter_map(|u| calls.get(u)).sum();
    let bad_addrs: Vec<String> = bad
        .iter()
        .map(|&b| format!("127.0.0.1:{}", cluster.nodes[b].port()))
        .collect();
    let healthy_openings: u64 = instances
        .iter()
        .flat_map(|i| i.backend.stats().redis.expect("redis").nodes)
        .filter(|n| !bad_addrs.contains(&n.address))
        .map(|n| n.circuit_openings)
        .sum();
    eprintln!(
        "paused {bad:?} for {pause_ms} ms: statuses {statuses:?}; {} healthy keys, {healthy_off} off one call; {} paused-shard keys, {bad_calls} calls, {bad_over} over two; healthy openings {healthy_openings}",
        keys - on_bad.len(),
        on_bad.len()
    );
    assert_eq!(
        statuses.get(&200).copied(),
        Some(2 * asks * keys),
        "{statuses:?}"
    );
    assert_eq!(healthy_off, 0);
    assert_eq!(bad_over, 0);
    assert_eq!(healthy_openings, 0);
}

/// One shard paused for 700 ms, thawing in the middle of a burst of 600
/// cold keys, each asked twice by each of two instances.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_thaws_in_the_middle_of_a_burst() {
    burst_over_paused(&[0], "700", 600, 2).await;
}

/// Two of three shards paused for the whole burst (600 cold keys, each
/// asked twice by each of two instances): the third shard's keys still
/// cost one call each.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_paused_through_a_burst() {
    burst_over_paused(&[0, 2], "120000", 600, 2).await;
}
