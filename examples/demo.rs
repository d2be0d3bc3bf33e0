//! A cache stampede, with and without `stampede-guard`.
//!
//! One axum app serves the same slow handler twice: `/report` behind a
//! `StampedeGuard`, `/report-unguarded` without it. The demo then hits each
//! route with a burst of requests, as a crowd of clients would the moment a
//! hot entry expires, and counts how often the handler actually ran.
//!
//! ```text
//! cargo run --example demo
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Requests per burst.
const REQUESTS: usize = 500;
/// Requests on the wire at once. Each one holds a socket at both ends, so this
/// stays well under the common open-file limits (256 on macOS, 1024 on Linux).
const CONNECTIONS: usize = 100;
/// How long the handler pretends to aggregate.
const ORIGIN_LATENCY: Duration = Duration::from_millis(200);
/// How long `/report` is served from memory before it is rebuilt.
const TTL: Duration = Duration::from_secs(2);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

/// The expensive handler: think of a database aggregate over many rows.
/// `calls` counts how often it really runs.
async fn report(calls: Arc<AtomicUsize>) -> String {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(ORIGIN_LATENCY).await;
    format!("{{\"orders\":48213,\"revenue\":\"1.2M\",\"build\":{n}}}")
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let guarded_calls = Arc::new(AtomicUsize::new(0));
    let unguarded_calls = Arc::new(AtomicUsize::new(0));

    // The embedded backend keeps entries in this process; no server needed.
    let guard = StampedeGuard::new(Backend::local()).ttl(TTL);
    let app = Router::new()
        .route("/report", {
            let calls = guarded_calls.clone();
            // The layer goes on the route, so other routes stay uncached.
            get(move || report(calls.clone())).layer(guard)
        })
        .route("/report-unguarded", {
            let calls = unguarded_calls.clone();
            get(move || report(calls.clone()))
        });

    // Port 0 lets the OS pick a free port; loopback keeps the demo private.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    // A pooling client, so connections are reused from one burst to the next.
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let guarded = format!("http://{addr}/report");
    let unguarded = format!("http://{addr}/report-unguarded");

    println!("stampede-guard demo on http://{addr}");
    println!(
        "each burst: {REQUESTS} requests, {CONNECTIONS} at a time; \
         handler takes {} ms; /report ttl {} s\n",
        ORIGIN_LATENCY.as_millis(),
        TTL.as_secs()
    );

    println!("1. Cold cache: a crowd arrives at once.");
    burst(&client, &unguarded, &unguarded_calls).await?;
    burst(&client, &guarded, &guarded_calls).await?;

    println!("\n2. Same crowd again while the entry is fresh.");
    burst(&client, &guarded, &guarded_calls).await?;

    println!("\n3. The entry expires; the next crowd rebuilds it once.");
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    burst(&client, &guarded, &guarded_calls).await?;

    // Closing the client's idle connections lets the graceful shutdown finish.
    drop(client);
    let _ = stop.send(());
    // A stuck shutdown, a panicked server task and a serve error all fail the run.
    tokio::time::timeout(Duration::from_secs(5), server).await???;
    println!("\nserver stopped; bye");
    Ok(())
}

/// Sends `REQUESTS` GETs to `url`, at most `CONNECTIONS` at a time, and prints
/// what came back.
async fn burst(client: &HttpClient, url: &str, calls: &AtomicUsize) -> Result<(), Error> {
    let uri: hyper::Uri = url.parse()?;
    let calls_before = calls.load(Ordering::SeqCst);
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let started = Instant::now();

    let mut requests = JoinSet::new();
    for _ in 0..REQUESTS {
        let (client, uri, slots) = (client.clone(), uri.clone(), slots.clone());
        requests.spawn(async move {
            let _slot = slots.acquire_owned().await?;
            let response = client.get(uri).await?;
            let x_cache = response
                .headers()
                .get("x-cache")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(no header)")
                .to_owned();
            // Reading the body to its end hands the connection back to the pool.
            response.into_body().collect().await?;
            Ok::<_, Error>(x_cache)
        });
    }
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(result) = requests.join_next().await {
        *by_status.entry(result??).or_default() += 1;
    }

    let elapsed = started.elapsed();
    let origin_calls = calls.load(Ordering::SeqCst) - calls_before;
    // Print in the order a request can go through the guard.
    let statuses: Vec<String> = ["MISS", "COALESCED", "HIT", "STALE", "BYPASS", "(no header)"]
        .iter()
        .filter_map(|s| by_status.get(*s).map(|n| format!("{s} {n}")))
        .collect();
    println!(
        "   {:<19} {REQUESTS} requests | origin calls {origin_calls:>3} | {:>5} ms | x-cache: {}",
        uri.path(),
        elapsed.as_millis(),
        statuses.join(", ")
    );
    Ok(())
}
