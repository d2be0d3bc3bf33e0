//! Purge bursts under real faults, on real Redis: the batched barrier
//! (one acknowledgement naming many purges, the sender's reads shared by
//! every purge waiting at the time) must keep the barrier's promise for
//! each purge of the burst.
//!
//! Each test counts answers that break the promise: after a purge
//! returned `Ok`, an instance that still serves the value from before it
//! (its in-process tier, [`Cache::get`]), or a call that started after the
//! purge returned and got that value.
//!
//! - the subscribers killed (`CLIENT KILL TYPE pubsub`) again and again
//!   while a burst runs, with readers filling the in-process tiers;
//! - one member's link frozen during a burst of 1,000 purges, while a
//!   client that may only publish forges batched acknowledgements (many
//!   nonces in one message) in every instance's name: no purge may return
//!   while the frozen member still trusts its copy;
//! - half the purges of a burst cancelled at every stage (their callers'
//!   futures dropped): the others, and a second burst, are still all
//!   confirmed.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::driver::Boom;
use crate::common::fleet::roomy_builder;
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, Cache};

fn unconfirmed(backend: &Backend) -> u64 {
    backend
        .stats()
        .redis
        .expect("a redis tier")
        .unconfirmed_invalidations
}

fn key(i: usize) -> String {
    format!("item-{i}")
}

fn cache(backend: &Backend) -> Cache<String> {
    Cache::<String>::new(backend.clone())
        .namespace("burst")
        .ttl(Duration::from_secs(600))
}

/// The value of `key` on `cache`, rebuilt as `v<version>` on a miss.
async fn value(cache: &Cache<String>, version: &Arc<AtomicU64>, key: String) -> Option<String> {
    let version = version.clone();
    cache
        .get_or_rebuild(key, move || async move {
            Ok::<_, Boom>(format!("v{}", version.load(Ordering::SeqCst)))
        })
        .await
        .ok()
}

/// Every key of `0..n` warm as `v0` in every cache's in-process tier.
async fn warm(caches: &Arc<Vec<Cache<String>>>, version: &Arc<AtomicU64>, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(20) {
        let mut warming = Vec::new();
        for &i in chunk {
            let (caches, version) = (caches.clone(), version.clone());
            warming.push(tokio::spawn(async move {
                for cache in caches.iter() {
                    assert_eq!(value(cache, &version, key(i)).await.as_deref(), Some("v0"));
                }
            }));
        }
        for task in warming {
            task.await.expect("warming task");
        }
    }
    for i in 0..n {
        for cache in caches.iter() {
            if cache.get(key(i)).as_deref() != Some("v0") {
                assert_eq!(value(cache, version, key(i)).await.as_deref(), Some("v0"));
            }
        }
    }
}

