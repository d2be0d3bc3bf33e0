//! Labelled counters, histograms and gauges, as a debugging recorder sees
//! them. The recorder is process-wide and a snapshot resets it, so the tests
//! run one at a time (`crate::common::metrics::recorder`) and each uses its own
//! namespace.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::metrics::{recorder, series, Series};
use crate::common::{burst, get as get_req, send, Origin};
use axum::routing::get;
use axum::Router;
use metrics_util::debugging::DebugValue;
use stampede_guard::{Backend, Cache, StampedeGuard};
use tokio::sync::Semaphore;
use tower::{ServiceBuilder, ServiceExt};

fn of_namespace<'a>(all: &'a [Series], namespace: &str) -> Vec<&'a Series> {
    all.iter()
        .filter(|s| s.label("namespace") == Some(namespace))
        .collect()
}

fn counter(all: &[&Series], name: &str, route: &str) -> u64 {
    all.iter()
        .filter(|s| s.name == name && s.label("route") == Some(route))
        .map(|s| match s.value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

fn histogram(all: &[&Series], name: &str, route: &str) -> Vec<f64> {
    all.iter()
        .filter(|s| s.name == name && s.label("route") == Some(route))
        .flat_map(|s| match &s.value {
            DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_carry_the_route_name_and_namespace_with_rebuild_and_wait_times() {
    let (snapshotter, _turn) = recorder().await;
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let (o, g) = (origin.clone(), gate.clone());
    let guard = StampedeGuard::new(Backend::local())
        .namespace("shop")
        .route_name("report")
        .ttl(Duration::from_secs(30));
    let app = Router::new().route(
        "/report/{region}",
        get(move || {
            let (origin, gate) = (o.clone(), g.clone());
            async move {
                origin.enter();
                gate.acquire().await.expect("open").forget();
                "v"
            }
        })
        .layer(guard),
    );
    let releaser = {
        let gate = gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            gate.add_permits(1);
        })
    };
    let answers = burst(&app, 10, || get_req("/report/eu")).await;
    releaser.await.unwrap();
    for _ in 0..3 {
        assert_eq!(send(&app, get_req("/report/eu")).await.x_cache(), "HIT");
    }
    let coalesced = crate::common::tally(&answers, "COALESCED") as u64;
    let early_hits = crate::common::tally(&answers, "HIT") as u64;

    let all = series(snapshotter);
    let shop = of_namespace(&all, "shop");
    assert_eq!(counter(&shop, "stampede_guard_misses_total", "report"), 1);
    assert_eq!(
        counter(&shop, "stampede_guard_origin_calls_total", "report"),
        1
    );
    assert_eq!(
        counter(&shop, "stampede_guard_coalesced_total", "report"),
        coalesced
    );
    assert_eq!(
        counter(&shop, "stampede_guard_hits_total", "report"),
        early_hits + 3
    );
    assert!(
        shop.iter().all(|s| s.label("route") == Some("report")),
        "a named route is labelled by its name, never its path"
    );
    let rebuilds = histogram(&shop, "stampede_guard_rebuild_duration_seconds", "report");
    assert_eq!(rebuilds.len(), 1, "one rebuild, one duration");
    assert!(rebuilds[0] > 0.0);
    let waits = histogram(&shop, "stampede_guard_wait_duration_seconds", "report");
    assert_eq!(
        waits.len() as u64,
        coalesced,
        "one wait per request answered by the rebuild it did not run"
    );
    assert!(waits.iter().all(|w| *w >= 0.0));
    assert_eq!(origin.calls(), 1);
    // Units and help texts are told to the recorder.
    let unit = |name: &str| all.iter().find(|s| s.name == name).and_then(|s| s.unit);
    assert_eq!(
        unit("stampede_guard_rebuild_duration_seconds"),
        Some(metrics::Unit::Seconds)
    );
    assert_eq!(
        unit("stampede_guard_hits_total"),
        Some(metrics::Unit::Count)
    );
}

/// An attacker sends thousands of distinct paths and queries: the route
/// label stays the route's template (or `unnamed`), never the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_sent_by_clients_never_become_label_values() {
    let (snapshotter, _turn) = recorder().await;
    let guard = StampedeGuard::new(Backend::local()).namespace("attack");
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item" }).layer(guard.clone()))
        .route(
            "/static/{*rest}",
            get(|| async { "file" }).layer(guard.clone()),
        );
    // The same guard around a whole router: no matched path is known there.
    let outer = ServiceBuilder::new()
        .layer(guard.clone().namespace("attack-outer"))
        .service(Router::new().fallback(|| async { "anything" }));
    for i in 0..300 {
        send(&app, get_req(&format!("/items/{i}?x={i}"))).await;
        send(&app, get_req(&format!("/static/a/{i}/b%20{i}"))).await;
        let request = get_req(&format!("/free/{i}"));
        let response = outer.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), 200);
        // Requests that bypass (a method, credentials) are labelled the same.
        let post = http::Request::post(format!("/items/{i}"))
            .body(axum::body::Body::empty())
            .unwrap();
        send(&app, post).await;
    }
    let all = series(snapshotter);
    let routes = |namespace: &str| -> BTreeSet<String> {
        of_namespace(&all, namespace)
            .iter()
            .filter_map(|s| s.label("route").map(str::to_owned))
            .collect()
    };
    assert_eq!(
        routes("attack"),
        BTreeSet::from(["/items/{id}".to_owned(), "/static/{*rest}".to_owned()])
    );
    assert_eq!(
        routes("attack-outer"),
        BTreeSet::from(["unnamed".to_owned()])
    );
    let attack = of_namespace(&all, "attack");
    assert_eq!(
        counter(&attack, "stampede_guard_misses_total", "/items/{id}"),
        300
    );
    let label_sets: BTreeSet<_> = all.iter().map(|s| s.labels.clone()).collect();
    assert!(
        label_sets.len() < 40,
        "a bounded number of series whatever the traffic: {}",
        label_sets.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_l1_bytes_gauge_follows_what_the_tier_holds() {
    let (snapshotter, _turn) = recorder().await;
    let backend = Backend::local();
    let guard = StampedeGuard::new(backend.clone()).namespace("bytes");
    let app = Router::new().route(
        "/k/{n}",
        get(|| async { "x".repeat(1000) }).layer(guard.clone()),
    );
    for n in 0..5 {
        send(&app, get_req(&format!("/k/{n}"))).await;
    }
    let gauge = |all: &[Series]| -> f64 {
        all.iter()
            .filter(|s| s.name == "stampede_guard_l1_bytes")
            .map(|s| match s.value {
                DebugValue::Gauge(v) => v.into_inner(),
                _ => 0.0,
            })
            .sum()
    };
    let held = backend.l1_weighted_size();
    assert!(held > 5_000, "five entries of a kilobyte at least: {held}");
    let all = series(snapshotter);
    assert!(all
        .iter()
        .filter(|s| s.name == "stampede_guard_l1_bytes")
        .all(|s| s.labels.is_empty() && s.unit == Some(metrics::Unit::Bytes)));
    // (A snapshot resets the gauge: what it shows is the change since the
    // last one, here the five entries this backend stored.)
    assert_eq!(gauge(&all), held as f64);
    let request = get_req("/k/0");
    guard.invalidate(&request).await.unwrap();
    let after = backend.l1_weighted_size();
    assert!(after < held);
    assert_eq!(gauge(&series(snapshotter)), after as f64 - held as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_cache_is_labelled_too() {
    let (snapshotter, _turn) = recorder().await;
    let cache: Cache<String> = Cache::new(Backend::local())
        .namespace("prices")
        .route_name("fx");
    for _ in 0..4 {
        let value = cache
            .get_or_rebuild("eur", || async {
                Ok::<_, std::io::Error>("1.1".to_owned())
            })
            .await
            .unwrap();
        assert_eq!(value, "1.1");
    }
    let all = series(snapshotter);
    let prices = of_namespace(&all, "prices");
    assert_eq!(counter(&prices, "stampede_guard_misses_total", "fx"), 1);
    assert_eq!(counter(&prices, "stampede_guard_hits_total", "fx"), 3);
    assert_eq!(
        histogram(&prices, "stampede_guard_rebuild_duration_seconds", "fx").len(),
        1
    );
}

/// Every metric the crate describes is one the dashboard may use, and the
/// dashboard uses no other.
#[test]
fn the_grafana_dashboard_parses_and_names_only_emitted_metrics() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana-dashboard.json"
    ))
    .expect("the dashboard is in the repository");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("a panels array");
    assert!(
        panels.len() >= 6,
        "hit ratio, origin calls, rebuild, wait, L1, circuit"
    );
    let emitted: BTreeSet<&str> = stampede_guard::metrics::names().collect();
    let mut used = BTreeSet::new();
    for panel in panels {
        for target in panel["targets"].as_array().expect("each panel has targets") {
            let expr = target["expr"].as_str().expect("a PromQL expression");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(base) = word.strip_prefix("stampede_guard_") {
                    // Prometheus adds these suffixes to a histogram's series.
                    let base = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|s| base.strip_suffix(s))
                        .unwrap_or(base);
                    used.insert(format!("stampede_guard_{base}"));
                }
            }
        }
    }
    for name in &used {
        assert!(
            emitted.contains(name.as_str()),
            "{name} is not emitted by the crate"
        );
    }
    for needed in [
        "stampede_guard_hits_total",
        "stampede_guard_origin_calls_total",
        "stampede_guard_rebuild_duration_seconds",
        "stampede_guard_wait_duration_seconds",
        "stampede_guard_l1_bytes",
        "stampede_guard_circuit_open",
    ] {
        assert!(used.contains(needed), "the dashboard shows {needed}");
    }
}
