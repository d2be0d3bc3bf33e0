//! Invalidation reaches every `Vary` variant of a URL (RFC 9111 §4.1), on
//! every instance, and stays a barrier for variants nobody has seen yet: on
//! Redis (two instances, two backends on one server) and embedded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{send, until_all_differ, Origin};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::header::ACCEPT_LANGUAGE;
use http::{HeaderMap, Request};
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Notify;

/// Parks the first rebuild of the `de` variant until released.
#[derive(Clone, Default)]
struct Gate {
    de_calls: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

/// `/p` varies on Accept-Language and answers `<lang>:<call>`.
fn app(origin: &Origin, gate: &Gate, backend: Backend) -> (StampedeGuard, Router) {
    let guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(60))
        .vary([ACCEPT_LANGUAGE]);
    let (origin, gate) = (origin.clone(), gate.clone());
    let handler = move |headers: HeaderMap| {
        let (origin, gate) = (origin.clone(), gate.clone());
        async move {
            let lang = headers
                .get(ACCEPT_LANGUAGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            let (n, _running) = origin.enter();
            if lang == "de" && gate.de_calls.fetch_add(1, Ordering::SeqCst) == 0 {
                gate.entered.notify_one();
                gate.release.notified().await;
            }
            format!("{lang}:{n}")
        }
    };
    let router = Router::new().route("/p", get(handler).layer(guard.clone()));
    (guard, router)
}

/// A request that names its host: guards on one backend (the embedded
/// stand-in for two instances) share its entries.
fn req(lang: Option<&str>) -> Request<Body> {
    let mut b = Request::get("/p").header("host", "shop.test");
    if let Some(lang) = lang {
        b = b.header(ACCEPT_LANGUAGE, lang);
    }
    b.body(Body::empty()).unwrap()
}

const LANGS: [Option<&str>; 3] = [Some("en"), Some("fr"), None];

async fn texts(app: &Router) -> Vec<String> {
    let mut out = Vec::new();
    for lang in LANGS {
        out.push(send(app, req(lang)).await.text());
    }
    out
}

/// Every variant rebuilds after one invalidation, on both instances, and
/// the second instance then shares the first's new entries.
async fn all_variants_rebuild(a: Backend, b: Backend) {
    let origin = Origin::default();
    let gate = Gate::default();
    let (guard_a, app_a) = app(&origin, &gate, a);
    let (_, app_b) = app(&origin, &gate, b);
    let old = texts(&app_a).await;
    assert_eq!(old, ["en:1", "fr:2", "none:3"]);
    // The second instance holds the same entries (from Redis, or its own
    // when embedded).
    let old_b = texts(&app_b).await;
    let shared = origin.calls() == 3;

    guard_a
        .invalidate(&req(Some("en")))
        .await
        .expect("invalidated");
    let new_a = texts(&app_a).await;
    for (new, old) in new_a.iter().zip(&old) {
        assert_ne!(new, old, "every variant of the URL was dropped here");
    }
    let calls = origin.calls();
    let new_b = until_all_differ(&old_b, || texts(&app_b)).await;
    for (new, old) in new_b.iter().zip(&old_b) {
        assert_ne!(new, old, "every variant was dropped on the other instance");
    }
    if shared {
        assert_eq!(new_b, new_a, "the other instance reads the new entries");
        assert_eq!(origin.calls(), calls, "and rebuilds none itself");
        assert_eq!(origin.calls(), 6);
    }
}

/// A rebuild of a variant nobody has cached yet, running while the URL is
/// invalidated (through another variant), stores nothing: the next request
/// for that variant, on either instance, gets a value built afterwards.
async fn a_running_rebuild_of_an_unseen_variant_cannot_store(a: Backend, b: Backend) {
    let origin = Origin::default();
    let gate = Gate::default();
    let (_, app_a) = app(&origin, &gate, a);
    let (guard_b, app_b) = app(&origin, &gate, b);
    let parked = {
        let app = app_a.clone();
        tokio::spawn(async move { send(&app, req(Some("de"))).await })
    };
    gate.entered.notified().await;
    guard_b
        .invalidate(&req(Some("en")))
        .await
        .expect("invalidated");
    gate.release.notify_one();
    let old = parked.await.unwrap().text();
    assert_eq!(old, "de:1", "the waiting request may still get it");
    for app in [&app_a, &app_b] {
        let after = send(app, req(Some("de"))).await.text();
        assert_ne!(after, old, "the old value was stored");
    }
    assert!(origin.calls() >= 2);
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    #[tokio::test]
    async fn invalidation_reaches_every_variant_on_every_instance() {
        let redis = RedisServer::start();
        all_variants_rebuild(connect(&redis).await, connect(&redis).await).await;
    }

    #[tokio::test]
    async fn an_unseen_variants_rebuild_is_fenced_by_the_urls_invalidation() {
        let redis = RedisServer::start();
        a_running_rebuild_of_an_unseen_variant_cannot_store(
            connect(&redis).await,
            connect(&redis).await,
        )
        .await;
    }

    /// An attacker cannot keep an old variant alive by asking for it again
    /// and again right after the invalidation: Redis holds it under the old
    /// generation, and no instance takes it back.
    #[tokio::test]
    async fn redis_never_hands_back_an_invalidated_variant() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let gate = Gate::default();
        let (guard_a, app_a) = app(&origin, &gate, connect(&redis).await);
        let old = texts(&app_a).await;
        guard_a.invalidate(&req(None)).await.expect("invalidated");
        // A cold instance asks Redis only.
        let (_, cold) = app(&origin, &gate, connect(&redis).await);
        let fresh = texts(&cold).await;
        for (new, old) in fresh.iter().zip(&old) {
            assert_ne!(new, old, "Redis served a variant of the old generation");
        }
        assert_eq!(origin.calls(), 6);
        // Generation and values share the URL's hash tag (one cluster slot).
        let group = guard_a.key_for(&req(Some("en"))).unwrap().group();
        let count = |pattern: String| {
            redis.raw(&["EVAL", "return #redis.call('KEYS', ARGV[1])", "0", &pattern])
        };
        assert_eq!(count(format!("sg:{{{group}}}:*:v")), ":3");
        assert_eq!(count(format!("sg:{{{group}}}:g")), ":1");
    }
}

