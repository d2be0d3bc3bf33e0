//! Attacks on the driver's promises with Redis: writes that land after the
//! caller's deadline, a Redis that comes back empty mid-flight, panics under
//! a lease, uncacheable error answers across a fleet, and leaks over many
//! keys. Tests that fail here document a promise that does not hold.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::{
    churn_app, connect, counted_app, fleet_apps, join_all, spawn_request, versioned_app, Versioned,
    HERD,
};
use crate::common::fleet::keys_of_kind;
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Answer, Origin};
use axum::Router;
use http::header::CACHE_CONTROL;
use http::StatusCode;
use stampede_guard::StampedeGuard;

fn value_of(redis: &RedisServer) -> String {
    redis.raw(&[
        "EVAL",
        "local k = redis.call('KEYS', '*:v')[1]; if k then return redis.call('GET', k) end; return ''",
        "0",
    ])
}

/// `/report`: takes 10 ms and answers `v<call>`.
fn counting_app(origin: &Origin, guard: StampedeGuard) -> Router {
    counted_app(origin, guard, |n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        format!("v{n}")
    })
}

// ---------------------------------------------------------------------------
// A lease taken by a script whose caller gave up on it (its deadline passed
// while Redis was paused for writes) is held by nobody.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_after_its_callers_deadline_is_not_left_held() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = counting_app(
        &origin,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    assert_eq!(redis.raw(&["CLIENT", "PAUSE", "300", "WRITE"]), "+OK");
    let first = send(&a, get_req("/report")).await;
    assert_eq!(first.text(), "v1");
    // This write waits out the pause behind the queued fetch-or-lease
    // script, which has run when it returns; the clean-up sent after it
    // frees the lease. Waited for, not slept out (a loaded machine is
    // slower), and given up long before the lease's own 5 s would free it.
    assert_eq!(redis.raw(&["SET", "after-the-pause", "1"]), "+OK");
    let give_up = std::time::Instant::now() + Duration::from_secs(3);
    while keys_of_kind(&redis, "l") > 0 && std::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leases = keys_of_kind(&redis, "l");
    assert_eq!(
        leases, 0,
        "after the flight ended: {leases} lease(s) still held in Redis by a token nobody holds"
    );
    // The rebuild ran without the lease (Redis did not answer in time), so
    // its value stays in this process: an unfenced write could overwrite a
    // newer one. Another instance is not held back by an orphan lease: it
    // takes the lease and rebuilds at once.
    let b = counting_app(
        &origin,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    let second = send(&b, get_req("/report")).await;
    assert_eq!((second.text().as_str(), second.x_cache()), ("v2", "MISS"));
    assert_eq!(keys_of_kind(&redis, "v"), 1, "its rebuild reached Redis");
}

// ---------------------------------------------------------------------------
// Redis restarts empty while a rebuild runs; the fence numbers start again.
// ---------------------------------------------------------------------------

