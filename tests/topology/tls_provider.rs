//! The crate never picks rustls's process-wide crypto provider: without one,
//! a `rediss` URL is a clear settings error, not a panic, and a plain
//! `redis://` URL needs none. The test runs in a process of its own, where
//! nothing installs a provider.
#![cfg(feature = "redis-tls")]

use rustls::crypto::CryptoProvider;
use stampede_guard::{Backend, ErrorKind};

fn assert_no_provider_error(result: Result<Backend, stampede_guard::Error>, url: &str) {
    let error = result.err().unwrap_or_else(|| panic!("{url} connected"));
    let message = error.to_string();
    assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{url}: {message}");
    assert!(message.contains("crypto provider"), "{url}: {message}");
    assert!(message.contains("install_default"), "{url}: {message}");
}

#[tokio::test]
async fn without_a_provider_rediss_urls_fail_clearly_and_none_is_installed() {
    // The provider is the process's, and other tests of this binary install
    // one: checked where no other test runs.
    if !crate::common::child::alone() {
        return crate::common::child::run_alone(
            module_path!(),
            "without_a_provider_rediss_urls_fail_clearly_and_none_is_installed",
        );
    }
    assert!(CryptoProvider::get_default().is_none());
    for url in [
        "rediss://127.0.0.1:1",
        "rediss-sentinel://127.0.0.1:1/mymaster",
    ] {
        assert_no_provider_error(Backend::redis(url).await, url);
        let built = Backend::redis_builder(url)
            .tls_ca_pem(b"not a pem".to_vec())
            .connect()
            .await;
        assert_no_provider_error(built, url);
    }
    #[cfg(feature = "redis-cluster")]
    assert_no_provider_error(
        Backend::redis_cluster(["rediss://127.0.0.1:1", "rediss://127.0.0.1:2"]).await,
        "rediss cluster",
    );
    // Still none: the attempts did not install one behind the app's back.
    assert!(CryptoProvider::get_default().is_none());

    // Plain Redis needs no provider.
    let server = crate::common::redis::RedisServer::start();
    let backend = Backend::redis(&server.url()).await.expect("plain Redis");
    drop(backend);
    assert!(CryptoProvider::get_default().is_none());
}
