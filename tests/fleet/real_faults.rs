//! Attacks on the fleet's promises with real faults against real
//! redis-servers: an evicted fence hash, a subscriber link that dies without
//! a word, a subscriber killed while its instance is cut off, commits and
//! lease calls whose replies never come, failing origins across a fleet, and
//! churn under faults. Tests that fail here document a promise that does not
//! hold.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::driver::{
    churn_app, connect, counted_app, fleet_apps, join_all, spawn_request, versioned_app, Versioned,
    HERD,
};
use crate::common::fleet::{event_subscribers, evict, keys_of_kind};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Answer, Origin};
use axum::routing::get;
use axum::Router;
use http::header::{CACHE_CONTROL, SET_COOKIE};
use http::StatusCode;
use stampede_guard::{Backend, StampedeGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Subscribers of the default namespace's event channel.
async fn backend_at(url: &str, deadline: Duration, probe: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(deadline)
        .probe_interval(probe)
        .connect()
        .await
        .expect("redis backend")
}

/// `/report`: answers `v<call>` at once.
fn numbered(origin: &Origin, guard: StampedeGuard) -> Router {
    counted_app(origin, guard, |n| async move { format!("v{n}") })
}

/// Asks `app` every 100 ms, up to `limit`, until `done` holds for the answer.
async fn poll_until(app: &Router, limit: Duration, done: impl Fn(&Answer) -> bool) -> Answer {
    let until = std::time::Instant::now() + limit;
    loop {
        let answer = send(app, get_req("/report")).await;
        if done(&answer) || std::time::Instant::now() >= until {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// A proxy whose existing connections can go dead without a word: Redis's
// side is closed (Redis forgets the client, and its subscription), the
// client's side stays open and nothing ever comes back on it, as after a
// NAT or load balancer dropped the connection's state. New connections are
// carried as usual.
// ---------------------------------------------------------------------------

struct Blackhole {
    port: u16,
    links: Arc<Mutex<Vec<watch::Sender<bool>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    async fn start(upstream: u16) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let links: Arc<Mutex<Vec<watch::Sender<bool>>>> = Arc::default();
        let task = {
            let links = links.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        continue;
                    };
                    let (dead_tx, dead) = watch::channel(false);
                    links.lock().unwrap().push(dead_tx);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(up(cr, sw, dead.clone()));
                    tokio::spawn(down(sr, cw, dead));
                }
            })
        };
        Blackhole { port, links, task }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Every connection open now goes dead silently.
    fn drop_existing(&self) {
        for link in self.links.lock().unwrap().drain(..) {
            link.send_replace(true);
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Client to Redis; once dead, Redis's side is closed and what the client
/// sends is swallowed.
async fn up(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    mut dead: watch::Receiver<bool>,
) {
    let mut to = Some(to);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = match read { Ok(0) | Err(_) => return, Ok(n) => n };
                if let Some(w) = to.as_mut()
                    && w.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
            }
            changed = dead.changed(), if to.is_some() => {
                if changed.is_err() || *dead.borrow() {
                    to = None; // FIN to Redis: it drops the client
                }
            }
        }
    }
}

/// Redis to client; once dead, nothing more reaches the client, whose
/// connection stays open.
async fn down(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut dead: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = match read { Ok(0) | Err(_) => break, Ok(n) => n };
                if *dead.borrow() {
                    break;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            changed = dead.changed() => {
                if changed.is_err() || *dead.borrow() {
                    break;
                }
            }
        }
    }
    drop(from);
    // Keep the client's side open, silent.
    let _keep = to;
    std::future::pending::<()>().await;
}

// ---------------------------------------------------------------------------
// Promise 2: an idle instance whose subscriber link died silently finds out
// (it pings its subscriber every second) and subscribes again.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_whose_link_died_silently_subscribes_again() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a_guard = StampedeGuard::new(
        backend_at(
            &redis.url(),
            Duration::from_millis(50),
            Duration::from_millis(100),
        )
        .await,
    )
    .ttl(Duration::from_secs(60));
    let a = numbered(&origin, a_guard.clone());
    let proxy = Blackhole::start(redis.port()).await;
    let b_guard = StampedeGuard::new(
        backend_at(
            &proxy.url(),
            Duration::from_millis(50),
            Duration::from_millis(100),
        )
        .await,
    )
    .ttl(Duration::from_secs(60));
    let b = numbered(&origin, b_guard);
    assert_eq!(send(&b, get_req("/report")).await.text(), "v1");
    let cached = send(&b, get_req("/report")).await;
    assert_eq!((cached.text().as_str(), cached.x_cache()), ("v1", "HIT"));
    assert_eq!(event_subscribers(&redis), 2);

    // B's connections die without a word while B is idle.
    proxy.drop_existing();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(event_subscribers(&redis), 1, "Redis forgot B's subscriber");
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    assert_eq!(send(&a, get_req("/report")).await.text(), "v2");

    // A keepalive every second: within four, B has found its subscriber
    // silent, subscribed again, and dropped what it could not confirm.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let after = send(&b, get_req("/report")).await;
    let subs = event_subscribers(&redis);
    assert!(
        !(after.text() == "v1" && after.x_cache() == "HIT") && subs == 2,
        "3.5 s after its link died B still answers {} ({}), Redis has {subs} subscriber(s) \
         on the channel (B's never came back)",
        after.text(),
        after.x_cache()
    );
}