/// Waits until the fleet's membership is older than a subscription lease
/// (3 s) on Redis's clock: a purge on a younger one waits a whole lease
/// whatever the acknowledgements say.
async fn membership_grown(redis: &RedisServer) {
    let script = "local t = redis.call('TIME') \
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
        local born = tonumber(redis.call('ZSCORE', KEYS[1], 'born') or '') \
        if born == nil then return -1 end \
        return tostring(now - born)";
    for _ in 0..1_000 {
        let age: i64 = redis
            .raw(&["EVAL", script, "1", "sg:members"])
            .trim()
            .parse()
            .unwrap_or(-1);
        if age > 3_500 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the fleet's membership never grew a lease old");
}

/// How many of `caches` serve `v0` for `key` from their in-process tier.
fn holding_v0(caches: &[Cache<String>], key: &str) -> usize {
    caches
        .iter()
        .filter(|cache| cache.get(key).as_deref() == Some("v0"))
        .count()
}

/// Three instances; a burst of purges while every subscriber is killed
/// again and again, and readers keep asking every key on every instance
/// (filling the in-process tiers from Redis, before and after each purge).
/// No purge that returned `Ok` may leave an instance serving `v0`, and no
/// read that began after a key's purge returned may answer `v0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_killed_during_a_purge_burst_leave_no_pre_purge_value() {
    const KEYS: usize = 300;
    let redis = Arc::new(RedisServer::start());
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Backend::redis(&redis.url()).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;

    version.store(1, Ordering::SeqCst);
    let purged: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (redis, stop, kills) = (redis.clone(), stop.clone(), kills.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let _ = redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
                kills.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };
    // Readers: each key on each instance, round after round, counting
    // `v0` answers to calls that began after the key's purge returned.
    let late_reads = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|n| {
            let (caches, version, purged, stop) = (
                caches.clone(),
                version.clone(),
                purged.clone(),
                stop.clone(),
            );
            let (late_reads, reads) = (late_reads.clone(), reads.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    for i in 0..KEYS {
                        let was_purged = purged[i].load(Ordering::SeqCst);
                        let got = value(&caches[n], &version, key(i)).await;
                        reads.fetch_add(1, Ordering::SeqCst);
                        if was_purged && got.as_deref() == Some("v0") {
                            late_reads.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();

    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let (caches, purged) = (caches.clone(), purged.clone());
            tokio::spawn(async move {
                let done = tokio::time::timeout(
                    Duration::from_secs(60),
                    caches[i % caches.len()].invalidate(key(i)),
                )
                .await
                .expect("a purge returns");
                if done.is_err() {
                    return (0, 1);
                }
                purged[i].store(true, Ordering::SeqCst);
                (holding_v0(&caches, &key(i)), 0)
            })
        })
        .collect();
    let (mut stale, mut failed) = (0, 0);
    for purge in purges {
        let (s, f) = purge.await.expect("purge task");
        stale += s;
        failed += f;
    }
    // Keep reading a while after the burst, with the kills still going.
    let after = reads.load(Ordering::SeqCst);
    for _ in 0..2_000 {
        if reads.load(Ordering::SeqCst) >= after + 3 * KEYS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    killer.join().expect("killer thread");
    for reader in readers {
        reader.await.expect("reader");
    }
    // Still held anywhere after every purge returned?
    let mut held_after = 0;
    for i in 0..KEYS {
        if purged[i].load(Ordering::SeqCst) {
            held_after += holding_v0(&caches, &key(i));
        }
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    eprintln!(
        "kills {} reads {} failed purges {failed} unconfirmed {unconfirmed:?}",
        kills.load(Ordering::SeqCst),
        reads.load(Ordering::SeqCst)
    );
    assert!(kills.load(Ordering::SeqCst) > 1, "subscribers were killed");
    assert_eq!(stale, 0, "an instance held v0 when its purge returned");
    assert_eq!(
        late_reads.load(Ordering::SeqCst),
        0,
        "a read begun after its key's purge returned answered v0"
    );
    assert_eq!(held_after, 0, "an instance held v0 after the burst");
}

/// A client that may only use the channels: it learns every instance's
/// name from the acknowledgements it hears, and for every purge it hears
/// publishes, on the purger's channel, acknowledgements in every other
/// known instance's name: one per purge, and one naming the last 64
/// purges of that purger at once (a batched acknowledgement). Counts the
/// purges it answered.
async fn forge_batched_acks(
    redis: &RedisServer,
    forged: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    use tokio_stream::StreamExt as _;
    let url = format!("redis://forger:secret@127.0.0.1:{}/", redis.port());
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("sg:events").await.unwrap();
    pubsub.psubscribe("sg:events:ack:*").await.unwrap();
    let names: Arc<Mutex<Vec<String>>> = Arc::default();
    let recent: Arc<Mutex<std::collections::HashMap<String, Vec<String>>>> = Arc::default();
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let payload: String = message.get_payload().unwrap_or_default();
            let learn = |name: &str| {
                let mut names = names.lock().unwrap();
                if name.len() == 16 && !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            };
            if let Some(ack) = payload.strip_prefix("a:") {
                if let Some((_, by)) = ack.rsplit_once(':') {
                    learn(by);
                }
                continue;
            }
            let Some(purge) = payload.strip_prefix("i:") else {
                continue;
            };
            let Some((rest, nonce)) = purge.rsplit_once(':') else {
                continue;
            };
            let Some((_, sender)) = rest.rsplit_once(':') else {
                continue;
            };
            learn(sender);
            let batch = {
                let mut recent = recent.lock().unwrap();
                let list = recent.entry(sender.to_owned()).or_default();
                list.push(nonce.to_owned());
                if list.len() > 64 {
                    list.remove(0);
                }
                list.join(",")
            };
            let known = names.lock().unwrap().clone();
            let channel = format!("sg:events:ack:{sender}");
            let mut pipe = redis::pipe();
            for name in known.iter().filter(|n| *n != sender) {
                pipe.cmd("PUBLISH")
                    .arg(&channel)
                    .arg(format!("a:{nonce}:{name}"))
                    .ignore();
                pipe.cmd("PUBLISH")
                    .arg(&channel)
                    .arg(format!("a:{batch}:{name}"))
                    .ignore();
            }
            pipe.cmd("PUBLISH")
                .arg(&channel)
                .arg(format!("a:{batch}"))
                .ignore();
            let _: Result<(), _> = pipe.query_async(&mut conn).await;
            forged.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// Three instances, A and C on Redis, B through a link that freezes; a
/// client that may only publish forges batched acknowledgements in every
/// instance's name. Every key warm everywhere; B's link frozen; 1,000
/// purges at once from A and C. When each returns, B must no longer serve
/// its copy (its subscription lease ran out: the purge waited for it), nor
/// may A or C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_holds_a_burst_of_purges_despite_forged_batched_acks() {
    const KEYS: usize = 1_000;
    let redis = RedisServer::start();
    let acl = [
        "ACL",
        "SETUSER",
        "forger",
        "on",
        ">secret",
        "resetkeys",
        "&*",
        "-@all",
        "+publish",
        "+subscribe",
        "+psubscribe",
        "+ping",
        "+hello",
    ];
    assert_eq!(redis.raw(&acl), "+OK");
    let version = Arc::new(AtomicU64::new(0));
    let proxy = Proxy::start(redis.port()).await;
    let a = Backend::redis(&redis.url()).await.expect("redis backend");
    let b = Backend::redis(&proxy.url()).await.expect("redis backend");
    let c = Backend::redis(&redis.url()).await.expect("redis backend");
    let caches = Arc::new(vec![cache(&a), cache(&b), cache(&c)]);
    let forged = Arc::new(AtomicUsize::new(0));
    let forger = forge_batched_acks(&redis, forged.clone()).await;
    // The forger learns every name from a first round of purges.
    for cache in caches.iter() {
        cache.invalidate("warm-up").await.expect("warm-up purge");
    }
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;
    let before: Vec<u64> = [&a, &c].iter().map(|b| unconfirmed(b)).collect();

    version.store(1, Ordering::SeqCst);
    proxy.freeze();
    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                let from = if i % 2 == 0 { 0 } else { 2 };
                tokio::time::timeout(Duration::from_secs(60), caches[from].invalidate(key(i)))
                    .await
                    .expect("a purge returns")
                    .expect("the purge reaches redis");
                (
                    usize::from(caches[1].get(key(i)).as_deref() == Some("v0")),
                    usize::from(caches[0].get(key(i)).as_deref() == Some("v0"))
                        + usize::from(caches[2].get(key(i)).as_deref() == Some("v0")),
                )
            })
        })
        .collect();
    let (mut frozen_served, mut live_served) = (0, 0);
    for purge in purges {
        let (f, l) = purge.await.expect("purge task");
        frozen_served += f;
        live_served += l;
    }
    proxy.thaw();
    forger.abort();
    let after: Vec<u64> = [&a, &c].iter().map(|b| unconfirmed(b)).collect();
    let unconfirmed_burst: u64 = after.iter().zip(&before).map(|(x, y)| x - y).sum();
    eprintln!(
        "forged answers {} unconfirmed in the burst {unconfirmed_burst}",
        forged.load(Ordering::SeqCst)
    );
    assert!(
        forged.load(Ordering::SeqCst) >= KEYS,
        "the forger answered the burst"
    );
    assert_eq!(
        frozen_served, 0,
        "the frozen member served v0 after a purge returned"
    );
    assert_eq!(
        live_served, 0,
        "a live member served v0 after a purge returned"
    );
    assert!(
        unconfirmed_burst >= 1,
        "the purges waiting for the frozen member are unconfirmed"
    );
}

