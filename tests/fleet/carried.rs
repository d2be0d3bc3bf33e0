//! The commit's wake-up carries a small entry: a woken instance answers its
//! waiters without reading Redis again, and only with what every check of a
//! fetched entry admits. Round trips are counted with `MONITOR` on a real
//! redis-server.
#![cfg(feature = "redis")]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::items::{fleet, text_of, warm_up, Gate, Node};
use crate::common::monitor::{until, Monitor};
use crate::common::redis::RedisServer;
use crate::common::Origin;
use stampede_guard::StampedeGuard;

fn rand_token() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Node 0 rebuilds `uri` under the fleet's lease, parked in the origin;
/// node 1 sends `waiters` requests for it, which wait for the lease. Returns
/// once node 1 asked Redis (and found the lease held): node 0's request,
/// then node 1's.
async fn park(
    monitor: &Monitor,
    nodes: &[Node],
    gate: &Gate,
    uri: &'static str,
    waiters: usize,
) -> (
    tokio::task::JoinHandle<String>,
    Vec<tokio::task::JoinHandle<String>>,
) {
    let mark = monitor.len();
    gate.armed.store(true, Ordering::SeqCst);
    let app = nodes[0].app.clone();
    let leader = tokio::spawn(async move { text_of(&app, uri).await });
    gate.entered.notified().await;
    monitor.await_fetches(mark, 1).await;
    let waiting = (0..waiters)
        .map(|_| {
            let app = nodes[1].app.clone();
            tokio::spawn(async move { text_of(&app, uri).await })
        })
        .collect();
    monitor.await_fetches(mark, 2).await;
    (leader, waiting)
}

