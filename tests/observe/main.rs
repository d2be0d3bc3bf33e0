//! Metrics as a recorder sees them. The recorder is process-wide: every test
//! here takes it with `common::metrics::recorder()`, which also gives the
//! test its turn, so no other test's series reach a snapshot.

#[path = "../common/mod.rs"]
mod common;

mod counters;
mod dashboard;
mod labels;
mod outage_series;
mod same_counts;
mod series;
