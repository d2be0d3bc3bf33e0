//! The fleet on a Redis that requires TLS (a private CA, optionally client
//! certificates) and an ACL user confined to the crate's keys, channel and
//! commands, as managed services are set up. Certificates are made by the
//! test with the `openssl` command. The fleet scenarios of tests/fleet/protection.rs run
//! over TLS too; this file holds what is particular to TLS and ACLs.
#![cfg(all(feature = "redis-tls", feature = "serde"))]

use std::time::Duration;

use crate::common::fleet::{fleet, fleet_burst, instance, wakeups};
use crate::common::tls::{Certs, TlsRedis};
use crate::common::{get as get_req, send, tally, Origin, ROOMY_DEADLINE};
use stampede_guard::{Backend, ErrorKind, Lock, RedisConfig, TlsFiles};

fn config(redis: &TlsRedis, certs: &Certs, password: &str) -> RedisConfig {
    let mut config = RedisConfig::new(redis.url(password));
    let mut tls = TlsFiles::default();
    tls.ca_file = Some(certs.path("ca.crt"));
    config.tls = Some(tls);
    config
}

/// A backend whose deadline a loaded machine meets: the fleet's origin
/// calls are counted exactly, and a call missing the default 50 ms (a TLS
/// round trip on a busy machine) falls back to local protection.
async fn connect(redis: &TlsRedis, certs: &Certs) -> Backend {
    let mut config = config(redis, certs, "app-secret");
    config.deadline = ROOMY_DEADLINE;
    Backend::from_config(config).await.expect("TLS backend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_runs_over_tls_as_a_confined_acl_user() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let origin = Origin::default();
    let connect = || connect(&redis, &certs);
    let instances = fleet(3, &origin, Duration::from_millis(200), connect, |g| {
        g.ttl(Duration::from_millis(300))
            .lease(Duration::from_secs(30))
    })
    .await;

    // Cold key: one origin call for the fleet, waiters woken by the publish
    // (a lease of 30 s would show any timer wake-up as a timeout).
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1, "one origin call for the whole fleet");
    assert!(answers.iter().all(|a| a.status == 200 && a.text() == "v1"));
    assert_eq!(tally(&answers, "MISS"), 1);
    let (by_message, by_timeout) = wakeups(&instances);
    assert_eq!(by_timeout, 0, "no waiter slept out a timer");
    assert!(by_message >= 1);

    // Expiry: one rebuild for the fleet.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(origin.calls(), 2, "one rebuild per expiry, fleet-wide");
    assert!(answers.iter().all(|a| a.text() == "v2"));

    // Invalidation reaches Redis and every instance's L1.
    instances[0]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in &instances[1..] {
        assert_eq!(send(&i.app, get_req("/report")).await.text(), "v3");
    }
    assert_eq!(origin.calls(), 3);

    // The lock's scripts run under the same ACL.
    let lock = Lock::new(instances[1].backend.clone());
    let guard = lock.acquire("job").await.expect("lock over TLS");
    assert!(lock.try_acquire("job").await.unwrap().is_none());
    assert!(guard.release().await.unwrap());

    // Nothing the crate did was refused by the ACL.
    let stats = instances[0].backend.stats().redis.unwrap();
    assert_eq!(stats.errors, 0, "no call was refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_presented_when_the_server_requires_them() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, true);

    // Without a client certificate the handshake fails at start-up.
    let error = Backend::from_config(config(&redis, &certs, "app-secret"))
        .await
        .expect_err("a client certificate is required");
    let message = error.to_string();
    assert!(message.contains("could not set up Redis"), "{message}");
    assert!(message.contains("TLS"), "{message}");
    assert_eq!(error.kind(), ErrorKind::Tls, "{message}");

    // With one (from files, as a service's config names them), it works.
    let mut with_cert = config(&redis, &certs, "app-secret");
    let mut tls = TlsFiles::default();
    tls.ca_file = Some(certs.path("ca.crt"));
    tls.client_cert_file = Some(certs.path("client.crt"));
    tls.client_key_file = Some(certs.path("client.key"));
    with_cert.tls = Some(tls);
    with_cert.deadline = ROOMY_DEADLINE;
    // And from memory, through the builder.
    let from_memory = Backend::redis_builder(&redis.url("app-secret"))
        .deadline(ROOMY_DEADLINE)
        .tls_ca_pem(certs.pem("ca.crt"))
        .tls_client_pem(certs.pem("client.crt"), certs.pem("client.key"));

    let origin = Origin::default();
    let a = instance(
        Backend::from_config(with_cert).await.expect("mutual TLS"),
        &origin,
        Duration::from_millis(100),
        |g| g,
    );
    let b = instance(
        from_memory.connect().await.expect("mutual TLS"),
        &origin,
        Duration::from_millis(100),
        |g| g,
    );
    let both = [a, b];
    let answers = fleet_burst(&both, 100, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers.iter().all(|x| x.text() == "v1"));
}

#[tokio::test]
async fn a_wrong_password_fails_fast_with_a_clear_error() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let attempt = Backend::from_config(config(&redis, &certs, "not-the-secret"));
    let error = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("fails, does not hang")
        .expect_err("must not connect");
    let message = error.to_string();
    assert!(message.contains("could not set up Redis"), "{message}");
    assert!(message.contains("authentication failed"), "{message}");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(
        !message.contains("not-the-secret"),
        "the password is not echoed: {message}"
    );
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_a_clear_start_up_error() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let mut wrong_ca = config(&redis, &certs, "app-secret");
    let mut tls = TlsFiles::default();
    tls.ca_file = Some(certs.path("other-ca.crt"));
    wrong_ca.tls = Some(tls);
    let error = Backend::from_config(wrong_ca)
        .await
        .expect_err("the server's CA is not trusted");
    let message = error.to_string();
    assert!(message.contains("could not set up Redis"), "{message}");
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    assert_eq!(error.kind(), ErrorKind::Tls, "{message}");

    // A CA file that does not exist is named in the error.
    let mut missing = config(&redis, &certs, "app-secret");
    let mut tls = TlsFiles::default();
    tls.ca_file = Some(certs.path("no-such-ca.crt"));
    missing.tls = Some(tls);
    let error = Backend::from_config(missing).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("no-such-ca.crt"), "{message}");
    assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{message}");
}

#[tokio::test]
async fn a_prefix_outside_the_users_acl_is_a_clear_start_up_error() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let mut config = config(&redis, &certs, "app-secret");
    config.prefix = "other".to_owned();
    let error = Backend::from_config(config)
        .await
        .expect_err("the user may not use this channel");
    let message = error.to_string();
    assert!(message.contains("permission"), "{message}");
    assert_eq!(error.kind(), ErrorKind::Permission, "{message}");
}
