//! An origin whose body is over the guard's buffering cap, streamed in
//! chunks of known bytes, so that a test can check every reader got the
//! whole body, byte for byte.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::{mpsc, Semaphore};

use super::Origin;

/// The body cap of the guards [`big_app_on`] builds.
pub const CAP: usize = 1024;

/// `/big` behind a guard of `backend` (600 s ttl, a [`CAP`]-byte body cap):
/// `chunks` chunks of `chunk` bytes each, as [`expected`] has them, with
/// its `Content-Length`; the body fails after `fail_at` chunks if given.
/// Each call counts on `origin` and waits for a permit from `gate` before
/// it answers.
pub fn big_app_on(
    backend: Backend,
    origin: &Origin,
    gate: &Arc<Semaphore>,
    chunk: usize,
    chunks: usize,
    fail_at: Option<usize>,
) -> Router {
    let (origin, gate) = (origin.clone(), gate.clone());
    let guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(600))
        .max_body_bytes(CAP);
    Router::new().route(
        "/big",
        get(move || {
            let (origin, gate) = (origin.clone(), gate.clone());
            async move {
                let (_n, running) = origin.enter();
                gate.acquire().await.expect("gate").forget();
                let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
                tokio::spawn(async move {
                    let _running = running;
                    for c in 0..chunks {
                        if fail_at == Some(c) {
                            let _ = tx.send(Err(std::io::Error::other("origin broke"))).await;
                            return;
                        }
                        let part: Vec<u8> = (c * chunk..(c + 1) * chunk)
                            .map(|i| (i % 251) as u8)
                            .collect();
                        if tx.send(Ok(Bytes::from(part))).await.is_err() {
                            return;
                        }
                    }
                });
                http::Response::builder()
                    .header("content-length", chunk * chunks)
                    .body(Body::from_stream(
                        tokio_stream::wrappers::ReceiverStream::new(rx),
                    ))
                    .unwrap()
            }
        })
        .layer(guard),
    )
}

/// [`big_app_on`] a local backend, with a body that does not fail.
pub fn big_app(origin: &Origin, gate: &Arc<Semaphore>, chunk: usize, chunks: usize) -> Router {
    big_app_on(Backend::local(), origin, gate, chunk, chunks, None)
}

/// The first `len` bytes of a `/big` body: byte `i` is `i % 251`.
pub fn expected(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}
