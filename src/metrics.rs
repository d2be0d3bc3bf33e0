//! Metrics published through the [`metrics`] facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, …), then call
//! [`describe_metrics`] once so the recorder knows each series' unit and
//! help text (the first [`StampedeGuard`](crate::StampedeGuard) or
//! [`Cache`](crate::Cache) built in the process also calls it, which is
//! enough when the recorder was installed before). Without a recorder every
//! update is a no-op.
//!
//! Every per-request series is labelled `route` and `namespace`:
//!
//! - `route`: the name the route gave ([`StampedeGuard::route_name`](crate::StampedeGuard::route_name),
//!   [`Cache::route_name`](crate::Cache::route_name)), else, with the `axum`
//!   feature, the route's matched path as axum records it (`/users/{id}`,
//!   the template, never the path a client sent), else `unnamed`. A client
//!   cannot create label values: at most 1,000 (route, namespace) pairs are
//!   labelled per process, and any further pair is counted as
//!   `route="other", namespace="other"`.
//! - `namespace`: the guard's or cache's namespace (empty by default).
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `stampede_guard_hits_total` | counter | answered from a fresh entry |
//! | `stampede_guard_stale_total` | counter | answered from a stale entry (while revalidating, or on error) |
//! | `stampede_guard_misses_total` | counter | requests that led a rebuild |
//! | `stampede_guard_coalesced_total` | counter | requests answered by another request's rebuild |
//! | `stampede_guard_origin_calls_total` | counter | calls to the origin (handler or rebuild closure) |
//! | `stampede_guard_bypass_total` | counter | requests passed through without the cache, and origin answers that could not be shared; also labelled `reason` (`method`, `credentials`, `request body`, `set-cookie`, `vary`, …) |
//! | `stampede_guard_refreshes_total` | counter | background refreshes started |
//! | `stampede_guard_wait_timeouts_total` | counter | waiters whose wait budget ran out |
//! | `stampede_guard_l2_hits_total` | counter | misses in this process answered by an entry in Redis |
//! | `stampede_guard_early_refreshes_total` | counter | probabilistic early refreshes started |
//! | `stampede_guard_fenced_writes_total` | counter | late commits refused because a newer entry was stored |
//! | `stampede_guard_revalidated_total` | counter | rebuilds answered `304 Not Modified` by the origin: the entry was renewed without its body |
//! | `stampede_guard_unsafe_invalidations_total` | counter | URL groups dropped after a successful unsafe method (POST, PUT, …) |
//! | `stampede_guard_invalidation_failures_total` | counter | such invalidations that did not reach Redis (the response is sent all the same) |
//! | `stampede_guard_rebuild_duration_seconds` | histogram | how long each origin call (rebuild) took, until it gave its answer or failed |
//! | `stampede_guard_wait_duration_seconds` | histogram | how long each request that waited on a rebuild it did not run waited, until it was answered |
//!
//! Series of the backend, not of a route (no `route` or `namespace` label):
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `stampede_guard_l1_bytes` | gauge | bytes the in-process tiers of this process hold (weighted size, summed over backends), updated as entries are stored and dropped |
//! | `stampede_guard_circuit_open` | gauge | circuits of this process's Redis tiers that are open (one per tier; on Redis Cluster one per primary; 0: every circuit closed) |
//! | `stampede_guard_corrupt_entries_total` | counter | unreadable entries found in Redis (treated as misses) |
//! | `stampede_guard_redis_errors_total` | counter | Redis calls that failed or missed their deadline |
//! | `stampede_guard_circuit_openings_total` | counter | circuits opened (on Redis Cluster, one per primary): that node's keys are served from the in-process tier until a probe of the node itself answers |

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;

use metrics::{
    describe_counter, describe_gauge, describe_histogram, gauge, Key, Label, Level, Metadata, Unit,
};