/// Three instances, every key warm; 1,000 purges at once, every other one
/// cancelled (its future dropped) at a different stage: before it starts,
/// while Redis runs it, while it waits for acknowledgements. The purges
/// not cancelled are all confirmed and take effect everywhere; so is a
/// second burst of every key afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_purges_in_a_burst_cost_the_others_nothing() {
    const KEYS: usize = 1_000;
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Backend::redis(&redis.url()).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;

    version.store(1, Ordering::SeqCst);
    let mut kept = Vec::new();
    let mut cancelled = Vec::new();
    for i in 0..KEYS {
        let caches = caches.clone();
        let task = tokio::spawn(async move {
            caches[i % caches.len()]
                .invalidate(key(i))
                .await
                .expect("the purge reaches redis");
            holding_v0(&caches, &key(i))
        });
        if i % 2 == 0 {
            kept.push(task);
        } else {
            cancelled.push((i, task));
        }
    }
    // Cancel at every stage: some at once, the rest after a few yields
    // each (the burst's own progress decides where each one is).
    for (n, (_, task)) in cancelled.iter().enumerate() {
        for _ in 0..(n % 50) {
            tokio::task::yield_now().await;
        }
        task.abort();
    }
    let mut stale = 0;
    for task in kept {
        stale += task.await.expect("purge task");
    }
    let first: Vec<u64> = backends.iter().map(unconfirmed).collect();
    assert_eq!(
        first, [0; 3],
        "a purge kept in a half-cancelled burst went unconfirmed"
    );
    assert_eq!(stale, 0, "an instance held v0 after its purge returned");

    // A second burst, every key, none cancelled.
    warm(&caches, &version, 0).await;
    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches[(i + 1) % caches.len()]
                    .invalidate(key(i))
                    .await
                    .expect("the purge reaches redis");
                holding_v0(&caches, &key(i))
            })
        })
        .collect();
    for purge in purges {
        stale += purge.await.expect("purge task");
    }
    let second: Vec<u64> = backends.iter().map(unconfirmed).collect();
    assert_eq!(
        second, [0; 3],
        "a purge of the second burst went unconfirmed"
    );
    assert_eq!(stale, 0, "an instance held v0 after its purge returned");
}

