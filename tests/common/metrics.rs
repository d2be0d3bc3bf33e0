//! Reading the counters a test's recorder captured.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// Every counter series in a snapshot, as (name, value); a name recorded
/// with several label sets comes once per set.
pub fn counters(snapshotter: &Snapshotter) -> Vec<(String, u64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect()
}
