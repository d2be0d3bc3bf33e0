//! Fleet-wide failure memory: a failed rebuild leaves a marker in Redis, and
//! while its backoff runs no instance calls the origin for the key again.
//! Counts only: origin calls are checked against the episode's own step
//! count, which Redis keeps in the marker, and each call against the
//! backoff Redis's clock had left when it was made; never against the test's
//! own clock.
#![cfg(feature = "redis")]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::driver::counted_app;
use crate::common::fleet::keys_like;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Answer, Origin, ROOMY_DEADLINE};
use axum::response::IntoResponse;
use axum::Router;
use http::header::CACHE_CONTROL;
use http::StatusCode;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Semaphore;

/// The longest backoff, as documented; also how long a marker outlives its
/// backoff.
const CAP: Duration = Duration::from_secs(10);

struct Fleet {
    apps: Vec<Router>,
    guards: Vec<StampedeGuard>,
    origin: Origin,
    failing: Arc<AtomicBool>,
    /// While set, the failure is a 503 that may be shared (no `no-store`),
    /// with a `retry-after` header.
    shareable: Arc<AtomicBool>,
    /// While set, each origin call waits for a permit of `gate` first.
    hold: Arc<AtomicBool>,
    gate: Arc<Semaphore>,
    /// For each origin call, as it began: the backoff the key's failure
    /// marker still had to run by Redis's clock, in milliseconds (zero or
    /// less: none ran).
    backoff_at_calls: Arc<Mutex<Vec<i64>>>,
}

/// `k` instances of `/report` on one Redis (ttl 1 s, stale-if-error
/// `stale_if_error` seconds): the origin answers `v<n>` while healthy, and a
/// 503 (no-store) while `failing`.
async fn fleet(redis: &RedisServer, k: usize, stale_if_error: u64) -> Fleet {
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let shareable = Arc::new(AtomicBool::new(false));
    let hold = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Semaphore::new(0));
    let backoff_at_calls = Arc::new(Mutex::new(Vec::new()));
    let port = redis.port();
    let (mut apps, mut guards) = (Vec::new(), Vec::new());
    for _ in 0..k {
        // A roomy deadline: these scenarios count origin calls, and a call
        // past a 50 ms deadline on a loaded machine takes no lease and adds
        // no backoff step, which costs one origin call more.
        let backend = Backend::redis_builder(&redis.url())
            .deadline(ROOMY_DEADLINE)
            .connect()
            .await
            .expect("redis backend");
        let guard = StampedeGuard::new(backend)
            .ttl(Duration::from_secs(1))
            .stale_if_error(Duration::from_secs(stale_if_error));
        guards.push(guard.clone());
        let (failing, hold, gate) = (failing.clone(), hold.clone(), gate.clone());
        let seen = backoff_at_calls.clone();
        let shareable = shareable.clone();
        apps.push(counted_app(&origin, guard, move |n| {
            let held = hold.load(Ordering::SeqCst);
            let gate = gate.clone();
            let failing = failing.clone();
            let seen = seen.clone();
            let shareable = shareable.load(Ordering::SeqCst);
            async move {
                let left = tokio::task::spawn_blocking(move || backoff_left(port))
                    .await
                    .expect("read the marker");
                if let Some(left) = left {
                    seen.lock().expect("calls").push(left);
                }
                if held {
                    let _ = gate.acquire().await;
                }
                let failing = failing.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                if failing && shareable {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "7")],
                        "down".to_owned(),
                    )
                        .into_response();
                }
                if failing {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(CACHE_CONTROL, "no-store".to_owned())],
                        "down".to_owned(),
                    )
                        .into_response();
                }
                // Tagged, for the purge by tag below.
                (
                    StatusCode::OK,
                    [("surrogate-key", "report")],
                    format!("v{n}"),
                )
                    .into_response()
            }
        }));
    }
    Fleet {
        apps,
        guards,
        origin,
        failing,
        shareable,
        hold,
        gate,
        backoff_at_calls,
    }
}