/// Three instances, every key warm; B's link frozen, so that each purge
/// waits out B's lease once Redis has it. Purges from A, each cancelled
/// (its caller's future dropped) once Redis ran it (C, which hears the
/// message, dropped its copy). Redis and the fleet have moved on: A must
/// not keep serving the value from before the purge Redis carried out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_cancelled_after_redis_ran_it_leaves_no_copy_on_its_own_instance() {
    const KEYS: usize = 20;
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let proxy = Proxy::start(redis.port()).await;
    let a = Backend::redis(&redis.url()).await.expect("redis backend");
    let b = Backend::redis(&proxy.url()).await.expect("redis backend");
    let c = Backend::redis(&redis.url()).await.expect("redis backend");
    let caches = Arc::new(vec![cache(&a), cache(&b), cache(&c)]);
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;

    version.store(1, Ordering::SeqCst);
    proxy.freeze();
    let mut kept_by_a = 0;
    for i in 0..KEYS {
        let purge = {
            let caches = caches.clone();
            tokio::spawn(async move { caches[0].invalidate(key(i)).await })
        };
        // Redis ran it once C, which hears every message, dropped its copy.
        for _ in 0..2_000 {
            if caches[2].get(key(i)).is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(caches[2].get(key(i)).is_none(), "the purge reached redis");
        assert!(
            !purge.is_finished(),
            "the purge waits for the frozen member"
        );
        purge.abort();
        let _ = purge.await;
        // A new read on C gets v1 from the origin: the fleet moved on.
        assert_eq!(
            value(&caches[2], &version, key(i)).await.as_deref(),
            Some("v1")
        );
        if caches[0].get(key(i)).as_deref() == Some("v0") {
            kept_by_a += 1;
        }
    }
    proxy.thaw();
    // And for how long: past two more purges of the fleet, each confirmed.
    for other in ["other-1", "other-2"] {
        caches[2]
            .invalidate(other)
            .await
            .expect("the purge reaches redis");
    }
    let still = (0..KEYS)
        .filter(|&i| caches[0].get(key(i)).as_deref() == Some("v0"))
        .count();
    eprintln!("kept by the purging instance {kept_by_a}, still after two more purges {still}");
    // Right after the cancel, A may not have heard its own purge yet (its
    // subscriber reads in its own time); once it heard the later purges,
    // which come after it on the channel, it has dropped every copy.
    assert_eq!(
        still, 0,
        "the purging instance kept serving v0 after Redis and the fleet dropped it"
    );
}

