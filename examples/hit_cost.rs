//! The L1 hit path's cost in instructions, for a profiler that counts them
//! (the same route answered bare, through the guard on an L1 hit, or the
//! guard's service alone). Run it twice under `valgrind --tool=callgrind`
//! with different counts; the difference divided by the difference in
//! requests is the cost of one request, whatever else loads the machine.
//!
//! `http-bare` and `http-guarded` serve the same routes over HTTP/1.1: a
//! hyper server connection and a hyper client on the two ends of an
//! in-memory pipe, one keep-alive connection, so the request is parsed and
//! the response written and read as on a socket (without the system calls).
//! The server runs on a thread of its own: with `--separate-threads=yes`,
//! callgrind writes its instructions to a file of their own (`-02` for the
//! second thread), apart from the client's.
//!
//! ```text
//! cargo build --release --example hit_cost
//! valgrind --tool=callgrind target/release/examples/hit_cost guarded 2000
//! valgrind --tool=callgrind target/release/examples/hit_cost guarded 12000
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use stampede_guard::{Backend, StampedeGuard};
use tower::{ServiceBuilder, ServiceExt};

static PAYLOAD: [u8; 1024] = [b'x'; 1024];
const CONTENT_TYPE: &str = "application/json";
const URI: &str = "/report?region=eu";
const TTL: Duration = Duration::from_secs(3600);

async fn handler() -> ([(header::HeaderName, &'static str); 1], Bytes) {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        Bytes::from_static(&PAYLOAD),
    )
}

fn request() -> Request<axum::body::Body> {
    Request::get(URI)
        .header(header::HOST, "bench.local")
        .body(axum::body::Body::empty())
        .expect("valid request")
}

/// `count` requests over one HTTP/1.1 connection served by `router`.
async fn over_http(router: Router, count: u64) {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let service = hyper_util::service::TowerToHyperService::new(router);
    // The server on a thread of its own, so that `--separate-threads=yes`
    // gives its instructions apart from the client's.
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(server_io), service)
                .await;
        });
    });
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .expect("in-memory handshake");
    let connection = tokio::spawn(connection);
    let request = || {
        Request::get(URI)
            .header(header::HOST, "bench.local")
            .body(Empty::<Bytes>::new())
            .expect("valid request")
    };
    let first = sender.send_request(request()).await.expect("served");
    assert_eq!(first.status(), 200);
    black_box(first.into_body().collect().await.expect("body"));
    for _ in 0..count {
        let response = sender.send_request(request()).await.expect("served");
        black_box(
            response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes(),
        );
    }
    drop(sender);
    let _ = connection.await;
    server.join().expect("server thread");
}

/// The route without the layer. Both routers are given their state here, as
/// `axum::serve` does for each connection: otherwise axum builds the
/// handler's service (and the layer around it) again on every request.
fn bare_router() -> Router {
    Router::new().route("/report", get(handler)).with_state(())
}

/// The same route with the layer, on the embedded backend.
fn guarded_router() -> Router {
    Router::new()
        .route(
            "/report",
            get(handler).layer(StampedeGuard::new(Backend::local()).ttl(TTL)),
        )
        .with_state(())
}

async fn call_router(router: &Router) -> Bytes {
    let response = router.clone().oneshot(request()).await.expect("infallible");
    response
        .into_body()
        .collect()
        .await
        .expect("in-memory body")
        .to_bytes()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "guarded".into());
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        match mode.as_str() {
            "bare" => {
                let bare = bare_router();
                for _ in 0..count {
                    black_box(call_router(&bare).await);
                }
            }
            "guarded" => {
                let guarded = guarded_router();
                call_router(&guarded).await;
                let response = guarded.clone().oneshot(request()).await.unwrap();
                assert_eq!(response.headers()["x-cache"], "HIT");
                for _ in 0..count {
                    black_box(call_router(&guarded).await);
                }
            }
            "http-bare" => {
                over_http(bare_router(), count).await;
            }
            "http-guarded" => {
                let guarded = guarded_router();
                call_router(&guarded).await;
                over_http(guarded, count).await;
            }
            "service" => {
                let service = ServiceBuilder::new()
                    .layer(StampedeGuard::new(Backend::local()).ttl(TTL))
                    .service_fn(|_: Request<Empty<Bytes>>| async {
                        let response = Response::builder()
                            .header(header::CONTENT_TYPE, CONTENT_TYPE)
                            .body(Full::new(Bytes::from_static(&PAYLOAD)))
                            .expect("valid response");
                        Ok::<_, Infallible>(response)
                    });
                let request = || {
                    Request::get(URI)
                        .header(header::HOST, "bench.local")
                        .body(Empty::<Bytes>::new())
                        .expect("valid request")
                };
                service.clone().oneshot(request()).await.unwrap();
                for _ in 0..count {
                    let response = service.clone().oneshot(request()).await.unwrap();
                    assert_eq!(response.headers()["x-cache"], "HIT");
                    black_box(response.into_body().collect().await.unwrap().to_bytes());
                }
            }
            other => {
                panic!("unknown mode {other}: bare, guarded, service, http-bare or http-guarded")
            }
        }
    });
}
