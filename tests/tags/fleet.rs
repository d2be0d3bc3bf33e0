//! Invalidation by tag and of everything across a fleet on a real Redis:
//! the barrier over three instances, a rebuild racing it, a Redis restarted
//! with empty memory, foreign bytes in the table, and an instance that may
//! have missed a message.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fleet::backend_at;
use crate::common::redis::RedisServer;
use crate::common::tagged::{bucket_field, settled, text, Node};
use crate::common::{get as request, send, Origin};
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Notify;

/// Parks the origin's first call until released.
#[derive(Clone, Default)]
struct Gate {
    armed: Arc<std::sync::atomic::AtomicBool>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

/// `/products/{id}` answers `p<id>-v<call>` (calls counted across the
/// fleet), tagged `product:<id>` and `products` in `Surrogate-Key`.
fn app(origin: &Origin, gate: &Gate, guard: &StampedeGuard) -> Router {
    let (origin, gate) = (origin.clone(), gate.clone());
    let handler = move |Path(id): Path<u32>| {
        let (origin, gate) = (origin.clone(), gate.clone());
        async move {
            let (n, _running) = origin.enter();
            if gate.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                gate.entered.notify_one();
                gate.release.notified().await;
            }
            let tags = format!("product:{id} products");
            ([("surrogate-key", tags)], format!("p{id}-v{n}"))
        }
    };
    Router::new().route("/products/{id}", get(handler).layer(guard.clone()))
}

async fn node(backend: Backend, origin: &Origin, gate: &Gate) -> Node {
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = app(origin, gate, &guard);
    Node { guard, app }
}

async fn fleet(redis: &RedisServer, k: usize, origin: &Origin, gate: &Gate) -> Vec<Node> {
    let mut nodes = Vec::new();
    for _ in 0..k {
        let backend = backend_at(&redis.url(), Duration::from_millis(500)).await;
        nodes.push(node(backend, origin, gate).await);
    }
    nodes
}

