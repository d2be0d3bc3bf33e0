//! A fleet of nodes serving `/items/{id}` through the guard, with an origin
//! whose next call can be parked: the setup of the carried-entry tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Notify;

use super::fleet::backend_at;
use super::redis::RedisServer;
use super::{get as request, send, Origin};

/// Parks the origin's next call until released.
#[derive(Clone, Default)]
pub struct Gate {
    pub armed: Arc<AtomicBool>,
    pub entered: Arc<Notify>,
    pub release: Arc<Notify>,
}

/// `/items/{id}` answers `i<id>-v<call>.` padded to 1 KiB, or to 40 KiB
/// for ids of 100 and above (over the 16 KiB a wake-up carries), tagged
/// `item:<id>`.
pub fn app(origin: &Origin, gate: &Gate, guard: &StampedeGuard) -> Router {
    let (origin, gate) = (origin.clone(), gate.clone());
    let handler = move |Path(id): Path<u32>| {
        let (origin, gate) = (origin.clone(), gate.clone());
        async move {
            let (n, _running) = origin.enter();
            if gate.armed.swap(false, Ordering::SeqCst) {
                gate.entered.notify_one();
                gate.release.notified().await;
            }
            let size = if id >= 100 { 40 * 1024 } else { 1024 };
            let mut body = format!("i{id}-v{n}.");
            body.extend(std::iter::repeat_n('x', size - body.len()));
            ([("surrogate-key", format!("item:{id}"))], body)
        }
    };
    Router::new().route("/items/{id}", get(handler).layer(guard.clone()))
}

/// One instance: its guard (for its backend's stats) and its app.
pub struct Node {
    pub guard: StampedeGuard,
    pub app: Router,
}

impl Node {
    /// The body's text up to its first `.`.
    pub async fn text(&self, uri: &str) -> String {
        text_of(&self.app, uri).await
    }

    /// Waits answered by the entry a wake-up carried.
    pub fn with_entry(&self) -> u64 {
        let stats = self.guard.backend().stats().redis.expect("redis stats");
        stats.wakeups_with_entry
    }

    /// Waits ended by a wake-up message.
    pub fn by_message(&self) -> u64 {
        let stats = self.guard.backend().stats().redis.expect("redis stats");
        stats.wakeups_by_message
    }
}

/// The body's text up to its first `.`.
pub async fn text_of(app: &Router, uri: &str) -> String {
    let text = send(app, request(uri)).await.text();
    text.split('.').next().unwrap_or_default().to_owned()
}

/// `k` nodes on `redis`, deadline 500 ms, ttl 60 s.
pub async fn fleet(redis: &RedisServer, k: usize, origin: &Origin, gate: &Gate) -> Vec<Node> {
    let mut backends = Vec::new();
    for _ in 0..k {
        backends.push(backend_at(&redis.url(), Duration::from_millis(500)).await);
    }
    fleet_of(backends, origin, gate)
}

/// One node per backend, ttl 60 s.
pub fn fleet_of(backends: Vec<Backend>, origin: &Origin, gate: &Gate) -> Vec<Node> {
    backends
        .into_iter()
        .map(|backend| {
            let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
            let app = app(origin, gate, &guard);
            Node { guard, app }
        })
        .collect()
}

/// Loads the scripts (and the tag table) with a first request on each
/// node, so that what is counted afterwards is one call per round trip.
pub async fn warm_up(nodes: &[Node]) {
    for node in nodes {
        assert_eq!(node.text("/items/0").await, "i0-v1");
    }
}
