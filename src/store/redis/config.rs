//! The Redis tier's public settings, as a service loads them from its own
//! configuration file or environment.

use std::path::PathBuf;
use std::time::Duration;

/// Where the fleet's Redis is and how to talk to it: every setting of a
/// Redis-backed [`Backend`](crate::Backend), in one value a service can load
/// from its own configuration (with the `serde` feature, durations in human
/// form: `"50ms"`, `"2s"`).
///
/// The `url` names the topology:
///
/// | URL | topology |
/// |---|---|
/// | `redis://[user:password@]host:port[/db]` | one server (or a managed endpoint) |
/// | `rediss://…` | the same over TLS |
/// | `redis-cluster://[user:password@]host1:port1,host2:port2` | Redis Cluster, from seed nodes |
/// | `redis-sentinel://[user:password@]host1:port1,host2:port2/service[/db][?sentinel_user=…&sentinel_password=…]` | the primary named `service`, found through Sentinel |
///
/// `rediss-cluster://` and `rediss-sentinel://` are the TLS forms (the
/// sentinels are then reached over TLS too). User and password belong to
/// the data nodes; the sentinels are asked with [`sentinel_user`] and
/// [`sentinel_password`] (their own `requirepass` or ACL user; here or,
/// percent-encoded, in the URL's query, not both), or without credentials
/// when neither is set.
///
/// [`sentinel_user`]: RedisConfig::sentinel_user
/// [`sentinel_password`]: RedisConfig::sentinel_password
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use stampede_guard::RedisConfig;
///
/// let config: RedisConfig = serde_json::from_str(r#"{
///     "url": "rediss://cache:secret@redis.internal:6380",
///     "prefix": "shop",
///     "deadline": "80ms",
///     "tls": { "ca_file": "/etc/ssl/redis-ca.pem" }
/// }"#).unwrap();
/// assert_eq!(config.deadline, std::time::Duration::from_millis(80));
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Where Redis is (see the table above). Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// Prefix of every key and of the event channel (default `sg`).
    pub prefix: String,
    /// How long a Redis call may go without its connection answering
    /// anything (default 50 ms; more on a link whose measured round trip
    /// needs it). See [`RedisBackendBuilder::deadline`](crate::RedisBackendBuilder::deadline).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub deadline: Duration,
    /// How long connecting may take at start-up (default 2 s).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub connect_timeout: Duration,
    /// How often an open circuit asks whether Redis is back (default 250 ms).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub probe_interval: Duration,
    /// Bound of each process's in-process tier in bytes (default 64 MiB).
    pub l1_max_bytes: u64,
    /// Certificates for `rediss` URLs; without them the system's roots are
    /// trusted and no client certificate is sent.
    pub tls: Option<TlsFiles>,
    /// Fail at start-up when Redis cannot be reached (default false: the
    /// backend starts with in-process protection and joins the fleet once
    /// Redis answers). See
    /// [`RedisBackendBuilder::require_redis_at_start`](crate::RedisBackendBuilder::require_redis_at_start).
    pub require_redis_at_start: bool,
    /// How long after it last heard the fleet's invalidations an instance
    /// still serves its in-process tier past the subscription lease
    /// (default zero: the strict barrier). See
    /// [`RedisBackendBuilder::outage_grace`](crate::RedisBackendBuilder::outage_grace).
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub outage_grace: Duration,
    /// The user the sentinels are asked as (a `redis-sentinel://` URL
    /// only; the URL's user is the data nodes'). Without it, and with a
    /// [`sentinel_password`](Self::sentinel_password), the sentinels'
    /// `default` user (`requirepass`). See
    /// [`RedisBackendBuilder::sentinel_auth`](crate::RedisBackendBuilder::sentinel_auth).
    pub sentinel_user: Option<String>,
    /// The password the sentinels are asked with (default none).
    pub sentinel_password: Option<String>,
}

