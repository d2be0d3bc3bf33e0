//! Attacks on when an invalidation takes effect across a fleet: the moment
//! `invalidate` (or an unsafe method's response) returns, a rebuild stalled
//! past its lease, and a revalidation whose 304 arrives after the
//! invalidation. Real redis-servers; tests that fail here document a promise
//! that does not hold.
#![cfg(feature = "redis")]

use crate::common::fleet::backend_at;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::driver::{versioned_app, Versioned};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, read_until, send, Answer};
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{ETAG, IF_NONE_MATCH};
use http::{Method, Request};
use stampede_guard::StampedeGuard;
use tokio::sync::Notify;

// ---------------------------------------------------------------------------
// Promise 1: "after invalidate returns (Ok), no instance ever answers a value
// committed before it". Round after round: B holds the value in its L1, A
// invalidates, and B is asked the moment A's call returns.
// ---------------------------------------------------------------------------

/// `/report`: answers the current version.
fn version_app(version: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let (r, w) = (version.clone(), version.clone());
    Router::new().route(
        "/report",
        get(move || {
            let r = r.clone();
            async move { format!("v{}", r.load(Ordering::SeqCst)) }
        })
        .post(move || {
            let w = w.clone();
            async move {
                w.fetch_add(1, Ordering::SeqCst);
                "written"
            }
        })
        .layer(guard.ttl(Duration::from_secs(60))),
    )
}

const ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_sees_an_invalidation_as_soon_as_it_returns() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let _a = version_app(&version, a_guard.clone());
    let b = version_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    let mut stale = Vec::new();
    for round in 1..=ROUNDS {
        assert_eq!(
            send(&b, get_req("/report")).await.text(),
            format!("v{round}")
        );
        version.store(round + 1, Ordering::SeqCst);
        a_guard
            .invalidate(&get_req("/report"))
            .await
            .expect("invalidated");
        let seen = send(&b, get_req("/report")).await;
        if seen.text() != format!("v{}", round + 1) {
            stale.push(format!(
                "round {round}: {} ({})",
                seen.text(),
                seen.x_cache()
            ));
            // Let the notice land before the next round.
            read_until(&b, &format!("v{}", round + 1), 50).await;
        }
    }
    assert!(
        stale.is_empty(),
        "B answered a value invalidated before the call returned in {} of {ROUNDS} rounds: {stale:?}",
        stale.len()
    );
}

// ---------------------------------------------------------------------------
// Promise 2: a client that wrote through A reads its write through B at
// once ("invalidate their target's group on every instance before the
// response returns").
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_one_instance_is_read_back_at_once_through_another() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let a = version_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    let b = version_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    let mut stale = Vec::new();
    for round in 1..=ROUNDS {
        assert_eq!(
            send(&b, get_req("/report")).await.text(),
            format!("v{round}")
        );
        let wrote = send(
            &a,
            Request::builder()
                .method(Method::POST)
                .uri("/report")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(wrote.text(), "written");
        let seen = send(&b, get_req("/report")).await;
        if seen.text() != format!("v{}", round + 1) {
            stale.push(format!(
                "round {round}: {} ({})",
                seen.text(),
                seen.x_cache()
            ));
            read_until(&b, &format!("v{}", round + 1), 50).await;
        }
    }
    assert!(
        stale.is_empty(),
        "the writer did not read its write through B in {} of {ROUNDS} rounds: {stale:?}",
        stale.len()
    );
}

// ---------------------------------------------------------------------------
// Promise 1/5: an instance stalled mid-rebuild (its link frozen, as under
// SIGSTOP) past its lease; meanwhile A invalidates and C rebuilds and commits
// the new value. B's late commit (held in the frozen link, delivered at the
// thaw) must be refused, and nothing old may be served afterwards.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_rebuild_past_its_lease_cannot_commit_over_an_invalidation() {
    let redis = RedisServer::start();
    let v = Versioned::new(); // the first call (B's) reads "old", then parks
    let lease = Duration::from_millis(300);
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await)
        .ttl(Duration::from_secs(60))
        .lease(lease);
    let a = versioned_app(&v, a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b_backend = backend_at(&proxy.url(), Duration::from_millis(200)).await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(b_backend.clone())
            .ttl(Duration::from_secs(60))
            .lease(lease),
    );
    let parked = {
        let b = b.clone();
        tokio::spawn(async move { send(&b, get_req("/report")).await })
    };
    v.entered.notified().await;
    proxy.freeze();
    // B's lease lapses (its renewals are held in the frozen link).
    tokio::time::sleep(lease * 3).await;
    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    let c = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await)
            .ttl(Duration::from_secs(60))
            .lease(lease),
    );
    assert_eq!(send(&c, get_req("/report")).await.text(), "new");
    // B's rebuild ends while frozen: its commit goes into the held link.
    v.release.notify_one();
    assert_eq!(parked.await.unwrap().text(), "old");
    proxy.thaw();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let fresh = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await),
    );
    assert_eq!(
        send(&fresh, get_req("/report")).await.text(),
        "new",
        "Redis holds the new value"
    );
    assert_eq!(send(&a, get_req("/report")).await.text(), "new");
    assert_eq!(send(&c, get_req("/report")).await.text(), "new");
    let after = read_until(&b, "new", 50).await;
    assert_eq!(after.text(), "new", "B: {}", after.x_cache());
}

