//! The driver's promises with the Redis backend: a rebuild outlives its
//! clients and fills both tiers, failures release no herd across the fleet,
//! and `invalidate()` is a barrier for every instance.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::{
    connect, failing_app, fleet_apps, impatient_callers, impatient_requests,
    rebuild_outlived_requests, rebuilt_once_for_callers, slow_app, spawn_calls, spawn_requests,
    texts, values, versioned_app, Boom, Failure, Versioned, HERD,
};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Origin};
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use stampede_guard::{Cache, StampedeGuard};
use tower::ServiceExt;

// ---------------------------------------------------------------------------
// 1. A rebuild runs to completion on its own task, and fills L1 and Redis.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_clients_do_not_cancel_the_rebuild_which_fills_l1_and_redis() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let configure = |backend| StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = slow_app(&origin, &finished, configure(connect(&redis).await));
    let seen = impatient_requests(&app, &finished).await;

    rebuild_outlived_requests(
        &seen,
        &origin,
        &finished,
        "the client that started the rebuild gave up",
        "answered at once after the landing",
        "the abandoned rebuild filled the L1",
    );
    // Another instance, with an empty L1, finds the entry in Redis.
    let other = slow_app(&origin, &finished, configure(connect(&redis).await));
    let answer = send(&other, get_req("/report")).await;
    assert_eq!((answer.x_cache(), answer.text().as_str()), ("HIT", "v1"));
    assert_eq!(origin.calls(), 1, "the abandoned rebuild filled Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impatient_cache_callers_do_not_cancel_the_rebuild_which_fills_l1_and_redis() {
    let redis = RedisServer::start();
    let cache: Cache<String> = Cache::new(connect(&redis).await).ttl(Duration::from_secs(60));
    let origin = Origin::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let seen = impatient_callers(&cache, &origin, &finished).await;

    rebuilt_once_for_callers(&seen, &origin, &finished);
    assert_eq!(cache.get("report").as_deref(), Some("v1"), "in the L1");
    let other: Cache<String> = Cache::new(connect(&redis).await).ttl(Duration::from_secs(60));
    let value = other
        .get_or_rebuild("report", || async { Ok::<_, Boom>("rebuilt".to_string()) })
        .await
        .unwrap();
    assert_eq!(value, "v1", "and in Redis");
    assert_eq!(origin.calls(), 1);
}

// ---------------------------------------------------------------------------
// 2. No failure releases a herd, across a fleet.
// ---------------------------------------------------------------------------