/// The fetches of one parked rebuild and its waiters on the other node.
async fn round_trips(uri: &'static str, want: &str) -> (usize, u64) {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    warm_up(&nodes).await;
    let monitor = Monitor::start(&redis);
    let mark = monitor.len();
    let (leader, waiting) = park(&monitor, &nodes, &gate, uri, 4).await;
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), want);
    for w in waiting {
        assert_eq!(w.await.unwrap(), want, "every waiter gets the commit");
    }
    assert_eq!(origin.calls(), 2, "one rebuild for the fleet");
    monitor.settle(&redis).await;
    (monitor.fetches(mark).len(), nodes[1].with_entry())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_entry_reaches_the_waiters_in_the_wake_up() {
    // The leader's fetch, and the waiter's one before its wait: 2 in all.
    let (fetches, with_entry) = round_trips("/items/1", "i1-v2").await;
    assert_eq!(fetches, 2, "the woken instance did not read Redis again");
    assert_eq!(with_entry, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_entry_is_fetched_after_the_wake_up() {
    // The waiter fetches again once woken: 3 in all.
    let (fetches, with_entry) = round_trips("/items/100", "i100-v2").await;
    assert_eq!(fetches, 3, "the woken instance read the entry from Redis");
    assert_eq!(with_entry, 0);
}

/// The key's hex as the channel names it, from a fetch's value key
/// (`<prefix>:{<group>}:<key>:v`, or `<prefix>:{<key>}:v`), and the
/// fence hash's name.
fn names(fetch: &[String]) -> (String, String) {
    let value = &fetch[3];
    let inner = value.strip_suffix(":v").expect("value key");
    let hex = match inner.split_once("}:") {
        Some((_, key)) => key.to_owned(),
        None => inner
            .split_once('{')
            .and_then(|(_, k)| k.strip_suffix('}'))
            .expect("key in braces")
            .to_owned(),
    };
    (hex, fetch[6].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_wake_up_is_not_served() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    let monitor = Monitor::start(&redis);
    warm_up(&nodes).await;
    // A genuine carried message, of another key and lease (the commit may
    // still be on its way when the warm-up's answer came, and the monitor
    // reads on a thread of its own).
    let carried = |m: &str| m.starts_with("c:") && m.split(':').count() == 8;
    until("the warm-up's commit carried its entry", || {
        monitor.published(0).iter().any(|(_, m)| carried(m))
    })
    .await;
    let (channel, genuine) = monitor
        .published(0)
        .into_iter()
        .find(|(_, m)| carried(m))
        .expect("the warm-up's commit carried its entry");
    let fields: Vec<&str> = genuine.split(':').collect();
    let (old_secret, entry) = (fields[3], fields[7]);

    let mark = monitor.len();
    let (leader, waiting) = park(&monitor, &nodes, &gate, "/items/1", 2).await;
    let (hex, fence_key) = names(&monitor.fetches(mark)[1]);
    // The right key and the lease's own fencing number, a well-formed entry
    // (the warm-up's body), but not the lease's secret; and garbage.
    let fence = redis.raw(&["HGET", &fence_key, "next"]);
    let forged = format!("c:{hex}:1:{old_secret}:{fence}:60000:60000:{entry}");
    // The forged wake-ups are plain ones: node 1 asks Redis again, finds
    // the lease still held, and waits on. One at a time, each followed by
    // its fetch, so that no fetch of node 1's is still on its way when the
    // real commit comes (a fetch that finds the commit answers from Redis).
    for message in [forged, format!("c:{hex}:1:{fence}:AAAA")] {
        let (woken, fetched) = (nodes[1].by_message(), monitor.fetches(mark).len());
        assert!(redis.raw(&["PUBLISH", &channel, &message]).starts_with(':'));
        let deadline = Instant::now() + Duration::from_secs(20);
        while nodes[1].by_message() == woken || monitor.fetches(mark).len() == fetched {
            assert!(Instant::now() < deadline, "the forged wake-up woke nobody");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(nodes[1].with_entry(), 0, "nothing taken from a forgery");
    gate.release.notify_one();
    assert_eq!(leader.await.unwrap(), "i1-v2");
    for w in waiting {
        assert_eq!(w.await.unwrap(), "i1-v2", "never the forged body");
    }
    assert_eq!(nodes[1].text("/items/1").await, "i1-v2");
    assert_eq!(nodes[1].with_entry(), 1, "the genuine commit's entry");
}

/// Node 0's rebuild of `/items/{id}` commits while node 2 invalidates it
/// (`purge`); once the invalidation returned, node 1 (which waited for the
/// commit) serves nothing from before it. Several rounds, so that the commit
/// lands before, during and after the invalidation.
async fn race<F, Fut>(purge: F)
where
    F: Fn(StampedeGuard, u32) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 3, &origin, &gate).await;
    warm_up(&nodes).await;
    let monitor = Monitor::start(&redis);
    const URIS: [&str; 6] = [
        "/items/1", "/items/2", "/items/3", "/items/4", "/items/5", "/items/6",
    ];
    for (round, uri) in URIS.into_iter().enumerate() {
        let id = round as u32 + 1;
        let (leader, waiting) = park(&monitor, &nodes, &gate, uri, 2).await;
        let purged = tokio::spawn(purge(nodes[2].guard.clone(), id));
        // The commit goes out at various points of the invalidation.
        for _ in 0..round {
            tokio::task::yield_now().await;
        }
        gate.release.notify_one();
        purged.await.unwrap();
        let built = leader.await.unwrap();
        let after = nodes[1].text(uri).await;
        assert_ne!(after, built, "round {round}: served from before the purge");
        for w in waiting {
            w.await.unwrap();
        }
        assert_ne!(nodes[1].text(uri).await, built, "round {round}: in the L1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_entry_is_not_served_after_an_invalidation_returned() {
    race(|guard, id| async move {
        let uri = format!("/items/{id}");
        let target = http::Request::get(uri.as_str()).body(()).unwrap();
        guard.invalidate(&target).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_entry_is_not_served_after_a_tag_purge_returned() {
    race(|guard, id| async move {
        guard.invalidate_tag(&format!("item:{id}")).await.unwrap();
    })
    .await;
}

/// The test holds `uri`'s lease itself, as an instance would, after node 0
/// built the entry once: returns (the key's hex, the lease's secret and
/// fence, the channel, the entry node 0's commit carried).
async fn hold_lease(
    redis: &RedisServer,
    monitor: &Monitor,
    nodes: &[Node],
    uri: &str,
) -> (String, String, String, String, String) {
    let mark = monitor.len();
    let built = nodes[0].text(uri).await;
    monitor.settle(redis).await;
    let fetch = monitor.fetches(mark).remove(0);
    let (hex, fence_key) = names(&fetch);
    let (channel, message) = monitor
        .published(mark)
        .into_iter()
        .find(|(_, m)| m.starts_with(&format!("c:{hex}:1:")))
        .expect("the commit carried its entry");
    let entry = message.rsplit(':').next().unwrap().to_owned();
    // Gone from Redis (node 1 never held it), and the lease is ours.
    assert_eq!(redis.raw(&["DEL", &fetch[3], &fetch[4]]), ":2");
    // As an instance does: the lease stores the SHA-1 of a secret, which
    // the commit's wake-up reveals.
    let secret = format!("{:032x}", rand_token());
    let token = sha1_smol::Sha1::from(&secret).digest().to_string();
    assert_eq!(
        redis.raw(&["SET", &fetch[5], &token, "NX", "PX", "60000"]),
        "+OK"
    );
    let fence = redis.raw(&["HINCRBY", &fence_key, "next", "1"]);
    let fence = fence.trim_start_matches(':').to_owned();
    assert!(built.starts_with('i'));
    (hex, secret, fence, channel, entry)
}

/// Node 1 waits on a lease the test holds; the test publishes what that
/// lease's commit would (its secret and fence, a genuine entry). Taken only
/// when nothing was heard on the channel since node 1 asked Redis; after a
/// tag purge, not taken, and after a purge of the entry's own tag never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_entry_is_taken_only_when_proven_current() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 3, &origin, &gate).await;
    warm_up(&nodes).await;
    let monitor = Monitor::start(&redis);

    // An unrelated tag is purged between node 1's question and the commit:
    // the entry cannot be proven current, so node 1 asks Redis again.
    let (hex, secret, fence, channel, entry) =
        hold_lease(&redis, &monitor, &nodes, "/items/7").await;
    let carried = format!("c:{hex}:1:{secret}:{fence}:60000:60000:{entry}");
    let mark = monitor.len();
    let app = nodes[1].app.clone();
    let waiter = tokio::spawn(async move { text_of(&app, "/items/7").await });
    monitor.await_fetches(mark, 1).await;
    nodes[2].guard.invalidate_tag("unrelated").await.unwrap();
    redis.raw(&["PUBLISH", &channel, &carried]);
    monitor.await_fetches(mark, 2).await;
    assert_eq!(nodes[1].with_entry(), 0);
    // Nothing heard since that second question: taken, without a third.
    redis.raw(&["PUBLISH", &channel, &carried]);
    assert_eq!(waiter.await.unwrap(), "i7-v2");
    monitor.settle(&redis).await;
    assert_eq!(monitor.fetches(mark).len(), 2);
    assert_eq!(nodes[1].with_entry(), 1);

    // The entry's own tag is purged: neither before nor after node 1 asks
    // again is the carried entry taken; once the lease is given up, node 1
    // rebuilds.
    let (hex, secret, fence, channel, entry) =
        hold_lease(&redis, &monitor, &nodes, "/items/8").await;
    let carried = format!("c:{hex}:1:{secret}:{fence}:60000:60000:{entry}");
    let mark = monitor.len();
    let app = nodes[1].app.clone();
    let waiter = tokio::spawn(async move { text_of(&app, "/items/8").await });
    monitor.await_fetches(mark, 1).await;
    nodes[2].guard.invalidate_tag("item:8").await.unwrap();
    redis.raw(&["PUBLISH", &channel, &carried]);
    monitor.await_fetches(mark, 2).await;
    redis.raw(&["PUBLISH", &channel, &carried]);
    monitor.await_fetches(mark, 3).await;
    assert_eq!(nodes[1].with_entry(), 1, "neither was taken");
    let calls = origin.calls();
    let lease = monitor.fetches(mark)[0][5].clone();
    assert_eq!(redis.raw(&["DEL", &lease]), ":1");
    redis.raw(&["PUBLISH", &channel, &format!("f:{hex}")]);
    assert_eq!(waiter.await.unwrap(), format!("i8-v{}", calls + 1));
}
