//! Attacks on fleet-wide tag invalidation on a real Redis: forged
//! generations on the event channel, a table at the top of the numbers a
//! script can hold, a purge while Redis is frozen, and Redis restarted with
//! empty memory between a purge and the reads after it.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::redis::RedisServer;
use crate::common::{get as request, send, Origin};
use axum::Router;

use crate::common::fleet::backend_at;
use crate::common::tagged::{bucket_field, fleet, text, Node};
use axum::routing::get;
use stampede_guard::StampedeGuard;

fn micros_from_now(ahead: Duration) -> u64 {
    (SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + ahead).as_micros() as u64
}

/// What `node` serves `/products/1` with once it answers it from its L1
/// twice in a row.
async fn settled(node: &Node) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let first = send(&node.app, request("/products/1")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = send(&node.app, request("/products/1")).await;
        if second.x_cache() == "HIT" && first.text() == second.text() {
            return second.text();
        }
        assert!(Instant::now() < deadline, "the instance did not settle");
    }
}

async fn wait_until_available(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let up = |n: &Node| n.guard.backend().stats().redis.is_some_and(|r| r.available);
        if nodes.iter().all(up) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the circuit did not close");
}

/// A forged generation only minutes ahead of the clock (well under any
/// "from the future" ceiling of an hour) must not make the real purges that
/// follow no-ops: they come from Redis's clock, below the forged number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_generation_minutes_ahead_cannot_disable_later_purges() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    let field = bucket_field("product:1");
    let forged = micros_from_now(Duration::from_secs(30 * 60));
    for f in [field.clone(), "all".to_owned()] {
        let message = format!("g:{f}:{forged}:0123456789abcdef:7");
        redis.raw(&["PUBLISH", "sg:events", &message]);
    }
    // Heard in order: once this purge is acknowledged, the forged ones were.
    nodes[0].guard.invalidate_tag("unrelated").await.unwrap();
    // Entries built now, on each instance.
    let mut held = Vec::new();
    for node in &nodes {
        held.push(settled(node).await);
    }
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    for (i, (node, old)) in nodes.iter().zip(&held).enumerate() {
        assert_ne!(&text(node, "/products/1").await, old, "instance {i}");
    }
    let mut held = Vec::new();
    for node in &nodes {
        held.push(settled(node).await);
    }
    nodes[0].guard.invalidate_all().await.unwrap();
    for (i, (node, old)) in nodes.iter().zip(&held).enumerate() {
        assert_ne!(&text(node, "/products/1").await, old, "instance {i}");
    }
}

/// A field at 2^53 - 1 (a plain number the scripts accept): the purge
/// after it must either fail or truly move the generation; a purge that
/// returns Ok must never be a no-op on the entries built under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_at_the_top_of_a_scripts_numbers_never_turns_purges_into_no_ops() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let field = bucket_field("product:1");
    redis.raw(&["HSET", "sg:tags", &field, "9007199254740991"]);
    let nodes = fleet(&redis, 2, &origin).await;
    let mut held = Vec::new();
    for node in &nodes {
        held.push(settled(node).await);
    }
    for attempt in 0..3 {
        if nodes[0].guard.invalidate_tag("product:1").await.is_ok() {
            for (i, (node, old)) in nodes.iter().zip(&held).enumerate() {
                assert_ne!(
                    &text(node, "/products/1").await,
                    old,
                    "instance {i}, after purge {attempt} returned Ok"
                );
            }
            held.clear();
            for node in &nodes {
                held.push(settled(node).await);
            }
        }
    }
    // Everything still works.
    nodes[1].guard.invalidate_all().await.unwrap();
    for (i, (node, old)) in nodes.iter().zip(&held).enumerate() {
        assert_ne!(&text(node, "/products/1").await, old, "instance {i}");
    }
}