/// Sends until the answer is not `old`, at most `limit`; returns it. For
/// what happens in the background (a reload after a gap), not for speed.
async fn until_not(node: &Node, uri: &str, old: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let now = text(node, uri).await;
        if now != old || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until every node's circuit is closed again.
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

/// Every node answers `/products/1` with `want`.
async fn all_answer(nodes: &[Node], want: &str) {
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(text(node, "/products/1").await, want, "instance {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_tag_is_a_barrier_across_three_instances() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 3, &origin, &gate).await;
    // Each instance holds v1 in its L1 (and Redis holds it too).
    all_answer(&nodes, "p1-v1").await;
    all_answer(&nodes, "p1-v1").await;
    assert_eq!(text(&nodes[0], "/products/2").await, "p2-v2");
    assert_eq!(origin.calls(), 2);

    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    // Once it returned, none of the three answers v1, from L1 or Redis; one
    // rebuild serves the fleet, and the untagged product stays.
    all_answer(&nodes, "p1-v3").await;
    assert_eq!(text(&nodes[2], "/products/2").await, "p2-v2");
    assert_eq!(origin.calls(), 3);

    // A tag of both products, from the third instance.
    nodes[2].guard.invalidate_tag("products").await.unwrap();
    all_answer(&nodes, "p1-v4").await;
    for node in &nodes {
        assert_eq!(text(node, "/products/2").await, "p2-v5");
    }
    assert_eq!(origin.calls(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_all_reaches_every_instance() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 3, &origin, &gate).await;
    all_answer(&nodes, "p1-v1").await;
    assert_eq!(text(&nodes[1], "/products/2").await, "p2-v2");
    nodes[0].guard.invalidate_all().await.unwrap();
    all_answer(&nodes, "p1-v3").await;
    for node in &nodes {
        assert_eq!(text(node, "/products/2").await, "p2-v4");
    }
    assert_eq!(origin.calls(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_racing_invalidate_tag_on_another_instance_stores_nothing() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 3, &origin, &gate).await;
    gate.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // Instance 0 rebuilds from data older than the invalidation, holding
    // the fleet's lease.
    let racing = tokio::spawn({
        let app = nodes[0].app.clone();
        async move { send(&app, request("/products/1")).await.text() }
    });
    gate.entered.notified().await;
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    // A request after it, on a third instance, waits for the lease holder,
    // which now stores nothing, and then rebuilds.
    let after = tokio::spawn({
        let app = nodes[2].app.clone();
        async move { send(&app, request("/products/1")).await.text() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.release.notify_one();
    assert_eq!(
        racing.await.unwrap(),
        "p1-v1",
        "its own waiters may have it"
    );
    let after = after.await.unwrap();
    assert_eq!(after, "p1-v2");
    all_answer(&nodes, "p1-v2").await;
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_empty_generations_do_not_go_back() {
    let mut redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    let field = bucket_field("product:1");
    // The tag has a generation before the restart: entries record it.
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    let before: u64 = redis.raw(&["HGET", "sg:tags", &field]).parse().unwrap();
    all_answer(&nodes, "p1-v1").await;

    redis.restart();
    wait_until_available(&nodes).await;
    // Each instance reconnects and serves an entry built after the
    // restart, under the generation it still holds in memory.
    let mut held = Vec::new();
    for node in &nodes {
        held.push(settled(node).await);
    }
    assert!(held.iter().all(|v| v != "p1-v1"));

    // Redis lost the table; the next generation is still above the one
    // every cached entry recorded, so none of them is served.
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    let after: u64 = redis.raw(&["HGET", "sg:tags", &field]).parse().unwrap();
    assert!(after > before, "{after} > {before}");
    for (node, old) in nodes.iter().zip(&held) {
        assert_ne!(&text(node, "/products/1").await, old);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_bytes_in_the_table_count_as_an_invalidation() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    all_answer(&nodes, "p1-v1").await;

    // A foreign value in the tag's field: the next invalidation starts it
    // again from Redis's clock.
    let field = bucket_field("product:1");
    redis.raw(&["HSET", "sg:tags", &field, "not a number", "foreign", "x"]);
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    all_answer(&nodes, "p1-v2").await;
    let stored = redis.raw(&["HGET", "sg:tags", &field]);
    assert!(
        !stored.is_empty() && stored.bytes().all(|b| b.is_ascii_digit()),
        "{stored}"
    );

    // Foreign bytes in `all` (and a number too large for a script) found by
    // an instance loading the table: everything is invalidated, never
    // served as current.
    redis.raw(&[
        "HSET",
        "sg:tags",
        "all",
        "1e999",
        &field,
        "99999999999999999999",
    ]);
    let late = node(
        backend_at(&redis.url(), Duration::from_millis(500)).await,
        &origin,
        &gate,
    )
    .await;
    assert_eq!(text(&late, "/products/1").await, "p1-v3");
    let all = redis.raw(&["HGET", "sg:tags", "all"]);
    assert!(
        !all.is_empty() && all.bytes().all(|b| b.is_ascii_digit()),
        "{all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_wrong_type_fails_the_call_and_serves_nothing_stale() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 1, &origin, &gate).await;
    assert_eq!(text(&nodes[0], "/products/1").await, "p1-v1");
    redis.raw(&["SET", "sg:tags", "a string"]);
    assert!(nodes[0].guard.invalidate_tag("product:1").await.is_err());
    assert!(nodes[0].guard.invalidate_all().await.is_err());
    // Nothing was invalidated in Redis, and nothing panics; the purging
    // instance dropped its own copies all the same, and rebuilds.
    assert_eq!(text(&nodes[0], "/products/1").await, "p1-v2");
    // An instance that cannot load the table checks every entry it takes
    // from Redis against Redis, cannot, and rebuilds rather than trust it.
    let late = node(
        backend_at(&redis.url(), Duration::from_millis(500)).await,
        &origin,
        &gate,
    )
    .await;
    assert_eq!(text(&late, "/products/1").await, "p1-v3");
    assert_eq!(
        text(&late, "/products/1").await,
        "p1-v3",
        "its own build is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_message_is_made_up_by_the_reload_after_a_gap() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    all_answer(&nodes, "p1-v1").await;
    for node in &nodes {
        assert_eq!(text(node, "/products/3").await, "p3-v2");
    }
    assert_ne!(bucket_field("product:1"), bucket_field("product:3"));
    // A generation moved without the fleet hearing it (as if its message
    // was lost): far above any clock-seeded one.
    let field = bucket_field("product:1");
    redis.raw(&["HSET", "sg:tags", &field, "8000000000000000"]);
    all_answer(&nodes, "p1-v1").await;
    // The instances lose their subscriptions; once subscribed again they
    // reload the table, and serve nothing from before it, from their L1
    // or from Redis.
    redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    for node in &nodes {
        let now = until_not(node, "/products/1", "p1-v1", Duration::from_secs(10)).await;
        assert_ne!(now, "p1-v1");
        assert_ne!(text(node, "/products/1").await, "p1-v1");
    }

    // A new instance loads the table when it connects: it does not take
    // the old entry of a product from Redis either.
    redis.raw(&[
        "HSET",
        "sg:tags",
        &bucket_field("product:3"),
        "8000000000000000",
    ]);
    let calls = origin.calls();
    let late = node(
        backend_at(&redis.url(), Duration::from_millis(500)).await,
        &origin,
        &gate,
    )
    .await;
    assert_eq!(
        text(&late, "/products/3").await,
        format!("p3-v{}", calls + 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_generation_on_the_channel_cannot_disable_later_purges() {
    let redis = RedisServer::start();
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = fleet(&redis, 2, &origin, &gate).await;
    all_answer(&nodes, "p1-v1").await;
    // Anyone who may publish on the channel sends a generation far ahead of
    // any clock, for everything and for the tag, and garbage.
    let field = bucket_field("product:1");
    for forged in [
        "g:all:9000000000000000:0123456789abcdef:1".to_owned(),
        format!("g:{field}:9000000000000000:0123456789abcdef:2"),
        "g:all:1:2:3:4:5".to_owned(),
        "g:b99999:1:0123456789abcdef:3".to_owned(),
        "g:".to_owned(),
    ] {
        redis.raw(&["PUBLISH", "sg:events", &forged]);
    }
    // Heard in order: once this one is acknowledged, the forged ones were.
    nodes[0].guard.invalidate_tag("unrelated").await.unwrap();
    let mut held = Vec::new();
    for node in &nodes {
        held.push(settled(node).await);
    }
    // The real purges that follow still reach every cached entry.
    nodes[1].guard.invalidate_tag("product:1").await.unwrap();
    let mut now = Vec::new();
    for (node, old) in nodes.iter().zip(&held) {
        now.push(text(node, "/products/1").await);
        assert_ne!(now.last().unwrap(), old);
    }
    let held = now;
    nodes[0].guard.invalidate_all().await.unwrap();
    for (node, old) in nodes.iter().zip(&held) {
        assert_ne!(&text(node, "/products/1").await, old);
    }
}

/// An instance as a user confined by ACL to the crate's commands and
/// prefix, over TLS.
#[cfg(all(feature = "redis-tls", feature = "serde"))]
async fn confined(
    certs: &crate::common::tls::Certs,
    server: &crate::common::tls::TlsRedis,
    origin: &Origin,
    gate: &Gate,
) -> Node {
    let mut config = stampede_guard::RedisConfig::new(server.url("app-secret"));
    let mut tls = stampede_guard::TlsFiles::default();
    tls.ca_file = Some(certs.path("ca.crt"));
    config.tls = Some(tls);
    config.deadline = Duration::from_millis(500);
    let backend = Backend::from_config(config).await.expect("TLS backend");
    node(backend, origin, gate).await
}

#[cfg(all(feature = "redis-tls", feature = "serde"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_confined_to_the_crates_commands_can_purge_and_load_the_table() {
    let certs = crate::common::tls::Certs::generate();
    let server = crate::common::tls::TlsRedis::start(&certs, false);
    let (origin, gate) = (Origin::default(), Gate::default());
    let nodes = vec![
        confined(&certs, &server, &origin, &gate).await,
        confined(&certs, &server, &origin, &gate).await,
    ];
    all_answer(&nodes, "p1-v1").await;
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    all_answer(&nodes, "p1-v2").await;
    nodes[1].guard.invalidate_all().await.unwrap();
    all_answer(&nodes, "p1-v3").await;
    // A new instance loads the table (as that user) and takes the current
    // entry from Redis rather than rebuilding it.
    let late = confined(&certs, &server, &origin, &gate).await;
    assert_eq!(text(&late, "/products/1").await, "p1-v3");
    assert_eq!(origin.calls(), 3);
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_table_has_its_own_slot_and_purges_reach_every_instance() {
    let cluster = crate::common::cluster::Cluster::start(3, 0);
    let (origin, gate) = (Origin::default(), Gate::default());
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let backend = Backend::redis_cluster_builder(cluster.urls())
            .deadline(Duration::from_millis(500))
            .connect()
            .await
            .expect("cluster backend");
        nodes.push(node(backend, &origin, &gate).await);
    }
    all_answer(&nodes, "p1-v1").await;
    // On a cluster the call waits for the instances subscribed through the
    // node that ran it; the others hear it over the cluster bus (see
    // docs/TOPOLOGY.md), so they are asked until they have.
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    assert_eq!(text(&nodes[0], "/products/1").await, "p1-v2");
    for node in &nodes[1..] {
        let now = until_not(node, "/products/1", "p1-v1", Duration::from_secs(10)).await;
        assert_eq!(now, "p1-v2");
    }
    nodes[2].guard.invalidate_all().await.unwrap();
    assert_eq!(text(&nodes[2], "/products/1").await, "p1-v3");
    for node in &nodes[..2] {
        let now = until_not(node, "/products/1", "p1-v2", Duration::from_secs(10)).await;
        assert_eq!(now, "p1-v3");
    }
    assert_eq!(origin.calls(), 3, "one rebuild per purge for the fleet");
}
