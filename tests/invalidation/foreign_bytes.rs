//! Attacks on what the shared tier reads back: foreign bytes where a URL's
//! generation, value and fence hash live, and entries without a generation
//! prefix (as an earlier version wrote them). Nothing may panic, and nothing
//! invalidated may be served. Real redis-servers; tests that fail here
//! document a promise that does not hold.
#![cfg(feature = "redis")]

use crate::common::driver::variant_app;
use crate::common::fleet::{backend_at, keys_like};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::header::ACCEPT_LANGUAGE;
use http::Request;
use stampede_guard::StampedeGuard;

// ---------------------------------------------------------------------------
// Promise 5: foreign bytes where the generation, the value and the fence
// hash live. Nothing panics, every request is answered by the origin's body,
// and the instance keeps its shared tier.
// ---------------------------------------------------------------------------

fn counting_app(calls: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let calls = calls.clone();
    Router::new().route(
        "/report",
        get(move || {
            let calls = calls.clone();
            async move { format!("v{}", calls.fetch_add(1, Ordering::SeqCst) + 1) }
        })
        .layer(guard.ttl(Duration::from_secs(60))),
    )
}

/// Writes `value` at the URL's generation, value or fence key, then reads
/// and invalidates; returns whether the invalidation succeeded.
async fn corrupt(kind: &str, value: &str) -> (bool, bool) {
    let redis = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let backend = guard.backend().clone();
    let a = counting_app(&calls, guard.clone());
    assert_eq!(send(&a, get_req("/report")).await.text(), "v1");
    let key = keys_like(&redis, &format!("*:{kind}"));
    assert_eq!(key.len(), 1, "{kind}: {key:?}");
    match kind {
        "n" => {
            redis.raw(&["HSET", &key[0], "next", value]);
            redis.raw(&["HSET", &key[0], "committed", value]);
        }
        _ => {
            redis.raw(&["SET", &key[0], value]);
        }
    }
    for _ in 0..10 {
        // Fresh instances, so each asks Redis.
        let b = counting_app(
            &calls,
            StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
        );
        for _ in 0..3 {
            let answer = send(&b, get_req("/report")).await;
            assert_eq!(answer.status, 200, "{kind}={value}");
            assert!(
                answer.text().starts_with('v'),
                "{kind}={value}: {}",
                answer.text()
            );
        }
    }
    let invalidated = guard.invalidate(&get_req("/report")).await.is_ok();
    let available = backend.stats().redis.unwrap().available;
    (invalidated, available)
}

const GARBAGE: [(&str, &str); 12] = [
    ("g", "abc"),
    ("g", "-5"),
    ("g", "99999999999999999999999999999"),
    ("g", "9223372036854775807"),
    ("g", ""),
    ("v", "12|not an entry"),
    ("v", "123456789012345678901234567890|x"),
    ("v", "abc|x"),
    ("v", "|"),
    ("n", "99999999999999999999999999999"),
    ("n", "abc"),
    ("n", "1e400"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_bytes_in_redis_never_panic() {
    for (kind, value) in GARBAGE {
        corrupt(kind, value).await;
    }
}

/// One corrupt generation key must not disable the URL's invalidation (and
/// so every unsafe method's) for good, nor cost the instance its shared
/// tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_generation_does_not_disable_invalidation() {
    let mut broken = Vec::new();
    for (kind, value) in GARBAGE {
        let (invalidated, available) = corrupt(kind, value).await;
        if !invalidated || !available {
            broken.push(format!(
                "{kind}={value}: invalidate ok {invalidated}, redis available {available}"
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

// ---------------------------------------------------------------------------
// Promise 1: an entry without a `<generation>|` prefix (the format earlier
// versions wrote; "entries written by earlier versions are rebuilt once")
// must not outlive an invalidation of its URL through another variant.
// ---------------------------------------------------------------------------

fn lang_req(lang: Option<&str>) -> Request<Body> {
    let mut b = Request::get("/report");
    if let Some(lang) = lang {
        b = b.header(ACCEPT_LANGUAGE, lang);
    }
    b.body(Body::empty()).unwrap()
}

const LANGS: [Option<&str>; 4] = [Some("en"), Some("fr"), Some("de"), None];

/// Strips the generation prefix of every stored value, keeping its TTL.
fn strip_generations(redis: &RedisServer) -> usize {
    let reply = redis.raw(&[
        "EVAL",
        "local n = 0; for _, k in ipairs(redis.call('KEYS', '*:v')) do \
         local v = redis.call('GET', k); local i = string.find(v, '|', 1, true); \
         if i then redis.call('SET', k, string.sub(v, i + 1), 'KEEPTTL'); n = n + 1 end end; \
         return n",
        "0",
    ]);
    reply.trim_start_matches(':').parse().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_without_a_generation_does_not_outlive_an_invalidation() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let a_guard = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await);
    let a = variant_app(&version, &calls, a_guard.clone());
    for lang in LANGS {
        send(&a, lang_req(lang)).await;
    }
    assert_eq!(strip_generations(&redis), 4);
    version.store(2, Ordering::SeqCst);
    a_guard
        .invalidate(&lang_req(Some("en")))
        .await
        .expect("invalidated");
    let c = variant_app(
        &version,
        &calls,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    let mut seen = Vec::new();
    for lang in LANGS {
        let answer = send(&c, lang_req(lang)).await;
        seen.push(format!("{} ({})", answer.text(), answer.x_cache()));
    }
    assert!(
        seen.iter().all(|s| s.contains(":2")),
        "a fresh instance served pre-invalidation variants: {seen:?}"
    );
}

/// An entry without a generation is rebuilt (once), not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_without_a_generation_is_rebuilt_not_served() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicUsize::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let a = variant_app(
        &version,
        &calls,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    send(&a, lang_req(None)).await;
    assert_eq!(strip_generations(&redis), 1);
    version.store(2, Ordering::SeqCst);
    let c = variant_app(
        &version,
        &calls,
        StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(300)).await),
    );
    let answer = send(&c, lang_req(None)).await;
    assert_eq!(answer.text(), "none:2", "served as {}", answer.x_cache());
    assert_eq!(send(&c, lang_req(None)).await.text(), "none:2");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "rebuilt once");
}