pub(crate) const HITS: &str = "stampede_guard_hits_total";
pub(crate) const STALE: &str = "stampede_guard_stale_total";
pub(crate) const MISSES: &str = "stampede_guard_misses_total";
pub(crate) const COALESCED: &str = "stampede_guard_coalesced_total";
pub(crate) const ORIGIN_CALLS: &str = "stampede_guard_origin_calls_total";
pub(crate) const BYPASS: &str = "stampede_guard_bypass_total";
pub(crate) const REFRESHES: &str = "stampede_guard_refreshes_total";
pub(crate) const WAIT_TIMEOUTS: &str = "stampede_guard_wait_timeouts_total";
pub(crate) const L2_HITS: &str = "stampede_guard_l2_hits_total";
pub(crate) const EARLY_REFRESHES: &str = "stampede_guard_early_refreshes_total";
pub(crate) const FENCED_WRITES: &str = "stampede_guard_fenced_writes_total";
pub(crate) const CORRUPT_ENTRIES: &str = "stampede_guard_corrupt_entries_total";
pub(crate) const REDIS_ERRORS: &str = "stampede_guard_redis_errors_total";
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const CIRCUIT_OPENINGS: &str = "stampede_guard_circuit_openings_total";

pub(crate) const REVALIDATED: &str = "stampede_guard_revalidated_total";
pub(crate) const UNSAFE_INVALIDATIONS: &str = "stampede_guard_unsafe_invalidations_total";
pub(crate) const INVALIDATION_FAILURES: &str = "stampede_guard_invalidation_failures_total";
pub(crate) const REBUILD_DURATION: &str = "stampede_guard_rebuild_duration_seconds";
pub(crate) const WAIT_DURATION: &str = "stampede_guard_wait_duration_seconds";
pub(crate) const L1_BYTES: &str = "stampede_guard_l1_bytes";
pub(crate) const CIRCUIT_OPEN: &str = "stampede_guard_circuit_open";

/// Every metric the crate emits, with its kind, unit and help text.
const DESCRIBED: [(&str, Kind, Unit, &str); 21] = [
    (HITS, Kind::Counter, Unit::Count, "Requests answered from a fresh entry."),
    (STALE, Kind::Counter, Unit::Count, "Requests answered from a stale entry (while revalidating, or on error)."),
    (MISSES, Kind::Counter, Unit::Count, "Requests that led a rebuild."),
    (COALESCED, Kind::Counter, Unit::Count, "Requests answered by another request's rebuild."),
    (ORIGIN_CALLS, Kind::Counter, Unit::Count, "Calls to the origin (handler or rebuild closure)."),
    (BYPASS, Kind::Counter, Unit::Count, "Requests passed through without the cache, and origin answers that could not be shared, by reason."),
    (REFRESHES, Kind::Counter, Unit::Count, "Background refreshes started."),
    (WAIT_TIMEOUTS, Kind::Counter, Unit::Count, "Waiters whose wait budget ran out."),
    (L2_HITS, Kind::Counter, Unit::Count, "Misses in this process answered by an entry in Redis."),
    (EARLY_REFRESHES, Kind::Counter, Unit::Count, "Probabilistic early refreshes started."),
    (FENCED_WRITES, Kind::Counter, Unit::Count, "Late commits refused because a newer entry was stored."),
    (CORRUPT_ENTRIES, Kind::Counter, Unit::Count, "Unreadable entries found in Redis (treated as misses)."),
    (REDIS_ERRORS, Kind::Counter, Unit::Count, "Redis calls that failed or missed their deadline."),
    (CIRCUIT_OPENINGS, Kind::Counter, Unit::Count, "Circuits of this process's Redis tiers opened (on Redis Cluster, one per primary)."),
    (REVALIDATED, Kind::Counter, Unit::Count, "Rebuilds answered 304 Not Modified: the entry was renewed without its body."),
    (UNSAFE_INVALIDATIONS, Kind::Counter, Unit::Count, "URL groups dropped after a successful unsafe method."),
    (INVALIDATION_FAILURES, Kind::Counter, Unit::Count, "Invalidations after an unsafe method that did not reach Redis."),
    (REBUILD_DURATION, Kind::Histogram, Unit::Seconds, "Time each origin call (rebuild) took."),
    (WAIT_DURATION, Kind::Histogram, Unit::Seconds, "Time each request waited on a rebuild it did not run, until answered."),
    (L1_BYTES, Kind::Gauge, Unit::Bytes, "Bytes held by the in-process tiers of this process."),
    (CIRCUIT_OPEN, Kind::Gauge, Unit::Count, "Redis tiers of this process whose circuit breaker is open."),
];

