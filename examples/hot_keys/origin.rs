//! The expensive origin every instance calls: it sleeps for the configured
//! delay, like a slow aggregate query, and keeps the books the bench is about
//! (calls, and how many ran at once for the same key).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::header;

/// A clone of the origin's books, taken after a run.
#[derive(Clone, Debug, Default)]
pub struct OriginStats {
    pub calls: u64,
    /// The most calls that ever ran at once for one key.
    pub max_concurrent_per_key: u32,
    /// The most calls that ever ran at once, all keys together.
    pub max_concurrent: u32,
    /// Distinct keys the origin was asked for.
    pub keys: usize,
    /// When each call started, in microseconds after the run's start.
    pub starts_us: Vec<u64>,
    /// When the first call returned, in microseconds after the run's start.
    pub first_done_us: Option<u64>,
}

#[derive(Default)]
struct KeyBook {
    running: u32,
    peak: u32,
}

struct Books {
    epoch: Instant,
    keys: HashMap<String, KeyBook>,
    running: u32,
    peak: u32,
    starts_us: Vec<u64>,
    first_done_us: Option<u64>,
    failing: Option<(Duration, Duration)>,
}

pub struct Origin {
    delay: Duration,
    pad: Bytes,
    books: Mutex<Books>,
}

impl Origin {
    pub fn new(delay: Duration, body_bytes: usize) -> Arc<Self> {
        Arc::new(Origin {
            delay,
            pad: Bytes::from(vec![b'x'; body_bytes]),
            books: Mutex::new(Books {
                epoch: Instant::now(),
                keys: HashMap::new(),
                running: 0,
                peak: 0,
                starts_us: Vec::new(),
                first_done_us: None,
                failing: None,
            }),
        })
    }

    /// Calls that start within this window of the run (counted from its
    /// start, as `starts_us`) take their time and answer 503 (no-store);
    /// `None`: none fails.
    pub fn fail_between(&self, window: Option<(Duration, Duration)>) {
        self.books().failing = window;
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        // Nothing panics under this lock; a poisoned one still holds sane counts.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clears the books for a new run that starts at `epoch`.
    pub fn reset(&self, epoch: Instant) {
        let mut books = self.books();
        books.epoch = epoch;
        books.keys.clear();
        books.running = 0;
        books.peak = 0;
        books.starts_us.clear();
        books.first_done_us = None;
    }

    pub fn stats(&self) -> OriginStats {
        let books = self.books();
        OriginStats {
            calls: books.starts_us.len() as u64,
            max_concurrent_per_key: books.keys.values().map(|k| k.peak).max().unwrap_or(0),
            max_concurrent: books.peak,
            keys: books.keys.len(),
            starts_us: books.starts_us.clone(),
            first_done_us: books.first_done_us,
        }
    }

    /// The expensive handler. Returns a JSON body of about the configured
    /// size, or, while failing, a 503 after the same delay.
    pub async fn call(&self, key: &str) -> Response {
        let (n, failing) = {
            let mut books = self.books();
            let elapsed = books.epoch.elapsed();
            let failing = books
                .failing
                .is_some_and(|(from, until)| elapsed >= from && elapsed < until);
            let at = elapsed.as_micros() as u64;
            books.starts_us.push(at);
            books.running += 1;
            books.peak = books.peak.max(books.running);
            let book = books.keys.entry(key.to_owned()).or_default();
            book.running += 1;
            book.peak = book.peak.max(book.running);
            (books.starts_us.len(), failing)
        };
        // The book-keeping must survive a cancelled call (a client gone away),
        // or a stuck "running" count would inflate every later peak.
        struct Leave<'a>(&'a Origin, &'a str);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut books = self.0.books();
                books.running = books.running.saturating_sub(1);
                if books.first_done_us.is_none() {
                    books.first_done_us = Some(books.epoch.elapsed().as_micros() as u64);
                }
                if let Some(book) = books.keys.get_mut(self.1) {
                    book.running = book.running.saturating_sub(1);
                }
            }
        }
        let leave = Leave(self, key);
        tokio::time::sleep(self.delay).await;
        drop(leave);

        if failing {
            return (
                http::StatusCode::SERVICE_UNAVAILABLE,
                [(header::CACHE_CONTROL, "no-store")],
                "origin down",
            )
                .into_response();
        }
        (
            [(header::CONTENT_TYPE, "application/json")],
            self.body(key, n),
        )
            .into_response()
    }

    /// The body of the `n`th build of `key`: about the configured size.
    pub fn body(&self, key: &str, n: usize) -> Bytes {
        let head = format!("{{\"key\":\"{key}\",\"build\":{n},\"pad\":\"");
        let mut body = Vec::with_capacity(head.len() + self.pad.len() + 2);
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(&self.pad[..self.pad.len().saturating_sub(head.len() + 2)]);
        body.extend_from_slice(b"\"}");
        Bytes::from(body)
    }
}

/// The origin as an HTTP server on loopback, for proxies that cannot call a
/// function (nginx). Runs until the process ends.
pub async fn serve_http(origin: Arc<Origin>) -> std::io::Result<SocketAddr> {
    let app = Router::new().route(
        "/item/{key}",
        get(move |Path(key): Path<String>| {
            let origin = origin.clone();
            async move { origin.call(&key).await }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("origin server stopped: {e}");
        }
    });
    Ok(addr)
}
