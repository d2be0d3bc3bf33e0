//! A fleet of service instances on any backend: the same scenarios run on
//! one server, over TLS, on a cluster and behind Sentinel.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

use super::redis::RedisServer;
use super::{send, Answer, Origin};

/// One instance of the service: its own backend (L1 + Redis connections).
pub struct Instance {
    pub backend: Backend,
    pub guard: StampedeGuard,
    pub app: Router,
}

/// An instance whose `/report` (and `/report/*`) asks `origin`, taking `delay`.
pub fn instance(
    backend: Backend,
    origin: &Origin,
    delay: Duration,
    configure: impl Fn(StampedeGuard) -> StampedeGuard,
) -> Instance {
    let guard = configure(StampedeGuard::new(backend.clone()));
    let handler = {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(delay).await;
                format!("v{n}")
            }
        }
    };
    let app = Router::new()
        .route("/report", get(handler.clone()).layer(guard.clone()))
        .route("/report/{id}", get(handler).layer(guard.clone()));
    Instance {
        backend,
        guard,
        app,
    }
}

/// `k` instances, each on a backend of its own from `connect`.
pub async fn fleet<F, Fut>(
    k: usize,
    origin: &Origin,
    delay: Duration,
    connect: F,
    configure: impl Fn(StampedeGuard) -> StampedeGuard + Copy,
) -> Vec<Instance>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Backend>,
{
    let mut instances = Vec::new();
    for _ in 0..k {
        instances.push(instance(connect().await, origin, delay, configure));
    }
    instances
}

/// `n` concurrent requests, round-robin over the instances.
pub async fn fleet_burst(
    instances: &[Instance],
    n: usize,
    make: impl Fn() -> Request<Body>,
) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = instances[i % instances.len()].app.clone();
            let request = make();
            tokio::spawn(async move { send(&app, request).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for t in tasks {
        answers.push(t.await.expect("request task"));
    }
    answers
}

/// Waits (bounded) until every instance's circuit is closed.
pub async fn wait_until_available(instances: &[Instance], limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if instances
            .iter()
            .all(|i| i.backend.stats().redis.is_some_and(|r| r.available))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the circuit did not close within {limit:?}");
}

/// Sums the wake-up counters over the fleet: (by message, by timeout).
pub fn wakeups(instances: &[Instance]) -> (u64, u64) {
    instances
        .iter()
        .map(|i| {
            let s = i.backend.stats().redis.expect("redis stats");
            (s.wakeups_by_message, s.wakeups_by_timeout)
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// A backend on `url` whose calls have this deadline, probing a broken
/// link every 100 ms, under the strict invalidation barrier (no outage
/// grace): the tests built on it check what the barrier promises to an
/// instance that cannot hear the fleet.
pub async fn backend_at(url: &str, deadline: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(deadline)
        .probe_interval(Duration::from_millis(100))
        .outage_grace(Duration::ZERO)
        .connect()
        .await
        .expect("redis backend")
}

/// The Redis keys matching `pattern`.
pub fn keys_like(redis: &RedisServer, pattern: &str) -> Vec<String> {
    let reply = redis.raw(&[
        "EVAL",
        &format!("return table.concat(redis.call('KEYS', '{pattern}'), ' ')"),
        "0",
    ]);
    reply.split_whitespace().map(str::to_owned).collect()
}

/// The longest a whole burst may take on a loaded machine, for tests whose
/// subject is not a time limit: a burst of thousands of calls queues for
/// seconds on a busy 2-core machine, and a call queued past the connect
/// timeout, a lease whose renewal is queued past its end, or a waiter past
/// its budget each falls back to an origin call by design.
pub const ROOMY_BURST: Duration = Duration::from_secs(60);

/// Settings on `url` whose call limits a loaded machine meets: each call
/// judged silent after [`ROOMY_DEADLINE`](super::ROOMY_DEADLINE), a queued
/// call waiting up to [`ROOMY_BURST`]; the strict invalidation barrier (no
/// outage grace).
pub fn roomy_builder(url: &str) -> stampede_guard::RedisBackendBuilder {
    Backend::redis_builder(url)
        .deadline(super::ROOMY_DEADLINE)
        .connect_timeout(ROOMY_BURST)
}

/// A backend on [`roomy_builder`]'s settings that also keeps trusting its
/// in-process tier for [`ROOMY_BURST`] past a subscription keepalive
/// answered late (its flights stay attached): for tests that count origin
/// calls, not invalidations.
pub async fn roomy_backend_at(url: &str) -> Backend {
    roomy_builder(url)
        .outage_grace(ROOMY_BURST)
        .connect()
        .await
        .expect("redis backend")
}

/// Waits (bounded) until every instance protects the fleet again: Redis
/// answers and its subscription to the fleet's invalidations is confirmed
/// live. A closed circuit alone is not that: until the subscription is
/// back, an instance trusts nothing it holds, and when it comes back the
/// instance drops what it holds and detaches its flights, so a burst sent
/// meanwhile may cost that instance an origin call of its own.
pub async fn wait_until_fleet(instances: &[Instance], limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if instances
            .iter()
            .all(|i| i.backend.health().status == stampede_guard::Status::Fleet)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("an instance did not rejoin the fleet within {limit:?}");
}
