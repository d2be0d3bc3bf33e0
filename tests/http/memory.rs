//! The in-process tier's byte bound holds in real memory: what it stores owns
//! its bytes (no slice pinning a client's whole read buffer) and its weight
//! counts what an entry really costs, so a flood of small proxied answers
//! grows the heap by about the bound, not by many times it.

use std::time::Duration;

use crate::common::counting::live;
#[cfg(feature = "redis")]
use crate::common::redis::RedisServer;
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

/// A 20 MiB body asked by 21 clients over 3 instances on Redis costs
/// memory by instance, not by waiter: each instance holds the entry once in
/// its in-process tier, every answer shares those bytes (the answers are
/// kept here, as slow clients would hold them), and the rest is what the
/// Redis client's connections keep (their buffers keep the capacity a
/// 20 MiB read or write gave them). 42 more clients add nothing. The
/// instances' time limits are ones a loaded machine meets (see
/// `roomy_backend_at`): a lease renewal queued past its end, or a
/// subscription keepalive read late, costs a second origin call or a
/// second copy by design, which is not what this test counts.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_body_costs_memory_by_instance_not_by_waiter() {
    use crate::common::counting::{peak, reset_peak};
    use crate::common::fleet::{roomy_backend_at, ROOMY_BURST};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const BODY: usize = 20 << 20;
    const INSTANCES: usize = 3;
    let redis = RedisServer::start();
    let origin = Arc::new(AtomicUsize::new(0));
    let mut apps = Vec::new();
    for _ in 0..INSTANCES {
        let backend = roomy_backend_at(&redis.url()).await;
        let guard = StampedeGuard::new(backend)
            .ttl(Duration::from_secs(60))
            .lease(ROOMY_BURST)
            .wait_budget(ROOMY_BURST)
            .max_body_bytes(32 << 20);
        let origin = origin.clone();
        let handler = move || {
            let origin = origin.clone();
            async move {
                origin.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                vec![b'x'; BODY]
            }
        };
        apps.push(Router::new().route("/big", get(handler).layer(guard)));
    }
    let burst = |clients: usize| {
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let app = apps[i % INSTANCES].clone();
                tokio::spawn(async move {
                    let request = Request::get("/big").body(Body::empty()).unwrap();
                    let response = app.oneshot(request).await.unwrap();
                    response.into_body().collect().await.unwrap().to_bytes()
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut answers = Vec::new();
            for task in tasks {
                let body = task.await.unwrap();
                assert_eq!(body.len(), BODY);
                answers.push(body);
            }
            answers
        }
    };
    let copies = |bytes: isize| bytes / BODY as isize;
    let before = live();
    reset_peak();
    let cold = burst(21).await;
    let held = copies(live() - before);
    let most = copies(peak() - before);
    assert_eq!(
        origin.load(Ordering::SeqCst),
        1,
        "one origin call for the fleet"
    );
    assert!(
        held <= 3 * INSTANCES as isize,
        "{held} copies held for 21 answers"
    );
    assert!(
        most <= 4 * INSTANCES as isize,
        "{most} copies at once for 21 answers"
    );
    let warm = burst(42).await;
    let more = copies(live() - before) - held;
    assert!(more <= 0, "42 more answers held {more} more copies");
    drop((cold, warm));
}
