//! Making a Redis client, and the settings every connection is opened with.
//!
//! A leaf: the link (see [`super::connection`]), the sentinels and the
//! cluster's node connections all open theirs from here.

use std::time::Duration;

use redis::{Client, ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisError};

use super::config::TlsPem;

/// What opening a link needs besides the topology.
pub(crate) struct Options<'a> {
    pub connect_timeout: Duration,
    pub deadline: Duration,
    pub tls: &'a TlsPem,
    pub channel: &'a str,
    /// This process's acknowledgement channel, on the same subscriber.
    pub ack_channel: &'a str,
}

/// A client for `url` that speaks RESP3, with `tls`'s certificates.
pub(crate) fn client(url: &str, tls: &TlsPem) -> Result<Client, RedisError> {
    client_as(url, tls, None, None)
}

/// [`client`], authenticating as `user` with `password` (those given here
/// replace the URL's): for the sentinels, whose credentials are their own.
pub(crate) fn client_as(
    url: &str,
    tls: &TlsPem,
    user: Option<&str>,
    password: Option<&str>,
) -> Result<Client, RedisError> {
    // Without TLS compiled in, the client's own error would name its own
    // feature, not the one to turn on here.
    #[cfg(not(feature = "redis-tls"))]
    if url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss:"))
    {
        return Err(no_tls());
    }
    let info = url.into_connection_info()?;
    // RESP3 lets the subscriber receive pushes on a connection that the
    // client reconnects and resubscribes by itself.
    let mut settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    if let Some(user) = user {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    let info = info.set_redis_settings(settings);
    let secure = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if secure {
        require_crypto_provider()?;
    }
    if tls.ca.is_some() || tls.client.is_some() {
        // Nothing has been sent yet: any failure here is in the settings
        // (a PEM that does not parse), and says so by its kind.
        #[cfg(feature = "redis-tls")]
        return Client::build_with_tls(info, certificates(tls)).map_err(|e| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "unusable TLS certificate or key",
                e.to_string(),
            ))
        });
        #[cfg(not(feature = "redis-tls"))]
        return Err(no_tls());
    }
    Client::open(info)
}

#[cfg(feature = "redis-tls")]
pub(super) fn certificates(tls: &TlsPem) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

#[cfg(not(feature = "redis-tls"))]
pub(super) fn no_tls() -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "TLS support is not compiled in",
        "a rediss:// URL needs stampede-guard's `redis-tls` feature".to_owned(),
    ))
}

/// rustls needs a process-wide crypto provider, and choosing it is the
/// application's call (ring, aws-lc-rs, a FIPS build): the crate never
/// installs one. Without one, the Redis client's rustls would panic while
/// building its configuration; this says what to do instead, as a settings
/// error, before anything is sent.
#[cfg(feature = "redis-tls")]
pub(super) fn require_crypto_provider() -> Result<(), RedisError> {
    match rustls::crypto::CryptoProvider::get_default() {
        Some(_) => Ok(()),
        None => Err(no_crypto_provider()),
    }
}

/// Without TLS compiled in, no TLS link can be made: the error names the
/// feature to turn on.
#[cfg(not(feature = "redis-tls"))]
pub(super) fn require_crypto_provider() -> Result<(), RedisError> {
    Err(no_tls())
}

#[cfg(feature = "redis-tls")]
fn no_crypto_provider() -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "no rustls crypto provider is installed",
        "a rediss:// URL needs one: call rustls::crypto::ring::default_provider().install_default() \
         (or aws_lc_rs's) once at start-up, before the backend connects"
            .to_owned(),
    ))
}

/// `future` under `limit`; past it, an I/O timeout error naming `what`.
pub(crate) async fn with_timeout<T>(
    limit: Duration,
    what: &'static str,
    future: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| timeout_error(what))?
}

/// The error of a call that passed its time limit, as the client's own
/// timeouts are (an I/O error of kind `TimedOut`).
pub(crate) fn timeout_error(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}
