//! Attacks on the invalidation barrier's two newest parts, on real Redis:
//! acknowledgements recorded in Redis (`ack.lua`, the purger's one read of
//! the set), and the supervisor keeping a subscriber whose client
//! reconnected and subscribed again by itself.
//!
//! Each test fails if, after a purge returned `Ok`, an instance answers a
//! request with what it held from before the purge.
//!
//! - a client allowed only the channels copies each purge's nonce into
//!   messages of its own (another tag bucket, a later generation), forges
//!   every member's acknowledgement and re-addresses them to every purger:
//!   a member whose link is frozen must still not serve its copy;
//! - a passive subscriber makes every purge wait its whole lease (the
//!   documented cost of an event channel anyone may subscribe to);
//! - the subscribers killed (`CLIENT KILL TYPE pubsub`) just before a purge;
//! - Redis restarted empty, with a value built from the origin during the
//!   outage in the instance's L1, and the purge sent while its probe and
//!   resubscription are pending;
//! - a subscriber whose client reconnects but may no longer subscribe to
//!   the event channel (only to its acknowledgement channel, whose
//!   subscription must not end the gap): it answers pings, so its
//!   keepalives must not keep its L1 trusted;
//! - then a new link that subscribes and fails to open after that (its
//!   scripts refused): its subscription must not end the old one's gap.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::fleet::{backend_at, event_subscribers};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::tagged::versioned as app;
use crate::common::{get as request, send, ROOMY_DEADLINE};
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};

/// An instance: its backend, guard and app.
struct Node {
    backend: Backend,
    guard: StampedeGuard,
    app: Router,
}

async fn node(url: &str, version: &Arc<AtomicU64>) -> Node {
    let backend = backend_at(url, ROOMY_DEADLINE).await;
    let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
    let app = app(version, &guard);
    Node {
        backend,
        guard,
        app,
    }
}

fn unconfirmed(backend: &Backend) -> u64 {
    backend
        .stats()
        .redis
        .expect("a redis tier")
        .unconfirmed_invalidations
}