// ---------------------------------------------------------------------------
// Promise 4: a 304 that arrives after an invalidation does not resurrect the
// invalidated body, on the revalidating instance or anywhere else.
// ---------------------------------------------------------------------------

/// `/report` with an ETag per version; a conditional request for the
/// current tag is answered 304. With `park` set, the next conditional
/// request decides its answer, then parks until released.
#[derive(Clone, Default)]
struct Tagged {
    body: Arc<Mutex<&'static str>>,
    park: Arc<AtomicBool>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
    not_modified: Arc<AtomicUsize>,
}

impl Tagged {
    fn app(&self, guard: StampedeGuard) -> Router {
        let o = self.clone();
        let handler = move |headers: HeaderMap| {
            let o = o.clone();
            async move {
                let body = *o.body.lock().unwrap();
                let tag = format!("\"{body}\"");
                let unchanged = headers.get(IF_NONE_MATCH).is_some_and(|t| *t == *tag);
                if headers.contains_key(IF_NONE_MATCH) && o.park.swap(false, Ordering::SeqCst) {
                    o.entered.notify_one();
                    o.release.notified().await;
                }
                if unchanged {
                    o.not_modified.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::NOT_MODIFIED, [(ETAG, tag)]).into_response()
                } else {
                    (StatusCode::OK, [(ETAG, tag)], body).into_response()
                }
            }
        };
        Router::new().route(
            "/report",
            get(handler).layer(
                guard
                    .ttl(Duration::from_millis(100))
                    .stale_while_revalidate(Duration::from_secs(60)),
            ),
        )
    }
}