/// Status and x-cache of a request; `None` if its task panicked.
async fn status_of(app: Router) -> Option<(StatusCode, String)> {
    let task = tokio::spawn(async move {
        let response = app.oneshot(get_req("/report")).await.expect("infallible");
        let x_cache = response
            .headers()
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let status = response.status();
        let _ = response.into_body().collect().await;
        (status, x_cache)
    });
    task.await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rebuild_costs_a_fleet_of_three_at_most_two_origin_calls() {
    let mut report = Vec::new();
    for (failure, waiter_status) in [
        (Failure::BodyError, StatusCode::BAD_GATEWAY),
        (Failure::Panic, StatusCode::INTERNAL_SERVER_ERROR),
        (Failure::Timeout, StatusCode::GATEWAY_TIMEOUT),
    ] {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let failing = Arc::new(AtomicBool::new(true));
        let apps = fleet_apps(&redis, 3, |guard| {
            failing_app(
                &origin,
                &failing,
                failure,
                guard.ttl(Duration::from_secs(60)),
            )
        })
        .await;
        let tasks: Vec<_> = (0..HERD)
            .map(|i| tokio::spawn(status_of(apps[i % apps.len()].clone())))
            .collect();
        for t in tasks {
            if let Some((status, x_cache)) = t.await.unwrap()
                && x_cache == "COALESCED"
            {
                assert_eq!(status, waiter_status, "{failure:?}: the shared failure");
            }
        }
        report.push((failure, origin.calls()));
    }
    assert!(
        report.iter().all(|(_, calls)| *calls <= 2),
        "{HERD} requests over three instances; origin calls per failure kind: {report:?}"
    );
}

// ---------------------------------------------------------------------------
// 3. invalidate() is a barrier, for every instance.
// ---------------------------------------------------------------------------

struct Node {
    guard: StampedeGuard,
    app: Router,
}

async fn node(redis: &RedisServer, v: &Versioned) -> Node {
    let guard = StampedeGuard::new(connect(redis).await).ttl(Duration::from_secs(60));
    let app = versioned_app(v, guard.clone());
    Node { guard, app }
}

/// Which requests issued after the invalidation got "old": (where, when).
fn olds(label: &str, texts: &[String]) -> Vec<String> {
    texts
        .iter()
        .filter(|t| *t == "old")
        .map(|_| label.to_owned())
        .collect()
}

/// Instance `a` runs a rebuild that read "old" (parked); requests wait for it
/// on `a` and on `b`. `invalidator` (0: `a`, 1: `b`) invalidates and the
/// origin switches to "new"; with `during`, both instances get requests
/// while the old rebuild still runs; it lands; then every instance (and a
/// fresh one) gets requests. None issued after invalidate() returned may
/// get "old".
async fn invalidate_during_a_fleet_rebuild(invalidator: usize, during: bool) {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let a = node(&redis, &v).await;
    let b = node(&redis, &v).await;

    let starter = spawn_requests(&a.app, 1);
    v.entered.notified().await;
    let before_a = spawn_requests(&a.app, 5);
    let before_b = spawn_requests(&b.app, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;

    v.switch();
    [&a, &b][invalidator]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    // Time for the invalidation notice to reach every instance, so that what
    // follows is not a delivery delay.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut old = Vec::new();
    if during {
        let on_a = spawn_requests(&a.app, 10);
        let on_b = spawn_requests(&b.app, 10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        v.release.notify_one();
        old.extend(olds(
            "instance a, while the old rebuild ran",
            &texts(on_a).await,
        ));
        old.extend(olds(
            "instance b, while the old rebuild ran",
            &texts(on_b).await,
        ));
    } else {
        v.release.notify_one();
    }
    assert_eq!(
        texts(starter).await,
        ["old"],
        "the scenario's rebuild read the old data"
    );
    texts(before_a).await;
    texts(before_b).await;

    let c = node(&redis, &v).await;
    for (label, n) in [
        ("instance a", &a),
        ("instance b", &b),
        ("a new instance", &c),
    ] {
        old.extend(olds(
            &format!("{label}, after the old rebuild landed"),
            &texts(spawn_requests(&n.app, 5)).await,
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (label, n) in [
        ("instance a", &a),
        ("instance b", &b),
        ("a new instance", &c),
    ] {
        old.extend(olds(
            &format!("{label}, later"),
            &texts(spawn_requests(&n.app, 1)).await,
        ));
    }
    old.dedup();
    assert!(
        old.is_empty(),
        "requests issued after invalidate() returned got the old value: {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_any_instance_after_invalidate_never_get_the_answer_of_a_rebuild_already_running(
) {
    invalidate_during_a_fleet_rebuild(0, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_running_at_invalidate_stores_its_old_answer_neither_in_l1_nor_in_redis() {
    invalidate_during_a_fleet_rebuild(0, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_on_another_instance_keeps_a_running_rebuilds_old_answer_from_later_requests() {
    invalidate_during_a_fleet_rebuild(1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_on_another_instance_keeps_a_running_rebuild_from_storing_its_old_answer() {
    invalidate_during_a_fleet_rebuild(1, false).await;
}

/// The same through `Cache<V>`, on two backends (and a fresh third).
async fn invalidate_during_a_fleet_cache_rebuild(invalidator: usize, during: bool) {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let new_cache =
        || async { Cache::<String>::new(connect(&redis).await).ttl(Duration::from_secs(60)) };
    let a = new_cache().await;
    let b = new_cache().await;
    let spawn_calls = |cache: &Cache<String>, n: usize| spawn_calls(cache, &v, n);

    let starter = spawn_calls(&a, 1);
    v.entered.notified().await;
    let before_a = spawn_calls(&a, 5);
    let before_b = spawn_calls(&b, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;

    v.switch();
    [&a, &b][invalidator]
        .invalidate("k")
        .await
        .expect("the invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut old = Vec::new();
    if during {
        let on_a = spawn_calls(&a, 10);
        let on_b = spawn_calls(&b, 10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        v.release.notify_one();
        old.extend(olds(
            "cache a, while the old rebuild ran",
            &values(on_a).await,
        ));
        old.extend(olds(
            "cache b, while the old rebuild ran",
            &values(on_b).await,
        ));
    } else {
        v.release.notify_one();
    }
    assert_eq!(
        values(starter).await,
        ["old"],
        "the scenario's rebuild read the old data"
    );
    values(before_a).await;
    values(before_b).await;

    let c = new_cache().await;
    for (label, cache) in [("cache a", &a), ("cache b", &b), ("a new cache", &c)] {
        old.extend(olds(
            &format!("{label}, after the old rebuild landed"),
            &values(spawn_calls(cache, 5)).await,
        ));
    }
    for (label, cache) in [("cache a", &a), ("cache b", &b), ("a new cache", &c)] {
        if cache.get("k").as_deref() == Some("old") {
            old.push(format!("{label}, in its L1"));
        }
    }
    old.dedup();
    assert!(
        old.is_empty(),
        "calls that started after invalidate() returned got the old value: {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_calls_on_any_instance_after_invalidate_never_get_the_value_of_a_rebuild_already_running(
) {
    invalidate_during_a_fleet_cache_rebuild(0, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_rebuild_running_at_invalidate_stores_its_old_value_neither_in_l1_nor_in_redis() {
    invalidate_during_a_fleet_cache_rebuild(0, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_invalidate_on_another_instance_keeps_a_running_rebuilds_old_value_from_later_calls()
{
    invalidate_during_a_fleet_cache_rebuild(1, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_invalidate_on_another_instance_keeps_a_running_rebuild_from_storing_its_old_value() {
    invalidate_during_a_fleet_cache_rebuild(1, false).await;
}
