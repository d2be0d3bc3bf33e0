//! Attacks on the tag table's epoch with foreign bytes: a client rewrites
//! `epoch` in `{prefix}:tags` with 2^63, a negative number, a float, text,
//! a value far in the future, or one just under what the instances know.
//! Nothing panics, a purge that returned `Ok` is never undone, and the
//! fleet settles back to hits (no permanent miss storm: one origin call per
//! key for the fleet once settled).
#![cfg(feature = "redis")]

use crate::common::fleet::{fleet_on, settled, tagged_product};
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};

fn epoch(redis: &RedisServer) -> String {
    redis.raw(&["HGET", "sg:tags", "epoch"])
}

/// The foreign epochs: each a Lua expression over `c`, Redis's clock in
/// microseconds, as a string, or a literal.
const FOREIGN: &[(&str, &str)] = &[
    ("2^63", "'9223372036854775808'"),
    ("2^63-1", "'9223372036854775807'"),
    ("negative", "'-1700000000000000'"),
    ("float", "'1.7e15'"),
    ("text", "'not a number'"),
    ("empty", "''"),
    ("far future", "string.format('%.0f', c + 86400000000)"),
    ("59 minutes ahead", "string.format('%.0f', c + 3540000000)"),
    (
        "just behind",
        "string.format('%.0f', tonumber(redis.call('HGET', KEYS[1], 'epoch')) - 1)",
    ),
];

async fn one(what: &str, value: &str) {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let instances = fleet_on(&redis, 2, &origin, tagged_product).await;
    let first = settled(&instances[0], "/report").await;
    assert_eq!(
        settled(&instances[1], "/report").await,
        first,
        "{what}: one value"
    );
    let script = format!(
        "local t = redis.call('TIME') local c = tonumber(t[1] .. string.format('%06d', tonumber(t[2]))) \
         redis.call('HSET', KEYS[1], 'epoch', {value}) return 1"
    );
    assert_eq!(
        redis.raw(&["EVAL", &script, "1", "sg:tags"]),
        ":1",
        "{what}"
    );
    // A purge after the foreign write: it is never undone.
    instances[0]
        .guard
        .invalidate_tag("product:42")
        .await
        .unwrap();
    let calls = origin.calls();
    let mut seen = Vec::new();
    for instance in &instances {
        let now = settled(instance, "/report").await;
        assert_ne!(
            now,
            first,
            "{what}: a value from before the purge (epoch {})",
            epoch(&redis)
        );
        seen.push(now);
    }
    assert!(
        origin.calls() <= calls + 2,
        "{what}: {} origin calls to settle",
        origin.calls() - calls
    );
    // Settled: the fleet answers hits from now on, no miss storm.
    let calls = origin.calls();
    for _ in 0..20 {
        for instance in &instances {
            let answer = send(&instance.app, get("/report")).await;
            assert_ne!(answer.text(), first, "{what}");
        }
    }
    assert_eq!(
        origin.calls(),
        calls,
        "{what}: misses keep reaching the origin"
    );
    // And the next purge still works.
    instances[1].guard.invalidate_all().await.unwrap();
    for instance in &instances {
        let after = settled(instance, "/report").await;
        assert!(
            !seen.contains(&after),
            "{what}: a value from before the second purge"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_epochs_neither_panic_nor_undo_a_purge_nor_storm() {
    for (what, value) in FOREIGN {
        one(what, value).await;
    }
}
