//! Attacks on the entry a commit's wake-up carries: messages a client that
//! may `PUBLISH` (and perhaps read keys) crafts, and an invalidation by the
//! waiting instance itself racing the commit. Real redis-server; the
//! round trips and the messages are read with `MONITOR`.
#![cfg(feature = "redis")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use crate::common::items::fleet_of;
use crate::common::items::{fleet, text_of, warm_up, Gate, Node};
use crate::common::monitor::{until, Monitor};
use crate::common::redis::RedisServer;
use crate::common::Origin;

/// Node 0 rebuilds `uri`, parked in the origin; node 1 sends one request,
/// which finds the lease held. Returns both requests and node 1's fetch.
async fn park(
    monitor: &Monitor,
    nodes: &[Node],
    gate: &Gate,
    uri: &'static str,
) -> (
    tokio::task::JoinHandle<String>,
    tokio::task::JoinHandle<String>,
    Vec<String>,
) {
    let mark = monitor.len();
    gate.armed.store(true, Ordering::SeqCst);
    let app = nodes[0].app.clone();
    let leader = tokio::spawn(async move { text_of(&app, uri).await });
    gate.entered.notified().await;
    monitor.await_fetches(mark, 1).await;
    let app = nodes[1].app.clone();
    let waiter = tokio::spawn(async move { text_of(&app, uri).await });
    monitor.await_fetches(mark, 2).await;
    let fetch = monitor.fetches(mark).remove(1);
    (leader, waiter, fetch)
}

/// The key's hex as the channel names it, from a fetch's value key.
fn hex_of(fetch: &[String]) -> String {
    let inner = fetch[3].strip_suffix(":v").expect("value key");
    match inner.split_once("}:") {
        Some((_, key)) => key.to_owned(),
        None => inner
            .split_once('{')
            .and_then(|(_, k)| k.strip_suffix('}'))
            .expect("key in braces")
            .to_owned(),
    }
}

/// A genuine carried message published since `mark`: (channel, fields).
async fn genuine(redis: &RedisServer, monitor: &Monitor, mark: usize) -> (String, Vec<String>) {
    monitor.settle(redis).await;
    let (channel, message) = monitor
        .published(mark)
        .into_iter()
        .find(|(_, m)| m.starts_with("c:") && m.split(':').count() == 8)
        .expect("a commit carried its entry");
    (channel, message.split(':').map(str::to_owned).collect())
}

/// One command as a user that authenticates with `user`/`pass`.
fn as_user(redis: &RedisServer, user: &str, pass: &str, args: &[&str]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut out = String::new();
    for command in [&["AUTH", user, pass][..], args] {
        out.push_str(&format!("*{}\r\n", command.len()));
        for a in command {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    stream.write_all(out.as_bytes()).expect("write");
    let mut reader = BufReader::new(stream);
    let mut auth = String::new();
    reader.read_line(&mut auth).expect("auth reply");
    assert_eq!(auth.trim_end(), "+OK", "authenticated");
    let mut first = String::new();
    reader.read_line(&mut first).expect("reply");
    if let Some(len) = first.trim_end().strip_prefix('$') {
        let Ok(len) = len.parse::<usize>() else {
            return String::new();
        };
        let mut body = vec![0u8; len + 2];
        reader.read_exact(&mut body).expect("bulk");
        body.truncate(len);
        return String::from_utf8_lossy(&body).into_owned();
    }
    first.trim_end().to_owned()
}

/// A client that may read every key and publish, but write none, reads the
/// held lease and publishes what looks like its commit, carrying another
/// key's genuine entry. It cannot write the entry into Redis; it must not
/// get it served (nor into the waiting instance's L1) either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_the_lease_cannot_forge_its_commit() {
    let redis = RedisServer::start();
    let acl = [
        "ACL", "SETUSER", "reader", "on", ">secret", "~*", "&*", "-@all", "+@read", "+publish",
    ];
    assert_eq!(redis.raw(&acl), "+OK");
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    let (channel, entry_of_0) = genuine(&redis, &monitor, 0).await;

    let (leader, waiter, fetch) = park(&monitor, &nodes, &gate, "/items/1").await;
    let mark = monitor.len();
    let hex = hex_of(&fetch);
    let (lease_key, fence_key) = (&fetch[5], &fetch[6]);
    let reader = |args: &[&str]| as_user(&redis, "reader", "secret", args);
    assert!(reader(&["SET", &fetch[3], "x"]).starts_with("-NOPERM"));
    let token = reader(&["GET", lease_key]);
    let fence = reader(&["HGET", fence_key, "next"]);
    assert!(
        !token.is_empty() && !fence.is_empty(),
        "the lease is readable"
    );
    let forged = format!("c:{hex}:1:{token}:{fence}:60000:60000:{}", entry_of_0[7]);
    assert!(reader(&["PUBLISH", &channel, &forged]).starts_with(':'));
    // Node 1 either takes the forgery or asks Redis again.
    until("node 1 handled the forgery", || {
        nodes[1].with_entry() > 0 || !monitor.fetches(mark).is_empty()
    })
    .await;
    assert_eq!(nodes[1].with_entry(), 0, "a forged carried entry was taken");
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2");
    assert_eq!(waiter.await.unwrap(), "i1-v2", "served the forged body");
    assert_eq!(nodes[1].text("/items/1").await, "i1-v2", "in the L1");
}

/// A client that may only `PUBLISH` replays the key's previous commit
/// (its own token and fence, then with the held lease's fence) and sends
/// another key's genuine commit addressed to this key: each is a plain
/// wake-up (node 1 asks Redis again), and the waiter gets the new commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_and_readdressed_commits_are_plain_wake_ups() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    let (channel, entry_of_0) = genuine(&redis, &monitor, 0).await;
    // A first commit of /items/1, seen on the channel.
    let mark = monitor.len();
    assert_eq!(nodes[0].text("/items/1").await, "i1-v2");
    let (_, old) = genuine(&redis, &monitor, mark).await;
    let target = http::Request::get("/items/1").body(()).unwrap();
    nodes[0].guard.invalidate(&target).await.unwrap();

    let (leader, waiter, fetch) = park(&monitor, &nodes, &gate, "/items/1").await;
    let hex = hex_of(&fetch);
    assert_eq!(old[1], hex);
    let fence = redis.raw(&["HGET", &fetch[6], "next"]);
    assert_ne!(fence, old[4], "a new lease");
    let mut with_fence = old.clone();
    with_fence[4] = fence.clone();
    let mut readdressed = entry_of_0.clone();
    readdressed[1] = hex.clone();
    let mut both = readdressed.clone();
    both[4] = fence;
    for (i, message) in [old, with_fence, readdressed, both].iter().enumerate() {
        let mark = monitor.len();
        redis.raw(&["PUBLISH", &channel, &message.join(":")]);
        until("node 1 handled the message", || {
            nodes[1].with_entry() > 0 || !monitor.fetches(mark).is_empty()
        })
        .await;
        assert_eq!(nodes[1].with_entry(), 0, "message {i} was taken");
    }
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v3");
    assert_eq!(waiter.await.unwrap(), "i1-v3");
    assert_eq!(nodes[1].with_entry(), 1, "the genuine commit's entry");
    assert_ne!(nodes[1].text("/items/1").await, "i1-v2");
}

