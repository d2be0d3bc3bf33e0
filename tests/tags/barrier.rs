//! Attacks on the tag barrier on real Redis: after `invalidate_tag` (or
//! `invalidate_all`, or `invalidate`) returns `Ok`, no request that starts
//! afterwards, on any instance, is answered with data read before it.
//!
//! - purges of every kind, from any of the instances (a third joins midway),
//!   racing rebuilds on all of them, checked request by request against the
//!   data each purge followed;
//! - Redis pausing writes (`CLIENT PAUSE WRITE`) through a purge: the
//!   subscribers' pings are answered, the acknowledgements and membership
//!   renewals are not;
//! - Redis restarted empty between a rebuild's start and its end on another
//!   instance, known to that instance at once or not at all;
//! - acknowledgements forged by a client allowed only the crate's channels
//!   (and one that may also read every key: `tests/invalidation/acks.rs`).
//!
//! An instance stopped with SIGSTOP through a purge:
//! `stopped_process.rs`.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::fleet::backend_at;
use crate::common::redis::RedisServer;
use crate::common::{get as request, send, ROOMY_DEADLINE};
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::StampedeGuard;

/// The "database": a version per product, moved by the writer.
#[derive(Clone, Default)]
struct Db {
    versions: Arc<[AtomicU64; 3]>,
    /// The version of each product every purge that returned `Ok` followed:
    /// a request that starts afterwards must see it, or a later one.
    floors: Arc<[AtomicU64; 3]>,
}

/// A small deterministic generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `/products/{id}` reads the product's version when the handler begins,
/// takes a few milliseconds (so that rebuilds overlap the purges), and
/// answers `p<id>-d<version>`, tagged `product:<id>` and `catalog`.
fn app(db: &Db, guard: &StampedeGuard) -> Router {
    let db = db.clone();
    let seed = Arc::new(AtomicU64::new(0x9e37_79b9_7f4a_7c15));
    let handler = move |Path(id): Path<usize>| {
        let db = db.clone();
        let seed = seed.clone();
        async move {
            let version = db.versions[id].load(Ordering::SeqCst);
            let pause = seed.fetch_add(0x2545_f491, Ordering::Relaxed) % 15;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            (
                [("surrogate-key", format!("product:{id} catalog"))],
                format!("p{id}-d{version}"),
            )
        }
    };
    Router::new().route("/products/{id}", get(handler).layer(guard.clone()))
}

fn version_of(body: &str) -> u64 {
    body.rsplit_once("-d")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("unexpected answer {body:?}"))
}

/// Two instances (a third joins a quarter of the way through), three
/// products, a writer that moves a product's version and then purges it one
/// of four ways from one of the instances, and four readers on all of them. Each read notes the product's floor
/// before it is sent; the answer must be at least that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_of_every_kind_racing_rebuilds_never_serve_older_data() {
    let redis = RedisServer::start();
    let db = Db::default();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        nodes.push((guard.clone(), app(&db, &guard)));
    }
    let nodes = Arc::new(std::sync::RwLock::new(nodes));
    let done = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for r in 0..4u64 {
        let (nodes, db, done) = (nodes.clone(), db.clone(), done.clone());
        let (violations, reads) = (violations.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678 + r * 7919);
            while !done.load(Ordering::SeqCst) {
                let id = rng.next(3) as usize;
                let app = {
                    let nodes = nodes.read().unwrap();
                    let node = rng.next(nodes.len() as u64) as usize;
                    nodes[node].1.clone()
                };
                let floor = db.floors[id].load(Ordering::SeqCst);
                let answer = send(&app, request(&format!("/products/{id}"))).await;
                reads.fetch_add(1, Ordering::Relaxed);
                // A hit never waits: without this the readers would keep
                // the runtime's threads from everything else.
                tokio::task::yield_now().await;
                let seen = version_of(&answer.text());
                if seen < floor {
                    violations.lock().unwrap().push(format!(
                        "product {id} answered with version {seen} ({}) after a purge that \
                         followed version {floor}",
                        answer.x_cache()
                    ));
                }
            }
        }));
    }
    let mut rng = Rng(0xdead_beef);
    let mut kinds = [0usize; 4];
    let mut joiner = None;
    for round in 0..40 {
        if round == 10 {
            // A third instance starts (subscribes, loads the table, joins
            // the membership) while the purges go on, and serves at once.
            let (nodes, db, url) = (nodes.clone(), db.clone(), redis.url());
            joiner = Some(tokio::spawn(async move {
                let backend = backend_at(&url, ROOMY_DEADLINE).await;
                let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
                let app = app(&db, &guard);
                nodes.write().unwrap().push((guard, app));
            }));
        }
        let id = rng.next(3) as usize;
        let version = db.versions[id].fetch_add(1, Ordering::SeqCst) + 1;
        let guard = {
            let nodes = nodes.read().unwrap();
            nodes[rng.next(nodes.len() as u64) as usize].0.clone()
        };
        let kind = round % 4;
        kinds[kind] += 1;
        let purged = match kind {
            0 => guard.invalidate_tag(&format!("product:{id}")).await,
            1 => guard.invalidate_tag("catalog").await,
            2 => guard.invalidate_all().await,
            _ => guard.invalidate(&request(&format!("/products/{id}"))).await,
        };
        purged.unwrap_or_else(|e| panic!("round {round}: the purge failed: {e}"));
        db.floors[id].fetch_max(version, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(rng.next(20))).await;
    }
    done.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.expect("reader");
    }
    joiner.expect("started").await.expect("joined");
    assert_eq!(nodes.read().unwrap().len(), 3);
    let violations = violations.lock().unwrap();
    assert!(
        violations.is_empty(),
        "{} of {} reads broke the barrier: {:#?}",
        violations.len(),
        reads.load(Ordering::Relaxed),
        &violations[..violations.len().min(10)]
    );
    assert!(reads.load(Ordering::Relaxed) > 100, "the readers ran");
    assert_eq!(kinds, [10; 4]);
}