/// Three instances, every key warm; a burst of purges, and Redis killed
/// (SIGKILL) and started again empty once some of them returned. A purge
/// may fail (it did not reach Redis); one that returned `Ok` must leave no
/// instance serving `v0`, and once the fleet is back every key answers
/// `v1` everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_mid_burst_leaves_no_pre_purge_value() {
    const KEYS: usize = 300;
    let mut redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Backend::redis(&redis.url()).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;

    version.store(1, Ordering::SeqCst);
    let returned = Arc::new(AtomicUsize::new(0));
    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let (caches, returned) = (caches.clone(), returned.clone());
            tokio::spawn(async move {
                let done = tokio::time::timeout(
                    Duration::from_secs(60),
                    caches[i % caches.len()].invalidate(key(i)),
                )
                .await
                .expect("a purge returns");
                returned.fetch_add(1, Ordering::SeqCst);
                match done {
                    Ok(()) => (holding_v0(&caches, &key(i)), 0),
                    Err(_) => (0, 1),
                }
            })
        })
        .collect();
    for _ in 0..6_000 {
        if returned.load(Ordering::SeqCst) >= KEYS / 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let at_restart = returned.load(Ordering::SeqCst);
    redis.restart();
    let (mut stale, mut failed) = (0, 0);
    for purge in purges {
        let (s, f) = purge.await.expect("purge task");
        stale += s;
        failed += f;
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    eprintln!(
        "returned before the restart {at_restart} failed {failed} unconfirmed {unconfirmed:?}"
    );
    assert_eq!(stale, 0, "an instance held v0 after its purge returned Ok");
    let mut old = 0;
    for i in 0..KEYS {
        for cache in caches.iter() {
            if cache.get(key(i)).as_deref() == Some("v0") {
                old += 1;
            }
        }
    }
    assert_eq!(old, 0, "an instance held v0 after the burst");
}

/// Three healthy instances, every key warm; a client that may only
/// publish floods the event channel with invalidations of groups nobody
/// holds, each in the name of a sender of its own making, just before a
/// burst of purges. Every instance acknowledges each of them (one script
/// per named sender, one set written in Redis for each): the purges'
/// acknowledgements queue behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures how a publisher's flood delays the fleet's acknowledgements"]
async fn a_publishers_flood_of_foreign_senders_delays_a_purge_burst() {
    const KEYS: usize = 200;
    const FORGED: usize = 20_000;
    let redis = RedisServer::start();
    let acl = [
        "ACL",
        "SETUSER",
        "forger",
        "on",
        ">secret",
        "resetkeys",
        "&*",
        "-@all",
        "+publish",
        "+ping",
        "+hello",
    ];
    assert_eq!(redis.raw(&acl), "+OK");
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Backend::redis(&redis.url()).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    warm(&caches, &version, KEYS).await;
    membership_grown(&redis).await;

    let url = format!("redis://forger:secret@127.0.0.1:{}/", redis.port());
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for chunk in (0..FORGED).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &n in chunk {
            pipe.cmd("PUBLISH")
                .arg("sg:events")
                .arg(format!(
                    "i:{:032x}:{:016x}:{n}",
                    n as u128 + 1,
                    n as u64 + 1
                ))
                .ignore();
        }
        let () = pipe
            .query_async(&mut conn)
            .await
            .expect("the flood is published");
    }
    version.store(1, Ordering::SeqCst);
    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches[i % caches.len()]
                    .invalidate(key(i))
                    .await
                    .expect("the purge reaches redis");
                holding_v0(&caches, &key(i))
            })
        })
        .collect();
    let mut stale = 0;
    for purge in purges {
        stale += purge.await.expect("purge task");
    }
    // The sets the instances wrote for the forger's senders, at most.
    let mut most = 0;
    for _ in 0..100 {
        let n: usize = redis
            .raw(&["EVAL", "return #redis.call('KEYS', 'sg:acks:*')", "0"])
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap_or(0);
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    eprintln!("forged {FORGED} ack sets in redis at most {most} unconfirmed {unconfirmed:?}");
    assert_eq!(stale, 0, "an instance held v0 after its purge returned");
    assert_eq!(unconfirmed, [0; 3], "a purge waited out the lease");
}