async fn a_late_304(invalidate_on_the_revalidating_instance: bool) {
    let redis = RedisServer::start();
    let o = Tagged::default();
    *o.body.lock().unwrap() = "old";
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let a = o.app(a_guard.clone());
    let b_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let b = o.app(b_guard.clone());
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");
    tokio::time::sleep(Duration::from_millis(250)).await;
    o.park.store(true, Ordering::SeqCst);
    let stale = send(&b, get_req("/report")).await;
    assert_eq!((stale.text().as_str(), stale.x_cache()), ("old", "STALE"));
    // B's background refresh asked "old"'s tag and was told 304; before that
    // 304 lands, the data changes and the URL is invalidated.
    o.entered.notified().await;
    *o.body.lock().unwrap() = "new";
    let by = if invalidate_on_the_revalidating_instance {
        &b_guard
    } else {
        &a_guard
    };
    by.invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    tokio::time::sleep(Duration::from_millis(200)).await;
    o.release.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(o.not_modified.load(Ordering::SeqCst), 1, "the 304 was sent");
    let c = o.app(StampedeGuard::new(
        backend_at(&redis.url(), Duration::from_millis(300)).await,
    ));
    for (name, app) in [("B", &b), ("A", &a), ("C", &c)] {
        let answer = send(app, get_req("/report")).await;
        assert_eq!(
            answer.text(),
            "new",
            "{name} answered the invalidated body after a late 304 ({})",
            answer.x_cache()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_after_another_instances_invalidation_does_not_resurrect_the_body() {
    a_late_304(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_after_a_local_invalidation_does_not_resurrect_the_body() {
    a_late_304(true).await;
}

// ---------------------------------------------------------------------------
// Promise 2: a write completes while Redis stays frozen (SIGSTOP), and its
// writer reads it back on that instance; once Redis is back, so does the
// rest of the fleet.
// ---------------------------------------------------------------------------

fn store_app(version: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let (r, w) = (version.clone(), version.clone());
    Router::new().route(
        "/item",
        get(move || {
            let r = r.clone();
            async move { format!("v{}", r.load(Ordering::SeqCst)) }
        })
        .post(move || {
            let w = w.clone();
            async move {
                w.fetch_add(1, Ordering::SeqCst);
                "written"
            }
        })
        .layer(guard.ttl(Duration::from_secs(60))),
    )
}

async fn item(app: &Router, method: Method) -> Answer {
    send(
        app,
        Request::builder()
            .method(method)
            .uri("/item")
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_completes_while_redis_is_frozen_and_is_read_back() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let a = store_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await),
    );
    let b = store_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await),
    );
    assert_eq!(item(&a, Method::GET).await.text(), "v1");
    assert_eq!(item(&b, Method::GET).await.text(), "v1");
    redis.freeze();
    // A guard against a hang only: the write must come back while Redis
    // stays frozen.
    let wrote = tokio::time::timeout(Duration::from_secs(30), item(&a, Method::POST)).await;
    let own = match &wrote {
        Ok(_) => Some(
            tokio::time::timeout(Duration::from_secs(30), item(&a, Method::GET))
                .await
                .map(|a| a.text()),
        ),
        Err(_) => None,
    };
    redis.thaw();
    let wrote = wrote.expect("the write came back while Redis was frozen");
    assert_eq!(wrote.status, 200);
    assert_eq!(wrote.text(), "written");
    assert_eq!(
        own.unwrap()
            .expect("the read came back while Redis was frozen"),
        "v2",
        "the writer reads its write on the same instance"
    );
}

// ---------------------------------------------------------------------------
// Promise 1: Redis restarts empty; an invalidation right after it (while B's
// subscriber may still be reconnecting) still reaches B's copy.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_right_after_an_empty_restart_reaches_every_instance() {
    let mut redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await);
    let a = version_app(&version, a_guard.clone());
    let b = version_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(200)).await),
    );
    for round in 1..=3 {
        assert_eq!(
            read_until(&b, &format!("v{round}"), 50).await.text(),
            format!("v{round}")
        );
        redis.restart();
        version.store(round + 1, Ordering::SeqCst);
        // The first tries may meet the restart; the caller retries until Ok.
        let mut ok = false;
        for _ in 0..50 {
            if a_guard.invalidate(&get_req("/report")).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "the invalidation reached the restarted Redis");
        let want = format!("v{}", round + 1);
        assert_eq!(send(&a, get_req("/report")).await.text(), want);
        let after = read_until(&b, &want, 50).await;
        assert_eq!(after.text(), want, "round {round}: B {}", after.x_cache());
    }
}

// ---------------------------------------------------------------------------
// Promise 2: a write whose invalidation could not reach Redis (the writer's
// link froze, then its connections died) still succeeds; the client must
// then read its write afterwards, on the writer's instance and on another,
// once Redis is reachable again.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_invalidation_was_lost_is_still_read_back() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let before = redis.client_ids();
    let proxy = Proxy::start(redis.port()).await;
    let a = version_app(
        &version,
        StampedeGuard::new(backend_at(&proxy.url(), Duration::from_millis(100)).await),
    );
    let a_clients: Vec<String> = redis
        .client_ids()
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    assert!(!a_clients.is_empty());
    let b = version_app(
        &version,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await),
    );
    assert_eq!(send(&a, get_req("/report")).await.text(), "v1");
    assert_eq!(send(&b, get_req("/report")).await.text(), "v1");

    proxy.freeze();
    let wrote = tokio::time::timeout(
        Duration::from_secs(30),
        send(
            &a,
            Request::builder()
                .method(Method::POST)
                .uri("/report")
                .body(Body::empty())
                .unwrap(),
        ),
    )
    .await
    .expect("the write came back while A's link was frozen");
    assert_eq!(wrote.text(), "written");
    // A's connections die while the invalidation is still held in the link.
    for id in &a_clients {
        redis.raw(&["CLIENT", "KILL", "ID", id]);
    }
    proxy.thaw();
    let on_a = read_until(&a, "v2", 50).await;
    let on_b = read_until(&b, "v2", 50).await;
    assert_eq!(
        (on_a.text().as_str(), on_b.text().as_str()),
        ("v2", "v2"),
        "5 s after the link came back the writer reads {} on A ({}) and {} on B ({})",
        on_a.text(),
        on_a.x_cache(),
        on_b.text(),
        on_b.x_cache()
    );
}
