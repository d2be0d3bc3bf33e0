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

/// One series of a snapshot: its name, its labels (sorted) and its value.
#[derive(Debug)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub unit: Option<metrics::Unit>,
    pub value: DebugValue,
}

impl Series {
    /// The value of label `name`, if the series has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every series in a snapshot (taking it resets counters and gauges and
/// drains histograms, as the debugging recorder does).
pub fn series(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _, value)| {
            let (_, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            Series {
                name: key.name().to_owned(),
                labels,
                unit,
                value,
            }
        })
        .collect()
}
