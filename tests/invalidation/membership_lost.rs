//! Attacks on the fleet membership that the invalidation barrier relies on:
//! the membership itself is lost (a `DEL`, a `FLUSHALL`, a restart with
//! empty memory) while an instance cannot hear the channel and does not
//! know it. `PUBLISH` does not count that instance and the membership no
//! longer names it, yet its in-process tier is still trusted for the rest of
//! its subscription lease: the purge must still wait for it.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::{backend_at, fleet_on, settled, tagged_product};
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
use stampede_guard::StampedeGuard;

/// Far more than one subscription lease: only a hang reaches it.
const HANG: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Purge {
    Url,
    Tag,
    All,
}

async fn purge(guard: &StampedeGuard, how: Purge) -> Result<(), stampede_guard::Error> {
    match how {
        Purge::Url => guard.invalidate(&get("/report")).await,
        Purge::Tag => guard.invalidate_tag("product:42").await,
        Purge::All => guard.invalidate_all().await,
    }
}

#[derive(Clone, Copy, Debug)]
enum Loss {
    /// The membership key alone goes (a `DEL`, or an eviction: the key has
    /// an expiry, so even `volatile-*` policies may pick it).
    Del,
    /// Everything goes (`FLUSHALL`).
    Flushall,
    /// Redis restarts with empty memory (every connection dropped too).
    Restart,
}

/// `b` serves `/report` from its L1 through a link that then freezes and
/// holds Redis's closes; its subscriber is dropped by Redis and the
/// membership is lost. `a` purges: once that returns `Ok`, `b` must not
/// answer what it held.
async fn a_lost_membership_does_not_shorten_the_barrier(how: Purge, loss: Loss) {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = fleet_on(&redis, 1, &origin, tagged_product).await.remove(0);
    let proxy = Proxy::start(redis.port()).await;
    let b = crate::common::fleet::instance(
        backend_at(&proxy.url(), Duration::from_millis(500)).await,
        &origin,
        Duration::ZERO,
        tagged_product,
    );
    let held = settled(&b, "/report").await;
    proxy.freeze_closes_too();
    match loss {
        Loss::Del => {
            assert!(redis
                .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .starts_with(':'));
            assert_eq!(redis.raw(&["DEL", "sg:members"]), ":1");
        }
        Loss::Flushall => {
            assert!(redis
                .raw(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .starts_with(':'));
            assert_eq!(redis.raw(&["FLUSHALL"]), "+OK");
        }
        Loss::Restart => redis.restart(),
    }
    // `a` may need a few tries to get its links back after a restart.
    let mut result = Err(None);
    for _ in 0..50 {
        match tokio::time::timeout(HANG, purge(&a.guard, how))
            .await
            .expect("no hang")
        {
            Ok(()) => {
                result = Ok(());
                break;
            }
            Err(e) => result = Err(Some(e)),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if result.is_err() {
        // Never confirmed: the barrier promised nothing.
        proxy.thaw();
        return;
    }
    let after = send(&b.app, get("/report")).await;
    assert_ne!(
        after.text(),
        held,
        "{how:?} after {loss:?}: b answered what it held ({})",
        after.x_cache()
    );
    proxy.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_tag_after_the_membership_was_deleted() {
    a_lost_membership_does_not_shorten_the_barrier(Purge::Tag, Loss::Del).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_all_after_flushall() {
    a_lost_membership_does_not_shorten_the_barrier(Purge::All, Loss::Flushall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_after_the_membership_was_deleted() {
    a_lost_membership_does_not_shorten_the_barrier(Purge::Url, Loss::Del).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_tag_after_a_restart_with_empty_memory() {
    a_lost_membership_does_not_shorten_the_barrier(Purge::Tag, Loss::Restart).await;
}
