//! What a start-up or call error says, as a report that prints the chain
//! (`anyhow`, `eyre`) shows it: each layer says its own part once, the
//! top one what to check, and no password.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::error_chain;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, ErrorKind};

/// This crate's layer (the chain's first) does not repeat the text of the
/// layer below it. (Layers further down are the Redis client's own.)
fn each_once(chain: &[String]) {
    let chain = &chain[..chain.len().min(2)];
    for pair in chain.windows(2) {
        assert!(
            !pair[1].is_empty() && !pair[0].contains(&pair[1]),
            "a layer repeats its source: {chain:#?}"
        );
    }
}

#[tokio::test]
async fn a_wrong_password_says_what_to_check_once_and_hides_the_password() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let url = format!("redis://:wrong-secret@127.0.0.1:{}/", redis.port());
    let error = Backend::redis(&url).await.expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::Auth);
    let chain = error_chain(&error);
    assert_eq!(
        chain[0],
        format!(
            "could not set up Redis at redis://:***@127.0.0.1:{}/: authentication failed \
             (check the user name and password)",
            redis.port()
        )
    );
    assert!(
        chain.len() >= 2,
        "the client's error is the source: {chain:?}"
    );
    each_once(&chain);
    assert!(!chain.concat().contains("wrong-secret"), "{chain:?}");
}

#[tokio::test]
async fn a_refused_connection_says_so_once() {
    let mut redis = RedisServer::start();
    redis.kill();
    let error = Backend::redis_builder(&redis.url())
        .connect_timeout(Duration::from_millis(500))
        .require_redis_at_start()
        .connect()
        .await
        .expect_err("nothing listens");
    assert_eq!(error.kind(), ErrorKind::Connect);
    let chain = error_chain(&error);
    assert_eq!(
        chain[0],
        format!("could not set up Redis at {}: cannot connect", redis.url())
    );
    assert!(chain.len() >= 2, "{chain:?}");
    each_once(&chain);
}

#[tokio::test]
async fn a_url_of_another_scheme_gets_the_same_hint_as_a_garbled_one() {
    for (url, names) in [
        ("http://127.0.0.1:6379", Some("(not http://)")),
        ("https://cache.internal:6379/0", Some("(not https://)")),
        ("redis//127.0.0.1:6379", None),
    ] {
        let error = Backend::redis(url).await.expect_err("not a Redis URL");
        assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{url}: {error}");
        let message = error.to_string();
        assert!(
            message.contains(
                "a Redis URL starts with redis://, rediss://, redis-cluster:// or redis-sentinel://"
            ),
            "{url}: {message}"
        );
        if let Some(names) = names {
            assert!(message.contains(names), "{url}: {message}");
        }
    }
}

#[tokio::test]
async fn a_lock_refused_without_redis_says_its_layer_and_keeps_the_cause() {
    let mut redis = RedisServer::start();
    redis.kill();
    let backend = Backend::redis_builder(&redis.url())
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("starts without redis");
    let lock = stampede_guard::Lock::new(backend);
    let error = lock.try_acquire("job").await.expect_err("no redis");
    let chain = error_chain(&error);
    assert_eq!(chain[0], "lock backend unavailable", "{chain:?}");
    assert!(chain.len() >= 2, "{chain:?}");
    each_once(&chain);
}
