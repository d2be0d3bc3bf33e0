//! Where Redis is: one server, a Redis Cluster's seeds, or a service
//! behind Sentinel, parsed from the backend's URL.

use super::sentinel::{SentinelAuth, Sentinels};

/// Where Redis is, parsed from the URL.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server (or a managed endpoint that looks like one).
    Single(String),
    /// Redis Cluster, from seed nodes' URLs.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Cluster(Vec<String>),
    /// The primary named `service`, as the sentinels report it.
    Sentinel {
        sentinels: Sentinels,
        service: String,
        master: MasterUrl,
    },
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry passwords: print them redacted.
        use super::config::redact;
        match self {
            Topology::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            Topology::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| redact(n)).collect::<Vec<_>>())
                .finish(),
            Topology::Sentinel {
                sentinels, service, ..
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("service", service)
                .finish_non_exhaustive(),
        }
    }
}

/// How to reach a primary once the sentinels have named its address.
#[derive(Clone)]
pub(crate) struct MasterUrl {
    scheme: &'static str,
    userinfo: String,
    db: String,
}

impl MasterUrl {
    pub(super) fn at(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        format!(
            "{}://{}{host}:{port}/{}",
            self.scheme, self.userinfo, self.db
        )
    }
}

impl Topology {
    /// Where Redis is, for logs and messages: `host:port` (a cluster's seeds
    /// or the sentinels, comma-separated, and the service behind them),
    /// never a password.
    pub(crate) fn address(&self) -> String {
        match self {
            Topology::Single(url) => host_port(url).to_owned(),
            Topology::Cluster(nodes) => nodes
                .iter()
                .map(|n| host_port(n))
                .collect::<Vec<_>>()
                .join(","),
            Topology::Sentinel {
                sentinels, service, ..
            } => format!(
                "{service} via sentinels {}",
                sentinels
                    .list()
                    .iter()
                    .map(|n| host_port(n))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    /// Parses `redis[s]://`, `redis[s]-cluster://` and `redis[s]-sentinel://`
    /// URLs (the last two are this crate's own forms; see `RedisConfig`).
    pub(crate) fn parse(url: &str) -> Result<Topology, String> {
        const STARTS: &str =
            "a Redis URL starts with redis://, rediss://, redis-cluster:// or redis-sentinel://";
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(STARTS.to_owned());
        };
        let (base, kind) = match scheme {
            "redis-cluster" => ("redis", "cluster"),
            "rediss-cluster" => ("rediss", "cluster"),
            "redis-sentinel" => ("redis", "sentinel"),
            "rediss-sentinel" => ("rediss", "sentinel"),
            // The schemes the Redis client takes itself.
            "redis" | "rediss" | "valkey" | "valkeys" | "unix" | "redis+unix" | "valkey+unix" => {
                return Ok(Topology::Single(url.to_owned()))
            }
            // Named only if it looks like a scheme: whatever precedes
            // `://` in a garbled URL might be a secret.
            _ if scheme.len() <= 16
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
            {
                return Err(format!("{STARTS} (not {scheme}://)"))
            }
            _ => return Err(STARTS.to_owned()),
        };
        // The sentinels' own credentials may come in the query (after the
        // userinfo, whose password may hold any character).
        let (rest, query) = match kind {
            "sentinel" => {
                let hosts_at = rest.rfind('@').map_or(0, |at| at + 1);
                match rest[hosts_at..].find('?') {
                    Some(q) => (&rest[..hosts_at + q], Some(&rest[hosts_at + q + 1..])),
                    None => (rest, None),
                }
            }
            _ => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (format!("{}@", &authority[..at]), &authority[at + 1..]),
            None => (String::new(), authority),
        };
        let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
        if hosts.is_empty() {
            return Err(format!("{scheme}:// needs at least one host:port"));
        }
        match kind {
            "cluster" => Ok(Topology::Cluster(
                hosts
                    .iter()
                    .map(|h| format!("{base}://{userinfo}{h}/"))
                    .collect(),
            )),
            _ => {
                let mut parts = path.split('/').filter(|p| !p.is_empty());
                let Some(service) = parts.next() else {
                    return Err(format!(
                        "{scheme}://hosts/SERVICE: the name of the primary is missing"
                    ));
                };
                let db = parts.next().unwrap_or("0").to_owned();
                let auth = sentinel_query(query.unwrap_or(""))?;
                Ok(Topology::Sentinel {
                    sentinels: Sentinels::new(
                        hosts.iter().map(|h| format!("{base}://{h}/")).collect(),
                    )
                    .with_auth(auth),
                    service: service.to_owned(),
                    master: MasterUrl {
                        scheme: base,
                        userinfo,
                        db,
                    },
                })
            }
        }
    }

    /// The sentinels asked as `user` with `password` (their own
    /// credentials, not the data nodes'). Either one set on a topology
    /// without sentinels is a settings error: it would do nothing.
    pub(crate) fn with_sentinel_auth(
        self,
        user: Option<String>,
        password: Option<String>,
    ) -> Result<Topology, String> {
        match self {
            Topology::Sentinel {
                sentinels,
                service,
                master,
            } if user.is_some() || password.is_some() => {
                if sentinels.auth().is_set() {
                    return Err("the sentinel credentials are given twice: in the URL's \
                                query and in sentinel_user/sentinel_password"
                        .to_owned());
                }
                Ok(Topology::Sentinel {
                    sentinels: sentinels.with_auth(SentinelAuth { user, password }),
                    service,
                    master,
                })
            }
            _ if user.is_some() || password.is_some() => Err(
                "sentinel_user/sentinel_password are set, but the URL names no sentinels \
                 (redis-sentinel://)"
                    .to_owned(),
            ),
            topology => Ok(topology),
        }
    }

    /// Whether the address of the primary can change under the tier, so that
    /// the probe must ask where it is before it trusts a ping.
    pub(crate) fn needs_resolve(&self) -> bool {
        matches!(self, Topology::Sentinel { .. })
    }
}

/// The sentinel credentials of a `redis-sentinel://` URL's query:
/// `sentinel_user` and `sentinel_password`, percent-encoded. Any other
/// parameter is an error (a typo is not silently ignored).
fn sentinel_query(query: &str) -> Result<SentinelAuth, String> {
    let mut auth = SentinelAuth::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| format!("the URL's {name} is not UTF-8 once percent-decoded"))?
            .into_owned();
        match name {
            "sentinel_user" => auth.user = Some(value),
            "sentinel_password" => auth.password = Some(value),
            _ => {
                return Err(format!(
                    "unknown parameter {name:?} in a redis-sentinel:// URL \
                     (it takes sentinel_user and sentinel_password)"
                ))
            }
        }
    }
    Ok(auth)
}