/// Redis pauses writes while another instance purges: the purge's script
/// waits in Redis, the subscribers' pings are still answered (a read), the
/// acknowledgements and membership renewals wait too. Whatever the purge
/// returns, once it returned `Ok` no instance serves the copy from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_pause_through_a_purge_keeps_the_barrier() {
    let redis = RedisServer::start();
    let db = Db::default();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), Duration::from_millis(400)).await;
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        nodes.push((guard.clone(), app(&db, &guard)));
    }
    for (_, app) in &nodes {
        for _ in 0..50 {
            if send(app, request("/products/1")).await.x_cache() == "HIT" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(send(app, request("/products/1")).await.text(), "p1-d0");
    }
    db.versions[1].store(1, Ordering::SeqCst);
    // Less than the purge's tries (four deadlines): its script runs when
    // the pause ends.
    assert_eq!(redis.raw(&["CLIENT", "PAUSE", "1000", "WRITE"]), "+OK");
    let purged = nodes[0].0.invalidate_tag("product:1").await;
    if purged.is_err() {
        // Its tries ran out under the pause (a loaded machine): nothing is
        // promised of that purge. The caller calls it again.
        nodes[0]
            .0
            .invalidate_tag("product:1")
            .await
            .expect("the purge once the pause ended");
    }
    for (n, (_, app)) in nodes.iter().enumerate() {
        let answer = send(app, request("/products/1")).await;
        assert_eq!(
            answer.text(),
            "p1-d1",
            "instance {n} served the copy from before a purge that returned Ok ({})",
            answer.x_cache()
        );
    }
}

