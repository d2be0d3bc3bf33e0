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
    /// Parses `redis[s]://`, `redis[s]-cluster://` and `redis[s]-sentinel://`
    /// URLs (the last two are this crate's own forms; see `RedisConfig`).
    pub(crate) fn parse(url: &str) -> Result<Topology, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err("a Redis URL starts with redis://, rediss://, redis-cluster:// or redis-sentinel://".to_owned());
        };
        let (base, kind) = match scheme {
            "redis-cluster" => ("redis", "cluster"),
            "rediss-cluster" => ("rediss", "cluster"),
            "redis-sentinel" => ("redis", "sentinel"),
            "rediss-sentinel" => ("rediss", "sentinel"),
            _ => return Ok(Topology::Single(url.to_owned())),
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
                Ok(Topology::Sentinel {
                    sentinels: Sentinels::new(
                        hosts.iter().map(|h| format!("{base}://{h}/")).collect(),
                    ),
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
            } => Ok(Topology::Sentinel {
                sentinels: sentinels.with_auth(SentinelAuth { user, password }),
                service,
                master,
            }),
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
