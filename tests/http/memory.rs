//! The in-process tier's byte bound holds in real memory: what it stores owns
//! its bytes (no slice pinning a client's whole read buffer) and its weight
//! counts what an entry really costs, so a flood of small proxied answers
//! grows the heap by about the bound, not by many times it.

use std::time::Duration;

use crate::common::counting::live;
use axum::body::Body;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stampede_guard::{Backend, StampedeGuard};
use tower::ServiceExt;

const BOUND: u64 = 1 << 20;
const ANSWERS: usize = 6_000;

/// An upstream on a real socket: small answers, a few headers each.
async fn upstream() -> std::net::SocketAddr {
    let app = Router::new().route(
        "/item/{n}",
        get(|Path(n): Path<u32>| async move {
            (
                [
                    ("content-type", "application/json"),
                    ("etag", "\"0123456789abcdef\""),
                    ("x-request-id", "5f0c6a1e-8d43-4b9a-9d1c-2f6e7b3a9c10"),
                ],
                format!(
                    "{{\"id\":{n},\"name\":\"item number {n}\",\"price\":{}}}",
                    n * 3
                ),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A front whose handler passes on the upstream's response as hyper gives it.
fn front(upstream: std::net::SocketAddr, backend: Backend) -> Router {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    Router::new().route(
        "/item/{n}",
        get(move |Path(n): Path<u32>| {
            let client = client.clone();
            async move {
                let uri = format!("http://{upstream}/item/{n}");
                let request = Request::get(uri).body(Body::empty()).unwrap();
                match client.request(request).await {
                    Ok(response) => response.map(Body::new).into_response(),
                    Err(_) => Response::builder().status(502).body(Body::empty()).unwrap(),
                }
            }
        })
        .layer(StampedeGuard::new(backend).ttl(Duration::from_secs(600))),
    )
}

async fn fetch(app: &Router, n: usize) {
    let request = Request::get(format!("/item/{n}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"{\"id\":"));
}

#[tokio::test(flavor = "current_thread")]
async fn small_proxied_answers_stay_within_the_l1_bound_in_real_memory() {
    // The heap is the process's: measured where no other test runs.
    if !crate::common::child::alone() {
        return crate::common::child::run_alone(
            module_path!(),
            "small_proxied_answers_stay_within_the_l1_bound_in_real_memory",
        );
    }
    let upstream = upstream().await;
    let backend = Backend::builder().l1_max_bytes(BOUND).build();
    let app = front(upstream, backend.clone());
    // Warm up the connection pool, the runtime and the cache's structures.
    for n in 0..100 {
        fetch(&app, 1_000_000 + n).await;
    }
    backend.l1_weighted_size();
    let baseline = live();

    for n in 0..ANSWERS {
        fetch(&app, n).await;
    }
    let weighted = backend.l1_weighted_size();
    let growth = live() - baseline;
    println!(
        "live heap growth {growth} bytes for {ANSWERS} answers; L1 weighs {weighted} of {BOUND}"
    );
    assert!(weighted <= BOUND, "the tier keeps its own bound");
    assert!(
        weighted > BOUND / 2,
        "the run filled the tier, so the growth measured is the tier's"
    );
    assert!(
        growth <= (BOUND as isize) * 3 / 2,
        "live heap grew by {growth} bytes with a {BOUND}-byte bound"
    );
}