/// A client allowed only the crate's channels (subscribe and publish, no
/// key), as a `&sg:*` ACL allows: from the acknowledgements of one purge it
/// learns the instances' names, and from each purge's message its nonce; it
/// then acknowledges each purge in every instance's name at once. An
/// instance whose link is frozen (it heard nothing, and still trusts its
/// in-process tier for the rest of its subscription lease) must not serve
/// what it held once the purge returned `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_acknowledgements_do_not_shorten_the_barrier() {
    use crate::common::proxy::Proxy;
    use tokio_stream::StreamExt as _;

    let redis = RedisServer::start();
    let db = Db::default();
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), ROOMY_DEADLINE).await)
        .ttl(Duration::from_secs(60));
    let proxy = Proxy::start(redis.port()).await;
    let b_guard = StampedeGuard::new(backend_at(&proxy.url(), ROOMY_DEADLINE).await)
        .ttl(Duration::from_secs(60));
    let b = app(&db, &b_guard);
    // The forger: names from the acknowledgements it sees, acknowledgements
    // in all of them for each purge message.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut publisher = client.get_multiplexed_async_connection().await.unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("sg:events").await.unwrap();
    pubsub.psubscribe("sg:events:ack:*").await.unwrap();
    let forged = Arc::new(AtomicUsize::new(0));
    let forger = {
        let forged = forged.clone();
        tokio::spawn(async move {
            let mut names = std::collections::BTreeSet::new();
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let payload: String = message.get_payload().unwrap_or_default();
                let parts: Vec<&str> = payload.split(':').collect();
                match parts.first() {
                    Some(&"a") if parts.len() == 3 => {
                        names.insert(parts[2].to_owned());
                    }
                    Some(&"g") if parts.len() >= 5 => {
                        let (sender, nonce) = (parts[parts.len() - 2], parts[parts.len() - 1]);
                        names.insert(sender.to_owned());
                        for name in &names {
                            for _ in 0..4 {
                                let _: Result<i64, _> = redis::cmd("PUBLISH")
                                    .arg(format!("sg:events:ack:{sender}"))
                                    .arg(format!("a:{nonce}:{name}"))
                                    .query_async(&mut publisher)
                                    .await;
                            }
                        }
                        forged.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
        })
    };
    // A first purge: the forger learns both names from it, and the fleet's
    // first lease passes.
    a_guard.invalidate_tag("warm-up").await.unwrap();
    let mut held = String::new();
    for _ in 0..100 {
        let answer = send(&b, request("/products/1")).await;
        if answer.x_cache() == "HIT" {
            held = answer.text();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held, "p1-d0");
    db.versions[1].store(1, Ordering::SeqCst);
    proxy.freeze();
    let purged = tokio::time::timeout(Duration::from_secs(30), a_guard.invalidate_tag("product:1"))
        .await
        .expect("no hang");
    purged.unwrap();
    let after = send(&b, request("/products/1")).await;
    proxy.thaw();
    forger.abort();
    assert!(
        forged.load(Ordering::SeqCst) >= 2,
        "the forger saw both purges"
    );
    assert_eq!(
        after.text(),
        "p1-d1",
        "the frozen instance served what it held after the purge returned ({})",
        after.x_cache()
    );
}

/// `/products/{id}` as [`app`], but the first call after `gate` is armed
/// reads the version, says so on `entered`, and waits for `release`.
fn gated_app(
    db: &Db,
    gate: &Arc<(AtomicBool, tokio::sync::Notify, tokio::sync::Notify)>,
    guard: &StampedeGuard,
) -> Router {
    let (db, gate) = (db.clone(), gate.clone());
    let handler = move |Path(id): Path<usize>| {
        let (db, gate) = (db.clone(), gate.clone());
        async move {
            let version = db.versions[id].load(Ordering::SeqCst);
            if gate.0.swap(false, Ordering::SeqCst) {
                gate.1.notify_one();
                gate.2.notified().await;
            }
            (
                [("surrogate-key", format!("product:{id} catalog"))],
                format!("p{id}-d{version}"),
            )
        }
    };
    Router::new().route("/products/{id}", get(handler).layer(guard.clone()))
}

/// Redis restarts with empty memory between a rebuild's start (it read the
/// product before the write) and its end, on another instance than the one
/// that purges after the write; the rebuilding instance learns of the
/// restart at once (`announced`) or not at all (a link that holds Redis's
/// close). Once the purge returned `Ok`, every instance, and one started
/// afterwards, answers the new version.
async fn restart_between_a_rebuilds_start_and_its_end(announced: bool) {
    use crate::common::proxy::Proxy;
    let mut redis = RedisServer::start();
    let db = Db::default();
    let gate = Arc::new((
        AtomicBool::new(false),
        tokio::sync::Notify::new(),
        tokio::sync::Notify::new(),
    ));
    let a = StampedeGuard::new(backend_at(&redis.url(), ROOMY_DEADLINE).await)
        .ttl(Duration::from_secs(60));
    let a_app = app(&db, &a);
    let proxy = Proxy::start(redis.port()).await;
    let b_url = if announced { redis.url() } else { proxy.url() };
    let b =
        StampedeGuard::new(backend_at(&b_url, ROOMY_DEADLINE).await).ttl(Duration::from_secs(60));
    let b_app = gated_app(&db, &gate, &b);
    gate.0.store(true, Ordering::SeqCst);
    let racing = tokio::spawn({
        let app = b_app.clone();
        async move { send(&app, request("/products/1")).await.text() }
    });
    gate.1.notified().await;
    if !announced {
        proxy.freeze_closes_too();
    }
    redis.restart();
    db.versions[1].store(1, Ordering::SeqCst);
    let purged = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            // Right after the restart a call may find the link still down.
            match a.invalidate_tag("product:1").await {
                Ok(()) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    purged.expect("the purge returns Ok once Redis is back");
    gate.2.notify_one();
    assert_eq!(
        racing.await.unwrap(),
        "p1-d0",
        "its own request may have it"
    );
    for (name, app) in [("purger", &a_app), ("rebuilder", &b_app)] {
        let answer = send(app, request("/products/1")).await;
        assert_eq!(
            answer.text(),
            "p1-d1",
            "the {name} answered from before the purge ({})",
            answer.x_cache()
        );
    }
    let c = StampedeGuard::new(backend_at(&redis.url(), ROOMY_DEADLINE).await)
        .ttl(Duration::from_secs(60));
    let answer = send(&app(&db, &c), request("/products/1")).await;
    assert_eq!(
        answer.text(),
        "p1-d1",
        "a new instance ({})",
        answer.x_cache()
    );
    proxy.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_rebuild_then_a_purge_brings_nothing_old_back() {
    restart_between_a_rebuilds_start_and_its_end(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unannounced_restart_during_a_rebuild_then_a_purge_brings_nothing_old_back() {
    restart_between_a_rebuilds_start_and_its_end(false).await;
}
