//! An instance that shuts down leaves nothing for the fleet to wait out: a
//! rebuild that finishes within the deadline is committed and serves the
//! fleet; one that does not has its lease handed back, so the instance
//! waiting for it takes over at once. The instance leaves the membership
//! and closes its connections.
#![cfg(feature = "redis")]

use std::collections::HashSet;
use std::time::Duration;

use crate::common::backends::redis_backend;
use crate::common::fleet::{instance, keys_like, members, Instance};
use crate::common::monitor::{until, Monitor};
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
use stampede_guard::{Backend, StampedeGuard, Status};

/// A lease far longer than the wait budget: a waiter released by the
/// lease's expiry would have run out of budget first (and been counted as
/// woken by a timeout).
const LEASE: Duration = Duration::from_secs(60);
const WAIT_BUDGET: Duration = Duration::from_secs(30);

fn configure(guard: StampedeGuard) -> StampedeGuard {
    guard
        .ttl(Duration::from_secs(60))
        .lease(LEASE)
        .wait_budget(WAIT_BUDGET)
}

/// B is connected; A connects, and its connections are told apart.
struct Pair {
    a: Instance,
    b: Instance,
    a_clients: HashSet<String>,
}

async fn pair(
    redis: &RedisServer,
    origin_a: &Origin,
    a_takes: Duration,
    origin_b: &Origin,
) -> Pair {
    let b = instance(
        redis_backend(redis).await,
        origin_b,
        Duration::from_millis(200),
        configure,
    );
    let before = redis.client_ids();
    let a = instance(redis_backend(redis).await, origin_a, a_takes, configure);
    let a_clients: HashSet<String> = redis.client_ids().difference(&before).cloned().collect();
    assert!(
        a_clients.len() >= 2,
        "A has a command and a subscriber connection: {a_clients:?}"
    );
    until("both instances are members", || members(redis).len() == 2).await;
    Pair { a, b, a_clients }
}

/// A starts a rebuild; once its lease is taken, B gets `n` requests for the
/// same key and asks Redis, finding the lease held. Returns A's request
/// task, B's request tasks and A's lease token.
async fn a_rebuilds_and_b_waits(
    redis: &RedisServer,
    monitor: &Monitor,
    pair: &Pair,
    origin_a: &Origin,
    n: usize,
) -> (
    tokio::task::JoinHandle<crate::common::Answer>,
    Vec<tokio::task::JoinHandle<crate::common::Answer>>,
    String,
) {
    let app = pair.a.app.clone();
    let a_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
    until("A's handler runs", || origin_a.calls() == 1).await;
    let leases = keys_like(redis, "sg:*:l");
    assert_eq!(leases.len(), 1, "A holds the one lease: {leases:?}");
    let token = redis.raw(&["GET", &leases[0]]);
    assert!(!token.is_empty());
    monitor.settle(redis).await;
    let mark = monitor.len();
    let b_requests: Vec<_> = (0..n)
        .map(|_| {
            let app = pair.b.app.clone();
            tokio::spawn(async move { send(&app, get("/report/hot")).await })
        })
        .collect();
    // B listens for the key before it asks Redis: once its fetch is seen,
    // whatever A publishes from then on reaches it.
    monitor.await_fetches(mark, 1).await;
    (a_request, b_requests, token)
}

async fn answers(
    tasks: Vec<tokio::task::JoinHandle<crate::common::Answer>>,
) -> Vec<crate::common::Answer> {
    let mut answers = Vec::new();
    for task in tasks {
        let answer = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("B's request is answered")
            .expect("request task");
        answers.push(answer);
    }
    answers
}