/// Sends `/products/1` to `app` until it answers from its cache; its text.
async fn held(app: &Router) -> String {
    for _ in 0..300 {
        let answer = send(app, request("/products/1")).await;
        if answer.x_cache() == "HIT" {
            return answer.text();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never a hit");
}

/// Sends `/products/1` to `app` until it answers `text` from its cache.
async fn held_as(app: &Router, text: &str) {
    for _ in 0..400 {
        let answer = send(app, request("/products/1")).await;
        if answer.x_cache() == "HIT" && answer.text() == text {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never a hit of {text}");
}

/// Waits (at most 20 s) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

/// How many connections `user` has open.
fn clients_of(redis: &RedisServer, user: &str) -> usize {
    let named = format!("user={user} ");
    redis
        .raw(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains(&named))
        .count()
}

/// A purge, bounded: it never takes more than two leases and a few tries.
async fn purge(guard: &StampedeGuard, tag: &str) {
    tokio::time::timeout(Duration::from_secs(30), guard.invalidate_tag(tag))
        .await
        .expect("the purge returns")
        .expect("the purge reached redis");
}

/// A client that may only use the channels (no key at all): for every tag
/// purge it hears (`g:<field>:<generation>:<sender>:<nonce>`), it
/// - publishes two messages of its own with the purge's nonce, one naming
///   another bucket, one the next generation (the members handle them and
///   record acknowledgements of what they named),
/// - forges, in the name of every instance it has heard of, an
///   acknowledgement of the nonce, on the purger's channel and on every
///   other purger's channel it has seen (a re-addressed acknowledgement).
///
/// Counts the purges it answered.
async fn forge_on_channels(
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
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let payload: String = message.get_payload().unwrap_or_default();
            let parts: Vec<&str> = payload.split(':').collect();
            let learn = |name: &str| {
                let mut names = names.lock().unwrap();
                if name.len() == 16 && !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            };
            if parts.first() == Some(&"a") && parts.len() == 3 {
                learn(parts[2]);
                continue;
            }
            if parts.first() != Some(&"g") || parts.len() != 5 {
                continue;
            }
            let (field, generation, sender, nonce) = (parts[1], parts[2], parts[3], parts[4]);
            learn(sender);
            let other = match field.strip_prefix('b').and_then(|b| b.parse::<u32>().ok()) {
                Some(b) => format!("b{}", (b + 1) % 4096),
                None => "b0".to_owned(),
            };
            let next = generation.parse::<u64>().map_or(1, |g| g.saturating_add(1));
            let mut out = vec![
                (
                    "sg:events".to_owned(),
                    format!("g:{other}:{generation}:{sender}:{nonce}"),
                ),
                (
                    "sg:events".to_owned(),
                    format!("g:{field}:{next}:{sender}:{nonce}"),
                ),
            ];
            let known = names.lock().unwrap().clone();
            for purger in &known {
                for name in &known {
                    out.push((
                        format!("sg:events:ack:{purger}"),
                        format!("a:{nonce}:{name}"),
                    ));
                }
            }
            for (channel, message) in out {
                let _: Result<i64, _> = redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(message)
                    .query_async(&mut conn)
                    .await;
            }
            forged.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// Three instances: A purges, B's link is frozen (it hears nothing and
/// trusts its L1 for the rest of its lease), C is live. A client allowed
/// only the channels copies the purge's nonce into messages of its own and
/// forges every instance's acknowledgement: the purge must still wait out
/// B's lease, and B must not serve its copy afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_copied_and_readdressed_acknowledgements_do_not_end_a_purge() {
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
    let a = node(&redis.url(), &version).await;
    let proxy = Proxy::start(redis.port()).await;
    let b = node(&proxy.url(), &version).await;
    let c = node(&redis.url(), &version).await;
    let forged = Arc::new(AtomicUsize::new(0));
    let forger = forge_on_channels(&redis, Arc::clone(&forged)).await;

    // The forger learns every name from a first purge and its
    // acknowledgements.
    purge(&a.guard, "warm-up").await;
    assert_eq!(held(&b.app).await, "p1-d0");
    assert_eq!(held(&c.app).await, "p1-d0");
    version.store(1, Ordering::SeqCst);
    let before = unconfirmed(&a.backend);
    proxy.freeze();
    purge(&a.guard, "product:1").await;
    let from_b = send(&b.app, request("/products/1")).await;
    let from_c = send(&c.app, request("/products/1")).await;
    proxy.thaw();
    forger.abort();
    assert!(
        forged.load(Ordering::SeqCst) >= 2,
        "the forger answered every purge"
    );
    assert_eq!(
        from_b.text(),
        "p1-d1",
        "the frozen instance served what it held after the purge returned ({})",
        from_b.x_cache()
    );
    assert_eq!(from_c.text(), "p1-d1", "the live instance after the purge");
    assert_eq!(
        unconfirmed(&a.backend),
        before + 1,
        "the purge through the frozen link was not confirmed"
    );
}

/// A client that may only subscribe, and never acknowledges, is one more
/// receiver of every purge's `PUBLISH`: every purge waits its whole lease
/// and counts as unconfirmed (README: "Other subscribers of the event
/// channel that never acknowledge"), and still returns `Ok` with the fleet
/// answering the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passive_subscriber_makes_every_purge_wait_its_lease() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let a = node(&redis.url(), &version).await;
    let b = node(&redis.url(), &version).await;
    purge(&a.guard, "warm-up").await;
    assert_eq!(unconfirmed(&a.backend), 0, "confirmed without the listener");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut listener = client.get_async_pubsub().await.unwrap();
    listener.subscribe("sg:events").await.unwrap();
    assert_eq!(held(&b.app).await, "p1-d0");
    version.store(1, Ordering::SeqCst);
    purge(&a.guard, "product:1").await;
    purge(&b.guard, "product:2").await;
    assert_eq!(unconfirmed(&a.backend), 1, "A's purge waited its lease");
    assert_eq!(unconfirmed(&b.backend), 1, "B's purge waited its lease");
    assert_eq!(send(&b.app, request("/products/1")).await.text(), "p1-d1");
    drop(listener);
}

/// Every subscriber connection killed (`CLIENT KILL TYPE pubsub`) just
/// before a purge: B's client reconnects and subscribes again by itself,
/// and the purge may be published before or after that. Either way B
/// answers the new version once the purge returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_racing_a_killed_subscriber_is_not_missed() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let a = node(&redis.url(), &version).await;
    let b = node(&redis.url(), &version).await;
    purge(&a.guard, "warm-up").await;
    for round in 1..=2u64 {
        assert_eq!(held(&b.app).await, format!("p1-d{}", round - 1));
        version.store(round, Ordering::SeqCst);
        redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        purge(&a.guard, "product:1").await;
        let answer = send(&b.app, request("/products/1")).await;
        assert_eq!(
            answer.text(),
            format!("p1-d{round}"),
            "round {round}: B served what it held before the purge ({})",
            answer.x_cache()
        );
    }
}

/// Redis killed: B's calls fail and its origin answers from its L1 (a
/// value built during the outage). Redis comes back empty and A purges at
/// once, while B's probe and resubscription may both be pending: B must
/// answer the new version once the purge returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_right_after_a_restart_reaches_a_value_built_during_the_outage() {
    let mut redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let a = node(&redis.url(), &version).await;
    let b = node(&redis.url(), &version).await;
    purge(&a.guard, "warm-up").await;
    assert_eq!(held(&b.app).await, "p1-d0");
    redis.kill();
    version.store(1, Ordering::SeqCst);
    // Built from the origin while Redis is down (once B dropped what it
    // held), and kept in B's L1.
    held_as(&b.app, "p1-d1").await;
    version.store(2, Ordering::SeqCst);
    redis.restart();
    purge(&a.guard, "product:1").await;
    let answer = send(&b.app, request("/products/1")).await;
    assert_eq!(
        answer.text(),
        "p1-d2",
        "B served what it built before the purge ({})",
        answer.x_cache()
    );
}

/// B runs as a user that loses the event channel (it keeps its
/// acknowledgement channel): Redis drops B's subscriber, whose client
/// reconnects, is refused its resubscription (one `SUBSCRIBE` naming both
/// channels), and answers pings. B's new links subscribe to the
/// acknowledgement channel (a subscription that must not end the gap),
/// then are refused the event channel. B hears no purge from then on, so
/// the keepalives it answers must not keep its L1 trusted: once A's purge
/// returned, B must answer the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_back_without_the_event_channel_keeps_no_lease() {
    let mut args = vec!["--user", "app", "on", ">app-secret"];
    args.extend(crate::common::tls::ACL_RULES.iter().copied());
    let redis = RedisServer::start_with(&args);
    let version = Arc::new(AtomicU64::new(0));
    let a = node(&redis.url(), &version).await;
    let b_url = format!("redis://app:app-secret@127.0.0.1:{}/", redis.port());
    let b = node(&b_url, &version).await;
    purge(&a.guard, "warm-up").await;
    assert_eq!(held(&b.app).await, "p1-d0");
    until("both instances subscribed", || {
        event_subscribers(&redis) == 2
    })
    .await;
    let revoke = ["ACL", "SETUSER", "app", "resetchannels", "&sg:events:ack:*"];
    assert_eq!(redis.raw(&revoke), "+OK");
    until("B's subscriber dropped", || event_subscribers(&redis) == 1).await;
    // B's client reconnected its subscriber (which it does on hearing the
    // disconnection, so B has dropped its L1 by now); B holds the entry
    // again, read from Redis.
    until("B's subscriber reconnected", || {
        clients_of(&redis, "app") == 2
    })
    .await;
    assert_eq!(held(&b.app).await, "p1-d0");
    version.store(1, Ordering::SeqCst);
    purge(&a.guard, "product:1").await;
    let answer = send(&b.app, request("/products/1")).await;
    assert_eq!(
        answer.text(),
        "p1-d1",
        "B, deaf to the event channel, served what it held before the purge ({})",
        answer.x_cache()
    );
    assert_eq!(event_subscribers(&redis), 1, "B never heard it");
}