/// What the waiting instance purges.
#[derive(Clone, Copy)]
enum Purge {
    Url,
    Tag,
    All,
}

/// The waiting instance purges the key itself (`purge`) while the commit it
/// waits for is on its way, or just after it was published: once the purge
/// returned, neither a request nor its L1 gives what was built before it.
/// (When the carried entry arrives, the channel may not yet have told that
/// instance of its own purge: its flight's detachment is what keeps the
/// entry out of the L1.)
async fn own_purge(purge: Purge) {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    const URIS: [&str; 6] = [
        "/items/1", "/items/2", "/items/3", "/items/4", "/items/5", "/items/6",
    ];
    for (round, uri) in URIS.into_iter().enumerate() {
        let (leader, waiter, _) = park(&monitor, &nodes, &gate, uri).await;
        // Odd rounds: the commit (and its carried entry) first, then the
        // purge; even rounds: the purge starts first.
        let mark = monitor.len();
        if round % 2 == 1 {
            gate.release.notify_one();
            until("the commit published", || {
                monitor
                    .published(mark)
                    .iter()
                    .any(|(_, m)| m.starts_with("c:"))
            })
            .await;
        }
        let guard = nodes[1].guard.clone();
        let purged = tokio::spawn(async move {
            match purge {
                Purge::Url => {
                    let target = http::Request::get(uri).body(()).unwrap();
                    guard.invalidate(&target).await
                }
                Purge::Tag => {
                    let id = uri.trim_start_matches("/items/");
                    guard.invalidate_tag(&format!("item:{id}")).await
                }
                Purge::All => guard.invalidate_all().await,
            }
            .unwrap();
        });
        if round % 2 == 0 {
            for _ in 0..round {
                tokio::task::yield_now().await;
            }
            gate.release.notify_one();
        }
        purged.await.unwrap();
        let built = leader.await.unwrap();
        assert_ne!(nodes[1].text(uri).await, built, "round {round}: served");
        waiter.await.unwrap();
        assert_ne!(nodes[1].text(uri).await, built, "round {round}: in the L1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiters_own_invalidation_wins_over_the_carried_entry() {
    own_purge(Purge::Url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiters_own_tag_purge_wins_over_the_carried_entry() {
    own_purge(Purge::Tag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiters_own_purge_of_everything_wins_over_the_carried_entry() {
    own_purge(Purge::All).await;
}

/// Redis restarts with empty memory between the lease and its commit: the
/// holder's commit is refused (the fence is reseeded above it), so nothing
/// is carried from it; the waiter answers with a rebuild of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_lease_redis_forgot_carries_nothing() {
    let mut redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    let (leader, waiter, _) = park(&monitor, &nodes, &gate, "/items/1").await;
    drop(monitor);
    redis.restart();
    let monitor = Monitor::start(&redis);
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2", "its own request");
    assert_eq!(
        waiter.await.unwrap(),
        "i1-v3",
        "never the forgotten lease's"
    );
    assert_eq!(nodes[1].with_entry(), 0);
    monitor.settle(&redis).await;
    assert!(
        !monitor
            .published(0)
            .iter()
            .any(|(_, m)| m.starts_with("c:") && m.split(':').count() == 8 && m.len() > 1000),
        "a carried commit went out"
    );
    assert_ne!(nodes[1].text("/items/1").await, "i1-v2");
}

/// The subscriptions are killed after the waiter asked and before the
/// commit. The gap voids the holder's rebuild for the fleet (its commit may
/// be refused, and then the waiter rebuilds); whatever the reconnection's
/// timing, the waiter answers with the commit or its own rebuild, and it
/// takes a carried entry only when that entry is the commit it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_gap_before_the_commit_still_answers_the_waiter() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    let calls = origin.calls();
    let (leader, waiter, _) = park(&monitor, &nodes, &gate, "/items/1").await;
    let killed = redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed.starts_with(':') && killed != ":0", "{killed}");
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2");
    let answered = waiter.await.unwrap();
    let taken = nodes[1].with_entry();
    match origin.calls() - calls {
        1 => assert_eq!(answered, "i1-v2", "the one rebuild"),
        2 => assert!(answered == "i1-v2" || answered == "i1-v3", "{answered}"),
        n => panic!("{n} rebuilds"),
    }
    assert!(
        taken == 0 || answered == "i1-v2",
        "carried {taken}: {answered}"
    );
}

/// On Redis Cluster the commit's message is published on the key's primary
/// and crosses the cluster bus to the waiter's subscriber: the waiter still
/// answers from it, with one round trip, and gets the commit.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_entry_crosses_the_cluster_bus() {
    let cluster = crate::common::cluster::Cluster::start(3, 0);
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(Monitor::start).collect();
    let (origin, gate) = (Origin::default(), Gate::default());
    let mut backends = Vec::new();
    for _ in 0..2 {
        backends.push(crate::common::shards::connect(&cluster, Duration::from_millis(500)).await);
    }
    let nodes = fleet_of(backends, &origin, &gate);
    warm_up(&nodes).await;
    let marks: Vec<usize> = monitors.iter().map(Monitor::len).collect();
    // The fetches of `/items/1`'s key (its value key is the script's first
    // key): a fetch of another key (one was seen once, on another node,
    // after the commit) is no round trip of this waiter's.
    let key = nodes[0]
        .guard
        .key_for(&crate::common::get("/items/1"))
        .unwrap()
        .to_string();
    let fetches = || -> usize {
        monitors
            .iter()
            .zip(&marks)
            .map(|(m, &mark)| {
                m.fetches(mark)
                    .iter()
                    .filter(|t| t[3].contains(&key))
                    .count()
            })
            .sum()
    };
    gate.armed.store(true, Ordering::SeqCst);
    let app = nodes[0].app.clone();
    let leader = tokio::spawn(async move { text_of(&app, "/items/1").await });
    gate.entered.notified().await;
    until("the leader's fetch", || fetches() >= 1).await;
    let app = nodes[1].app.clone();
    let waiter = tokio::spawn(async move { text_of(&app, "/items/1").await });
    until("the waiter's fetch", || fetches() >= 2).await;
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2");
    assert_eq!(waiter.await.unwrap(), "i1-v2");
    assert_eq!(nodes[1].with_entry(), 1, "taken from the message");
    for (monitor, node) in monitors.iter().zip(&cluster.nodes) {
        monitor.settle(node).await;
    }
    assert_eq!(fetches(), 2, "the woken waiter did not read Redis again");
}

/// Eviction while the lease is held. The fence hash gone: the commit is
/// refused (the hash is reseeded above it), nothing is carried, and the
/// waiter rebuilds. The lease key gone (and not taken again): the commit is
/// stored, and the waiter takes exactly what was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_fence_or_lease_keys_carry_only_what_was_stored() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let monitor = Monitor::start(&redis);
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;

    let (leader, waiter, fetch) = park(&monitor, &nodes, &gate, "/items/1").await;
    assert_eq!(redis.raw(&["DEL", &fetch[6]]), ":1", "the fence hash");
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2", "its own request");
    assert_eq!(waiter.await.unwrap(), "i1-v3", "a refused commit's entry");
    assert_eq!(nodes[1].with_entry(), 0);

    let (leader, waiter, fetch) = park(&monitor, &nodes, &gate, "/items/2").await;
    assert_eq!(redis.raw(&["DEL", &fetch[5]]), ":1", "the lease");
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i2-v4");
    assert_eq!(waiter.await.unwrap(), "i2-v4");
    assert_eq!(nodes[1].with_entry(), 1, "the stored commit's entry");
    let stored = redis.raw(&["GET", &fetch[3]]);
    assert!(stored.contains("|") && stored.contains("i2-v4."), "stored");
}
