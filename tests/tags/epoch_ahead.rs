//! A tag purge on a table whose epoch is ahead of Redis's clock.
//!
//! `load_generations.lua` keeps an epoch up to an hour ahead of Redis's
//! clock, and starts one at `floor + 1` (above the clock) when Redis lost
//! the table and its clock is behind the epoch an instance knew: Redis
//! restarted, or a replica promoted, on a host whose clock lags. Entries
//! stamped under such an epoch record every generation as at least the
//! epoch. A purge must move its tag above that, not to Redis's clock
//! alone, or the entries it purges are still admitted (found by the model
//! check, docs/MODEL.md, "Tag generations").
#![cfg(feature = "redis")]

use crate::common::redis::RedisServer;
use crate::common::tagged::{bucket_field, fleet, text};
use crate::common::Origin;

/// Sets the table's epoch ten minutes ahead of Redis's clock; returns it.
fn epoch_ahead(redis: &RedisServer) -> u64 {
    let script = "local t = redis.call('TIME') \
        local e = string.format('%.0f', t[1] * 1000000 + t[2] + 600000000) \
        redis.call('DEL', KEYS[1]) \
        redis.call('HSET', KEYS[1], 'epoch', e) \
        return e";
    let reply = redis.raw(&["EVAL", script, "1", "sg:tags"]);
    reply.parse().expect("the epoch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_under_an_epoch_ahead_of_the_clock_is_not_lost() {
    let redis = RedisServer::start();
    let epoch = epoch_ahead(&redis);
    let origin = Origin::default();
    let nodes = fleet(&redis, 2, &origin).await;
    let (a, b) = (&nodes[0], &nodes[1]);

    assert_eq!(text(a, "/products/1").await, "p1-v1");
    assert_eq!(
        text(a, "/products/1").await,
        "p1-v1",
        "a hit before the purge"
    );
    assert_eq!(text(b, "/products/1").await, "p1-v1", "b takes a's entry");
    assert_eq!(origin.calls(), 1);

    a.guard
        .invalidate_tag("product:1")
        .await
        .expect("the purge returned");
    // After the purge returned, neither instance answers the purged copy.
    assert_eq!(
        text(b, "/products/1").await,
        "p1-v2",
        "b served a purged copy"
    );
    assert_eq!(
        text(a, "/products/1").await,
        "p1-v2",
        "a served a purged copy"
    );
    // An instance started after the purge does not either.
    let late = fleet(&redis, 1, &origin).await;
    assert_eq!(text(&late[0], "/products/1").await, "p1-v2");

    let field = redis.raw(&["HGET", "sg:tags", &bucket_field("product:1")]);
    let generation: u64 = field.parse().expect("the purge's generation");
    assert!(
        generation > epoch,
        "the purge moved its tag to {generation}, not above the epoch {epoch}"
    );
}

/// Known limit (docs/MODEL.md, "Known limits"): an instance that read a
/// generation ahead of Redis's clock (written while Redis ran on a host
/// whose clock was ahead) keeps it in memory when Redis loses the table.
/// Its entries record that generation, and a later purge, from the slower
/// clock, stays below it: the instance still serves what the purge was
/// for. Found by the model check
/// (`current_restart_on_a_slower_clock_loses_a_purge_below_a_remembered_generation`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known: a generation remembered from a table whose clock was ahead outlives the table"]
async fn a_purge_below_a_generation_remembered_from_a_lost_table_is_not_lost() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let field = bucket_field("product:1");
    // The tag's generation, ten minutes ahead of Redis's clock, then an
    // instance that reads it at start-up.
    let script = "local t = redis.call('TIME') \
        redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', t[1] * 1000000 + t[2] + 600000000)) \
        return 1";
    let nodes = fleet(&redis, 1, &origin).await;
    redis.raw(&["EVAL", script, "1", "sg:tags", &field]);
    let late = fleet(&redis, 1, &origin).await;
    let (a, b) = (&nodes[0], &late[0]);
    // Redis loses the table.
    redis.raw(&["DEL", "sg:tags"]);

    assert_eq!(text(b, "/products/1").await, "p1-v1");
    a.guard
        .invalidate_tag("product:1")
        .await
        .expect("the purge returned");
    assert_eq!(
        text(b, "/products/1").await,
        "p1-v2",
        "b served a purged copy"
    );
    assert_eq!(
        text(a, "/products/1").await,
        "p1-v2",
        "a served a purged copy"
    );
}
