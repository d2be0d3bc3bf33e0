//! A backend on the Redis an application already has a `redis::Client`
//! (or `ConnectionInfo`) for: the same server, database, user and password
//! as that client, shared with a backend made from the equivalent URL.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::RedisServer;
use redis::IntoConnectionInfo;
use stampede_guard::{Backend, Cache, ErrorKind, RedisBackendBuilder};

/// A password with characters a URL must escape.
const PASSWORD: &str = "p@ss:w/rd #1";

/// A server with an ACL user `app` (the `default` user stays on for the
/// harness's own commands).
fn server() -> RedisServer {
    let redis = RedisServer::start();
    let reply = redis.raw(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]);
    assert_eq!(reply, "+OK", "{reply}");
    redis
}

fn url(redis: &RedisServer, password: &str) -> String {
    let escaped: String = password
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("redis://app:{escaped}@127.0.0.1:{}/3", redis.port())
}

#[tokio::test]
async fn a_backend_from_the_apps_client_shares_the_fleets_entries() {
    let redis = server();
    let client = redis::Client::open(url(&redis, PASSWORD)).expect("client");
    let from_client = Backend::redis_from_client(&client).await.expect("backend");
    let from_info = RedisBackendBuilder::from_connection_info(
        &url(&redis, PASSWORD).into_connection_info().unwrap(),
    )
    .connect()
    .await
    .expect("backend");

    let calls = Arc::new(AtomicUsize::new(0));
    for backend in [from_client, from_info] {
        let cache: Cache<String> = Cache::new(backend).ttl(Duration::from_secs(60));
        let calls = calls.clone();
        let value = cache
            .get_or_rebuild("report", move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("built".to_owned())
            })
            .await
            .expect("value");
        assert_eq!(value, "built");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the second backend read the first one's entry"
    );

    // In the client's database, as its user.
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the app's own connection");
    let keys: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert!(keys > 0, "the entry is in database 3");
    assert_eq!(redis.raw(&["DBSIZE"]), ":0", "nothing in database 0");
}

#[tokio::test]
async fn the_clients_credentials_are_the_ones_used() {
    let redis = server();
    let client = redis::Client::open(url(&redis, "wrong")).expect("client");
    let e = RedisBackendBuilder::from_client(&client)
        .require_redis_at_start()
        .connect()
        .await
        .expect_err("a wrong password is refused");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(
        !e.to_string().contains("wrong"),
        "the password is not shown: {e}"
    );
}
