//! The Redis backend configured the way services configure things: from a
//! URL, or from a section of their own config file (any serde format;
//! durations in human form).
#![cfg(all(feature = "redis", feature = "serde"))]

use std::time::Duration;

use crate::common::fleet::{fleet, fleet_burst};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, Origin};
use stampede_guard::{Backend, ErrorKind, RedisConfig};

#[test]
fn a_config_section_deserialises_with_human_durations_and_defaults() {
    let config: RedisConfig = serde_json::from_str(
        r#"{
            "url": "redis-sentinel://:secret@10.0.0.1:26379,10.0.0.2:26379/cache",
            "prefix": "shop",
            "deadline": "80ms",
            "connect_timeout": "3s",
            "probe_interval": "1s 500ms",
            "l1_max_bytes": 1048576,
            "tls": { "ca_file": "/etc/ssl/redis-ca.pem" }
        }"#,
    )
    .expect("valid config");
    assert_eq!(config.prefix, "shop");
    assert_eq!(config.deadline, Duration::from_millis(80));
    assert_eq!(config.connect_timeout, Duration::from_secs(3));
    assert_eq!(config.probe_interval, Duration::from_millis(1500));
    assert_eq!(config.l1_max_bytes, 1 << 20);
    let tls = config.tls.expect("tls section");
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/ssl/redis-ca.pem"))
    );
    assert_eq!(tls.client_cert_file, None);

    // Everything but the URL has a default.
    let minimal: RedisConfig =
        serde_json::from_str(r#"{ "url": "redis://127.0.0.1:6379" }"#).unwrap();
    assert_eq!(
        minimal,
        RedisConfig::new("redis://127.0.0.1:6379"),
        "defaults as documented"
    );
    assert_eq!(minimal.deadline, Duration::from_millis(50));
    assert_eq!(minimal.prefix, "sg");

    // Debug output never shows the password.
    let shown = format!("{:?}", RedisConfig::new("redis://app:hunter2@h:6379"));
    assert!(
        shown.contains("app:***@h:6379") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[test]
fn mistakes_in_a_config_section_are_rejected_not_ignored() {
    let typo = serde_json::from_str::<RedisConfig>(r#"{ "url": "redis://h", "dealine": "5ms" }"#);
    assert!(typo.unwrap_err().to_string().contains("dealine"));
    let bad_duration =
        serde_json::from_str::<RedisConfig>(r#"{ "url": "redis://h", "deadline": "fast" }"#);
    assert!(bad_duration.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_built_from_config_protects_the_origin() {
    let redis = RedisServer::start();
    let json = format!(
        r#"{{ "url": "{}", "prefix": "cfg", "deadline": "200ms", "l1_max_bytes": 4194304 }}"#,
        redis.url()
    );
    let origin = Origin::default();
    let connect = || async {
        let config: RedisConfig = serde_json::from_str(&json).unwrap();
        Backend::from_config(config).await.expect("backend")
    };
    let instances = fleet(3, &origin, Duration::from_millis(100), connect, |g| g).await;
    assert_eq!(instances[0].backend.l1_max_bytes(), 4 << 20);
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers.iter().all(|a| a.text() == "v1"));
    // The prefix is honoured: the entry lives under `cfg:`.
    let key = instances[0].guard.key_for(&get_req("/report")).unwrap();
    assert_eq!(redis.raw(&["EXISTS", &format!("cfg:{{{key}}}:v")]), ":1");
}

#[tokio::test]
async fn a_malformed_url_is_a_clear_start_up_error() {
    for (url, expected) in [
        ("localhost:6379", "redis://"),
        ("redis-sentinel://127.0.0.1:1", "name of the primary"),
        ("redis-cluster://", "host:port"),
    ] {
        let error = Backend::redis(url).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("could not set up Redis"), "{message}");
        assert!(message.contains(expected), "{url}: {message}");
        assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{message}");
    }
    // A client certificate without its key.
    let mut config = RedisConfig::new("rediss://127.0.0.1:1");
    let mut tls = stampede_guard::TlsFiles::default();
    tls.client_cert_file = Some("client.crt".into());
    config.tls = Some(tls);
    let message = Backend::from_config(config).await.unwrap_err().to_string();
    assert!(message.contains("client_key_file"), "{message}");
}
