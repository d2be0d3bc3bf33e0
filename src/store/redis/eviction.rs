//! Whether Redis may evict the tier's keys, and what that means for a lock.
//!
//! Redis cannot exempt a key from eviction: under a `maxmemory` limit every
//! policy but `noeviction` may evict a key with a TTL, and a lock's hold is
//! one. An evicted hold is a free lock while its holder still works, so the
//! public lock is refused on such a server unless its user opted in. The
//! cache's entries are rebuildable and their fencing numbers start again from
//! Redis's clock, so the cache tier works on any policy.
//!
//! The settings are read (`CONFIG GET maxmemory*`, or `INFO memory` where
//! `CONFIG` is refused, as on managed services) when the tier connects and
//! again, before the next lock acquisition, once the link was lost or
//! replaced (the server reached since may be another one: restarted,
//! promoted) or, on a cluster, once the slot map names other primaries. On a
//! cluster every primary is read, and the worst reading counts. Where
//! neither command is allowed the policy is unknown: a warning, once, and
//! locks go on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis::{RedisError, Value};

use super::connections::Connections;
use super::error::ErrorMeaning;
use super::health::Address;

/// What a server (or, on a cluster, the worst of its primaries) does under
/// memory pressure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No `maxmemory`, or `noeviction`: keys are never evicted.
    Keeps,
    /// A `maxmemory` and a policy that may evict a key with a TTL.
    Evicts { policy: String, maxmemory: u64 },
    /// The settings could not be read (neither `CONFIG` nor `INFO` allowed).
    Unknown,
}

/// The last reading, and what it was read under.
struct Reading {
    policy: Policy,
    /// The notifier's count of link losses and replacements when read.
    links: u64,
    /// The cluster's primaries when read (empty off a cluster).
    nodes: Vec<Address>,
}

/// The tier's view of the eviction policy.
pub(crate) struct Eviction {
    last: Mutex<Option<Reading>>,
    /// One read at a time: acquisitions after a reconnect share it.
    reading: tokio::sync::Mutex<()>,
    /// The unknown policy is logged once per tier.
    warned_unknown: AtomicBool,
}

impl Eviction {
    pub(crate) fn new() -> Self {
        Eviction {
            last: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            warned_unknown: AtomicBool::new(false),
        }
    }

    /// The policy as last read (`Unknown` before any reading).
    pub(crate) fn current(&self) -> Policy {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(Policy::Unknown, |r| r.policy.clone())
    }

    /// Whether the last reading may no longer hold: none yet, the link was
    /// lost or replaced since, or the cluster's primaries changed.
    fn is_stale(&self, conns: &Connections) -> bool {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let Some(last) = last.as_ref() else {
            return true;
        };
        last.links != conns.notifier.links() || !same_nodes(&last.nodes, &conns.health.nodes())
    }

    /// The policy that holds for a lock now: read again first if the last
    /// reading may no longer hold. A read that gets no answer (Redis down)
    /// keeps the last reading, and is tried again at the next acquisition.
    pub(crate) async fn for_lock(&self, conns: &Connections) -> Policy {
        if self.is_stale(conns) {
            let _one = self.reading.lock().await;
            if self.is_stale(conns) {
                self.read(conns).await;
            }
        }
        self.current()
    }

    /// Reads the settings of the server (every primary on a cluster),
    /// records them, and logs what changed. Returns false if a node gave no
    /// answer (the last reading stays).
    pub(crate) async fn read(&self, conns: &Connections) -> bool {
        // Counted before asking: a loss while the read runs makes the next
        // acquisition read again.
        let links = conns.notifier.links();
        let nodes = conns.health.nodes();
        let targets: Vec<Option<&Address>> = if nodes.is_empty() {
            vec![None]
        } else {
            nodes.iter().map(Some).collect()
        };
        let limit = conns.config.connect_timeout;
        let mut worst = Policy::Keeps;
        for node in targets {
            let read = tokio::time::timeout(limit, read_node(conns, node)).await;
            let Ok(Ok(policy)) = read else {
                return false;
            };
            worst = match (worst, policy) {
                (evicts @ Policy::Evicts { .. }, _) | (_, evicts @ Policy::Evicts { .. }) => evicts,
                (Policy::Unknown, _) | (_, Policy::Unknown) => Policy::Unknown,
                (Policy::Keeps, Policy::Keeps) => Policy::Keeps,
            };
        }
        let before = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Reading {
                policy: worst.clone(),
                links,
                nodes,
            })
            .map(|r| r.policy);
        self.log(before.as_ref(), &worst);
        true
    }

    fn log(&self, before: Option<&Policy>, now: &Policy) {
        if before == Some(now) {
            return;
        }
        match now {
            Policy::Evicts { policy, maxmemory } => tracing::warn!(
                policy = %policy,
                maxmemory = *maxmemory,
                "redis may evict keys: the cache tier works on, but locks are refused \
                 (an evicted hold is a free lock) unless allowed with \
                 Lock::allow_evicting_server; keep locks on a redis with \
                 maxmemory-policy noeviction"
            ),
            Policy::Unknown => {
                if !self.warned_unknown.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "cannot read redis's eviction policy (CONFIG GET and INFO refused): \
                         locks go on, but a lock whose key redis evicts is lost; make sure \
                         its maxmemory-policy is noeviction"
                    );
                }
            }
            Policy::Keeps if before.is_some() => {
                tracing::info!("redis keeps every key (noeviction, or no maxmemory)");
            }
            Policy::Keeps => {}
        }
    }
}

