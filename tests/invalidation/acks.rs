//! Acknowledgements of purges, on real Redis: each instance records its
//! acknowledgement in the purge's set before it publishes it, and the purger
//! accepts the acknowledgements it heard only once that set names every
//! member it waits for.
//!
//! - a client that may read every key (the members, the acknowledgement
//!   sets) and publish, but write none, forges every member's
//!   acknowledgement of each purge: the purge waits out the frozen
//!   instance's lease all the same;
//! - a purge across three live instances is confirmed by their recorded
//!   acknowledgements, without waiting out a lease;
//! - a Redis user without `+sadd` makes every purge wait out its lease.
//!
//! A client allowed only the channels: `tests/tags/barrier.rs`.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::fleet::{backend_at, keys_like};
use crate::common::redis::RedisServer;
use crate::common::tagged::versioned as app;
use crate::common::{get as request, send, ROOMY_DEADLINE};
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};

/// What `command` (SMEMBERS, or ZRANGE over all) lists at `key`.
fn listed(redis: &RedisServer, command: &str, key: &str) -> Vec<String> {
    let script = match command {
        "ZRANGE" => "return table.concat(redis.call('ZRANGE', KEYS[1], 0, -1), ' ')",
        _ => "return table.concat(redis.call('SMEMBERS', KEYS[1]), ' ')",
    };
    redis
        .raw(&["EVAL", script, "1", key])
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn unconfirmed(backend: &Backend) -> u64 {
    backend
        .stats()
        .redis
        .expect("a redis tier")
        .unconfirmed_invalidations
}

/// Sends `/products/1` to `app` until it answers from its cache.
async fn held(app: &Router) -> String {
    for _ in 0..200 {
        let answer = send(app, request("/products/1")).await;
        if answer.x_cache() == "HIT" {
            return answer.text();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never a hit");
}

/// The reader forges: for every purge message (`g:...:<sender>:<nonce>`),
/// an acknowledgement in the name of every member it reads, and an attempt
/// to record each in the purge's set. Counts (purges forged, records
/// refused).
async fn forge_as_reader(
    redis: &RedisServer,
    forged: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    use tokio_stream::StreamExt as _;
    let url = format!("redis://reader:secret@127.0.0.1:{}/", redis.port());
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("sg:events").await.unwrap();
    pubsub.psubscribe("sg:events:ack:*").await.unwrap();
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let payload: String = message.get_payload().unwrap_or_default();
            let parts: Vec<&str> = payload.split(':').collect();
            if parts.first() != Some(&"g") || parts.len() < 5 {
                continue;
            }
            let (sender, nonce) = (parts[parts.len() - 2], parts[parts.len() - 1]);
            let names: Vec<String> = redis::cmd("ZRANGE")
                .arg("sg:members")
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let set = format!("sg:acks:{{{sender}}}:{nonce}");
            for name in names.iter().filter(|n| n.as_str() != "born") {
                let recorded: Result<i64, _> = redis::cmd("SADD")
                    .arg(&set)
                    .arg(name)
                    .query_async(&mut conn)
                    .await;
                if recorded.is_err_and(|e| e.code() == Some("NOPERM")) {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                for _ in 0..4 {
                    let _: Result<i64, _> = redis::cmd("PUBLISH")
                        .arg(format!("sg:events:ack:{sender}"))
                        .arg(format!("a:{nonce}:{name}"))
                        .query_async(&mut conn)
                        .await;
                }
            }
            // What the set holds is readable too; it changes nothing.
            let _: Result<Vec<String>, _> = redis::cmd("SMEMBERS")
                .arg(&set)
                .query_async(&mut conn)
                .await;
            forged.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// A client with `+@read +publish` (and the subscriptions), no write: it
/// reads the fleet's members and forges each one's acknowledgement of every
/// purge, and tries to record them. An instance whose link is frozen (it
/// heard nothing, and trusts its in-process tier for the rest of its lease)
/// must not serve what it held once the purge returned `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_every_key_cannot_forge_acknowledgements() {
    use crate::common::proxy::Proxy;

    let redis = RedisServer::start();
    let acl = [
        "ACL",
        "SETUSER",
        "reader",
        "on",
        ">secret",
        "~*",
        "&*",
        "-@all",
        "+@read",
        "+publish",
        "+subscribe",
        "+psubscribe",
        "+ping",
        "+hello",
    ];
    assert_eq!(redis.raw(&acl), "+OK");
    let version = Arc::new(AtomicU64::new(0));
    let a_backend = backend_at(&redis.url(), ROOMY_DEADLINE).await;
    let a = StampedeGuard::new(a_backend.clone()).ttl(Duration::from_secs(60));
    let proxy = Proxy::start(redis.port()).await;
    let b_guard = StampedeGuard::new(backend_at(&proxy.url(), ROOMY_DEADLINE).await)
        .ttl(Duration::from_secs(60));
    let b = app(&version, &b_guard);
    let (forged, refused) = (Arc::default(), Arc::default());
    let forger = forge_as_reader(&redis, Arc::clone(&forged), Arc::clone(&refused)).await;

    a.invalidate_tag("warm-up").await.unwrap();
    assert_eq!(held(&b).await, "p1-d0");
    version.store(1, Ordering::SeqCst);
    proxy.freeze();
    let purged = tokio::time::timeout(Duration::from_secs(30), a.invalidate_tag("product:1"))
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
    assert!(
        refused.load(Ordering::SeqCst) >= 2,
        "the forger tried to record acknowledgements and was refused"
    );
    assert_eq!(
        after.text(),
        "p1-d1",
        "the frozen instance served what it held after the purge returned ({})",
        after.x_cache()
    );
    assert!(
        unconfirmed(&a_backend) >= 1,
        "the purge through the frozen link was not confirmed"
    );
}

/// Three live instances: each purge (a tag, everything) is confirmed by the
/// other two's recorded acknowledgements: `Ok`, and no purge counted as
/// unconfirmed (none waited out a lease). Each purge's set names exactly
/// the two other members, each with what the purge invalidated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_across_three_instances_is_confirmed_by_their_records() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = vec![];
    let mut apps = vec![];
    let mut guards = vec![];
    for _ in 0..3 {
        let backend = backend_at(&redis.url(), ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
        apps.push(app(&version, &guard));
        guards.push(guard);
        backends.push(backend);
    }
    for app in &apps {
        assert_eq!(held(app).await, "p1-d0");
    }
    version.store(1, Ordering::SeqCst);
    guards[0].invalidate_tag("product:1").await.unwrap();
    for (n, app) in apps.iter().enumerate() {
        let answer = send(app, request("/products/1")).await;
        assert_eq!(answer.text(), "p1-d1", "instance {n} after the purge");
    }
    guards[1].invalidate_all().await.unwrap();
    for backend in &backends {
        assert_eq!(unconfirmed(backend), 0, "every purge was confirmed");
    }
    let members = listed(&redis, "ZRANGE", "sg:members");
    let sets = keys_like(&redis, "sg:acks:*");
    assert_eq!(sets.len(), 2, "one set per purge: {sets:?}");
    for set in sets {
        let recorded = listed(&redis, "SMEMBERS", &set);
        assert_eq!(recorded.len(), 2, "{set}: {recorded:?}");
        // `sg:acks:{<purger>}:<nonce>`: one purger's sets share a slot.
        let purger = set
            .split(':')
            .nth(2)
            .and_then(|tag| tag.strip_prefix('{')?.strip_suffix('}'))
            .expect("the purger's name");
        // `<instance>:<what its message invalidated>`: here a table field
        // (a tag's bucket, or the whole of the empty namespace) and its new
        // generation, the same for both.
        let mut subjects = vec![];
        for entry in &recorded {
            let (name, subject) = entry.split_once(':').expect("instance:subject");
            assert!(members.iter().any(|m| m == name), "{name} is a member");
            assert_ne!(name, purger, "the purger acknowledges its own locally");
            subjects.push(subject);
        }
        assert_eq!(subjects[0], subjects[1], "{recorded:?}");
        assert!(
            subjects[0].starts_with('b') || subjects[0].starts_with("n.all:"),
            "{recorded:?}"
        );
    }
}

/// A Redis user confined as docs/TOPOLOGY.md says, but without `+sadd`
/// (an ACL written for the previous version): the instances cannot record
/// their acknowledgements, so every purge waits out its lease, and is
/// counted unconfirmed; it still returns `Ok`, and every instance answers
/// the new version afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sadd_every_purge_waits_its_lease() {
    let mut args = vec!["--user", "app", "on", ">app-secret"];
    args.extend(
        crate::common::tls::ACL_RULES
            .iter()
            .copied()
            .filter(|r| *r != "+sadd"),
    );
    let redis = RedisServer::start_with(&args);
    let url = format!("redis://app:app-secret@127.0.0.1:{}/", redis.port());
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = vec![];
    let mut apps = vec![];
    let mut guards = vec![];
    for _ in 0..2 {
        let backend = backend_at(&url, ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
        apps.push(app(&version, &guard));
        guards.push(guard);
        backends.push(backend);
    }
    for app in &apps {
        assert_eq!(held(app).await, "p1-d0");
    }
    version.store(1, Ordering::SeqCst);
    guards[0].invalidate_tag("product:1").await.unwrap();
    assert_eq!(unconfirmed(&backends[0]), 1, "the purge was not confirmed");
    for (n, app) in apps.iter().enumerate() {
        let answer = send(app, request("/products/1")).await;
        assert_eq!(answer.text(), "p1-d1", "instance {n} after the purge");
    }
    assert!(
        keys_like(&redis, "sg:acks:*").is_empty(),
        "nothing recorded"
    );
}
