//! Attacks on group invalidation (every variant of a URL through one
//! generation key), hit-for-miss windows and unsafe-method invalidation,
//! with real faults against real redis-servers: a frozen link, a killed
//! subscriber, evicted generation keys, CLIENT PAUSE, a frozen server under
//! a write, and foreign bytes where the generation and fence live. Tests
//! that fail here document a promise that does not hold.
#![cfg(feature = "redis")]

use crate::common::fleet::{backend_at, evict, keys_like};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::driver::variant_app;
use crate::common::driver::{versioned_app, Versioned};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, read_until, send};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{ACCEPT_LANGUAGE, SET_COOKIE};
use http::{HeaderMap, Request};
use stampede_guard::StampedeGuard;
use tokio::sync::Notify;

// ---------------------------------------------------------------------------
// Promise 1: an instance whose link to Redis is frozen (bytes stop both
// ways, the connection stays open) cannot hear an invalidation. Once its
// keepalive has found the subscriber silent it knows it may have missed
// some; it must not go on answering its pre-invalidation copy from the L1.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_does_not_serve_an_invalidated_copy_for_ever() {
    let redis = RedisServer::start();
    let v = Versioned::unparked();
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
        .ttl(Duration::from_secs(60));
    let a = versioned_app(&v, a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&proxy.url(), Duration::from_millis(100)).await)
            .ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");
    assert_eq!(send(&b, get_req("/report")).await.x_cache(), "HIT");

    proxy.freeze();
    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("A's invalidation reached Redis");
    assert_eq!(send(&a, get_req("/report")).await.text(), "new");
    // Three keepalives: B has pinged its subscriber, got no answer, marked
    // the gap, and failed to subscribe again.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let after = send(&b, get_req("/report")).await;
    proxy.thaw();
    assert_eq!(
        after.text(),
        "new",
        "3.5 s after A's invalidation returned, B (link frozen, subscriber known \
         silent) still answers the invalidated copy ({})",
        after.x_cache()
    );
}

/// The same instance, once its link thaws, drops the copy (the held
/// message arrives, or the resubscription after the gap flushes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_drops_the_invalidated_copy_once_thawed() {
    let redis = RedisServer::start();
    let v = Versioned::unparked();
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
        .ttl(Duration::from_secs(60));
    let proxy = Proxy::start(redis.port()).await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&proxy.url(), Duration::from_millis(100)).await)
            .ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");
    proxy.freeze();
    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.thaw();
    let after = read_until(&b, "new", 50).await;
    assert_eq!(after.text(), "new", "B answered {}", after.x_cache());
}

// ---------------------------------------------------------------------------
// Promise 1: a rebuild frozen mid-flight (its instance's link frozen while
// the origin answers) began before the invalidation: neither its L1 copy
// nor its commit may outlive the thaw.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_frozen_mid_flight_does_not_outlive_the_invalidation() {
    let redis = RedisServer::start();
    let v = Versioned::new(); // B's first call parks after reading "old"
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
        .ttl(Duration::from_secs(60));
    let a = versioned_app(&v, a_guard.clone());
    let proxy = Proxy::start(redis.port()).await;
    let b = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&proxy.url(), Duration::from_millis(100)).await)
            .ttl(Duration::from_secs(60)),
    );
    let parked = {
        let b = b.clone();
        tokio::spawn(async move { send(&b, get_req("/report")).await })
    };
    v.entered.notified().await;
    proxy.freeze();
    v.switch();
    a_guard
        .invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    v.release.notify_one();
    assert_eq!(
        parked.await.unwrap().text(),
        "old",
        "its waiter may have it"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.thaw();
    let after = read_until(&b, "new", 50).await;
    assert_eq!(after.text(), "new", "B answered {}", after.x_cache());
    // Nothing old reached Redis: a fresh instance and A read the new value.
    let c = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
            .ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&c, get_req("/report")).await.text(), "new");
    assert_eq!(send(&a, get_req("/report")).await.text(), "new");
}

// ---------------------------------------------------------------------------
// Promise 1: a lost pub/sub message: B's subscriber is killed just before
// the publish; B must drop its copy once it is subscribed again.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_lost_to_a_killed_subscriber_is_made_up_for() {
    let redis = RedisServer::start();
    let v = Versioned::unparked();
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
        .ttl(Duration::from_secs(60));
    let b = versioned_app(
        &v,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(100)).await)
            .ttl(Duration::from_secs(60)),
    );
    assert_eq!(send(&b, get_req("/report")).await.text(), "old");
    for round in 0..3 {
        v.switch();
        *v.current.lock().unwrap() = ["new", "newer", "newest"][round];
        redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        a_guard
            .invalidate(&get_req("/report"))
            .await
            .expect("invalidated");
        let want = ["new", "newer", "newest"][round];
        let after = read_until(&b, want, 50).await;
        assert_eq!(
            after.text(),
            want,
            "round {round}: B answered {}",
            after.x_cache()
        );
    }
}