/// Histogram buckets, in seconds, that fit the crate's two duration
/// series: a wait answered from another request's rebuild in a fraction of
/// a millisecond, through origin calls of a few milliseconds to seconds, up
/// to the default rebuild timeout (30 s). Give them to the exporter, or
/// it may render the durations as summaries, which cannot be aggregated
/// across instances (the Grafana dashboard in the repository's `docs/`
/// queries `_bucket` series).
///
/// ```
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
///
/// let builder = PrometheusBuilder::new()
///     .set_buckets_for_metric(
///         Matcher::Prefix("stampede_guard_".into()),
///         &stampede_guard::metrics::LATENCY_BUCKETS,
///     )
///     .unwrap();
/// # let _ = builder;
/// ```
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
    30.0,
];

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Histogram,
    Gauge,
}

/// Every metric name the crate emits.
///
/// ```
/// let names: Vec<&str> = stampede_guard::metrics::names().collect();
/// assert!(!names.is_empty());
/// ```
pub fn names() -> impl Iterator<Item = &'static str> {
    DESCRIBED.iter().map(|(name, ..)| *name)
}

/// Tells the installed recorder the unit and help text of every metric the
/// crate emits. Call it once after installing the recorder; calling it
/// again does no harm.
///
/// The first [`StampedeGuard`](crate::StampedeGuard) or
/// [`Cache`](crate::Cache) built in the process calls it too: with the
/// recorder installed before the first guard is built (the usual start-up
/// order), nothing else is needed.
///
/// ```
/// // After `metrics::set_global_recorder(...)` or an exporter's install:
/// stampede_guard::describe_metrics();
/// ```
pub fn describe_metrics() {
    for (name, kind, unit, help) in DESCRIBED {
        match kind {
            Kind::Counter => describe_counter!(name, unit, help),
            Kind::Histogram => describe_histogram!(name, unit, help),
            Kind::Gauge => describe_gauge!(name, unit, help),
        }
    }
}

/// [`describe_metrics`], the first time only.
pub(crate) fn describe_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(describe_metrics);
}

/// The labels of one route's series: made once per (route, namespace) pair
/// and kept for the process, so an update on the hit path copies a pointer
/// and allocates nothing. Opaque to the engine, which only passes them on.
#[derive(Clone, Copy)]
pub(crate) struct Labels(&'static LabelSet);

/// A (route, namespace) pair's labels, and the key of its hit counter made
/// once: a key hashes its name and labels when it is made, which every hit
/// would otherwise pay.
pub(crate) struct LabelSet {
    labels: &'static [Label; 2],
    hits: Key,
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.route(), self.namespace())
    }
}

/// At most this many (route, namespace) pairs get labels of their own; the
/// others share [`Labels::OVERFLOW`].
pub(crate) const MAX_LABEL_SETS: usize = 1000;

static OVERFLOW_LABELS: [Label; 2] = [
    Label::from_static_parts("route", "other"),
    Label::from_static_parts("namespace", "other"),
];

static OVERFLOW: LabelSet = LabelSet {
    labels: &OVERFLOW_LABELS,
    hits: Key::from_static_parts(HITS, &OVERFLOW_LABELS),
};

type Table = HashMap<Box<str>, HashMap<Box<str>, Labels>>;