/// How long an instance that cannot hear the fleet keeps serving its
/// in-process tier past the subscription lease, by default: not at all,
/// so that an invalidation that returned `Ok` holds on every instance.
///
/// ```
/// use stampede_guard::{RedisConfig, DEFAULT_OUTAGE_GRACE};
///
/// assert_eq!(RedisConfig::default().outage_grace, DEFAULT_OUTAGE_GRACE);
/// ```
pub const DEFAULT_OUTAGE_GRACE: Duration = Duration::ZERO;

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: never print it.
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("l1_max_bytes", &self.l1_max_bytes)
            .field("tls", &self.tls)
            .field("require_redis_at_start", &self.require_redis_at_start)
            .field("outage_grace", &self.outage_grace)
            .field("sentinel_user", &self.sentinel_user)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".to_owned(),
            prefix: "sg".to_owned(),
            deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(2),
            probe_interval: Duration::from_millis(250),
            l1_max_bytes: crate::store::DEFAULT_L1_MAX_BYTES,
            tls: None,
            require_redis_at_start: false,
            outage_grace: DEFAULT_OUTAGE_GRACE,
            sentinel_user: None,
            sentinel_password: None,
        }
    }
}

impl RedisConfig {
    /// The defaults, with this URL.
    ///
    /// ```
    /// let config = stampede_guard::RedisConfig::new("redis://cache.internal:6379");
    /// assert_eq!(config.prefix, "sg");
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            ..Self::default()
        }
    }
}

/// PEM files for TLS: a private CA to trust instead of the system's roots,
/// and a client certificate for servers that require one (mutual TLS).
///
/// ```
/// use stampede_guard::{RedisConfig, TlsFiles};
///
/// let mut tls = TlsFiles::default();
/// tls.ca_file = Some("/etc/ssl/private-ca.pem".into());
/// let mut config = RedisConfig::new("rediss://cache.internal:6380");
/// config.tls = Some(tls);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct TlsFiles {
    /// CA certificate(s) that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// The client's certificate chain (needs `client_key_file`).
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub client_key_file: Option<PathBuf>,
}

/// TLS material in memory, as the connection code consumes it.
#[derive(Clone, Default)]
pub(crate) struct TlsPem {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets: say only what is set.
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the files. A missing or unreadable file is a start-up error
    /// naming the file.
    pub(crate) fn read(&self) -> Result<TlsPem, String> {
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
        };
        let ca = self
            .ca_file
            .as_ref()
            .map(|p| read(p, "TLS CA file"))
            .transpose()?;
        let client = match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => Some((
                read(cert, "TLS client certificate")?,
                read(key, "TLS client key")?,
            )),
            (None, None) => None,
            _ => {
                return Err(
                    "a TLS client certificate needs both client_cert_file and client_key_file"
                        .to_owned(),
                )
            }
        };
        Ok(TlsPem { ca, client })
    }
}

/// The URL without its passwords (the userinfo's, and a sentinel password
/// in the query), for messages and `Debug` output.
pub(crate) fn redact(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    };
    // Every `sentinel_password=` value past the userinfo, up to its `&`.
    const SECRET: &str = "sentinel_password=";
    let mut out = String::with_capacity(url.len());
    let mut rest = url.as_str();
    let hosts = rest.rfind('@').map_or(0, |at| at + 1);
    out.push_str(&rest[..hosts]);
    rest = &rest[hosts..];
    while let Some(at) = rest.find(SECRET) {
        let value = at + SECRET.len();
        out.push_str(&rest[..value]);
        out.push_str("***");
        rest = &rest[value..];
        rest = &rest[rest.find('&').unwrap_or(rest.len())..];
    }
    out.push_str(rest);
    out
}