/// The backoff left on the key's failure marker by Redis's clock, in
/// milliseconds (a marker lives `CAP` past its backoff; no marker: `-CAP`);
/// `None` if Redis could not be asked (a test that stops it).
fn backoff_left(port: u16) -> Option<i64> {
    let script = format!(
        "local k = redis.call('KEYS', '*:x')[1] \
         if not k then return -{cap} end \
         return redis.call('PTTL', k) - {cap}",
        cap = CAP.as_millis()
    );
    let args = ["EVAL", script.as_str(), "0"];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(cmd.as_bytes()).ok()?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).ok()?;
    reply.trim_end().strip_prefix(':')?.parse().ok()
}

async fn burst(apps: &[Router], n: usize) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            tokio::spawn(async move { send(&app, get("/report")).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

/// The failure marker's key and its value (`<gen>:<code>:<step>`), if any.
fn marker(redis: &RedisServer) -> Option<(String, String)> {
    let key = keys_like(redis, "*:x").into_iter().next()?;
    let value = redis.raw(&["GET", &key]);
    Some((key, value))
}

/// The step count of the episode Redis remembers (0: no marker).
fn step(redis: &RedisServer) -> usize {
    marker(redis)
        .and_then(|(_, v)| v.rsplit(':').next()?.parse().ok())
        .unwrap_or(0)
}

/// The generation of the `/report` group.
fn generation(redis: &RedisServer) -> String {
    let key = keys_like(redis, "*:g").into_iter().next().expect("gen key");
    redis.raw(&["GET", &key])
}

/// Fills the entry, lets it go stale, and turns the origin off.
async fn fill_then_fail(f: &Fleet) {
    let first = send(&f.apps[0], get("/report")).await;
    assert_eq!(first.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    f.failing.store(true, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_origin_costs_the_fleet_one_call_per_backoff_step_not_one_per_instance() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.extend(burst(&f.apps, 24).await);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let calls = f.origin.calls();
    assert!(calls >= 1, "the episode began");
    // Each call failed and counted one step of the same episode; nothing
    // else reached the origin.
    assert_eq!(calls, step(&redis), "every origin call is one backoff step");
    // And none was made while a backoff ran: however long the bursts took
    // (a loaded machine stretches them over more backoffs, and so more
    // steps), an instance called only once Redis's clock had ended the last
    // step's backoff. So no two instances called for one step, nor any
    // request of a burst that met the backoff.
    let seen = f.backoff_at_calls.lock().expect("calls").clone();
    assert_eq!(seen.len(), calls, "each call looked at the marker");
    assert!(
        seen.iter().all(|&left| left <= 0),
        "origin calls while a backoff ran (ms left at each call): {seen:?}"
    );
    // Nobody got an entry, nor a status the origin never sent: each origin
    // call's starter its 503 whole, everyone else its status alone (the
    // answer is `no-store`: its body is not kept for others).
    for a in &answers {
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let whole = answers.iter().filter(|a| a.text() == "down").count();
    assert_eq!(whole, calls, "one whole answer per origin call");
    let (_, value) = marker(&redis).expect("a marker");
    assert!(value.starts_with(&format!("{}:", generation(&redis))));
}

/// One failure is no answer for a later request: the next one, on any
/// instance, asks the origin again and gets the origin's own status. A
/// second failure in a row starts the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_failure_starts_no_backoff_the_second_does() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 2, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    f.shareable.store(true, Ordering::SeqCst);
    let first = send(&f.apps[0], get("/report")).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!((f.origin.calls(), step(&redis)), (1, 1));
    let second = send(&f.apps[1], get("/report")).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.text(), "down", "the origin's own answer");
    assert_eq!((f.origin.calls(), step(&redis)), (2, 2));
    // The backoff runs now (at least BASE): the fleet does not call again,
    // and answers with the origin's own answer to the last failure, on
    // either instance.
    for app in &f.apps {
        let during = send(app, get("/report")).await;
        assert_eq!(
            (during.status, during.text().as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "down")
        );
        assert_eq!(during.headers["retry-after"], "7");
    }
    assert_eq!(f.origin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_stale_if_error_during_the_backoff() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 60).await;
    fill_then_fail(&f).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.extend(burst(&f.apps, 24).await);
    }
    let failed_calls = f.origin.calls() - 1;
    assert!(failed_calls >= 1);
    assert_eq!(failed_calls, step(&redis), "every failed call is one step");
    assert!(failed_calls < 4, "{failed_calls} failed calls for 4 bursts");
    for a in &answers {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.text(), "v1", "the stale entry, never the 503");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_before_a_tag_purge_is_not_served_during_the_backoff() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 60).await;
    fill_then_fail(&f).await;
    // The episode starts: the stale v1 is served meanwhile.
    for a in burst(&f.apps, 12).await {
        assert_eq!(a.text(), "v1");
    }
    let calls = f.origin.calls();
    f.guards[1].invalidate_tag("report").await.expect("purged");
    // The tag purge leaves the URL's marker (and its generation) alone: make
    // its backoff long, so that every request below meets it.
    let (key, _) = marker(&redis).expect("a marker");
    forge(&redis, &key, &format!("{}:1:9", generation(&redis)), CAP);
    for a in burst(&f.apps, 12).await {
        assert_ne!(a.text(), "v1", "a copy from before the tag purge");
        assert_eq!(
            a.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "the origin's failure"
        );
    }
    assert_eq!(f.origin.calls(), calls, "no call while the backoff runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_commit_after_the_origin_heals_ends_the_episode() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    burst(&f.apps, 12).await;
    let failed = f.origin.calls();
    assert_eq!(failed, step(&redis));
    f.failing.store(false, Ordering::SeqCst);
    // Keep asking until the backoff ends and a rebuild succeeds (bounded).
    let deadline = Instant::now() + CAP * 2;
    let mut ok = None;
    while Instant::now() < deadline {
        let a = send(&f.apps[1], get("/report")).await;
        if a.status == StatusCode::OK {
            ok = Some(a);
            break;
        }
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "the shared failure");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = ok.expect("the origin is called again once the backoff ends");
    assert_eq!(f.origin.calls(), failed + 1, "one call after the backoff");
    assert_eq!(ok.text(), format!("v{}", failed + 1));
    assert!(marker(&redis).is_none(), "the commit removed the marker");
    // The whole fleet is served the new entry without calling the origin.
    for a in burst(&f.apps, 12).await {
        assert_eq!(a.text(), ok.text());
    }
    assert_eq!(f.origin.calls(), failed + 1);
    // A new failure starts a new episode at step 1.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    f.failing.store(true, Ordering::SeqCst);
    burst(&f.apps, 6).await;
    assert_eq!(step(&redis), f.origin.calls() - failed - 1);
    assert_eq!(step(&redis), 1, "the backoff starts again from its base");
}

/// Writes a marker of the current generation with `left` of backoff.
fn forge(redis: &RedisServer, key: &str, value: &str, left: Duration) {
    let px = (left + CAP).as_millis().to_string();
    assert_eq!(redis.raw(&["SET", key, value, "PX", &px]), "+OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_clears_the_backoff() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    burst(&f.apps, 6).await;
    let calls = f.origin.calls();
    let (key, _) = marker(&redis).expect("a marker");
    // The episode is long by now: the longest backoff.
    let generation_now = generation(&redis);
    forge(&redis, &key, &format!("{generation_now}:1:9"), CAP);
    for a in burst(&f.apps, 12).await {
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(f.origin.calls(), calls, "no call while the backoff runs");
    // The operator fixes the origin and purges the URL.
    f.failing.store(false, Ordering::SeqCst);
    f.guards[2]
        .invalidate(&get("/report"))
        .await
        .expect("invalidated");
    let a = send(&f.apps[0], get("/report")).await;
    assert_eq!(a.status, StatusCode::OK, "retried at once");
    assert_eq!(f.origin.calls(), calls + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_of_a_rebuild_begun_before_an_invalidation_does_not_back_off_the_new_url() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    f.hold.store(true, Ordering::SeqCst);
    let app = f.apps[0].clone();
    let pending = tokio::spawn(async move { send(&app, get("/report")).await });
    for _ in 0..1000 {
        if f.origin.calls() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(f.origin.calls(), 1, "the rebuild is under way");
    let old = generation(&redis);
    f.guards[1]
        .invalidate(&get("/report"))
        .await
        .expect("invalidated");
    // Now the old rebuild fails, and leaves its marker.
    f.gate.add_permits(1);
    assert!(pending.await.expect("answered").status.is_server_error());
    let (_, value) = marker(&redis).expect("the failed rebuild left a marker");
    assert!(value.starts_with(&format!("{old}:")));
    assert_ne!(
        generation(&redis),
        old,
        "the invalidation moved the generation"
    );
    // It is of the old generation: the purged URL is tried at once.
    f.hold.store(false, Ordering::SeqCst);
    f.failing.store(false, Ordering::SeqCst);
    let a = send(&f.apps[2], get("/report")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(f.origin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_foreign_marker_is_harmless() {
    let redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    send(&f.apps[0], get("/report")).await;
    let (key, _) = marker(&redis).expect("a marker");
    f.failing.store(false, Ordering::SeqCst);
    // Each of these is not a backoff this version wrote: ignored, so the
    // origin is called. (Redis's own wrong-type errors are not ours to
    // test: a hash here would make every script fail, like a broken Redis.)
    let ignored = |g: &str| {
        [
            ("garbage".to_owned(), Some(CAP)),
            (format!("{g}:1:1"), None),          // no TTL
            (format!("{g}:1:1"), Some(CAP * 5)), // longer than any backoff
            (format!("{g}x:1:1"), Some(CAP)),
            ("1:1:1".to_owned(), Some(CAP)), // another generation
            (format!("{g}:1:-1"), Some(CAP)),
            (format!("{g}:1234:1"), Some(CAP)),
            (String::new(), Some(CAP)),
        ]
    };
    for i in 0..ignored("").len() {
        // A miss everywhere: the entry (and every copy in L1) is purged.
        f.guards[0]
            .invalidate(&get("/report"))
            .await
            .expect("purged");
        let (value, left) = ignored(&generation(&redis))[i].clone();
        match left {
            Some(left) => forge(&redis, &key, &value, left),
            None => assert_eq!(redis.raw(&["SET", &key, &value]), "+OK"),
        }
        let before = f.origin.calls();
        let a = send(&f.apps[i % 3], get("/report")).await;
        assert_eq!(a.status, StatusCode::OK, "marker {value:?} was honoured");
        assert_eq!(f.origin.calls(), before + 1);
        // The successful commit removed it.
        assert!(marker(&redis).is_none());
    }
    // A marker of ours with a code this version does not know: a failure
    // still (a plain 502: no answer of the origin's was kept with it), never
    // a panic, and no origin call.
    f.guards[0]
        .invalidate(&get("/report"))
        .await
        .expect("purged");
    let generation_now = generation(&redis);
    forge(&redis, &key, &format!("{generation_now}:99:1"), CAP);
    let before = f.origin.calls();
    for a in burst(&f.apps, 6).await {
        assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(f.origin.calls(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_mid_episode_means_one_fresh_attempt() {
    let mut redis = RedisServer::start();
    let f = fleet(&redis, 3, 0).await;
    f.failing.store(true, Ordering::SeqCst);
    burst(&f.apps, 6).await;
    let (key, value) = marker(&redis).expect("a marker");
    let calls = f.origin.calls();
    assert_eq!(calls, step(&redis));
    // A long backoff, then Redis loses everything.
    forge(&redis, &key, &value.replace(":1:1", ":1:9"), CAP);
    redis.restart();
    reconnect(&f).await;
    // The episode is forgotten: one instance tries again, once.
    for a in burst(&f.apps, 12).await {
        assert!(a.status.is_server_error());
    }
    assert_eq!(
        f.origin.calls(),
        calls + 1,
        "one fresh attempt for the fleet"
    );
    assert_eq!(step(&redis), 1, "a new episode");
}

/// Every instance's link to a restarted Redis works again (bounded).
async fn reconnect(f: &Fleet) {
    for guard in &f.guards {
        let mut done = false;
        for _ in 0..150 {
            if guard.invalidate(&get("/other")).await.is_ok() {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(done, "the instance reaches Redis again");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f
        .guards
        .iter()
        .all(|g| g.backend().stats().redis.is_some_and(|r| r.available))
    {
        assert!(Instant::now() < deadline, "the circuits closed again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