/// The fault a history runs under.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// `CLIENT KILL TYPE pubsub` every 150 ms.
    KillSubscribers,
    /// The second instance's link frozen (both ways) for 0.5 to 6.5 s at a
    /// time: past its subscription lease, sometimes.
    FreezeLink,
    /// `CLIENT KILL TYPE normal` every 150 ms: replies lost, calls retried.
    KillCommandLinks,
    /// `CLIENT PAUSE <0.1 to 3.6 s> WRITE` (scripts, `PUBLISH` and the
    /// membership's renewals held; reads served).
    PauseWrites,
    /// redis-server stopped (SIGSTOP) for 50 to 450 ms at a time.
    FreezeRedis,
}

/// A history of reads, rebuilds and purge bursts across three instances,
/// with the subscribers killed now and then: readers ask random keys on
/// random instances (each rebuild takes a while, so that rebuilds, the
/// commits that carry their entries to waiters, and purges overlap); a
/// purger bumps every key's version and purges every key at once, round
/// after round, each purge from a random instance. A read that began
/// after a key's purge returned `Ok` must answer a version built after
/// that purge's bump.
async fn history(fault: Fault) -> (usize, usize, usize) {
    const KEYS: usize = 40;
    const ROUNDS: usize = 12;
    let redis = Arc::new(RedisServer::start());
    let proxy = Arc::new(Proxy::start(redis.port()).await);
    let mut backends = Vec::new();
    for n in 0..3 {
        let url = if n == 1 { proxy.url() } else { redis.url() };
        backends.push(Backend::redis(&url).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    let versions: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    // The version every read that begins now must reach, per key.
    let floors: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    membership_grown(&redis).await;

    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (redis, proxy, stop) = (redis.clone(), proxy.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match fault {
                    Fault::None => return,
                    Fault::KillSubscribers => {
                        std::thread::sleep(Duration::from_millis(150));
                        let _ = redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
                    }
                    Fault::FreezeLink => {
                        std::thread::sleep(Duration::from_millis(500));
                        proxy.freeze();
                        std::thread::sleep(Duration::from_millis(
                            500 + rand::random::<u64>() % 6_000,
                        ));
                        proxy.thaw();
                    }
                    Fault::KillCommandLinks => {
                        std::thread::sleep(Duration::from_millis(150));
                        let _ = redis.raw(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
                    }
                    Fault::PauseWrites => {
                        std::thread::sleep(Duration::from_millis(600));
                        let pause = (100 + rand::random::<u64>() % 3_500).to_string();
                        let _ = redis.raw(&["CLIENT", "PAUSE", &pause, "WRITE"]);
                    }
                    Fault::FreezeRedis => {
                        std::thread::sleep(Duration::from_millis(600));
                        redis.freeze();
                        std::thread::sleep(Duration::from_millis(50 + rand::random::<u64>() % 400));
                        redis.thaw();
                    }
                }
            }
            proxy.thaw();
        })
    };
    let (violations, reads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let builds = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (caches, versions, floors, stop) = (
                caches.clone(),
                versions.clone(),
                floors.clone(),
                stop.clone(),
            );
            let (violations, reads, builds) = (violations.clone(), reads.clone(), builds.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let builds = builds.clone();
                    let k = (rand::random::<u64>() % KEYS as u64) as usize;
                    let on = (rand::random::<u64>() % 3) as usize;
                    let floor = floors[k].load(Ordering::SeqCst);
                    let versions = versions.clone();
                    let pause = rand::random::<u64>() % 15;
                    let got = caches[on]
                        .get_or_rebuild(key(k), move || async move {
                            builds.fetch_add(1, Ordering::SeqCst);
                            let v = versions[k].load(Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                            Ok::<_, Boom>(v.to_string())
                        })
                        .await;
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let read = got.map(|got| got.parse::<u64>().expect("a version"));
                    if matches!(read, Ok(v) if v < floor) {
                        violations.fetch_add(1, Ordering::SeqCst);
                        eprintln!("key {k} on {on}: read {read:?} after the purge of {floor}");
                    }
                }
            })
        })
        .collect();
    let mut failed = 0;
    for round in 1..=ROUNDS as u64 {
        // Each round begins once the readers made some progress (or a
        // while later, if a fault holds them back).
        let want = reads.load(Ordering::SeqCst) + 400;
        for _ in 0..100 {
            if reads.load(Ordering::SeqCst) >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let purges: Vec<_> = (0..KEYS)
            .map(|k| {
                let (caches, versions, floors) = (caches.clone(), versions.clone(), floors.clone());
                tokio::spawn(async move {
                    versions[k].store(round, Ordering::SeqCst);
                    let on = (rand::random::<u64>() % 3) as usize;
                    let done = caches[on].invalidate(key(k)).await;
                    if done.is_ok() {
                        floors[k].store(round, Ordering::SeqCst);
                    }
                    usize::from(done.is_err())
                })
            })
            .collect();
        for purge in purges {
            failed += purge.await.expect("purge task");
        }
    }
    stop.store(true, Ordering::SeqCst);
    killer.join().expect("fault thread");
    for reader in readers {
        reader.await.expect("reader");
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    eprintln!(
        "reads {} builds {} violations {} failed purges {failed} unconfirmed {unconfirmed:?}",
        reads.load(Ordering::SeqCst),
        builds.load(Ordering::SeqCst),
        violations.load(Ordering::SeqCst)
    );
    (
        violations.load(Ordering::SeqCst),
        reads.load(Ordering::SeqCst),
        failed,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_on_a_healthy_fleet() {
    let (violations, reads, _) = history(Fault::None).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_with_subscribers_killed() {
    let (violations, reads, _) = history(Fault::KillSubscribers).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_with_a_link_frozen_now_and_then() {
    let (violations, reads, _) = history(Fault::FreezeLink).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_with_redis_stopped_now_and_then() {
    let (violations, reads, _) = history(Fault::FreezeRedis).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_with_writes_paused_now_and_then() {
    let (violations, reads, _) = history(Fault::PauseWrites).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}

/// Three healthy instances; bursts shaped unlike the spread one: 2,000
/// purges of distinct keys all from one instance (its reads and the
/// others' acknowledgements past one batch's size), then 1,000 purges of
/// only 10 keys from every instance at once. Every purge is confirmed.
/// The calls' limits are ones a loaded machine meets: a purge queued behind
/// 2,000 others is not failing, and this test counts confirmations, not
/// purges that missed a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lopsided_purge_bursts_are_all_confirmed() {
    const KEYS: usize = 2_000;
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(
            roomy_builder(&redis.url())
                .connect()
                .await
                .expect("redis backend"),
        );
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    warm(&caches, &version, 10).await;
    membership_grown(&redis).await;
    version.store(1, Ordering::SeqCst);

    let purges: Vec<_> = (0..KEYS)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches[0]
                    .invalidate(key(i))
                    .await
                    .expect("the purge reaches redis");
                holding_v0(&caches, &key(i))
            })
        })
        .collect();
    let mut stale = 0;
    for purge in purges {
        stale += purge.await.expect("purge task");
    }
    let one_sender: Vec<u64> = backends.iter().map(unconfirmed).collect();

    version.store(0, Ordering::SeqCst);
    warm(&caches, &version, 10).await;
    version.store(1, Ordering::SeqCst);
    let purges: Vec<_> = (0..1_000)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches[i % 3]
                    .invalidate(key(i % 10))
                    .await
                    .expect("the purge reaches redis");
                holding_v0(&caches, &key(i % 10))
            })
        })
        .collect();
    for purge in purges {
        stale += purge.await.expect("purge task");
    }
    let hot: Vec<u64> = backends.iter().map(unconfirmed).collect();
    eprintln!("unconfirmed after one sender {one_sender:?}, after hot keys {hot:?}");
    assert_eq!(stale, 0, "an instance held v0 after its purge returned");
    assert_eq!(
        one_sender, [0; 3],
        "a purge of the one-sender burst went unconfirmed"
    );
    assert_eq!(hot, [0; 3], "a purge of the hot-key burst went unconfirmed");
}

