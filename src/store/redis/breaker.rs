//! A circuit breaker in front of Redis.
//!
//! A Redis that fails or hangs must not make every request pay the deadline:
//! after a run of consecutive failures the circuit opens and the layer runs on
//! its in-process tier alone. The tier's supervisor then pings Redis until it
//! answers, and closes the circuit. Requests never probe; they only read an
//! atomic flag.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::metrics::CIRCUIT_OPEN;

/// Consecutive failures that open the circuit.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

#[derive(Default)]
pub(crate) struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// Set from the opening until the close, so the opening is reported to
    /// the supervisor once.
    probing: AtomicBool,
}

impl Breaker {
    /// Whether calls may go to Redis.
    pub(crate) fn is_closed(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    pub(crate) fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// Records a failure. Returns true when this failure opened the circuit
    /// and the caller must ask the supervisor to probe.
    pub(crate) fn failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < FAILURES_TO_OPEN {
            return false;
        }
        if !self.open.swap(true, Ordering::AcqRel) {
            metrics::gauge!(CIRCUIT_OPEN).increment(1.0);
        }
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Called by the supervisor's probe when Redis answered again.
    pub(crate) fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open.swap(false, Ordering::AcqRel) {
            metrics::gauge!(CIRCUIT_OPEN).decrement(1.0);
        }
        self.probing.store(false, Ordering::Release);
    }
}

impl Drop for Breaker {
    /// A tier that goes away open no longer counts as an open circuit.
    fn drop(&mut self) {
        if *self.open.get_mut() {
            metrics::gauge!(CIRCUIT_OPEN).decrement(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_starts_one_probe() {
        let b = Breaker::default();
        assert!(!b.failure());
        b.success();
        assert!(!b.failure());
        assert!(!b.failure());
        assert!(b.is_closed());
        assert!(b.failure(), "third in a row opens and asks for a probe");
        assert!(!b.is_closed());
        assert!(!b.failure(), "a probe already runs");
        b.close();
        assert!(b.is_closed());
    }

    #[test]
    fn the_circuit_gauge_counts_open_circuits() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let gauge = || -> f64 {
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter(|(k, ..)| k.key().name() == CIRCUIT_OPEN)
                .map(|(.., v)| match v {
                    DebugValue::Gauge(g) => g.into_inner(),
                    _ => 0.0,
                })
                .sum()
        };
        metrics::with_local_recorder(&recorder, || {
            let (a, b) = (Breaker::default(), Breaker::default());
            for _ in 0..FAILURES_TO_OPEN + 2 {
                a.failure();
                b.failure();
            }
            // (Each snapshot resets the gauge: it shows the change since.)
            assert_eq!(gauge(), 2.0, "two circuits opened, each counted once");
            a.close();
            a.close();
            assert_eq!(gauge(), -1.0, "one closed, counted once");
            drop(b);
            assert_eq!(gauge(), -1.0, "an open breaker dropped is no longer open");
            drop(a);
            assert_eq!(gauge(), 0.0, "a closed one dropped changes nothing");
        });
    }
}
