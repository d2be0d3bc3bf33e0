//! What a cached key leaves in Redis once its entry is gone: nothing.
//! Fencing numbers and generations live no longer than the entry they
//! guard plus its lease; a key churned through the cache, rebuilt,
//! invalidated or never cached at all leaves no per-key state behind.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::fleet::{backend_at, instance};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Origin, ROOMY_DEADLINE};
use stampede_guard::Cache;

/// Distinct keys churned through the generic cache.
const KEYS: usize = 3_000;
/// Distinct URLs churned through the layer, each in two variants.
const URLS: usize = 500;
/// Requests in flight at once.
const WORKERS: usize = 32;
/// How long the test waits for the state to go: far longer than any entry
/// (ttl 1 s + 1 s stale) and its lease, so the count does not depend on
/// the machine's speed.
const LIMIT: Duration = Duration::from_secs(30);
/// Stragglers allowed to remain.
const HANDFUL: usize = 5;

const TTL: Duration = Duration::from_secs(1);
const STALE: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(2);

/// The keys of cached entries in Redis: every key with a hash tag (the
/// fleet's membership and the invalidation table are the namespace's own).
fn entry_keys(redis: &RedisServer) -> usize {
    let reply = redis.raw(&[
        "EVAL",
        "local n, cursor = 0, '0' \
         repeat \
           local r = redis.call('SCAN', cursor, 'COUNT', 1000) \
           cursor = r[1] \
           for _, k in ipairs(r[2]) do \
             if string.find(k, '{', 1, true) then n = n + 1 end \
           end \
         until cursor == '0' \
         return n",
        "0",
    ]);
    reply
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("a count, not {reply:?}"))
}

/// Thousands of keys cached with a short lifetime, some rebuilt, some
/// invalidated, some invalidated without ever being cached, through the
/// generic cache and the layer: once every entry and lease has lapsed, no
/// more than a handful of their keys remain in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_of_short_lived_keys_leaves_no_state_in_redis() {
    let redis = RedisServer::start();
    let backend = backend_at(&redis.url(), ROOMY_DEADLINE).await;
    let cache = Cache::<String>::new(backend.clone())
        .ttl(TTL)
        .stale_while_revalidate(STALE)
        .lease(LEASE);
    let origin = Origin::default();
    let site = instance(backend, &origin, Duration::ZERO, |g| {
        g.ttl(TTL)
            .stale_while_revalidate(STALE)
            .lease(LEASE)
            .vary([http::header::ACCEPT_LANGUAGE])
    });

    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let cache = cache.clone();
            let app = site.app.clone();
            tokio::spawn(async move {
                for i in (w..KEYS).step_by(WORKERS) {
                    let key = format!("churn:{i}");
                    let value = cache
                        .get_or_rebuild(&key, move || async move {
                            Ok::<_, std::io::Error>(format!("v{i}"))
                        })
                        .await
                        .expect("rebuilt");
                    assert_eq!(value, format!("v{i}"));
                    // Every tenth key is purged once cached, every tenth
                    // (another) one before it ever was.
                    match i % 10 {
                        0 => cache.invalidate(&key).await.expect("invalidate"),
                        5 => cache
                            .invalidate(format!("never:{i}"))
                            .await
                            .expect("invalidate"),
                        _ => {}
                    }
                }
                for i in (w..URLS).step_by(WORKERS) {
                    for language in ["en", "fr"] {
                        let mut request = get_req(&format!("/report/{i}"));
                        request.headers_mut().insert(
                            http::header::ACCEPT_LANGUAGE,
                            http::HeaderValue::from_static(language),
                        );
                        assert_eq!(send(&app, request).await.status, 200);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    let churned = entry_keys(&redis);

    let deadline = Instant::now() + LIMIT;
    let mut left = churned;
    while left > HANDFUL && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = entry_keys(&redis);
    }
    assert!(
        left <= HANDFUL,
        "{left} keys of {KEYS} entries and {URLS} URLs ({churned} right after the churn) \
         were still in Redis {LIMIT:?} after the churn"
    );
    // They went by expiry: every entry the churn stored (its value, marker,
    // fence hash and generation; an invalidated one keeps the last two).
    let expired = stat(&redis, "expired_keys");
    assert!(
        expired >= 2 * KEYS,
        "{expired} keys expired; the churn stored {KEYS} entries"
    );
}

/// A counter of `INFO stats`.
fn stat(redis: &RedisServer, name: &str) -> usize {
    let info = redis.raw(&["INFO", "stats"]);
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in INFO stats"))
}