/// The URL that names the server `info` connects to, with its database
/// and credentials: so a backend built from an application's own client
/// opens every connection it needs (link, subscriber) as that client
/// would. `Err` says why it cannot be written (certificates given in
/// memory, an address the crate cannot name), in words for a message.
pub(crate) fn url_of(info: &redis::ConnectionInfo) -> Result<String, String> {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    use redis::ConnectionAddr;

    let settings = info.redis_settings();
    let escape = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let host_port = |host: &str, port: u16| match host.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{host}]:{port}"),
        Err(_) => format!("{host}:{port}"),
    };
    let userinfo = match (settings.username(), settings.password()) {
        (None, None) => String::new(),
        (user, None) => format!("{}@", escape(user.unwrap_or_default())),
        (user, Some(password)) => {
            format!("{}:{}@", escape(user.unwrap_or_default()), escape(password))
        }
    };
    let db = settings.db();
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            Ok(format!("redis://{userinfo}{}/{db}", host_port(host, *port)))
        }
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        } => {
            if tls_params.is_some() {
                return Err(
                    "the client carries TLS certificates, which cannot be read back: \
                            give them with tls_ca_pem / tls_client_pem"
                        .to_owned(),
                );
            }
            let fragment = if *insecure { "#insecure" } else { "" };
            Ok(format!(
                "rediss://{userinfo}{}/{db}{fragment}",
                host_port(host, *port)
            ))
        }
        ConnectionAddr::Unix(path) => {
            let path = path
                .to_str()
                .ok_or_else(|| "the socket path is not UTF-8".to_owned())?;
            let mut url = format!("redis+unix://{path}?db={db}");
            if let Some(user) = settings.username() {
                url.push_str(&format!("&user={}", escape(user)));
            }
            if let Some(password) = settings.password() {
                url.push_str(&format!("&pass={}", escape(password)));
            }
            Ok(url)
        }
        other => Err(format!(
            "the client's address {other:?} is not one the crate can connect to"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_infos_url_reads_back_as_the_same_settings() {
        use redis::IntoConnectionInfo;
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis://app:p%40ss%3Aw%2Fo%20rd@cache.internal:6380/3",
            "redis://:only-password@[::1]:6379/0",
            "redis://user-only@h:1/0",
            "redis+unix:///run/redis.sock?db=2&user=u&pass=p%26q",
        ] {
            let info = url.into_connection_info().unwrap();
            let again = url_of(&info).unwrap().into_connection_info().unwrap();
            assert_eq!(again.addr(), info.addr(), "{url}");
            let (a, b) = (info.redis_settings(), again.redis_settings());
            assert_eq!(
                (a.db(), a.username(), a.password()),
                (b.db(), b.username(), b.password()),
                "{url}"
            );
        }
    }

    #[test]
    fn debug_output_hides_every_password() {
        let mut config = RedisConfig::new("redis-sentinel://app:data-secret@s1:26379/cache");
        config.sentinel_user = Some("watcher".into());
        config.sentinel_password = Some("sentinel-secret".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("data-secret"), "{shown}");
        assert!(!shown.contains("sentinel-secret"), "{shown}");
        assert!(shown.contains("watcher"), "{shown}");
    }

    #[cfg(feature = "serde")]
    #[test]
    fn sentinel_credentials_load_from_a_config_file() {
        let config: RedisConfig = serde_json::from_str(
            r#"{
                "url": "redis-sentinel://app:pw@s1:26379/cache",
                "sentinel_user": "watcher",
                "sentinel_password": "sentinel-secret"
            }"#,
        )
        .unwrap();
        assert_eq!(config.sentinel_user.as_deref(), Some("watcher"));
        assert_eq!(config.sentinel_password.as_deref(), Some("sentinel-secret"));
    }

    #[test]
    fn redact_hides_the_sentinel_password_in_the_query() {
        let url = "redis-sentinel://app:data@s1:1,s2:2/cache?sentinel_user=w&sentinel_password=s%26cret&sentinel_password=again";
        let shown = redact(url);
        assert_eq!(
            shown,
            "redis-sentinel://app:***@s1:1,s2:2/cache?sentinel_user=w&sentinel_password=***&sentinel_password=***"
        );
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
    }
}
