//! The guard's metrics in Prometheus: an axum app whose `/metrics` route
//! renders what `metrics-exporter-prometheus` recorded, ready for the
//! Grafana dashboard in `docs/grafana-dashboard.json`.
//!
//! ```text
//! cargo run --example prometheus                # serves on 127.0.0.1:3000
//! curl -s localhost:3000/report; curl -s localhost:3000/metrics
//! cargo run --example prometheus -- --test-mode # self-check, for CI
//! ```
//!
//! In test mode it serves on an ephemeral port, sends a burst of requests
//! to each route, scrapes `/metrics` and exits non-zero unless the labelled
//! series are there.

use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use stampede_guard::{Backend, StampedeGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn report() -> &'static str {
    // An expensive aggregate.
    tokio::time::sleep(Duration::from_millis(100)).await;
    "the report"
}

async fn user(Path(id): Path<u32>) -> String {
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("user {id}")
}

/// The exporter as this app configures it: the crate's two duration
/// series as histograms with buckets that fit cache latencies, so Grafana
/// can take quantiles across instances (without buckets the exporter
/// renders summaries, and the dashboard's `_bucket` queries find nothing).
pub fn exporter() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("stampede_guard_".into()),
            &stampede_guard::metrics::LATENCY_BUCKETS,
        )
        .expect("valid buckets")
}

#[tokio::main]
async fn main() {
    let test_mode = std::env::args().any(|a| a == "--test-mode");

    let handle = exporter().install_recorder().expect("the only recorder");
    // After installing the recorder: units and help texts.
    stampede_guard::describe_metrics();

    let guard = StampedeGuard::new(Backend::local())
        .namespace("example")
        .ttl(Duration::from_secs(30));
    let app = Router::new()
        // A route named by the app...
        .route(
            "/report",
            get(report).layer(guard.clone().route_name("report")),
        )
        // ...and one labelled by its matched path, `/users/{id}`.
        .route("/users/{id}", get(user).layer(guard))
        .route("/metrics", get(move || std::future::ready(handle.render())));

    let address = if test_mode {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = TcpListener::bind(address).await.expect("bind");
    let address = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if !test_mode {
        println!("serving on http://{address} (/report, /users/{{id}}, /metrics)");
        let _ = server.await;
        return;
    }

    // A burst on each route: one rebuild, the others coalesced, then hits.
    for path in ["/report", "/users/7", "/users/8"] {
        let burst: Vec<_> = (0..10)
            .map(|_| tokio::spawn(fetch(address, path)))
            .collect();
        for request in burst {
            request.await.expect("request task");
        }
        fetch(address, path).await;
    }
    let scraped = fetch(address, "/metrics").await;
    let missing = missing_series(&scraped);
    if missing.is_empty() {
        println!("all expected series are exported");
    } else {
        eprintln!("{scraped}");
        for m in &missing {
            eprintln!("missing: {m}");
        }
        std::process::exit(1);
    }
}

/// What the self-check expects in the scrape, none of it present.
fn missing_series(scraped: &str) -> Vec<String> {
    let has = |name: &str, labels: &[&str]| {
        scraped.lines().any(|line| {
            line.starts_with(name)
                && line[name.len()..].starts_with('{')
                && labels.iter().all(|l| line.contains(l))
        })
    };
    let report = ["route=\"report\"", "namespace=\"example\""];
    let users = ["route=\"/users/{id}\"", "namespace=\"example\""];
    let mut missing = Vec::new();
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            missing.push(what.to_owned());
        }
    };
    expect(
        has("stampede_guard_misses_total", &report),
        "misses of /report",
    );
    expect(has("stampede_guard_hits_total", &report), "hits of /report");
    expect(
        has("stampede_guard_origin_calls_total", &users),
        "origin calls of /users/{id}",
    );
    expect(
        has("stampede_guard_rebuild_duration_seconds_bucket", &report),
        "rebuild duration buckets",
    );
    expect(
        has("stampede_guard_wait_duration_seconds_count", &report),
        "wait duration of the coalesced requests",
    );
    expect(
        scraped
            .lines()
            .any(|l| l.starts_with("stampede_guard_l1_bytes ")),
        "the L1 bytes gauge",
    );
    expect(
        scraped
            .lines()
            .any(|l| l.starts_with("# HELP stampede_guard_rebuild_duration_seconds ")),
        "help text of the rebuild duration",
    );
    expect(
        !scraped.contains("route=\"/users/7\""),
        "no client path as a label value",
    );
    missing
}

/// One HTTP/1.1 GET, the whole answer's body back.
async fn fetch(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: example\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    match answer.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => answer,
    }
}