// ---------------------------------------------------------------------------
// Promises 1 and 2: a subscriber killed (CLIENT KILL TYPE pubsub) while its
// instance is cut off cannot hear the invalidation; once its subscription is
// back, its L1 is dropped.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_killed_while_cut_off_drops_its_copies_once_back() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a_backend = backend_at(
        &redis.url(),
        Duration::from_millis(50),
        Duration::from_millis(100),
    )
    .await;
    let a_guard = StampedeGuard::new(a_backend).ttl(Duration::from_secs(60));
    let a = numbered(&origin, a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = numbered(
        &origin,
        StampedeGuard::new(
            backend_at(
                &proxy.url(),
                Duration::from_millis(50),
                Duration::from_millis(100),
            )
            .await,
        )
        .ttl(Duration::from_secs(60)),
    );
    // B holds a copy in its L1. (Its deadline is tight, so that the cut
    // shows fast: on a loaded machine a first call may miss it and cost
    // another origin call, which is not what this is about.)
    let held = poll_until(&b, Duration::from_secs(5), |a| a.x_cache() == "HIT").await;
    assert_eq!(held.x_cache(), "HIT", "B answers from its L1");
    let old = held.text();

    proxy.freeze();
    assert!(redis
        .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .starts_with(':'));
    // A invalidates while B has no subscription (B cannot reconnect through
    // the held link).
    let mut done = false;
    for _ in 0..20 {
        if a_guard.invalidate(&get_req("/report")).await.is_ok() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(done, "A's invalidation reached Redis");
    assert_ne!(send(&a, get_req("/report")).await.text(), old);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.thaw();

    let after = poll_until(&b, Duration::from_secs(4), |a| a.text() != old).await;
    assert_ne!(
        after.text(),
        old,
        "B kept serving the invalidated {old} ({}) after its subscription came back",
        after.x_cache()
    );
}

// ---------------------------------------------------------------------------
// Promise 1: the circuit open on the instance that holds the old copy.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_with_its_circuit_open_drops_an_invalidated_copy() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let v = Versioned::unparked();
    let a_guard = StampedeGuard::new(
        backend_at(
            &redis.url(),
            Duration::from_millis(50),
            Duration::from_secs(60),
        )
        .await,
    )
    .ttl(Duration::from_secs(60));
    let b_backend = backend_at(
        &redis.url(),
        Duration::from_millis(50),
        Duration::from_secs(60),
    )
    .await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(b_backend.clone()).ttl(Duration::from_secs(60)),
    );
    let _ = origin;
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");
    // Open B's circuit: Redis stops answering under B's misses.
    redis.freeze();
    let trip = Router::new().route(
        "/trip/{i}",
        get(|| async { "x" }).layer(StampedeGuard::new(b_backend.clone())),
    );
    for i in 0..20 {
        send(&trip, get_req(&format!("/trip/{i}"))).await;
        if !b_backend.stats().redis.unwrap().available {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.thaw();
    assert!(
        !b_backend.stats().redis.unwrap().available,
        "B's circuit is open"
    );
    // B, circuit open, still serves its copy.
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");

    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("A's invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!b_backend.stats().redis.unwrap().available, "still open");
    let after = send(&b, get_req("/report")).await;
    assert_eq!(
        after.text(),
        "new",
        "B, circuit open, answered {} ({}) after the notice had time to arrive",
        after.text(),
        after.x_cache()
    );
}

// ---------------------------------------------------------------------------
// Promise 3: fencing numbers when the fence hash is evicted. A's rebuild
// began first; its lease was evicted; B took a newer lease and committed a
// newer value; then the fence hash was evicted too. A's late commit must
// still be refused.
// ---------------------------------------------------------------------------

async fn older_rebuild_after_eviction(evict_fence: bool) {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let a = versioned_app(
        &v,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    let b = versioned_app(
        &v,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    let starter = spawn_request(&a);
    v.entered.notified().await;
    assert_eq!(
        keys_of_kind(&redis, "l"),
        1,
        "A holds the lease, rebuilding from old data"
    );

    // Memory pressure evicts A's lease; the data changes; B rebuilds.
    assert_eq!(evict(&redis, "*:l"), 1);
    v.switch();
    let newer = send(&b, get_req("/report")).await;
    assert_eq!((newer.text().as_str(), newer.x_cache()), ("new", "MISS"));
    assert_eq!(keys_of_kind(&redis, "v"), 1, "B committed the newer value");
    if evict_fence {
        assert_eq!(evict(&redis, "*:n"), 1, "the fence hash is evicted");
    }

    // A's rebuild, which began before B's, lands.
    v.release.notify_one();
    assert_eq!(starter.await.unwrap().text(), "old");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let c = versioned_app(
        &v,
        StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60)),
    );
    let seen = send(&c, get_req("/report")).await;
    assert_eq!(
        seen.text(),
        "new",
        "a new instance got {:?} ({}) from Redis: the older rebuild overwrote the newer value",
        seen.text(),
        seen.x_cache()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_whose_lease_was_evicted_cannot_overwrite_a_newer_value() {
    older_rebuild_after_eviction(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_fence_hash_does_not_let_an_older_rebuild_overwrite_a_newer_value() {
    older_rebuild_after_eviction(true).await;
}

// ---------------------------------------------------------------------------
// Promise 4: a commit whose reply never came (Redis paused for writes past
// the deadline) leaves no lease, and the other instance's waiters go on.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_past_its_deadline_leaves_no_lease_and_holds_no_waiter_back() {
    let redis = RedisServer::start();
    let v = Versioned::new();
    let guard = |b: Backend| {
        StampedeGuard::new(b)
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(20))
    };
    let a = versioned_app(&v, guard(connect(&redis).await));
    let b = versioned_app(&v, guard(connect(&redis).await));
    let starter = spawn_request(&a);
    v.entered.notified().await;
    // B waits on A's lease.
    let waiter = spawn_request(&b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A's commit goes out while Redis holds writes for 300 ms.
    assert_eq!(redis.raw(&["CLIENT", "PAUSE", "300", "WRITE"]), "+OK");
    v.release.notify_one();
    assert_eq!(starter.await.unwrap().text(), "old");
    let answered = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("B's waiter is not held back by a 20 s lease")
        .unwrap();
    assert_eq!(answered.text(), "old");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(keys_of_kind(&redis, "l"), 0, "no lease is left held");
}

// ---------------------------------------------------------------------------
// Promise 4: a fetch-or-lease sent into a frozen link (its reply never
// comes in time) lands once the link thaws; the lease it takes is freed.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_through_a_frozen_link_is_freed_when_it_thaws() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let proxy = Proxy::start(redis.port()).await;
    let a = numbered(
        &origin,
        StampedeGuard::new(
            backend_at(
                &proxy.url(),
                Duration::from_millis(50),
                Duration::from_secs(60),
            )
            .await,
        )
        .ttl(Duration::from_secs(60))
        .lease(Duration::from_secs(20)),
    );
    proxy.freeze();
    // A's question is held; A rebuilds alone after its deadline.
    let first = send(&a, get_req("/report")).await;
    assert_eq!(first.text(), "v1");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.thaw();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        keys_of_kind(&redis, "l"),
        0,
        "no lease held by a token nobody knows"
    );
    // Another instance is not held back: it rebuilds at once.
    let b = numbered(
        &origin,
        StampedeGuard::new(connect(&redis).await)
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(20)),
    );
    let second = tokio::time::timeout(Duration::from_secs(2), send(&b, get_req("/report")))
        .await
        .expect("not held back by an orphan lease");
    assert_eq!(second.x_cache(), "MISS");
}

// ---------------------------------------------------------------------------
// Promise 5: failing origins across a fleet of three.
// ---------------------------------------------------------------------------

async fn fleet_herd(apps: &[Router]) -> Vec<Answer> {
    join_all(
        (0..HERD)
            .map(|i| spawn_request(&apps[i % apps.len()]))
            .collect(),
    )
    .await
    .into_iter()
    .map(|a| a.expect("answered"))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_with_a_cookie_costs_a_fleet_of_three_at_most_two_origin_calls() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        counted_app(
            &origin,
            guard.ttl(Duration::from_secs(60)),
            |n| async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(SET_COOKIE, format!("session={n}"))],
                    "down",
                )
            },
        )
    })
    .await;
    let answers = fleet_herd(&apps).await;
    assert!(answers.iter().all(|a| a.status.is_server_error()));
    let calls = origin.calls();
    assert!(
        calls <= 2,
        "{HERD} requests over 3 instances cost {calls} origin calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_marked_private_costs_a_fleet_of_three_at_most_two_origin_calls() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        counted_app(&origin, guard.ttl(Duration::from_secs(60)), |_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            (
                StatusCode::BAD_GATEWAY,
                [(CACHE_CONTROL, "private")],
                "down",
            )
        })
    })
    .await;
    let answers = fleet_herd(&apps).await;
    assert!(answers.iter().all(|a| a.status.is_server_error()));
    let calls = origin.calls();
    assert!(
        calls <= 2,
        "{HERD} requests over 3 instances cost {calls} origin calls"
    );
}

