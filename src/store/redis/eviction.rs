//! Whether Redis may evict the tier's keys, and what that means for a lock.
//!
//! Redis cannot exempt a key from eviction: under a `maxmemory` limit every
//! policy but `noeviction` may evict a key with a TTL, and a lock's hold is
//! one. An evicted hold is a free lock while its holder still works, so the
//! public lock is refused on such a server unless its user opted in. The
//! cache's entries are rebuildable and their fencing numbers start again from
//! Redis's clock, so the cache tier works on any policy.
//!
//! The refusal is not decided here: the acquisition script reads
//! `INFO memory` itself, on the server that would grant the lock, in the
//! same atomic step (`scripts/lock_acquire.lua`), so a policy set at runtime,
//! a failover or a slot moved to another primary is judged by the server
//! that actually serves the attempt. `CONFIG` cannot run in a script, so a
//! user without `+info` leaves the policy unknown: a warning, once, and
//! locks go on.
//!
//! What is kept here is what the tier last learnt, per node: read with
//! `INFO memory` when the tier connects (on a cluster, every primary), then
//! updated by every judged acquisition. It feeds the stats and the logs
//! (a warning when a node is found evicting, one warning for an unknown
//! policy), never a decision.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redis::Value;

use super::connections::Connections;
use super::error::ErrorMeaning;
use super::health::Address;

/// What a server does under memory pressure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// No `maxmemory`, or `noeviction`: keys are never evicted.
    Keeps,
    /// A `maxmemory` and a policy that may evict a key with a TTL.
    Evicts { policy: String, maxmemory: u64 },
    /// The settings could not be read (`INFO` refused, or foreign bytes).
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

/// The tier's view of the eviction policy, per node (`None`: the one
/// server, or the primary behind Sentinel).
pub(crate) struct Eviction {
    nodes: Mutex<HashMap<Option<Address>, Policy>>,
    /// The unknown policy is logged once per tier.
    warned_unknown: AtomicBool,
}

impl Eviction {
    pub(crate) fn new() -> Self {
        Eviction {
            nodes: Mutex::new(HashMap::new()),
            warned_unknown: AtomicBool::new(false),
        }
    }

    /// The worst policy of the nodes as last seen (`Unknown` before any).
    pub(crate) fn current(&self) -> Policy {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .values()
            .max_by_key(|p| p.rank())
            .cloned()
            .unwrap_or(Policy::Unknown)
    }

    /// Reads every primary (the server, off a cluster) as a step of
    /// connecting, each under the connect timeout. A node that gives no
    /// answer is left unread.
    pub(crate) async fn connect(&self, conns: &Connections) {
        let nodes = conns.health.nodes();
        let targets: Vec<Option<Address>> = if nodes.is_empty() {
            vec![None]
        } else {
            nodes.into_iter().map(Some).collect()
        };
        let limit = conns.config.connect_timeout;
        for node in targets {
            let mut info = redis::cmd("INFO");
            info.arg("memory");
            let read = conns.on_node(node.as_ref(), info);
            let policy = match tokio::time::timeout(limit, read).await {
                Ok(Ok(reply)) => from_info(&reply),
                // It answers, but will not tell (`NOPERM`, a renamed command).
                Ok(Err(e)) if e.is_server_reply() => {
                    tracing::debug!(error = ?e, "INFO refused");
                    Policy::Unknown
                }
                Ok(Err(_)) | Err(_) => continue,
            };
            self.seen(node, policy);
        }
    }

    /// Records what `node` was seen to do (read at connect, or judged by an
    /// acquisition), and logs what changed.
    pub(crate) fn seen(&self, node: Option<Address>, policy: Policy) {
        let before = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            if nodes.get(&node) == Some(&policy) {
                return;
            }
            nodes.insert(node.clone(), policy.clone())
        };
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
                        "cannot read redis's eviction policy (INFO refused): locks go on, \
                         but a lock whose key redis evicts is lost; make sure its \
                         maxmemory-policy is noeviction, or allow the user +info"
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

/// Reads the `maxmemory` fields of `INFO memory`.
fn from_info(reply: &Value) -> Policy {
    let info: String = redis::from_redis_value_ref(reply).unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
    };
    policy(field("maxmemory"), field("maxmemory_policy"))
}

/// The refusal of the acquisition script: the policy it read, and
/// `maxmemory` in decimal digits (a value past `u64` saturates).
pub(crate) fn refusal(policy: String, maxmemory: &str) -> Policy {
    let maxmemory = match maxmemory.trim().parse::<u64>() {
        Ok(n) => n,
        Err(_) if !maxmemory.is_empty() && maxmemory.bytes().all(|b| b.is_ascii_digit()) => {
            u64::MAX
        }
        Err(_) => 0,
    };
    Policy::Evicts { policy, maxmemory }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_limit_and_an_evicting_policy_may_evict() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory:1048576\r\n\
                    maxmemory_human:1.00M\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(
            from_info(&bulk(info)),
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
        assert_eq!(from_info(&Value::Nil), Policy::Unknown);
        assert_eq!(from_info(&bulk("maxmemory:lots")), Policy::Unknown);
        assert_eq!(policy(Some("-1"), Some("allkeys-lru")), Policy::Unknown);
    }

    #[test]
    fn a_refusal_past_u64_saturates() {
        let huge = "99999999999999999999999";
        assert_eq!(
            refusal("allkeys-lru".into(), huge),
            Policy::Evicts {
                policy: "allkeys-lru".into(),
                maxmemory: u64::MAX
            }
        );
    }
}
