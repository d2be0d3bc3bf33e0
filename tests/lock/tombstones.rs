//! What abandoned acquisitions leave in Redis: a tombstone each, for as
//! long as its attempt could still arrive, and no longer, however busy the
//! lock stays.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::lock::{backend, over_keys};
use crate::common::redis::RedisServer;
use crate::common::ROOMY_DEADLINE;
use stampede_guard::Lock;

/// Tombstones in Redis, over every lock: members of the tombstone sets,
/// and `x:` fields of the heartbeat hashes.
fn tombstones(redis: &RedisServer) -> u64 {
    let sets = over_keys(redis, "sg:lock:*:x", "n = n + redis.call('ZCARD', k)");
    let fields = over_keys(
        redis,
        "sg:lock:*:b",
        "for _, f in ipairs(redis.call('HKEYS', k)) do \
           if string.sub(f, 1, 2) == 'x:' then n = n + 1 end \
         end",
    );
    [sets, fields]
        .iter()
        .map(|r| r.trim_start_matches(':').parse::<u64>().expect("a count"))
        .sum()
}

/// Waiters that give up on a held lock leave tombstones; while the holder
/// keeps the lock (and its keys) alive, they all go once their time passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_of_abandoned_attempts_go_while_the_lock_is_busy() {
    let redis = RedisServer::start();
    let backend = backend(&redis.url(), ROOMY_DEADLINE).await;
    let holder = Lock::new(backend.clone()).lease(Duration::from_secs(60));
    let _held = holder.acquire("busy").await.expect("the lock");
    let impatient = Lock::new(backend).wait_budget(Duration::from_millis(20));
    const WAITERS: u64 = 100;
    for _ in 0..WAITERS {
        assert!(impatient.acquire("busy").await.is_err(), "the lock is held");
    }
    // Far past any tombstone's time (a queue heartbeat), so the count does
    // not depend on the machine's speed.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left = tombstones(&redis);
    while left > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = tombstones(&redis);
    }
    assert_eq!(left, 0, "tombstones of {WAITERS} abandoned attempts remain");
    assert!(
        holder.try_acquire("busy").await.expect("redis").is_none(),
        "the lock stayed held throughout"
    );
}
