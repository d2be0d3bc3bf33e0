//! Helpers for the lock's fault tests: a backend with a chosen deadline, and
//! what Redis holds for the locks.

use std::time::Duration;

use stampede_guard::{Backend, FencingToken, Lock};

use super::redis::RedisServer;

pub async fn backend(url: &str, deadline: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(deadline)
        .connect()
        .await
        .expect("redis backend")
}

/// Runs a Lua snippet over the keys matching `pattern` and returns the reply.
pub fn over_keys(redis: &RedisServer, pattern: &str, body: &str) -> String {
    let script = format!(
        "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do {body} end return n"
    );
    redis.raw(&["EVAL", &script, "0", pattern])
}

/// How many locks are held.
pub fn held_locks(redis: &RedisServer) -> String {
    over_keys(redis, "sg:lock:*:l", "n = n + 1")
}

/// Makes `server` evict from now on, its links left up: `maxmemory` and
/// `policy` set at runtime.
pub fn turn_evicting(server: &RedisServer, maxmemory: &str, policy: &str) {
    assert_eq!(
        server.raw(&["CONFIG", "SET", "maxmemory", maxmemory]),
        "+OK"
    );
    assert_eq!(
        server.raw(&["CONFIG", "SET", "maxmemory-policy", policy]),
        "+OK"
    );
}

/// A server that keeps every key, a lock on it (the backend's calls have
/// [`ROOMY_DEADLINE`](super::ROOMY_DEADLINE)) that takes and releases
/// `stock` there, and then the server turned evicting (64 MiB,
/// `allkeys-lru`) with the lock's links up.
pub async fn lock_on_a_server_turned_evicting() -> (RedisServer, Backend, Lock) {
    let redis = RedisServer::start();
    let backend = backend(&redis.url(), super::ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone());
    let guard = lock.acquire("stock").await.expect("noeviction");
    assert!(guard.release().await.expect("released"));
    turn_evicting(&redis, "64mb", "allkeys-lru");
    (redis, backend, lock)
}

/// The name of a lock (`job-<n>`) whose key `node` holds: each candidate is
/// taken and released until one is held there.
pub async fn a_lock_held_on(lock: &Lock, node: &RedisServer) -> String {
    for n in 0..200 {
        let candidate = format!("job-{n}");
        if let Ok(Some(guard)) = lock.try_acquire(&candidate).await {
            let here = held_locks(node) == ":1";
            assert!(guard.release().await.expect("released"));
            if here {
                return candidate;
            }
        }
    }
    panic!("no lock held on the node");
}

/// Tries `try_acquire` on `name` until it gets the lock (the instance may
/// have to follow a new primary first), `limit` at most; returns the
/// token, the lock released again.
pub async fn first_hold(lock: &Lock, name: &str, limit: Duration) -> FencingToken {
    let give_up = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(guard)) = lock.try_acquire(name).await {
            let token = guard.fencing_token();
            assert!(guard.release().await.expect("released"));
            return token;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "no lock within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
