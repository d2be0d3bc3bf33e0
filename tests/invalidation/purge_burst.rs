//! A burst of purges on a healthy fleet, on real Redis: three instances
//! with the default settings, many distinct warm keys, every key purged at
//! once (each from one of the instances).
//!
//! - every purge is confirmed by the fleet's acknowledgements: none falls
//!   back to waiting out the subscription lease, however many purges are
//!   in flight together (their acknowledgements and the reads that check
//!   them are batched, not queued one per purge);
//! - once a purge returned, no instance serves the value it held before.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::Boom;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, Cache};

/// How many keys are purged at once.
const PURGES: usize = 1_000;

/// How many instances make up the fleet.
const INSTANCES: usize = 3;

fn unconfirmed(backend: &Backend) -> u64 {
    backend
        .stats()
        .redis
        .expect("a redis tier")
        .unconfirmed_invalidations
}

fn key(i: usize) -> String {
    format!("item-{i}")
}

/// The value of `key` on `cache`, rebuilt as `v<version>` on a miss.
async fn value(cache: &Cache<String>, version: &Arc<AtomicU64>, key: String) -> String {
    let version = version.clone();
    cache
        .get_or_rebuild(key, move || async move {
            Ok::<_, Boom>(format!("v{}", version.load(Ordering::SeqCst)))
        })
        .await
        .expect("the rebuild succeeds")
}

/// Waits until the fleet's membership is older than a subscription lease
/// (3 s) on Redis's clock: a purge on a younger one waits a whole lease
/// whatever the acknowledgements say.
async fn membership_grown(redis: &RedisServer) {
    let script = "local t = redis.call('TIME') \
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
        local born = tonumber(redis.call('ZSCORE', KEYS[1], 'born') or '') \
        if born == nil then return -1 end \
        return tostring(now - born)";
    for _ in 0..1_000 {
        let age: i64 = redis
            .raw(&["EVAL", script, "1", "sg:members"])
            .trim()
            .parse()
            .expect("an age");
        if age > 3_500 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the fleet's membership never grew a lease old");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_purges_is_confirmed_by_the_fleet_and_takes_effect_everywhere() {
    let redis = RedisServer::start();
    let version = Arc::new(AtomicU64::new(0));
    let mut backends = Vec::new();
    let mut caches = Vec::new();
    for _ in 0..INSTANCES {
        let backend = Backend::redis(&redis.url()).await.expect("redis backend");
        caches.push(
            Cache::<String>::new(backend.clone())
                .namespace("burst")
                .ttl(Duration::from_secs(600)),
        );
        backends.push(backend);
    }
    let caches = Arc::new(caches);

    // Every key warm in every instance's in-process tier, as `v0`: a few
    // at a time, so that warming is not itself a burst.
    for chunk in (0..PURGES).collect::<Vec<_>>().chunks(20) {
        let mut warming = Vec::new();
        for &i in chunk {
            let (caches, version) = (caches.clone(), version.clone());
            warming.push(tokio::spawn(async move {
                for cache in caches.iter() {
                    assert_eq!(value(cache, &version, key(i)).await, "v0");
                }
            }));
        }
        for task in warming {
            task.await.expect("warming task");
        }
    }
    for i in 0..PURGES {
        for cache in caches.iter() {
            if cache.get(key(i)).as_deref() != Some("v0") {
                // Held in Redis only (its L1 copy lost to a slow call):
                // taken from there again.
                assert_eq!(value(cache, &version, key(i)).await, "v0");
            }
        }
    }
    membership_grown(&redis).await;
    let before: u64 = backends.iter().map(unconfirmed).sum();
    assert_eq!(before, 0, "no purge yet");

    // Every key purged at once, each from one instance; once its purge
    // returned, no instance has the old value.
    version.store(1, Ordering::SeqCst);
    let purges: Vec<_> = (0..PURGES)
        .map(|i| {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches[i % INSTANCES]
                    .invalidate(key(i))
                    .await
                    .expect("the purge reaches redis");
                caches
                    .iter()
                    .filter(|cache| cache.get(key(i)).as_deref() == Some("v0"))
                    .count()
            })
        })
        .collect();
    let mut stale = 0;
    for purge in purges {
        stale += purge.await.expect("purge task");
    }
    let unconfirmed: Vec<u64> = backends.iter().map(unconfirmed).collect();
    assert_eq!(
        unconfirmed, [0; INSTANCES],
        "a purge on a healthy fleet fell back to waiting out the subscription lease"
    );
    assert_eq!(stale, 0, "an instance held a value from before its purge");
    for i in 0..PURGES {
        for cache in caches.iter() {
            assert_eq!(value(cache, &version, key(i)).await, "v1", "{}", key(i));
        }
    }
}
