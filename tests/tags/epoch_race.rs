//! A tag purge that lands on a table Redis lost (evicted, deleted, Redis
//! restarted empty), while an instance that cannot hear the event channel
//! rebuilds an entry it read before the purge: the next read of the table
//! starts a new epoch and drops the purge's generation. The rebuild, stamped
//! under that new epoch, must not be served as current after the purge
//! returned (found by the model check, docs/MODEL.md, "Tag generations").
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fleet::backend_at;
use crate::common::redis::RedisServer;
use crate::common::tagged::bucket_field;
use crate::common::{get as request, send};
use axum::routing::get;
use axum::Router;
use stampede_guard::StampedeGuard;
use tokio::sync::Semaphore;

/// `/products/1` answers `v<version>` as the origin held it when the
/// handler began, tagged `product:1`; with a gate, it waits for it after
/// reading, and says so on `entered`.
fn app(
    guard: &StampedeGuard,
    version: Arc<AtomicUsize>,
    gate: Option<(Arc<Semaphore>, Arc<Semaphore>)>,
) -> Router {
    let handler = move || {
        let version = version.clone();
        let gate = gate.clone();
        async move {
            let read = version.load(Ordering::SeqCst);
            if let Some((entered, open)) = gate {
                entered.add_permits(1);
                let _permit = open.acquire().await.expect("gate");
            }
            ([("surrogate-key", "product:1")], format!("v{read}"))
        }
    };
    Router::new().route("/products/1", get(handler).layer(guard.clone()))
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_stamped_under_an_epoch_begun_after_a_purge_is_not_served() {
    let redis = RedisServer::start();
    redis.raw(&["ACL", "SETUSER", "a", "on", ">pw", "~*", "&*", "+@all"]);
    let url_a = format!("redis://a:pw@127.0.0.1:{}/", redis.port());
    let version = Arc::new(AtomicUsize::new(1));
    let entered = Arc::new(Semaphore::new(0));
    let open = Arc::new(Semaphore::new(0));

    let a = StampedeGuard::new(backend_at(&url_a, Duration::from_millis(500)).await)
        .ttl(Duration::from_secs(60));
    let app_a = app(&a, version.clone(), Some((entered.clone(), open.clone())));
    let b = StampedeGuard::new(backend_at(&redis.url(), Duration::from_millis(500)).await)
        .ttl(Duration::from_secs(60));
    let app_b = app(&b, version.clone(), None);

    // Instance a stops hearing the event channel: its subscriber is cut
    // and may not subscribe again (its commands still run).
    redis.raw(&[
        "ACL",
        "SETUSER",
        "a",
        "-subscribe",
        "-psubscribe",
        "-ssubscribe",
    ]);
    redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub", "USER", "a"]);
    until("a's subscriber is gone", || {
        !redis
            .raw(&["CLIENT", "LIST", "TYPE", "pubsub"])
            .contains("user=a ")
    })
    .await;
    // Let a notice the gap (its in-process tier is dropped, its flights
    // detached) before its rebuild begins.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // a's rebuild reads version 1, then waits.
    let rebuild = tokio::spawn({
        let app_a = app_a.clone();
        async move { send(&app_a, request("/products/1")).await.text() }
    });
    entered.acquire().await.expect("entered").forget();

    // The table is lost; the origin moves to version 2 and b purges the tag.
    redis.raw(&["DEL", "sg:tags"]);
    version.store(2, Ordering::SeqCst);
    let field = bucket_field("product:1");
    let purge = tokio::spawn({
        let b = b.clone();
        async move { b.invalidate_tag("product:1").await }
    });
    until("the purge reached redis", || {
        !redis.raw(&["HGET", "sg:tags", &field]).is_empty()
    })
    .await;

    // a's rebuild ends: it read the table (a new epoch) and stores.
    open.add_permits(1);
    assert_eq!(rebuild.await.expect("rebuild"), "v1");
    purge.await.expect("purge").expect("the purge returned");

    // After the purge returned, nobody answers version 1.
    for _ in 0..5 {
        let answer = send(&app_b, request("/products/1")).await.text();
        assert_eq!(answer, "v2", "b served a copy read before the purge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
