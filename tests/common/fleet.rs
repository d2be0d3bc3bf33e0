//! A fleet of service instances on any backend: the same scenarios run on
//! one server, over TLS, on a cluster and behind Sentinel.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get as route;
use axum::Router;
use http::Request;
use stampede_guard::{Backend, StampedeGuard, Status};

use super::redis::RedisServer;
use super::{get, send, Answer, Origin};

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
        .route("/report", route(handler.clone()).layer(guard.clone()))
        .route("/report/{id}", route(handler).layer(guard.clone()));
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
    backend_with_grace(url, deadline, Duration::ZERO).await
}

/// A backend on `url` whose calls have this deadline, probing a broken
/// link every 100 ms, that keeps serving its in-process tier for `grace`
/// once it can no longer hear the fleet.
pub async fn backend_with_grace(url: &str, deadline: Duration, grace: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(deadline)
        .probe_interval(Duration::from_millis(100))
        .outage_grace(grace)
        .connect()
        .await
        .expect("redis backend")
}

/// `k` instances on `redis`, each as [`backend_at`] with a 500 ms deadline,
/// their `/report` answered at once.
pub async fn fleet_on(
    redis: &RedisServer,
    k: usize,
    origin: &Origin,
    configure: impl Fn(StampedeGuard) -> StampedeGuard + Copy,
) -> Vec<Instance> {
    let url = redis.url();
    let connect = || backend_at(&url, Duration::from_millis(500));
    fleet(k, origin, Duration::ZERO, connect, configure).await
}

/// A 60 s ttl, every entry tagged `product:42`.
pub fn tagged_product(guard: StampedeGuard) -> StampedeGuard {
    guard
        .ttl(Duration::from_secs(60))
        .tags(|_req| vec!["product:42".to_owned()])
}

/// An instance (as [`instance`]) on a backend at `url` with a 500 ms call
/// deadline, probing a broken link every 100 ms, that keeps serving its
/// in-process tier for `grace` once it can no longer hear the fleet.
pub async fn graced_instance(
    url: &str,
    grace: Duration,
    origin: &Origin,
    delay: Duration,
    configure: impl Fn(StampedeGuard) -> StampedeGuard,
) -> Instance {
    let backend = backend_with_grace(url, Duration::from_millis(500), grace).await;
    instance(backend, origin, delay, configure)
}

/// Requests `uri` until the instance answers it from its in-process tier
/// (a 200 `HIT`, asked every 20 ms, 300 times at most) and returns that body.
pub async fn settled(instance: &Instance, uri: &str) -> String {
    for _ in 0..300 {
        let answer = send(&instance.app, get(uri)).await;
        if answer.status == 200 && answer.x_cache() == "HIT" {
            return answer.text();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the instance did not settle on {uri}");
}

/// Purges `uri` through `instance` and expects `Ok`, waiting 30 s at most
/// (only a hang reaches it).
pub async fn purged(instance: &Instance, uri: &str) {
    tokio::time::timeout(
        Duration::from_secs(30),
        instance.guard.invalidate(&get(uri)),
    )
    .await
    .expect("no hang")
    .expect("the purge returned Ok");
}

/// Asks `instance` for `uri` `asks` times, one after another, and counts
/// the answers whose body is `body`.
pub async fn answers_carrying(instance: &Instance, uri: &str, body: &str, asks: usize) -> usize {
    let mut count = 0;
    for _ in 0..asks {
        if send(&instance.app, get(uri)).await.text() == body {
            count += 1;
        }
    }
    count
}

/// Waits (30 s at most: only a hang reaches it) until every instance's
/// health reports `status`.
pub async fn wait_for_status(instances: &[&Instance], status: Status) {
    let limit = Duration::from_secs(30);
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if instances
            .iter()
            .all(|i| i.backend.health().status == status)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the instances did not reach {status:?} within {limit:?}");
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

/// The fleet's members as Redis holds them (expired ones included), without
/// `born`, which marks when this life of the set began.
pub fn members(redis: &RedisServer) -> Vec<String> {
    let reply = redis.raw(&[
        "EVAL",
        "return table.concat(redis.call('ZRANGE', KEYS[1], 0, -1), ' ')",
        "1",
        "sg:members",
    ]);
    reply
        .split_whitespace()
        .filter(|m| *m != "born")
        .map(str::to_owned)
        .collect()
}

/// How many keys of one kind (`l`: leases, `v`: values, `n`: fences, the
/// last segment of the key) Redis holds.
pub fn keys_of_kind(redis: &RedisServer, kind: &str) -> usize {
    let reply = redis.raw(&[
        "EVAL",
        &format!("return #redis.call('KEYS', '*:{kind}')"),
        "0",
    ]);
    reply.trim_start_matches(':').parse().expect("a count")
}

/// Deletes every key matching `pattern`, as eviction would; how many.
pub fn evict(redis: &RedisServer, pattern: &str) -> usize {
    let reply = redis.raw(&[
        "EVAL",
        &format!(
            "local n = 0; for _, k in ipairs(redis.call('KEYS', '{pattern}')) do \
             n = n + redis.call('DEL', k) end; return n"
        ),
        "0",
    ]);
    reply.trim_start_matches(':').parse().expect("a count")
}

/// How many connections of `server` subscribe to the fleet's event channel.
pub fn event_subscribers(server: &RedisServer) -> u64 {
    let reply = server.raw(&[
        "EVAL",
        "return redis.call('PUBSUB', 'NUMSUB', 'sg:events')[2]",
        "0",
    ]);
    reply.trim_start_matches(':').parse().expect("a count")
}
