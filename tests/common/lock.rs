//! Helpers for the lock's fault tests: a backend with a chosen deadline, and
//! what Redis holds for the locks.

use std::time::Duration;

use stampede_guard::Backend;

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
