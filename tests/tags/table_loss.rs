//! Attacks on the tag table's loss on a real Redis: the table evicted under
//! `maxmemory` while the entries stay, its fields rewritten with smaller
//! numbers by a foreign client, and a lost table read by an instance that
//! lived through the loss and one started after it.
#![cfg(feature = "redis")]

use crate::common::redis::RedisServer;
use crate::common::tagged::{bucket_field, fleet, settled, text};
use crate::common::Origin;

/// Keys in Redis.
fn dbsize(redis: &RedisServer) -> u64 {
    redis
        .raw(&["DBSIZE"])
        .trim_start_matches(':')
        .parse()
        .unwrap()
}

fn info_field(redis: &RedisServer, section: &str, name: &str) -> u64 {
    let info = redis.raw(&["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in INFO {section}"))
}

/// Makes `key` look unused for `idle` seconds to Redis's LRU.
async fn age(conn: &mut redis::aio::MultiplexedConnection, key: &str, idle: u64) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .arg("IDLETIME")
        .arg(idle)
        .query_async(conn)
        .await
        .unwrap();
}

/// `maxmemory` with `allkeys-lru` evicts the table (the least recently used
/// key: a purge writes it, reads never touch it) while the entries built
/// before the purge stay: no instance, running or started after, serves
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_evicted_under_maxmemory_does_not_revive_purged_entries() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // A filler that takes the memory over the limit, idle but less so than
    // the table: eviction takes the table, then the filler, and is done.
    let _: () = redis::cmd("SET")
        .arg("filler")
        .arg(vec![b'x'; 1 << 20])
        .query_async(&mut conn)
        .await
        .unwrap();
    age(&mut conn, "filler", 500_000).await;
    age(&mut conn, "sg:tags", 1_000_000).await;
    // The table, the filler and at least the entry of v1.
    let keys = dbsize(&redis);
    assert!(keys >= 3);
    let evicted = info_field(&redis, "stats", "evicted_keys");
    let used = info_field(&redis, "memory", "used_memory");
    redis.raw(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    redis.raw(&["CONFIG", "SET", "maxmemory-samples", "64"]);
    redis.raw(&[
        "CONFIG",
        "SET",
        "maxmemory",
        &(used - (256 << 10)).to_string(),
    ]);
    redis.raw(&["PING"]);
    redis.raw(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(info_field(&redis, "stats", "evicted_keys") > evicted);
    let exists = |key: &str| redis.raw(&["EXISTS", key]).trim_start_matches(':') == "1";
    assert!(!exists("sg:tags"), "the table was evicted");
    assert!(!exists("filler"));
    assert_eq!(dbsize(&redis), keys - 2, "every other key stayed");

    let late = fleet(&redis, 1, &origin).await;
    assert_ne!(
        text(&late[0], "/products/1").await,
        "p1-v1",
        "a new instance"
    );
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(text(node, "/products/1").await, "p1-v1", "instance {i}");
    }
}

/// A foreign client rewrites the table after a purge with smaller numbers
/// (the purged tag's field, `all`, and the epoch): neither the instances
/// that heard the purge nor one started afterwards serve what it purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smaller_numbers_written_over_the_table_do_not_undo_a_purge() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    for node in &nodes {
        assert_eq!(settled(node).await, "p1-v1");
    }
    nodes[0].guard.invalidate_tag("product:1").await.unwrap();
    let field = bucket_field("product:1");
    let epoch: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    for small in ["0", "1", &(epoch - 1).to_string()] {
        redis.raw(&["HSET", "sg:tags", &field, small, "all", small]);
        let late = fleet(&redis, 1, &origin).await;
        assert_ne!(
            text(&late[0], "/products/1").await,
            "p1-v1",
            "a new instance, fields at {small}"
        );
        for (i, node) in nodes.iter().enumerate() {
            assert_ne!(text(node, "/products/1").await, "p1-v1", "instance {i}");
        }
    }
    // The epoch itself set back: a new instance takes it, and still serves
    // nothing from before the purge; the running ones start a new epoch the
    // next time they read the table behind what they knew.
    redis.raw(&["HSET", "sg:tags", "epoch", "1"]);
    let late = fleet(&redis, 1, &origin).await;
    assert_ne!(text(&late[0], "/products/1").await, "p1-v1");
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(text(node, "/products/1").await, "p1-v1", "instance {i}");
    }
    let now: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    assert!(
        now >= epoch,
        "the epoch never stays behind: {now} < {epoch}"
    );
}

/// A purge, then the table lost (deleted), then an instance that lived
/// through the loss and one started after it both read: neither serves the
/// purged entry; they agree on the new epoch (the old instance takes the
/// new one's build instead of rebuilding), and a purge after the loss
/// reaches both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_table_read_by_an_old_and_a_new_instance() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 1, &origin).await;
    let old = &nodes[0];
    assert_eq!(settled(old).await, "p1-v1");
    let before: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    old.guard.invalidate_tag("product:1").await.unwrap();
    redis.raw(&["DEL", "sg:tags"]);
    let late = fleet(&redis, 1, &origin).await;
    let new = &late[0];
    let after: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    assert!(after > before, "a new epoch, above the lost one");

    let built = text(new, "/products/1").await;
    assert_ne!(built, "p1-v1");
    let calls = origin.calls();
    // The old instance missed its L1 on the purge, and finds the new
    // instance's build in Redis under an epoch it had not seen: it reads
    // the epoch, and serves that build rather than call the origin.
    assert_eq!(text(old, "/products/1").await, built);
    assert_eq!(origin.calls(), calls, "no second rebuild");
    assert_eq!(settled(old).await, built);

    new.guard.invalidate_tag("product:1").await.unwrap();
    assert_ne!(text(old, "/products/1").await, built);
    assert_ne!(text(new, "/products/1").await, built);
}

/// Redis restarted with empty memory: the next epoch, from Redis's clock,
/// is above the one before, so no entry of the old life (in an instance's
/// memory) reads as current, and a purge after the restart reaches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epoch_moves_up_across_a_restart_with_empty_memory() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let nodes = fleet(&redis, 1, &origin).await;
    assert_eq!(settled(&nodes[0]).await, "p1-v1");
    let before: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    redis.restart();
    let late = fleet(&redis, 1, &origin).await;
    let after: u64 = redis.raw(&["HGET", "sg:tags", "epoch"]).parse().unwrap();
    assert!(after > before, "{after} > {before}");
    let built = text(&late[0], "/products/1").await;
    assert_ne!(built, "p1-v1");
    late[0].guard.invalidate_tag("product:1").await.unwrap();
    assert_ne!(text(&late[0], "/products/1").await, built);
    assert_ne!(text(&nodes[0], "/products/1").await, "p1-v1");
}