#[cfg(feature = "redis")]
mod generation_lost {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    /// Deletes every group generation, as eviction or a restart would.
    fn evict_generations(redis: &RedisServer) -> String {
        redis.raw(&[
            "EVAL",
            "local n = 0; for _, k in ipairs(redis.call('KEYS', '*:g')) do \
             n = n + redis.call('DEL', k) end; return n",
            "0",
        ])
    }

    /// A lost generation never brings back a variant stored under an older
    /// one: the `fr` variant left over from before an invalidation stays
    /// gone, and a lost generation voids the current ones too (a miss, never
    /// an old value).
    #[tokio::test]
    async fn a_lost_generation_revives_nothing() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let gate = Gate::default();
        let (guard, app_a) = app(&origin, &gate, connect(&redis).await);
        let old = texts(&app_a).await;
        guard
            .invalidate(&req(Some("en")))
            .await
            .expect("invalidated");
        // Only `en` is rebuilt: `fr` and the default stay in Redis under
        // the old generation.
        let en = send(&app_a, req(Some("en"))).await.text();
        assert_ne!(en, old[0]);
        assert_eq!(evict_generations(&redis), ":1");
        // A cold instance asks Redis.
        let (_, cold) = app(&origin, &gate, connect(&redis).await);
        let now = texts(&cold).await;
        for (new, old) in now.iter().zip(&old) {
            assert_ne!(new, old, "an invalidated variant came back");
        }
        assert_ne!(now[0], en, "an entry of a lost generation is a miss");
    }
}

/// On a cluster, a URL's variants and its generation share one slot, so
/// every script still touches one slot only.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_on_a_cluster() {
    let cluster = crate::common::cluster::Cluster::start(3, 0);
    let connect = || async {
        Backend::redis_cluster_builder(cluster.urls())
            .connect()
            .await
            .expect("cluster backend")
    };
    all_variants_rebuild(connect().await, connect().await).await;
    a_running_rebuild_of_an_unseen_variant_cannot_store(connect().await, connect().await).await;
}

#[tokio::test]
async fn embedded_invalidation_reaches_every_variant() {
    let backend = Backend::local();
    all_variants_rebuild(backend.clone(), backend).await;
}

#[tokio::test]
async fn embedded_unseen_variants_rebuild_is_fenced() {
    let backend = Backend::local();
    a_running_rebuild_of_an_unseen_variant_cannot_store(backend.clone(), backend).await;
}

/// The scheme of an absolute-form target and the forwarding headers select
/// variants of the URL: a request with only the path and host drops them
/// all, and so does a write to the URL.
#[tokio::test]
async fn schemes_and_forwarding_headers_are_variants_of_the_url() {
    let origin = Origin::default();
    let o = origin.clone();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let handler = move || {
        let o = o.clone();
        async move { format!("v{}", o.enter().0) }
    };
    let app = Router::new().route(
        "/s",
        get(handler.clone()).post(handler).layer(guard.clone()),
    );
    let requests = || {
        let with = |uri: &str, forwarded: Option<&str>| {
            let mut b = Request::get(uri).header("host", "a.test");
            if let Some(proto) = forwarded {
                b = b.header("x-forwarded-proto", proto);
            }
            b.body(Body::empty()).unwrap()
        };
        [
            with("/s", None),
            with("http://a.test/s", None),
            with("https://a.test/s", None),
            with("/s", Some("https")),
        ]
    };
    let mut first = Vec::new();
    for r in requests() {
        first.push(send(&app, r).await.text());
    }
    assert_eq!(first, ["v1", "v2", "v3", "v4"], "four entries");
    for r in requests() {
        assert_eq!(send(&app, r).await.x_cache(), "HIT");
    }
    let plain = || {
        Request::get("/s")
            .header("host", "a.test")
            .body(Body::empty())
            .unwrap()
    };
    guard.invalidate(&plain()).await.expect("invalidated");
    for r in requests() {
        assert_eq!(send(&app, r).await.x_cache(), "MISS", "a variant survived");
    }
    let post = Request::post("/s")
        .header("host", "a.test")
        .body(Body::empty())
        .unwrap();
    send(&app, post).await;
    for r in requests() {
        assert_eq!(
            send(&app, r).await.x_cache(),
            "MISS",
            "a write left a variant"
        );
    }
}
