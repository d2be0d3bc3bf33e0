//! The L1 hit path's cost in instructions, for a profiler that counts them
//! (the same route answered bare, through the guard on an L1 hit, or the
//! guard's service alone). Run it twice under `valgrind --tool=callgrind`
//! with different counts; the difference divided by the difference in
//! requests is the cost of one request, whatever else loads the machine.
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
                let bare = Router::new().route("/report", get(handler));
                for _ in 0..count {
                    black_box(call_router(&bare).await);
                }
            }
            "guarded" => {
                let guarded = Router::new().route(
                    "/report",
                    get(handler).layer(StampedeGuard::new(Backend::local()).ttl(TTL)),
                );
                call_router(&guarded).await;
                let response = guarded.clone().oneshot(request()).await.unwrap();
                assert_eq!(response.headers()["x-cache"], "HIT");
                for _ in 0..count {
                    black_box(call_router(&guarded).await);
                }
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
            other => panic!("unknown mode {other}: bare, guarded or service"),
        }
    });
}
