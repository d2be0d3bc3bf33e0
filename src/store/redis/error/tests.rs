//! What Redis errors mean, against a real Redis where the error must come
//! from a server: refused connections and credentials, ACLs, a frozen
//! server, an unusable certificate, and a tier's errors as a user sees them.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::key::Key;
use crate::store::redis::testing::{config, connect, RedisServer};
use crate::store::redis::RedisTier;

#[test]
fn a_slot_on_the_move_is_no_failing_server() {
    for kind in [Server::TryAgain, Server::Moved, Server::Ask] {
        let e = TierError::Redis(RedisError::from((Client::Server(kind), "slot")));
        assert!(e.is_moving() && e.is_answer(), "{e}");
    }
    let down = RedisError::from((Client::Server(Server::ClusterDown), "down"));
    assert!(!TierError::Redis(down).is_moving());
    assert!(!TierError::Timeout.is_moving() && !TierError::Timeout.is_answer());
}

/// The error `RedisTier::connect` gives for `url`.
async fn connect_error(url: &str) -> redis::RedisError {
    let mut config = config(url);
    config.connect_timeout = Duration::from_millis(300);
    match RedisTier::connect(config, Arc::new(|_| {})).await {
        Ok(_) => panic!("{url} must not connect"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let port = {
        let mut redis = RedisServer::start();
        redis.kill();
        redis.port()
    };
    let e = connect_error(&format!("redis://127.0.0.1:{port}/")).await;
    assert_eq!(e.error_kind(), ErrorKind::Connect, "{e}");
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_auth_errors() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let port = redis.port();
    let wrong = connect_error(&format!("redis://:wrong@127.0.0.1:{port}/")).await;
    assert_eq!(wrong.error_kind(), ErrorKind::Auth, "{wrong}");
    let missing = connect_error(&format!("redis://127.0.0.1:{port}/")).await;
    assert_eq!(missing.error_kind(), ErrorKind::Auth, "{missing}");
    let e = setup_error("redis://127.0.0.1/", wrong);
    assert_eq!(e.kind(), ErrorKind::Auth);
    assert!(e.to_string().contains("check the user name"), "{e}");
    assert!(e.source().is_some(), "the client's error is kept");
}

#[tokio::test]
async fn a_channel_outside_the_users_acl_is_a_permission_error() {
    let redis = RedisServer::start_with(&["--user", "app", "on", ">pw", "~*", "&other:*", "+@all"]);
    let e = connect_error(&format!("redis://app:pw@127.0.0.1:{}/", redis.port())).await;
    assert_eq!(e.error_kind(), ErrorKind::Permission, "{e}");
}

#[tokio::test]
async fn a_command_a_script_may_not_run_is_a_permission_error() {
    let redis =
        RedisServer::start_with(&["--user", "app", "on", ">pw", "~*", "&*", "+@all", "-sadd"]);
    let client = redis::Client::open(format!("redis://app:pw@127.0.0.1:{}/", redis.port()))
        .expect("a valid URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let script = redis::Script::new("return redis.call('SADD', KEYS[1], 'x')");
    let e = script
        .key("k")
        .invoke_async::<i64>(&mut conn)
        .await
        .expect_err("SADD is refused to the user");
    assert_eq!(e.error_kind(), ErrorKind::Permission, "{e}");
}

#[tokio::test]
async fn a_frozen_server_is_a_timeout() {
    let redis = RedisServer::start();
    redis.freeze();
    let e = connect_error(&redis.url()).await;
    redis.thaw();
    assert_eq!(e.error_kind(), ErrorKind::Timeout, "{e}");
}

#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn a_certificate_that_does_not_parse_is_a_configuration_error() {
    let mut config = config("rediss://127.0.0.1:1/");
    config.tls.ca = Some(
        b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n".to_vec(),
    );
    let Err(e) = RedisTier::connect(config, Arc::new(|_| {})).await else {
        panic!("must not connect");
    };
    assert_eq!(e.error_kind(), ErrorKind::InvalidConfig, "{e}");
}

#[tokio::test]
async fn tier_errors_keep_their_kind_and_cause() {
    let mut redis = RedisServer::start();
    let tier = connect(&redis).await;
    let key = Key::for_value("t", b"k");
    redis.kill();
    let lease = std::time::Duration::from_secs(1);
    let first: Error = tier
        .fetch_or_lease(&key, lease, None)
        .await
        .err()
        .expect("Redis is gone")
        .into();
    assert!(
        matches!(first.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{first}: {:?}",
        first.kind()
    );
    let mut last = first;
    for _ in 0..10 {
        last = tier
            .fetch_or_lease(&key, lease, None)
            .await
            .err()
            .expect("Redis is gone")
            .into();
    }
    assert_eq!(last.kind(), ErrorKind::Unavailable, "the circuit is open");
    assert!(last.source().is_none(), "Redis was not asked");
    // An invalidation is still tried with the circuit open, and says why
    // it failed.
    let purge: Error = tier.invalidate(&key, &"k".into()).await.unwrap_err().into();
    assert!(
        matches!(purge.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{purge}: {:?}",
        purge.kind()
    );
    assert!(
        purge.source().is_some() || purge.kind() == ErrorKind::Timeout,
        "Redis was asked"
    );
}