/// Redis restarted with empty memory after a purge returned Ok and before
/// the reads: nothing built before the purge comes back, from any L1 or
/// from Redis (a rebuild may refill Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_empty_after_the_purge_brings_nothing_old_back() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 3, &origin).await;
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    nodes[2].guard.invalidate_tag("product:1").await.unwrap();
    redis.restart();
    wait_until_available(&nodes).await;
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(text(node, "/products/1").await, "p1-v1", "instance {i}");
    }
    // A purge after the restart is still above what every entry recorded.
    let held = settled(&nodes[0]).await;
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(text(node, "/products/1").await, held, "instance {i}");
    }
}

/// FLUSHALL between a commit and the purge (the table and the entry gone),
/// then a purge: it is above the generations every L1 entry recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_between_commit_and_purge_does_not_undo_the_purge() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    redis.raw(&["FLUSHALL"]);
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(text(node, "/products/1").await, "p1-v1", "instance {i}");
    }
}

/// A purge while Redis is frozen returns Err; once Redis thaws, the writer
/// that was told its purge failed is not handed the old value from Redis as
/// if nothing happened (as `invalidate` remembers a purge that did not reach
/// Redis and retries it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_while_redis_is_frozen_fails_and_is_not_forgotten() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    redis.freeze();
    let purged = nodes[0].guard.invalidate_tag("product:1").await;
    redis.thaw();
    assert!(purged.is_err(), "a purge Redis never ran is not Ok");
    wait_until_available(&nodes).await;
    // The writer's own reads, for a while after Redis is back.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert_ne!(text(&nodes[0], "/products/1").await, "p1-v1");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The table lost after a purge (evicted, or deleted) while the entries
/// built before the purge stay in Redis: an instance that starts then (a
/// deploy, a scale-up) must not take them as current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lost_after_a_purge_does_not_revive_entries_in_redis() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    // The entry of v1 stays in Redis (a purge scans no keys); the table goes,
    // as an eviction under maxmemory would take it.
    redis.raw(&["DEL", "sg:tags"]);
    let late = fleet(&redis, 1, &origin).await;
    assert_ne!(text(&late[0], "/products/1").await, "p1-v1");
}

/// A subscriber connection killed just before a purge: the purge does not
/// wait for an instance it cannot reach, but that instance must not answer
/// the old value from its L1 once the purge returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_does_not_serve_its_l1_after_the_purge() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    for round in 0..5 {
        let held = settled(&nodes[1]).await;
        redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        nodes[0].guard.invalidate_tag("product:1").await.unwrap();
        assert_ne!(text(&nodes[1], "/products/1").await, held, "round {round}");
        wait_until_available(&nodes).await;
    }
}

/// Entries past their freshness, inside stale-while-revalidate and
/// stale-if-error windows, with an origin that fails after the purge: no
/// instance serves the copy built before the purge as stale either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_copy_from_before_the_purge_under_swr_or_stale_if_error() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), Duration::from_millis(500)).await;
        let guard = StampedeGuard::new(backend)
            .ttl(Duration::from_millis(200))
            .stale_while_revalidate(Duration::from_secs(60))
            .stale_if_error(Duration::from_secs(60));
        let (origin, failing) = (origin.clone(), failing.clone());
        let handler = move || {
            let (origin, failing) = (origin.clone(), failing.clone());
            async move {
                let (n, _running) = origin.enter();
                let status = if failing.load(std::sync::atomic::Ordering::SeqCst) {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                };
                (status, [("surrogate-key", "product:1")], format!("v{n}"))
            }
        };
        let app = Router::new().route("/products/1", get(handler).layer(guard.clone()));
        nodes.push(Node { guard, app });
    }
    for node in &nodes {
        assert_eq!(text(node, "/products/1").await, "v1");
    }
    // Past freshness: both hold v1 as a stale copy (L1 and Redis).
    tokio::time::sleep(Duration::from_millis(300)).await;
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    for _ in 0..3 {
        for (i, node) in nodes.iter().enumerate() {
            assert_ne!(text(node, "/products/1").await, "v1", "instance {i}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
