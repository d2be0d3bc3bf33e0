//! Helpers shared by the integration tests: an origin that counts its calls,
//! and request helpers over real axum routers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A backend deadline a loaded machine meets, for tests whose subject is
/// not the deadline: a Redis call that misses the default 50 ms falls back
/// to local protection (by design), which costs an origin call more than an
/// exact count allows.
pub const ROOMY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

/// A guard on an embedded backend of its own, its entries fresh for 60 s.
pub fn local_guard() -> stampede_guard::StampedeGuard {
    stampede_guard::StampedeGuard::new(stampede_guard::Backend::local())
        .ttl(std::time::Duration::from_secs(60))
}

/// Counts origin calls and the most that ever ran at once.
#[derive(Clone, Default)]
pub struct Origin {
    calls: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Origin {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Marks a call as started; the guard marks it finished when dropped.
    /// Returns the call's number, from 1.
    pub fn enter(&self) -> (usize, Running) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        (
            n,
            Running {
                running: self.running.clone(),
            },
        )
    }
}

pub struct Running {
    running: Arc<AtomicUsize>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug)]
pub struct Answer {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn x_cache(&self) -> &str {
        self.headers
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn collect(response: Response<Body>) -> Answer {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

/// A request with `method` for `uri`, with `headers` (in order) and no body.
pub fn request_with<M>(method: M, uri: &str, headers: &[(&str, &str)]) -> Request<Body>
where
    http::Method: TryFrom<M>,
    <http::Method as TryFrom<M>>::Error: Into<http::Error>,
{
    let mut r = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    r.body(Body::empty()).unwrap()
}

pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    collect(app.clone().oneshot(request).await.expect("infallible")).await
}

/// Asks `app` for `/report` every 100 ms, up to `tries` times, until it
/// answers `want`; returns the last answer.
pub async fn read_until(app: &Router, want: &str, tries: usize) -> Answer {
    let mut answer = send(app, get("/report")).await;
    for _ in 0..tries {
        if answer.text() == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        answer = send(app, get("/report")).await;
    }
    answer
}

/// Reads with `read` until every text differs from its counterpart in
/// `old` (an instance learns of another's purge by message), 50 more times
/// at most, 20 ms apart; returns the last read.
pub async fn until_all_differ<F, Fut>(old: &[String], read: F) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let mut now = read().await;
    for _ in 0..50 {
        if now.iter().zip(old).all(|(a, b)| a != b) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        now = read().await;
    }
    now
}

/// Sends `n` copies of a request at once, each from its own task.
pub async fn burst(app: &Router, n: usize, make: impl Fn() -> Request<Body>) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            let request = make();
            tokio::spawn(async move { send(&app, request).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

/// An error and its sources, one per line, as `anyhow`'s `{:#}` or
/// `eyre` print the chain: each layer's own words once.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect()
}

/// How many answers carry each x-cache value.
pub fn tally(answers: &[Answer], status: &str) -> usize {
    answers.iter().filter(|a| a.x_cache() == status).count()
}
pub mod backends;
pub mod child;
pub mod cluster;
pub mod counting;
pub mod driver;
#[cfg(feature = "redis")]
pub mod fleet;
#[cfg(feature = "redis")]
pub mod items;
#[cfg(feature = "redis")]
pub mod lock;
pub mod logs;
pub mod metrics;
pub mod monitor;
pub mod over_cap;
pub mod proxy;
pub mod redis;
pub mod scripted;
pub mod sentinel;
pub mod server;
#[cfg(feature = "redis-cluster")]
pub mod shards;
pub mod status;
#[cfg(feature = "redis")]
pub mod tagged;
pub mod tls;
