//! Attacks on the metric labels: a guard around a whole router (nested
//! routers, a fallback, wildcards), clients sending many paths, hosts and
//! headers. Label values must stay the route templates (bounded), never a
//! path, host or header a client sent.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::metrics::series;
use crate::common::send;
use axum::routing::get;
use axum::Router;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

fn with(uri: &str, headers: &[(&str, &str)]) -> Request<axum::body::Body> {
    let mut b = Request::builder().uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(axum::body::Body::empty()).unwrap()
}

#[tokio::test]
async fn clients_cannot_make_label_values() {
    let (snapshotter, _turn) = crate::common::metrics::recorder().await;

    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let api = Router::new()
        .route("/items/{id}", get(|| async { "item" }))
        .route("/files/{*rest}", get(|| async { "file" }));
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .nest("/api", api)
        .fallback(|| async { "fallback" })
        .layer(guard);

    for n in 0..40 {
        let host = format!("evil-{n}.example");
        for (uri, headers) in [
            (format!("/users/{n}"), vec![]),
            (format!("/api/items/{n}?x={n}"), vec![]),
            (format!("/api/files/a/{n}/b"), vec![]),
            (format!("/nope-{n}"), vec![]),
            (format!("/api/nope-{n}"), vec![]),
            (format!("/users/{n}"), vec![("authorization", "Bearer t")]),
        ] {
            let mut headers = headers.clone();
            headers.push(("host", host.as_str()));
            let answer = send(&app, with(&uri, &headers)).await;
            assert!(answer.status.is_success(), "{uri}: {}", answer.status);
        }
    }

    let mut routes = BTreeSet::new();
    let mut values = BTreeSet::new();
    for s in series(snapshotter) {
        if !s.name.starts_with("stampede_guard") {
            continue;
        }
        for (k, v) in &s.labels {
            values.insert(format!("{k}={v}"));
            if k == "route" {
                routes.insert(v.clone());
            }
        }
    }
    assert!(
        routes.len() <= 6,
        "route label values grow with the paths sent: {routes:?}"
    );
    for v in &values {
        assert!(
            !v.contains("evil") && !v.contains("nope-") && !v.contains("Bearer"),
            "a label value carries request data: {v}"
        );
        for n in 1..40 {
            assert!(
                !v.ends_with(&format!("/{n}")) && !v.contains(&format!("/{n}/")),
                "a label value carries a path: {v}"
            );
        }
    }
    assert!(routes.contains("/users/{id}"), "{routes:?}");
}