/// Whether Redis's ACL log holds a refusal whose description contains
/// `what`.
async fn acl_log_names(redis: &RedisServer, what: &str) -> bool {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let log: redis::Value = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut conn)
        .await
        .unwrap();
    format!("{log:?}").contains(what)
}

/// As above, B's subscriber is back without the event channel. Then the
/// channel is given back, but `SCRIPT LOAD` taken away: B's next new link
/// subscribes (its subscription is seen to end the gap) and then fails to
/// load the scripts, and is dropped. The old subscriber still hears
/// nothing: B must not take the failed link's subscription for its own,
/// and must answer the new version once A's purge returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_fails_after_subscribing_does_not_end_the_gap() {
    let mut args = vec!["--user", "app", "on", ">app-secret"];
    args.extend(crate::common::tls::ACL_RULES.iter().copied());
    let redis = RedisServer::start_with(&args);
    let version = Arc::new(AtomicU64::new(0));
    let a = node(&redis.url(), &version).await;
    let b_url = format!("redis://app:app-secret@127.0.0.1:{}/", redis.port());
    let b = node(&b_url, &version).await;
    purge(&a.guard, "warm-up").await;
    assert_eq!(held(&b.app).await, "p1-d0");
    until("both instances subscribed", || {
        event_subscribers(&redis) == 2
    })
    .await;
    let revoke = ["ACL", "SETUSER", "app", "resetchannels", "&sg:events:ack:*"];
    assert_eq!(redis.raw(&revoke), "+OK");
    until("B's subscriber dropped", || event_subscribers(&redis) == 1).await;
    until("B's subscriber reconnected", || {
        clients_of(&redis, "app") == 2
    })
    .await;
    assert_eq!(redis.raw(&["ACL", "LOG", "RESET"]), "+OK");
    let swap = ["ACL", "SETUSER", "app", "&sg:*", "-script|load"];
    assert_eq!(redis.raw(&swap), "+OK");
    for _ in 0..400 {
        if acl_log_names(&redis, "load").await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(acl_log_names(&redis, "load").await, "B tried a new link");
    assert_eq!(held(&b.app).await, "p1-d0");
    version.store(1, Ordering::SeqCst);
    purge(&a.guard, "product:1").await;
    let answer = send(&b.app, request("/products/1")).await;
    assert_eq!(
        answer.text(),
        "p1-d1",
        "B, deaf to the event channel, served what it held before the purge ({})",
        answer.x_cache()
    );
}