/// Three healthy instances, one of which sends `SG_PURGES` (default
/// 10,000) purges of distinct keys at once: how many fail (their script
/// queued past its tries' deadlines) and how many go unconfirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures the largest one-sender burst on this machine"]
async fn a_large_one_sender_burst_measured() {
    let keys: usize = std::env::var("SG_PURGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let redis = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(Backend::redis(&redis.url()).await.expect("redis backend"));
    }
    let caches = Arc::new(backends.iter().map(cache).collect::<Vec<_>>());
    membership_grown(&redis).await;
    let purges: Vec<_> = (0..keys)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move { caches[0].invalidate(key(i)).await.is_err() })
        })
        .collect();
    let mut failed = 0;
    for purge in purges {
        failed += usize::from(purge.await.expect("purge task"));
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    let errors = backends[0].stats().redis.expect("a redis tier").errors;
    eprintln!("purges {keys} failed {failed} redis errors {errors} unconfirmed {unconfirmed:?}");
    assert_eq!(failed, 0, "a purge on a healthy fleet did not reach redis");
    assert_eq!(
        unconfirmed, [0; 3],
        "a purge on a healthy fleet went unconfirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_rebuilds_and_purge_bursts_with_command_links_killed() {
    let (violations, reads, _) = history(Fault::KillCommandLinks).await;
    assert!(reads > 0);
    assert_eq!(
        violations, 0,
        "a read after a purge returned a version from before it"
    );
}
