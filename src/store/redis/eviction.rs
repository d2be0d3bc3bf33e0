//! Whether Redis may evict the tier's keys, and what that means for a lock.
//!
//! Redis cannot exempt a key from eviction: under a `maxmemory` limit every
//! policy but `noeviction` may evict a key with a TTL, and a lock's hold is
//! one. An evicted hold is a free lock while its holder still works, so the
//! public lock is refused on such a server unless its user opted in. The
//! cache's entries are rebuildable and their fencing numbers start again from
//! Redis's clock, so the cache tier works on any policy.
//!
//! The settings are read (`INFO memory`, or `CONFIG GET maxmemory*` where
//! `INFO` is refused, as on managed services) when the tier connects (on a
//! cluster, on every primary), and again before a lock's next acquisition
//! once the link was lost or replaced (the server reached since may be
//! another one: restarted, promoted). A lock is judged by the node that
//! serves it: on a cluster, a primary read for the first time (one that took
//! over slots) is read before its first lock. The read before an acquisition
//! is a call like any other (deadline, circuit breaker). Where neither
//! command is allowed the policy is unknown: a warning, once, and locks go
//! on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis::Value;

use super::connections::Connections;
use super::error::ErrorMeaning;
use super::health::Address;
use super::TierError;

/// What a server does under memory pressure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No `maxmemory`, or `noeviction`: keys are never evicted.
    Keeps,
    /// A `maxmemory` and a policy that may evict a key with a TTL.
    Evicts { policy: String, maxmemory: u64 },
    /// The settings could not be read (neither `CONFIG` nor `INFO` allowed).
    Unknown,
}

impl Policy {
    /// How much a reading worries: the worst of several is reported.
    fn rank(&self) -> u8 {
        match self {
            Policy::Keeps => 0,
            Policy::Unknown => 1,
            Policy::Evicts { .. } => 2,
        }
    }
}

/// One node's last reading, and what it was read under.
struct Reading {
    policy: Policy,
    /// The notifier's count of link losses and replacements when read.
    links: u64,
}

/// The tier's view of the eviction policy, per node (`None`: the one
/// server, or the primary behind Sentinel).
pub(crate) struct Eviction {
    nodes: Mutex<HashMap<Option<Address>, Reading>>,
    /// One read at a time: acquisitions after a reconnect share it.
    reading: tokio::sync::Mutex<()>,
    /// The unknown policy is logged once per tier.
    warned_unknown: AtomicBool,
}

impl Eviction {
    pub(crate) fn new() -> Self {
        Eviction {
            nodes: Mutex::new(HashMap::new()),
            reading: tokio::sync::Mutex::new(()),
            warned_unknown: AtomicBool::new(false),
        }
    }

    /// The worst policy of the nodes as last read (`Unknown` before any).
    pub(crate) fn current(&self) -> Policy {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .values()
            .map(|r| &r.policy)
            .max_by_key(|p| p.rank())
            .cloned()
            .unwrap_or(Policy::Unknown)
    }

    /// `node`'s reading, if it still holds: taken since the link was last
    /// lost or replaced.
    fn known(&self, node: &Option<Address>, links: u64) -> Option<Policy> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .get(node)
            .filter(|r| r.links == links)
            .map(|r| r.policy.clone())
    }

    /// Reads every primary (the server, off a cluster) as a step of
    /// connecting, each under the connect timeout. A node that gives no
    /// answer is read before its first lock.
    pub(crate) async fn connect(&self, conns: &Connections) {
        let nodes = conns.health.nodes();
        let targets: Vec<Option<Address>> = if nodes.is_empty() {
            vec![None]
        } else {
            nodes.into_iter().map(Some).collect()
        };
        let limit = conns.config.connect_timeout;
        for node in targets {
            let links = conns.notifier.links();
            let ask = |cmd: redis::Cmd| {
                let node = node.as_ref();
                async move { conns.on_node(node, cmd).await.map_err(TierError::Redis) }
            };
            if let Ok(Ok(policy)) = tokio::time::timeout(limit, read_with(ask)).await {
                self.record(node, policy, links);
            }
        }
    }

    /// The policy of the node that serves `route` (a lock's key), read
    /// first if it was not since the link was last lost or replaced.
    ///
    /// # Errors
    ///
    /// The read's, if it had to be made and got no answer.
    pub(crate) async fn for_lock(
        &self,
        conns: &Connections,
        route: &str,
    ) -> Result<Policy, TierError> {
        let node = conns.health.node(route);
        if let Some(policy) = self.known(&node, conns.notifier.links()) {
            return Ok(policy);
        }
        let _one = self.reading.lock().await;
        // Counted before asking: a loss while the read runs makes the next
        // acquisition read again.
        let links = conns.notifier.links();
        if let Some(policy) = self.known(&node, links) {
            return Ok(policy);
        }
        let ask = |cmd: redis::Cmd| async move {
            conns
                .call(route)
                .once()
                .run(|mut conn| {
                    let cmd = &cmd;
                    async move { cmd.query_async::<Value>(&mut conn).await }
                })
                .await
        };
        let policy = read_with(ask).await?;
        self.record(node, policy.clone(), links);
        Ok(policy)
    }

    /// Records `node`'s reading, and logs what changed.
    fn record(&self, node: Option<Address>, policy: Policy, links: u64) {
        let before = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            let reading = Reading {
                policy: policy.clone(),
                links,
            };
            nodes.insert(node.clone(), reading).map(|r| r.policy)
        };
        if before.as_ref() == Some(&policy) {
            return;
        }
        let (host, port) = node.map_or((String::new(), 0), |(h, p)| (h, p));
        match &policy {
            Policy::Evicts { policy, maxmemory } => tracing::warn!(
                policy = %policy,
                maxmemory = *maxmemory,
                %host,
                port,
                "redis may evict keys: the cache tier works on, but locks are refused \
                 (an evicted hold is a free lock) unless allowed with \
                 Lock::allow_evicting_server; keep locks on a redis with \
                 maxmemory-policy noeviction"
            ),
            Policy::Unknown => {
                if !self.warned_unknown.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %host,
                        port,
                        "cannot read redis's eviction policy (CONFIG GET and INFO refused): \
                         locks go on, but a lock whose key redis evicts is lost; make sure \
                         its maxmemory-policy is noeviction"
                    );
                }
            }
            Policy::Keeps if before.is_some() => {
                tracing::info!(%host, port, "redis keeps every key (noeviction, or no maxmemory)");
            }
            Policy::Keeps => {}
        }
    }
}

/// Whether the server refused the command itself (`NOPERM`, an unknown or
/// renamed command): it answers, but will not tell.
fn refused(error: &TierError) -> bool {
    matches!(error, TierError::Redis(e) if e.is_server_reply())
}

/// One node's settings, asked through `ask`: `INFO memory` (the documented
/// least-privilege user may run it), or `CONFIG GET` where `INFO` is refused;
/// `Unknown` if both are. An error is a node that gave no answer.
async fn read_with<F, Fut>(ask: F) -> Result<Policy, TierError>
where
    F: Fn(redis::Cmd) -> Fut,
    Fut: Future<Output = Result<Value, TierError>>,
{
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    match ask(info).await {
        Ok(reply) => return Ok(from_info(&reply)),
        Err(e) if !refused(&e) => return Err(e),
        Err(e) => tracing::debug!(error = ?e, "INFO refused; trying CONFIG GET"),
    }
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory*");
    match ask(config).await {
        Ok(reply) => Ok(from_config(&reply)),
        Err(e) if !refused(&e) => Err(e),
        Err(e) => {
            tracing::debug!(error = ?e, "CONFIG GET refused");
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
