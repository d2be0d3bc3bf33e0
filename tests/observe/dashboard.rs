//! The Grafana dashboard against what the Prometheus example exports: after
//! traffic that makes every kind of answer (hits, a stale answer, a
//! coalesced burst, a pass, a wait that ran out, a fenced late commit, an
//! open circuit), every series a dashboard query names is in the scrape of
//! the example's exporter (its histograms with buckets, so the `_bucket`
//! series the quantile panels read exist), with a help text.
#![cfg(feature = "redis")]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::metrics::recorder;
use crate::common::redis::RedisServer;
use crate::common::{burst, get as get_req, send, Origin};
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use metrics::Recorder;
use metrics_util::debugging::{DebugValue, Snapshotter};
use stampede_guard::{Backend, Breaker, StampedeGuard, WaitTimeout};
use tokio::sync::Notify;

#[allow(dead_code)]
#[path = "../../examples/prometheus.rs"]
mod example;

/// Every series name a dashboard query reads (histogram suffixes kept).
fn dashboard_series() -> BTreeSet<String> {
    let text = include_str!("../../docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    let mut names = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a PromQL expression");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("stampede_guard_") {
                    names.insert(word.to_owned());
                }
            }
        }
    }
    names
}

/// An origin that parks its first call until released.
#[derive(Clone, Default)]
struct Parked {
    origin: Origin,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Parked {
    fn handler(
        &self,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = String> + Send>> + Clone + use<> {
        let this = self.clone();
        move || {
            let this = this.clone();
            Box::pin(async move {
                let (n, _running) = this.origin.enter();
                if n == 1 {
                    this.entered.notify_one();
                    this.release.notified().await;
                }
                format!("v{n}")
            })
        }
    }
}

/// Hits, a coalesced burst, a pass, a stale answer and a wait that ran out,
/// on the embedded backend.
async fn local_traffic() {
    let guard = StampedeGuard::new(Backend::local()).namespace("dash");
    let origin = Origin::default();
    let report = {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(Duration::from_millis(50)).await;
                format!("report {n}")
            }
        }
    };
    let parked = Parked::default();
    let app = Router::new()
        .route(
            "/report",
            get(report).layer(
                guard
                    .clone()
                    .route_name("report")
                    .ttl(Duration::from_secs(60)),
            ),
        )
        .route(
            "/soon-stale",
            get(|| async { "s" }).layer(
                guard
                    .clone()
                    .route_name("stale")
                    .ttl(Duration::from_millis(1))
                    .stale_while_revalidate(Duration::from_secs(60)),
            ),
        )
        .route(
            "/parked",
            get(parked.handler()).layer(
                guard
                    .clone()
                    .route_name("parked")
                    .wait_budget(Duration::from_millis(10))
                    .on_wait_timeout(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE)),
            ),
        );
    burst(&app, 10, || get_req("/report")).await;
    send(&app, get_req("/report")).await;
    let mut credentials = get_req("/report");
    credentials
        .headers_mut()
        .insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
    send(&app, credentials).await;

    send(&app, get_req("/soon-stale")).await;
    let mut stale = false;
    for _ in 0..500 {
        if send(&app, get_req("/soon-stale")).await.x_cache() == "STALE" {
            stale = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stale, "an expired entry was served stale");

    let leader = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get_req("/parked")).await })
    };
    parked.entered.notified().await;
    let waiter = send(&app, get_req("/parked")).await;
    assert_eq!(
        waiter.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "its wait ran out"
    );
    parked.release.notify_one();
    leader.await.unwrap();
}

/// A late commit fenced off, then an open circuit, on Redis.
async fn redis_traffic() {
    let mut redis = RedisServer::start();
    let connect = || async {
        Backend::redis_builder(&redis.url())
            .probe_interval(Duration::from_secs(60))
            .connect()
            .await
            .expect("backend")
    };
    let (a, b) = (connect().await, connect().await);
    let parked = Parked::default();
    let guard_a = StampedeGuard::new(a.clone())
        .namespace("dash")
        .route_name("fenced");
    let guard_b = StampedeGuard::new(b).namespace("dash").route_name("fenced");
    let app_a = Router::new().route("/f", get(parked.handler()).layer(guard_a.clone()));
    let app_b = Router::new().route("/f", get(parked.handler()).layer(guard_b));
    let slow = {
        let app_a = app_a.clone();
        tokio::spawn(async move { send(&app_a, get_req("/f")).await })
    };
    parked.entered.notified().await;
    // A's lease is lost: B rebuilds and commits, A's commit comes late.
    let key = guard_a.key_for(&get_req("/f")).unwrap();
    assert_eq!(redis.raw(&["DEL", &format!("sg:{{{key}}}:l")]), ":1");
    assert_eq!(send(&app_b, get_req("/f")).await.text(), "v2");
    parked.release.notify_one();
    slow.await.unwrap();
    assert_eq!(a.stats().redis.unwrap().fenced_writes, 1);

    redis.kill();
    let mut open = false;
    for n in 0..500 {
        send(&app_a, get_req(&format!("/f?n={n}"))).await;
        if matches!(a.health().redis.unwrap().breaker, Breaker::Open { .. }) {
            open = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(open, "the circuit opened");
}

/// What the recorder captured, recorded again into `into`.
fn replay(snapshotter: &Snapshotter, into: &impl Recorder) {
    static METADATA: metrics::Metadata<'static> =
        metrics::Metadata::new("dashboard", metrics::Level::INFO, None);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key().clone();
        match value {
            DebugValue::Counter(n) => into.register_counter(&key, &METADATA).increment(n),
            DebugValue::Gauge(v) => into.register_gauge(&key, &METADATA).set(v.into_inner()),
            DebugValue::Histogram(values) => {
                let histogram = into.register_histogram(&key, &METADATA);
                for v in values {
                    histogram.record(v.into_inner());
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_reads_is_exported() {
    let (snapshotter, _turn) = recorder().await;
    local_traffic().await;
    redis_traffic().await;

    let exporter = example::exporter().build_recorder();
    let handle = exporter.handle();
    metrics::with_local_recorder(&exporter, stampede_guard::describe_metrics);
    replay(snapshotter, &exporter);
    let scraped = handle.render();
    let exported: BTreeSet<&str> = scraped
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let wanted = dashboard_series();
    assert!(wanted.len() >= 10, "{wanted:?}");
    for name in &wanted {
        assert!(
            exported.contains(name.as_str()),
            "{name} is not exported:\n{scraped}"
        );
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            scraped.contains(&format!("# HELP {base} ")),
            "{base} has no help text"
        );
    }
    // Histograms, not summaries: no quantile series.
    assert!(!scraped.contains("quantile="), "{scraped}");
}
