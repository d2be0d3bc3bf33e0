//! Counters published through the [`metrics`] facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, …) and these appear:
//!
//! | counter | counts |
//! |---|---|
//! | `stampede_guard_hits_total` | answered from a fresh entry |
//! | `stampede_guard_stale_total` | answered from a stale entry (while revalidating, or on error) |
//! | `stampede_guard_misses_total` | requests that led a rebuild |
//! | `stampede_guard_coalesced_total` | requests answered by another request's rebuild |
//! | `stampede_guard_origin_calls_total` | calls to the origin (handler or rebuild closure) |
//! | `stampede_guard_bypass_total` | requests passed through without the cache, and origin answers that could not be shared; labelled `reason` (`method`, `credentials`, `request body`, `set-cookie`, `vary`, …) |
//! | `stampede_guard_refreshes_total` | background refreshes started |
//! | `stampede_guard_wait_timeouts_total` | waiters whose wait budget ran out |
//! | `stampede_guard_l2_hits_total` | misses in this process answered by an entry in Redis |
//! | `stampede_guard_early_refreshes_total` | probabilistic early refreshes started |
//! | `stampede_guard_fenced_writes_total` | late commits refused because a newer entry was stored |
//! | `stampede_guard_corrupt_entries_total` | unreadable entries found in Redis (treated as misses) |
//! | `stampede_guard_redis_errors_total` | Redis calls that failed or missed their deadline |
//! | `stampede_guard_circuit_openings_total` | circuits opened (on Redis Cluster, one per primary): that node's keys are served from the in-process tier until a probe of the node itself answers |
//! | `stampede_guard_revalidated_total` | rebuilds answered `304 Not Modified` by the origin: the entry was renewed without its body |
//! | `stampede_guard_unsafe_invalidations_total` | URL groups dropped after a successful unsafe method (POST, PUT, …) |
//! | `stampede_guard_invalidation_failures_total` | such invalidations that did not reach Redis (the response is sent all the same) |
//!
//! Without a recorder each increment is a no-op.

use metrics::counter;

pub(crate) const HITS: &str = "stampede_guard_hits_total";
pub(crate) const STALE: &str = "stampede_guard_stale_total";
pub(crate) const MISSES: &str = "stampede_guard_misses_total";
pub(crate) const COALESCED: &str = "stampede_guard_coalesced_total";
pub(crate) const ORIGIN_CALLS: &str = "stampede_guard_origin_calls_total";
pub(crate) const BYPASS: &str = "stampede_guard_bypass_total";
pub(crate) const REFRESHES: &str = "stampede_guard_refreshes_total";
pub(crate) const WAIT_TIMEOUTS: &str = "stampede_guard_wait_timeouts_total";
#[cfg(feature = "redis")]
pub(crate) const L2_HITS: &str = "stampede_guard_l2_hits_total";
pub(crate) const EARLY_REFRESHES: &str = "stampede_guard_early_refreshes_total";
#[cfg(feature = "redis")]
pub(crate) const FENCED_WRITES: &str = "stampede_guard_fenced_writes_total";
#[cfg(feature = "redis")]
pub(crate) const CORRUPT_ENTRIES: &str = "stampede_guard_corrupt_entries_total";
#[cfg(feature = "redis")]
pub(crate) const REDIS_ERRORS: &str = "stampede_guard_redis_errors_total";
#[cfg(feature = "redis")]
pub(crate) const CIRCUIT_OPENINGS: &str = "stampede_guard_circuit_openings_total";

pub(crate) const REVALIDATED: &str = "stampede_guard_revalidated_total";
pub(crate) const UNSAFE_INVALIDATIONS: &str = "stampede_guard_unsafe_invalidations_total";
pub(crate) const INVALIDATION_FAILURES: &str = "stampede_guard_invalidation_failures_total";

pub(crate) fn count(name: &'static str) {
    counter!(name).increment(1);
}

/// One request or answer past the cache, and why.
pub(crate) fn count_bypass(reason: &'static str) {
    counter!(BYPASS, "reason" => reason).increment(1);
}