/// The rebuild timeout longer than the wait budget, as the defaults have it
/// (30 s and 10 s), scaled down: a hanging origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_origin_past_the_wait_budget_costs_a_fleet_of_three_at_most_two_calls() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let apps = fleet_apps(&redis, 3, |guard| {
        counted_app(
            &origin,
            guard
                .ttl(Duration::from_secs(60))
                .wait_budget(Duration::from_millis(300))
                .rebuild_timeout(Duration::from_millis(900)),
            |_| async {
                std::future::pending::<()>().await;
                "never"
            },
        )
    })
    .await;
    let answers = fleet_herd(&apps).await;
    for a in &answers {
        assert!(a.status.is_server_error(), "{}", a.status);
    }
    let calls = origin.calls();
    assert!(
        calls <= 2,
        "{HERD} requests over 3 instances cost {calls} calls to a hanging origin"
    );
}

// ---------------------------------------------------------------------------
// Promise 6: churn under faults leaves no lease and no task behind.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_under_paused_writes_and_killed_subscribers_leaves_nothing_behind() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let failing = Arc::new(AtomicBool::new(false));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let guard = StampedeGuard::new(connect(&redis).await)
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(2))
            .rebuild_timeout(Duration::from_millis(200));
        apps.push(churn_app(&origin, &failing, false, guard));
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    // Warm the runtime's own tasks (connections are up).
    let _ = send(&apps[0], get_req("/k/99999")).await;
    let _ = send(&apps[1], get_req("/k/99999")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = metrics.num_alive_tasks();
    for phase in 0..3u32 {
        failing.store(phase == 1, Ordering::SeqCst);
        let tasks: Vec<_> = (0..100u32)
            .flat_map(|id| [(id, 0usize), (id, 1), (id, 0), (id, 1)])
            .map(|(id, i)| {
                let app = apps[i].clone();
                let path = format!("/k/{}", phase * 1000 + id);
                tokio::spawn(async move {
                    let _ = send(&app, get_req(&path)).await;
                })
            })
            .collect();
        // Faults in the middle of the churn.
        tokio::time::sleep(Duration::from_millis(30)).await;
        match phase {
            0 => assert_eq!(redis.raw(&["CLIENT", "PAUSE", "200", "WRITE"]), "+OK"),
            1 => {
                redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
                redis.raw(&["CLIENT", "PAUSE", "150", "WRITE"]);
            }
            _ => {
                redis.raw(&["CLIENT", "KILL", "TYPE", "normal"]);
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }
    // Every lease is 2 s: give the background releases that long at most.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let leases = keys_of_kind(&redis, "l");
    let alive = metrics.num_alive_tasks();
    assert_eq!(leases, 0, "{leases} lease(s) left held after the churn");
    assert!(
        alive <= base,
        "{alive} tasks alive after the requests ended (before: {base})"
    );
}

// ---------------------------------------------------------------------------
// Promise 1: a Redis read in flight on another instance when the
// invalidation came. B's question reached Redis before the invalidation,
// its reply (the old value, fresh) is held on the way back with the notice.
// Once both are through, no new request on B gets the old value.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_in_flight_at_invalidate_does_not_refill_another_instance() {
    let redis = RedisServer::start();
    let v = Versioned::unparked();
    let a_guard = StampedeGuard::new(connect(&redis).await).ttl(Duration::from_secs(60));
    let a = versioned_app(&v, a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(
            backend_at(
                &proxy.url(),
                Duration::from_secs(2),
                Duration::from_millis(100),
            )
            .await,
        )
        .ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&a, get_req("/report")).await.text(), "old");
    proxy.freeze_replies();
    let in_flight = spawn_request(&b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("A's invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.thaw();
    // The request that started before may have the old value.
    let _ = in_flight.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = send(&b, get_req("/report")).await;
    assert_eq!(
        after.text(),
        "new",
        "B answered {} ({}) after the invalidation notice arrived",
        after.text(),
        after.x_cache()
    );
}