/// Instance `a` holds the lease and parks a rebuild that read "old"; Redis
/// restarts empty; the origin switches to "new" and instance `b`
/// invalidates (with `invalidate`) or simply rebuilds. Then `a`'s rebuild
/// lands. A new instance must not get "old" from Redis.
async fn restart_under_a_running_rebuild(invalidate: bool) {
    let mut redis = RedisServer::start();
    let v = Versioned::new();
    let (ba, bb) = (connect(&redis).await, connect(&redis).await);
    let ga = StampedeGuard::new(ba.clone()).ttl(Duration::from_secs(60));
    let gb = StampedeGuard::new(bb.clone()).ttl(Duration::from_secs(60));
    let a = versioned_app(&v, ga);
    let b = versioned_app(&v, gb.clone());
    let starter = spawn_request(&a);
    v.entered.notified().await;
    assert_eq!(keys_of_kind(&redis, "l"), 1, "a holds the lease");

    redis.restart();
    // Both instances see Redis again (b's first call may find the old
    // connection broken).
    for _ in 0..100 {
        if gb.invalidate(&get_req("/other")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while ![&ba, &bb]
        .iter()
        .all(|b| b.stats().redis.is_some_and(|r| r.available))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the circuits closed again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    *v.current.lock().unwrap() = "new";
    if invalidate {
        let mut done = false;
        for _ in 0..100 {
            if gb.invalidate(&get_req("/report")).await.is_ok() {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(done, "b's invalidation reached the restarted Redis");
    } else {
        for _ in 0..100 {
            let answer = send(&b, get_req("/report")).await;
            assert_eq!(answer.text(), "new");
            if keys_of_kind(&redis, "v") == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stored = value_of(&redis);
        assert!(
            stored.contains("new"),
            "b stored the new value: {} value keys, {stored:?}, x-cache {}",
            keys_of_kind(&redis, "v"),
            send(&b, get_req("/report")).await.x_cache()
        );
    }
    // Time for notices to arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    v.release.notify_one();
    assert_eq!(
        starter.await.unwrap().text(),
        "old",
        "a's rebuild read old data"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    let c = versioned_app(
        &v,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    let fresh = send(&c, get_req("/report")).await;
    assert_eq!(
        fresh.text(),
        "new",
        "a new instance got {:?} ({}) from Redis after the old rebuild landed",
        fresh.text(),
        fresh.x_cache()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_empty_an_old_rebuild_does_not_outlive_an_invalidation() {
    restart_under_a_running_rebuild(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_empty_an_old_rebuild_does_not_overwrite_a_newer_value() {
    restart_under_a_running_rebuild(false).await;
}

// ---------------------------------------------------------------------------
// Failures across a fleet.
// ---------------------------------------------------------------------------

/// `n` concurrent requests, round-robin over `apps`; a task that panicked
/// is an `Err`.
async fn fleet_burst(apps: &[Router], n: usize) -> Vec<Result<Answer, tokio::task::JoinError>> {
    join_all(
        (0..n)
            .map(|i| spawn_request(&apps[i % apps.len()]))
            .collect(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_marked_no_store_costs_a_fleet_of_three_at_most_two_origin_calls() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        counted_app(&origin, guard.ttl(Duration::from_secs(60)), |_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(CACHE_CONTROL, "no-store")],
                "down",
            )
        })
    })
    .await;
    let answers = fleet_burst(&apps, HERD).await;
    assert!(answers
        .iter()
        .all(|a| a.as_ref().is_ok_and(|a| a.status.is_server_error())));
    let calls = origin.calls();
    assert!(
        calls <= 2,
        "{HERD} requests over 3 instances cost {calls} calls to a failing origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_under_a_long_lease_is_shared_by_the_fleet_and_the_lease_released() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        let o = origin.clone();
        counted_app(
            &origin,
            guard
                .ttl(Duration::from_secs(60))
                .lease(Duration::from_secs(20)),
            move |_| {
                let o = o.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if o.calls() > 0 {
                        panic!("handler panicked (on purpose)");
                    }
                    "unreachable"
                }
            },
        )
    })
    .await;
    let answers = tokio::time::timeout(Duration::from_secs(4), fleet_burst(&apps, HERD))
        .await
        .expect("nobody waits out the 20 s lease");
    let panicked = answers.iter().filter(|a| a.is_err()).count();
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} requests cost {calls} origin calls");
    assert_eq!(panicked, calls, "each starter sees its panic");
    for a in answers.iter().flatten() {
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(keys_of_kind(&redis, "l"), 0, "the lease was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_timeout_under_a_lease_is_shared_by_the_fleet() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        counted_app(
            &origin,
            guard
                .ttl(Duration::from_secs(60))
                .rebuild_timeout(Duration::from_millis(300)),
            |_| async {
                std::future::pending::<()>().await;
                "never"
            },
        )
    })
    .await;
    let answers = fleet_burst(&apps, HERD).await;
    let calls = origin.calls();
    assert!(calls <= 2, "{HERD} requests cost {calls} origin calls");
    for a in answers {
        assert_eq!(a.expect("answered").status, StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(keys_of_kind(&redis, "l"), 0, "the lease was released");
}

// ---------------------------------------------------------------------------
// Nothing stranded with Redis: many keys, no task or lease left behind.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_through_a_fleet_leave_no_task_or_lease_behind() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let mut apps = Vec::new();
    let failing = Arc::new(AtomicBool::new(false));
    for _ in 0..2 {
        let guard = StampedeGuard::new(connect(&redis).await)
            .ttl(Duration::from_secs(60))
            .rebuild_timeout(Duration::from_millis(200));
        apps.push(churn_app(&origin, &failing, true, guard));
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let base = metrics.num_alive_tasks();
    for phase in [false, true] {
        failing.store(phase, Ordering::SeqCst);
        let tasks: Vec<_> = (0..150u32)
            .flat_map(|id| [(id, 0usize), (id, 1), (id, 0), (id, 1)])
            .map(|(id, i)| {
                let app = apps[i].clone();
                let path =
                    format!("/k/{}{}", if phase { "f" } else { "" }, id).replace("/k/f", "/k/1000");
                tokio::spawn(async move {
                    let _ = send(&app, get_req(&path)).await;
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alive = metrics.num_alive_tasks();
    assert_eq!(keys_of_kind(&redis, "l"), 0, "no lease is left held");
    assert!(
        alive <= base,
        "{alive} tasks alive after the requests ended (before: {base})"
    );
}