impl Labels {
    /// The labels for `route` in `namespace`.
    pub(crate) fn of(route: &str, namespace: &str) -> Labels {
        static TABLE: OnceLock<Mutex<(usize, Table)>> = OnceLock::new();
        let table = TABLE.get_or_init(Mutex::default);
        let mut guard = table.lock().unwrap_or_else(|e| e.into_inner());
        let (count, table) = &mut *guard;
        if let Some(labels) = table.get(namespace).and_then(|routes| routes.get(route)) {
            return *labels;
        }
        if *count >= MAX_LABEL_SETS {
            return Labels(&OVERFLOW);
        }
        *count += 1;
        let leak = |s: &str| -> &'static str { Box::leak(Box::from(s)) };
        let set: &'static [Label; 2] = Box::leak(Box::new([
            Label::new("route", leak(route)),
            Label::new("namespace", leak(namespace)),
        ]));
        let labels = Labels(Box::leak(Box::new(LabelSet {
            labels: set,
            hits: Key::from_static_parts(HITS, set),
        })));
        table
            .entry(Box::from(namespace))
            .or_default()
            .insert(Box::from(route), labels);
        labels
    }

    pub(crate) fn route(&self) -> &'static str {
        label_value(&self.0.labels[0])
    }

    pub(crate) fn namespace(&self) -> &'static str {
        label_value(&self.0.labels[1])
    }

    fn key(self, name: &'static str) -> Key {
        Key::from_static_parts(name, self.0.labels)
    }
}

fn label_value(label: &'static Label) -> &'static str {
    label.value()
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// One more on a route's counter.
pub(crate) fn count(name: &'static str, labels: Labels) {
    let key = labels.key(name);
    metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
}

/// One more on a route's hit counter (`HITS`), with its key made once.
pub(crate) fn count_hit(labels: Labels) {
    metrics::with_recorder(|r| r.register_counter(&labels.0.hits, &METADATA).increment(1));
}

/// One more on a backend-wide counter.
#[cfg(feature = "redis")]
pub(crate) fn count_backend(name: &'static str) {
    let key = Key::from_static_name(name);
    metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
}

/// One request or answer past the cache, and why.
pub(crate) fn count_bypass(reason: &'static str, labels: Labels) {
    metrics::counter!(
        BYPASS,
        "route" => labels.route(),
        "namespace" => labels.namespace(),
        "reason" => reason
    )
    .increment(1);
}

/// A duration on a route's histogram, in seconds.
pub(crate) fn record(name: &'static str, labels: Labels, duration: Duration) {
    let key = labels.key(name);
    metrics::with_recorder(|r| {
        r.register_histogram(&key, &METADATA)
            .record(duration.as_secs_f64())
    });
}

/// Reports a changing size on a process-wide gauge summed over its
/// sources: each source keeps what it last reported and adds the change.
#[derive(Default, Debug)]
pub(crate) struct GaugeShare {
    reported: AtomicU64,
}

impl GaugeShare {
    /// This source's value is now `now`.
    pub(crate) fn set(&self, name: &'static str, now: u64) {
        let before = self.reported.swap(now, Ordering::AcqRel);
        if now >= before {
            gauge!(name).increment((now - before) as f64);
        } else {
            gauge!(name).decrement((before - now) as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_made_once_per_pair_and_bounded() {
        let a = Labels::of("report", "shop");
        let b = Labels::of("report", "shop");
        assert!(std::ptr::eq(a.0, b.0), "one label set per pair");
        assert!(
            a.0.hits == a.key(HITS),
            "the kept hit key is the one a count makes"
        );
        assert_eq!((a.route(), a.namespace()), ("report", "shop"));
        // Fill the table: past the bound, every new pair shares one set.
        for i in 0..MAX_LABEL_SETS + 10 {
            Labels::of(&format!("r{i}"), "flood");
        }
        let late = Labels::of("never-seen-before", "flood");
        assert_eq!((late.route(), late.namespace()), ("other", "other"));
        // Pairs labelled before the flood keep their own labels.
        assert_eq!(Labels::of("report", "shop").route(), "report");
    }

    #[test]
    fn every_metric_is_described_once() {
        let mut names: Vec<_> = names().collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DESCRIBED.len());
        // Every name this file declares has a description.
        let declared: Vec<&str> = include_str!("metrics.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("pub(crate) const "))
            .filter_map(|rest| rest.split_once(": &str = \"stampede_guard_"))
            .filter_map(|(_, name)| name.split_once('"'))
            .map(|(name, _)| name)
            .collect();
        assert!(declared.len() >= 20, "{declared:?}");
        for name in declared {
            let full = format!("stampede_guard_{name}");
            assert!(names.contains(&full.as_str()), "{full} has no description");
        }
    }
}
