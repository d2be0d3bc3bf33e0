//! The series an alert on Redis reads (`stampede_guard_circuit_open`, the
//! dashboard's circuit panel, and the Redis error and opening counters)
//! exist from a Redis backend's construction and fire for an outage that
//! began before its first connection: rendered by the Prometheus exporter,
//! in a process of its own (the recorder is
//! process-wide, and the gauge must be read as a scrape reads it).
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::child::{alone, run_alone};
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, Status};

/// Far more than any wait below needs: only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(30);

/// The value of the unlabelled series `name` in a scrape.
fn value(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.trim().parse().ok()
    })
}

#[test]
fn alerts_fire_for_an_outage_that_began_before_the_first_connect() {
    if !alone() {
        return run_alone(
            module_path!(),
            "alerts_fire_for_an_outage_that_began_before_the_first_connect",
        );
    }
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this process");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // Redis up: the series exist at zero from the start.
        let up = RedisServer::start();
        let healthy = Backend::redis(&up.url()).await.expect("connects");
        let scrape = handle.render();
        assert_eq!(
            value(&scrape, "stampede_guard_circuit_open"),
            Some(0.0),
            "{scrape}"
        );
        assert_eq!(
            value(&scrape, "stampede_guard_redis_errors_total"),
            Some(0.0),
            "{scrape}"
        );
        assert_eq!(
            value(&scrape, "stampede_guard_circuit_openings_total"),
            Some(0.0),
            "{scrape}"
        );

        // Redis down from the start: the alert's series say so at once.
        let mut down = RedisServer::start();
        down.kill();
        let backend = Backend::redis_builder(&down.url())
            .probe_interval(Duration::from_millis(100))
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .expect("starts without redis");
        let scrape = handle.render();
        assert_eq!(
            value(&scrape, "stampede_guard_circuit_open"),
            Some(1.0),
            "{scrape}"
        );
        assert_eq!(
            value(&scrape, "stampede_guard_circuit_openings_total"),
            Some(1.0),
            "{scrape}"
        );
        let errors = value(&scrape, "stampede_guard_redis_errors_total").expect("errors");
        assert!(errors >= 1.0, "{scrape}");

        // Joined: the gauge goes back to zero, the counters keep counting.
        down.restart();
        let limit = std::time::Instant::now() + LIMIT;
        while backend.health().status != Status::Fleet {
            assert!(std::time::Instant::now() < limit, "joined within {LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let scrape = handle.render();
        assert_eq!(
            value(&scrape, "stampede_guard_circuit_open"),
            Some(0.0),
            "{scrape}"
        );
        assert!(value(&scrape, "stampede_guard_redis_errors_total").expect("errors") >= errors);

        // A backend dropped before it ever connected no longer counts.
        drop(backend);
        let mut never = RedisServer::start();
        never.kill();
        let gone = Backend::redis(&never.url()).await.expect("starts");
        assert_eq!(
            value(&handle.render(), "stampede_guard_circuit_open"),
            Some(1.0)
        );
        drop(gone);
        let limit = std::time::Instant::now() + LIMIT;
        while value(&handle.render(), "stampede_guard_circuit_open") != Some(0.0) {
            assert!(std::time::Instant::now() < limit, "{}", handle.render());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(healthy);
    });
}
