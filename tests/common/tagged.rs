//! A fleet of tagged product routes on one Redis, for the tag-purge
//! attack tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::StampedeGuard;

use super::fleet::backend_at;
use super::redis::RedisServer;
use super::{get as request, send, Origin};

/// `/products/{id}` answers `p<id>-v<call>`, tagged `product:<id>`.
pub fn app(origin: &Origin, guard: &StampedeGuard) -> Router {
    let origin = origin.clone();
    let handler = move |Path(id): Path<u32>| {
        let origin = origin.clone();
        async move {
            let (n, _running) = origin.enter();
            (
                [("surrogate-key", format!("product:{id}"))],
                format!("p{id}-v{n}"),
            )
        }
    };
    Router::new().route("/products/{id}", get(handler).layer(guard.clone()))
}

pub struct Node {
    pub guard: StampedeGuard,
    pub app: Router,
}

pub async fn fleet(redis: &RedisServer, k: usize, origin: &Origin) -> Vec<Node> {
    let mut nodes = Vec::new();
    for _ in 0..k {
        let backend = backend_at(&redis.url(), Duration::from_millis(500)).await;
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let app = app(origin, &guard);
        nodes.push(Node { guard, app });
    }
    nodes
}

pub async fn text(node: &Node, uri: &str) -> String {
    send(&node.app, request(uri)).await.text()
}

/// What `node` serves `/products/1` with once it answers it from its L1
/// twice in a row, 100 ms apart (10 s at most).
pub async fn settled(node: &Node) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let first = send(&node.app, request("/products/1")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = send(&node.app, request("/products/1")).await;
        if second.x_cache() == "HIT" && first.text() == second.text() {
            return second.text();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the instance did not settle"
        );
    }
}

/// The generation-table field of `tag`'s bucket.
pub fn bucket_field(tag: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in tag.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("b{}", hash % 4096)
}

/// `/products/1` answering `p1-d<version>`, tagged `product:1`.
pub fn versioned(version: &Arc<AtomicU64>, guard: &StampedeGuard) -> Router {
    let version = version.clone();
    let handler = move || {
        let version = version.clone();
        async move {
            (
                [("surrogate-key", "product:1")],
                format!("p1-d{}", version.load(Ordering::SeqCst)),
            )
        }
    };
    Router::new().route("/products/1", get(handler).layer(guard.clone()))
}
