//! The process's metrics recorder, and reading the counters it captured.

use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::{Mutex, MutexGuard};

/// The process-wide debugging recorder, installed on first use, and the
/// turn of the test using it: the recorder sees every guard of the process,
/// so a test reads it only while it holds the turn, and every test of a
/// binary that installs it takes the turn. The snapshot taken here empties
/// what earlier tests left, so the test starts from nothing.
pub async fn recorder() -> (&'static Snapshotter, MutexGuard<'static, ()>) {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    static TURN: Mutex<()> = Mutex::const_new(());
    let turn = TURN.lock().await;
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder in this binary");
        snapshotter
    });
    let _ = snapshotter.snapshot();
    (snapshotter, turn)
}

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
