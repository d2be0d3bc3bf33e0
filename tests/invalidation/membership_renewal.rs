//! An instance trusts its in-process tier only while it is a member the
//! invalidation barrier waits for: a keepalive whose membership renewal
//! failed must not extend that trust. Found by the model check
//! (docs/MODEL.md, "Membership").
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::tagged::{app, text, Node};
use crate::common::Origin;
use stampede_guard::StampedeGuard;

async fn node(url: &str, origin: &Origin) -> Node {
    let backend = crate::common::fleet::backend_at(url, Duration::from_millis(500)).await;
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = app(origin, &guard);
    Node { guard, app }
}

/// Redis's clock in milliseconds.
fn redis_ms(redis: &RedisServer) -> u64 {
    let script = "local t = redis.call('TIME') \
                  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)";
    let reply = redis.raw(&["EVAL", script, "0"]);
    reply.trim_start_matches(':').parse().expect("TIME")
}

/// Members whose lease runs past now.
fn live_members(redis: &RedisServer) -> u64 {
    let now = redis_ms(redis).to_string();
    let reply = redis.raw(&["ZCOUNT", "sg:members", &format!("({now}"), "+inf"]);
    reply.trim_start_matches(':').trim().parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_whose_renewal_failed_does_not_keep_the_l1_trusted() {
    let redis = RedisServer::start();
    redis.raw(&["ACL", "SETUSER", "a", "on", ">pw", "~*", "&*", "+@all"]);
    let proxy = Proxy::start(redis.port()).await;
    let url_a = proxy.url().replace("redis://", "redis://a:pw@");
    let origin = Origin::default();
    let a = node(&url_a, &origin).await;
    let b = node(&redis.url(), &origin).await;

    // a holds the product in its L1.
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let first = text(&a, "/products/1").await;
        if text(&a, "/products/1").await == first {
            break first;
        }
        assert!(Instant::now() < deadline, "a did not settle");
    };

    // a's renewals fail from now on (its keepalives still succeed), until
    // its membership has run out.
    redis.raw(&[
        "ACL",
        "SETUSER",
        "a",
        "-eval",
        "-evalsha",
        "-eval_ro",
        "-evalsha_ro",
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while live_members(&redis) > 1 {
        assert!(Instant::now() < deadline, "a's membership did not run out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Redis drops a's subscriber; the close does not reach a.
    proxy.freeze_closes_too();
    redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub", "USER", "a"]);
    b.guard.invalidate_tag("product:1").await.unwrap();

    // After the purge returned, a does not answer what it held before.
    assert_ne!(text(&a, "/products/1").await, held);
    proxy.thaw();
}