fn same_nodes(a: &[Address], b: &[Address]) -> bool {
    a.len() == b.len() && a.iter().all(|n| b.contains(n))
}

/// One node's settings: `CONFIG GET`, or `INFO memory` where `CONFIG` is
/// refused; `Unknown` if both are. An error is a node that gave no answer.
async fn read_node(conns: &Connections, node: Option<&Address>) -> Result<Policy, RedisError> {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory*");
    match conns.on_node(node, config).await {
        Ok(reply) => return Ok(from_config(&reply)),
        Err(e) if !e.is_server_reply() => return Err(e),
        Err(e) => tracing::debug!(error = %e, "CONFIG GET refused; trying INFO memory"),
    }
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    match conns.on_node(node, info).await {
        Ok(reply) => Ok(from_info(&reply)),
        Err(e) if !e.is_server_reply() => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "INFO refused");
            Ok(Policy::Unknown)
        }
    }
}

/// What `maxmemory` and `maxmemory-policy` mean together.
fn policy(maxmemory: Option<&str>, policy: Option<&str>) -> Policy {
    let (Some(maxmemory), Some(policy)) = (maxmemory, policy) else {
        return Policy::Unknown;
    };
    let Ok(maxmemory) = maxmemory.trim().parse::<u64>() else {
        return Policy::Unknown;
    };
    let policy = policy.trim();
    if maxmemory == 0 || policy.eq_ignore_ascii_case("noeviction") {
        return Policy::Keeps;
    }
    Policy::Evicts {
        policy: policy.to_owned(),
        maxmemory,
    }
}

/// Reads a `CONFIG GET` reply: pairs (RESP2) or a map (RESP3).
fn from_config(reply: &Value) -> Policy {
    let settings: HashMap<String, String> = redis::from_redis_value_ref(reply).unwrap_or_default();
    policy(
        settings.get("maxmemory").map(String::as_str),
        settings.get("maxmemory-policy").map(String::as_str),
    )
}

/// Reads the `maxmemory` fields of `INFO memory`.
fn from_info(reply: &Value) -> Policy {
    let info: String = redis::from_redis_value_ref(reply).unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
    };
    policy(field("maxmemory"), field("maxmemory_policy"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_limit_and_an_evicting_policy_may_evict() {
        let reply = Value::Array(vec![
            bulk("maxmemory"),
            bulk("1048576"),
            bulk("maxmemory-policy"),
            bulk("allkeys-lru"),
        ]);
        assert_eq!(
            from_config(&reply),
            Policy::Evicts {
                policy: "allkeys-lru".into(),
                maxmemory: 1_048_576
            }
        );
    }

    #[test]
    fn no_limit_or_noeviction_keeps_every_key() {
        assert_eq!(policy(Some("0"), Some("allkeys-lru")), Policy::Keeps);
        assert_eq!(policy(Some("100"), Some("noeviction")), Policy::Keeps);
        let info = "# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:volatile-lru\r\n";
        assert_eq!(from_info(&bulk(info)), Policy::Keeps);
    }

    #[test]
    fn foreign_bytes_are_an_unknown_policy() {
        assert_eq!(from_config(&Value::Nil), Policy::Unknown);
        assert_eq!(from_info(&bulk("maxmemory:lots")), Policy::Unknown);
        assert_eq!(policy(Some("-1"), Some("allkeys-lru")), Policy::Unknown);
    }
}
