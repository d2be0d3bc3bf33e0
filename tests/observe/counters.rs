//! The counters published through the `metrics` facade.

use std::time::Duration;

use crate::common::{burst, get as get_req, send, Origin};
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_tell_hits_misses_and_coalesced_requests_apart() {
    let (snapshotter, _turn) = crate::common::metrics::recorder().await;

    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                tokio::time::sleep(Duration::from_millis(100)).await;
                "v"
            }
        })
        .layer(StampedeGuard::new(Backend::local())),
    );
    let answers = burst(&app, 100, || get_req("/r")).await;
    let coalesced = crate::common::tally(&answers, "COALESCED") as u64;
    let late_hits = crate::common::tally(&answers, "HIT") as u64;
    for _ in 0..5 {
        send(&app, get_req("/r")).await;
    }

    let counters: std::collections::HashMap<String, u64> =
        crate::common::metrics::counters(snapshotter)
            .into_iter()
            .collect();
    let c = |name: &str| counters.get(name).copied().unwrap_or(0);
    assert_eq!(c("stampede_guard_misses_total"), 1);
    assert_eq!(c("stampede_guard_origin_calls_total"), 1);
    assert_eq!(c("stampede_guard_coalesced_total"), coalesced);
    assert_eq!(c("stampede_guard_hits_total"), late_hits + 5);
    assert_eq!(origin.calls(), 1);
}