/// What a shut-down instance leaves behind: no membership, no connection.
async fn a_is_gone(redis: &RedisServer, pair: &Pair) {
    assert_eq!(
        members(redis).len(),
        1,
        "A left the membership; B is still in"
    );
    until("A's connections are closed", || {
        redis.client_ids().is_disjoint(&pair.a_clients)
    })
    .await;
    let health = pair.a.backend.health();
    assert_eq!(health.status, Status::Local);
    assert!(health.redis.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_cut_short_by_shutdown_hands_its_lease_to_the_waiting_instance() {
    let redis = RedisServer::start();
    let monitor = Monitor::start(&redis);
    let (origin_a, origin_b) = (Origin::default(), Origin::default());
    // A's handler would take far longer than the shutdown's deadline.
    let pair = pair(&redis, &origin_a, Duration::from_secs(600), &origin_b).await;
    let (a_request, b_requests, a_token) =
        a_rebuilds_and_b_waits(&redis, &monitor, &pair, &origin_a, 20).await;

    let report = pair.a.backend.shutdown(Duration::from_millis(100)).await;
    assert_eq!(report.unfinished_rebuilds, 1);
    assert_eq!(report.leases_handed_back, 1);
    assert_eq!(report.not_handed_back, 0);
    // Right after it returns, the lease is no longer A's: gone, or B's.
    let leases = keys_like(&redis, "sg:*:l");
    assert!(leases.len() <= 1, "{leases:?}");
    for lease in &leases {
        assert_ne!(redis.raw(&["GET", lease]), a_token, "A's lease is gone");
    }
    a_is_gone(&redis, &pair).await;

    let answers = answers(b_requests).await;
    assert_eq!(answers.len(), 20);
    assert!(
        answers.iter().all(|a| a.status == 200),
        "every waiter on B is answered: {:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(origin_b.calls(), 1, "B took the key over: one origin call");
    let stats = pair.b.backend.stats().redis.expect("B's redis stats");
    assert!(
        stats.wakeups_by_message >= 1,
        "B was woken by A's hand-back"
    );
    assert_eq!(
        stats.wakeups_by_timeout, 0,
        "B waited out neither the lease nor its budget"
    );
    // A second shutdown does nothing.
    let again = pair.a.backend.shutdown(Duration::from_millis(100)).await;
    assert_eq!(again, stampede_guard::ShutdownReport::default());
    a_request.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_that_finishes_within_the_deadline_serves_the_fleet() {
    let redis = RedisServer::start();
    let monitor = Monitor::start(&redis);
    let (origin_a, origin_b) = (Origin::default(), Origin::default());
    let pair = pair(&redis, &origin_a, Duration::from_millis(500), &origin_b).await;
    let (a_request, b_requests, _) =
        a_rebuilds_and_b_waits(&redis, &monitor, &pair, &origin_a, 20).await;

    // A deadline far beyond the rebuild: shutdown returns once it committed.
    let report = pair.a.backend.shutdown(Duration::from_secs(60)).await;
    assert_eq!(report.unfinished_rebuilds, 0);
    assert_eq!(report.leases_handed_back, 0);
    assert!(keys_like(&redis, "sg:*:l").is_empty(), "no lease is left");
    a_is_gone(&redis, &pair).await;

    let answers = answers(b_requests).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(origin_b.calls(), 0, "B is served from A's rebuild");
    assert_eq!(origin_a.calls(), 1);
    let a_answer = a_request.await.expect("A's request");
    assert_eq!(a_answer.status, 200);
    assert!(answers.iter().all(|a| a.body == a_answer.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_leaves_the_membership_while_a_rebuild_runs() {
    let redis = RedisServer::start();
    let (origin_a, origin_b) = (Origin::default(), Origin::default());
    let pair = pair(&redis, &origin_a, Duration::from_secs(600), &origin_b).await;
    let app = pair.a.app.clone();
    let a_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
    until("A's handler runs", || origin_a.calls() == 1).await;
    let Pair { a, b, .. } = pair;
    // The request gives up; the rebuild, on its own task, runs on.
    a_request.abort();
    drop(a);
    until("A left the membership", || members(&redis).len() == 1).await;
    assert_eq!(
        keys_like(&redis, "sg:*:l").len(),
        1,
        "its lease is still held"
    );
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_at_shutdown_is_handed_back_and_reported_lost() {
    use stampede_guard::{Lock, LockError};
    let redis = RedisServer::start();
    let (a, b) = (redis_backend(&redis).await, redis_backend(&redis).await);
    let lock = |backend: &Backend| Lock::new(backend.clone()).lease(LEASE);
    let held = lock(&a).acquire("job").await.expect("A takes the lock");
    assert!(lock(&b).try_acquire("job").await.expect("B asks").is_none());

    let report = a.shutdown(Duration::from_millis(100)).await;
    assert_eq!(report.locks_handed_back, 1);
    assert_eq!(report.not_handed_back, 0);
    assert!(held.is_lost(), "A's guard is told");
    let taken = lock(&b).try_acquire("job").await.expect("B asks again");
    assert!(
        taken.is_some(),
        "B takes it at once, long before its lease ends"
    );
    // A shut-down backend takes no lock, not even one of its own.
    assert!(matches!(
        lock(&a).try_acquire("other").await,
        Err(LockError::Unavailable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_given_up_half_way_still_leaves_the_fleet() {
    let redis = RedisServer::start();
    let (origin_a, origin_b) = (Origin::default(), Origin::default());
    let pair = pair(&redis, &origin_a, Duration::from_secs(600), &origin_b).await;
    let app = pair.a.app.clone();
    let a_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
    until("A's handler runs", || origin_a.calls() == 1).await;
    // The caller stops waiting while the shutdown waits for the rebuild.
    let shutdown = pair.a.backend.shutdown(Duration::from_secs(600));
    assert!(tokio::time::timeout(Duration::from_millis(50), shutdown)
        .await
        .is_err());
    assert_eq!(pair.a.backend.health().status, Status::Local);
    until("A left the membership", || members(&redis).len() == 1).await;
    // Left, not lapsed: its own ZREM (nothing else here issues one).
    assert!(redis.command_calls().get("zrem").is_some_and(|&n| n >= 1));
    until("A's connections are closed", || {
        redis.client_ids().is_disjoint(&pair.a_clients)
    })
    .await;
    a_request.abort();
}