/// Why these settings cannot work in this build or process: a feature
/// they need is not compiled in, or TLS has no crypto provider to run on.
/// Told at once, by the builder, in words that say what to do.
pub(crate) fn missing_feature(topology: &Topology, certificates: bool) -> Option<&'static str> {
    let secure = |url: &str| {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    };
    let tls = match topology {
        Topology::Single(url) => secure(url),
        Topology::Cluster(nodes) => nodes.iter().any(|n| secure(n)),
        Topology::Sentinel { master, .. } => master.scheme == "rediss",
    };
    if !cfg!(feature = "redis-tls") && tls {
        return Some("a rediss:// URL needs stampede-guard's `redis-tls` feature");
    }
    if !cfg!(feature = "redis-tls") && certificates {
        return Some("TLS certificates need stampede-guard's `redis-tls` feature");
    }
    if !cfg!(feature = "redis-cluster") && matches!(topology, Topology::Cluster(_)) {
        return Some("a redis-cluster:// URL needs stampede-guard's `redis-cluster` feature");
    }
    #[cfg(feature = "redis-tls")]
    if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
        return Some(
            "a rediss:// URL needs a rustls crypto provider, and none is installed: call \
             rustls::crypto::ring::default_provider().install_default() (or aws_lc_rs's) \
             once at start-up, before the backend connects",
        );
    }
    None
}

/// The `host:port` of a URL: past the scheme and the userinfo, up to the
/// path or the query. Everything up to the last `@` goes first, so no part
/// of a password (which may hold `/` or `?`) is ever shown.
fn host_port(url: &str) -> &str {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    if scheme.ends_with("unix") {
        // A socket's path.
        return &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel_auth(url: &str) -> Result<(SentinelAuth, String, String), String> {
        match Topology::parse(url)? {
            Topology::Sentinel {
                sentinels,
                service,
                master,
            } => Ok((sentinels.auth().clone(), service, master.at("h", 1))),
            _ => Err("no sentinels".to_owned()),
        }
    }

    #[test]
    fn the_sentinel_credentials_come_from_the_query() {
        let (auth, service, master) = sentinel_auth(
            "redis-sentinel://app:p%3Fw@s1:1,s2:2/cache/2?sentinel_user=watch&sentinel_password=s%26cret",
        )
        .unwrap();
        assert_eq!(auth.user.as_deref(), Some("watch"));
        assert_eq!(auth.password.as_deref(), Some("s&cret"), "percent-decoded");
        assert_eq!(service, "cache");
        assert_eq!(
            master, "redis://app:p%3Fw@h:1/2",
            "the data user is the URL's"
        );
        let (auth, service, _) =
            sentinel_auth("redis-sentinel://s1:1/cache?sentinel_password=pw").unwrap();
        assert_eq!((auth.user, auth.password.as_deref()), (None, Some("pw")));
        assert_eq!(service, "cache");
        let (auth, ..) = sentinel_auth("redis-sentinel://s1:1/cache").unwrap();
        assert!(!auth.is_set());
    }

    #[test]
    fn a_bad_query_or_credentials_given_twice_are_settings_errors() {
        let typo = sentinel_auth("redis-sentinel://s1:1/cache?sentinel_pass=pw").unwrap_err();
        assert!(typo.contains("sentinel_pass"), "{typo}");
        assert!(!typo.contains("pw\""), "{typo}");
        let twice = Topology::parse("redis-sentinel://s1:1/cache?sentinel_password=pw")
            .unwrap()
            .with_sentinel_auth(None, Some("pw".into()))
            .unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
        let nowhere = Topology::parse("redis://h:1/")
            .unwrap()
            .with_sentinel_auth(Some("u".into()), None)
            .unwrap_err();
        assert!(nowhere.contains("names no sentinels"), "{nowhere}");
    }

    #[test]
    fn the_address_shows_hosts_and_ports_and_never_a_password() {
        let single = Topology::parse("redis://user:p/a?ss@cache.internal:6380/2?protocol=resp3");
        assert_eq!(single.unwrap().address(), "cache.internal:6380");
        let cluster = Topology::parse("redis-cluster://:secret@a:7000,b:7001/").unwrap();
        assert_eq!(cluster.address(), "a:7000,b:7001");
        let sentinel =
            Topology::parse("redis-sentinel://:pw@s1:26379,s2:26379/shop?sentinel_password=x");
        assert_eq!(
            sentinel.unwrap().address(),
            "shop via sentinels s1:26379,s2:26379"
        );
    }
}