// ---------------------------------------------------------------------------
// Promise 1: every variant, the generation key evicted (before and after the
// invalidation), and CLIENT PAUSE during the invalidation. A fresh instance
// reads only what Redis says.
// ---------------------------------------------------------------------------

fn lang_req(uri: &str, lang: Option<&str>) -> Request<Body> {
    let mut b = Request::get(uri);
    if let Some(lang) = lang {
        b = b.header(ACCEPT_LANGUAGE, lang);
    }
    b.body(Body::empty()).unwrap()
}

const LANGS: [Option<&str>; 4] = [Some("en"), Some("fr"), Some("de"), None];

async fn variant_texts(app: &Router) -> Vec<String> {
    let mut out = Vec::new();
    for lang in LANGS {
        out.push(send(app, lang_req("/report", lang)).await.text());
    }
    out
}

async fn variants_after_generation_loss(evict_before: bool, evict_after: bool, pause: bool) {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let a = variant_app(&version, &calls, a_guard.clone());
    assert_eq!(variant_texts(&a).await, ["en:1", "fr:1", "de:1", "none:1"]);
    assert_eq!(
        keys_like(&redis, "*:g").len(),
        1,
        "one generation for the URL"
    );
    if evict_before {
        assert_eq!(evict(&redis, "*:g"), 1);
    }
    version.store(2, Ordering::SeqCst);
    if pause {
        redis.raw(&["CLIENT", "PAUSE", "400", "WRITE"]);
    }
    a_guard
        .invalidate(&lang_req("/report", Some("fr")))
        .await
        .expect("invalidated");
    if evict_after {
        evict(&redis, "*:g");
    }
    for _ in 0..2 {
        let c = variant_app(
            &version,
            &calls,
            StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
        );
        assert_eq!(
            variant_texts(&c).await,
            ["en:2", "fr:2", "de:2", "none:2"],
            "a fresh instance reads no pre-invalidation variant"
        );
        assert_eq!(
            variant_texts(&a).await,
            ["en:2", "fr:2", "de:2", "none:2"],
            "nor does the invalidating one"
        );
        if evict_after {
            evict(&redis, "*:g");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_stay_invalidated_when_the_generation_was_evicted_before() {
    variants_after_generation_loss(true, false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_stay_invalidated_when_the_generation_is_evicted_after() {
    variants_after_generation_loss(false, true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_are_invalidated_through_a_client_pause() {
    variants_after_generation_loss(false, false, true).await;
}

/// Real eviction: a small maxmemory under allkeys-lru, filled with junk after
/// the invalidation; whatever survives, no old variant is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_stay_invalidated_under_real_lru_eviction() {
    for policy in [
        "allkeys-lru",
        "volatile-lru",
        "volatile-ttl",
        "allkeys-random",
    ] {
        let redis = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", policy]);
        let version = Arc::new(AtomicUsize::new(1));
        let calls = Arc::new(AtomicUsize::new(0));
        let a_guard =
            StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
        let a = variant_app(&version, &calls, a_guard.clone());
        variant_texts(&a).await;
        version.store(2, Ordering::SeqCst);
        a_guard
            .invalidate(&lang_req("/report", Some("en")))
            .await
            .expect("invalidated");
        // Junk with and without a TTL, several times maxmemory.
        let blob = "x".repeat(64 * 1024);
        for i in 0..200 {
            let k = format!("junk{i}");
            if i % 2 == 0 {
                redis.raw(&["SET", &k, &blob, "PX", "600000"]);
            } else {
                redis.raw(&["SET", &k, &blob]);
            }
        }
        let c = variant_app(
            &version,
            &calls,
            StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
        );
        assert_eq!(
            variant_texts(&c).await,
            ["en:2", "fr:2", "de:2", "none:2"],
            "{policy}: no pre-invalidation variant"
        );
    }
}

/// Invalidating one URL leaves another URL's entries (and variants) alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidating_one_url_keeps_the_others() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let make = |guard: StampedeGuard| {
        let (version, calls) = (version.clone(), calls.clone());
        let handler = move |headers: HeaderMap, uri: http::Uri| {
            let (version, calls) = (version.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let lang = headers
                    .get(ACCEPT_LANGUAGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                format!("{uri}:{lang}:{}", version.load(Ordering::SeqCst))
            }
        };
        Router::new().route(
            "/{name}",
            get(handler).layer(guard.ttl(Duration::from_secs(60)).vary([ACCEPT_LANGUAGE])),
        )
    };
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let a = make(a_guard.clone());
    let uris = ["/one", "/two", "/one?x=1", "/two?x=1"];
    for uri in uris {
        for lang in LANGS {
            send(&a, lang_req(uri, lang)).await;
        }
    }
    let built = calls.load(Ordering::SeqCst);
    assert_eq!(built, 16);
    version.store(2, Ordering::SeqCst);
    a_guard
        .invalidate(&lang_req("/one", Some("en")))
        .await
        .expect("invalidated");
    let b = make(StampedeGuard::new(
        backend_at(&redis.url(), Duration::from_millis(300)).await,
    ));
    for app in [&a, &b] {
        for uri in ["/two", "/one?x=1", "/two?x=1"] {
            for lang in LANGS {
                let text = send(app, lang_req(uri, lang)).await.text();
                assert!(text.ends_with(":1"), "{uri} {lang:?} was dropped: {text}");
            }
        }
        for lang in LANGS {
            let text = send(app, lang_req("/one", lang)).await.text();
            assert!(text.ends_with(":2"), "/one {lang:?} kept: {text}");
        }
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        built + 4,
        "only /one rebuilt, once per variant"
    );
}

// ---------------------------------------------------------------------------
// Promise 3: a key marked by a cookie answer stores a shareable answer in
// the L1 only; an invalidation during that marked rebuild must keep its
// old value out, on this instance and another.
// ---------------------------------------------------------------------------

#[derive(Clone, Default)]
struct CookieThenParked {
    calls: Arc<AtomicUsize>,
    current: Arc<Mutex<&'static str>>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

/// `/report`: call 1 sets a cookie; call 2 reads the version, then parks;
/// later calls answer the version.
fn cookie_app(o: &CookieThenParked, guard: StampedeGuard) -> Router {
    let o = o.clone();
    let handler = move || {
        let o = o.clone();
        async move {
            let n = o.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let v = *o.current.lock().unwrap();
            if n == 1 {
                return ([(SET_COOKIE, "s=1")], format!("cookie-{v}")).into_response();
            }
            if n == 2 {
                o.entered.notify_one();
                o.release.notified().await;
            }
            v.to_string().into_response()
        }
    };
    Router::new().route(
        "/report",
        get(handler).layer(
            guard
                .ttl(Duration::from_secs(60))
                .hit_for_miss(Duration::from_secs(30)),
        ),
    )
}

async fn uncoalesced_rebuild_and_invalidation(other_instance: bool) {
    let redis = RedisServer::start();
    let o = CookieThenParked::default();
    *o.current.lock().unwrap() = "old";
    let b_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let b = cookie_app(&o, b_guard.clone());
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let _a = cookie_app(&o, a_guard.clone());
    assert_eq!(send(&b, get_req("/report")).await.text(), "cookie-old");
    let parked = {
        let b = b.clone();
        tokio::spawn(async move { send(&b, get_req("/report")).await })
    };
    o.entered.notified().await;
    *o.current.lock().unwrap() = "new";
    let by = if other_instance { &a_guard } else { &b_guard };
    by.invalidate(&get_req("/report"))
        .await
        .expect("invalidated");
    // Time for the notice to reach B.
    tokio::time::sleep(Duration::from_millis(300)).await;
    o.release.notify_one();
    let parked = parked.await.unwrap();
    assert_eq!(parked.text(), "old");
    assert!(
        keys_like(&redis, "*:v").is_empty(),
        "an answer in a hit-for-miss window is stored in the L1 only"
    );
    for _ in 0..3 {
        let after = send(&b, get_req("/report")).await;
        assert_eq!(
            after.text(),
            "new",
            "the uncoalesced rebuild stored its pre-invalidation answer ({})",
            after.x_cache()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncoalesced_rebuild_does_not_store_over_a_local_invalidation() {
    uncoalesced_rebuild_and_invalidation(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncoalesced_rebuild_does_not_store_over_another_instances_invalidation() {
    uncoalesced_rebuild_and_invalidation(true).await;
}
