//! What is known of a Redis tier from the backend's construction on,
//! before its first connection: where Redis is, the attempts that failed,
//! and that its circuit is open while none succeeded.
//!
//! A backend that started without Redis serves with in-process protection
//! and connects in the background; its stats, its health and the metrics
//! an alert reads must say so from the first moment, not only once a
//! connection exists. So the backend-wide series
//! (`stampede_guard_circuit_open`, `stampede_guard_redis_errors_total`,
//! `stampede_guard_circuit_openings_total`) are registered at construction
//! (at zero when Redis answered), and a start-up without Redis counts as one
//! circuit opened, one outage, and one error per failed attempt, kept in
//! the backend's counters after it joins.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::metrics::{self as m, CIRCUIT_OPEN, CIRCUIT_OPENINGS, REDIS_ERRORS};

/// A Redis tier's start (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Start {
    /// Where Redis is (`host:port`, no password).
    address: String,
    /// Connection attempts that failed before the first that succeeded.
    errors: AtomicU64,
    /// Whether the circuit is reported open: from the first failed attempt
    /// until one succeeds, the backend shuts down or is dropped.
    open: AtomicBool,
    /// Whether the start began without Redis (one circuit opening, one
    /// outage).
    began_down: AtomicBool,
}

impl Start {
    /// The start of a tier at `address`: its backend-wide series exist from
    /// now on.
    pub(crate) fn new(address: String) -> Start {
        metrics::gauge!(CIRCUIT_OPEN).increment(0.0);
        metrics::counter!(REDIS_ERRORS).increment(0);
        metrics::counter!(CIRCUIT_OPENINGS).increment(0);
        Start {
            address,
            errors: AtomicU64::new(0),
            open: AtomicBool::new(false),
            began_down: AtomicBool::new(false),
        }
    }

    /// Where Redis is, for logs.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// An attempt to connect failed: counted as an error, and the first one
    /// opens the circuit (one opening, one outage) until one succeeds.
    pub(crate) fn failed(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(REDIS_ERRORS);
        if !self.began_down.swap(true, Ordering::AcqRel) {
            self.open.store(true, Ordering::Release);
            metrics::gauge!(CIRCUIT_OPEN).increment(1.0);
            m::count_backend(CIRCUIT_OPENINGS);
        }
    }

    /// The tier connected, or will never (the backend shut down): its
    /// circuit is no longer reported open here.
    pub(crate) fn ended(&self) {
        if self.open.swap(false, Ordering::AcqRel) {
            metrics::gauge!(CIRCUIT_OPEN).decrement(1.0);
        }
    }

    /// Attempts that failed before the tier connected.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// 1 if the backend started without Redis, else 0: the circuit opening
    /// and the outage the start counts.
    pub(crate) fn began_down(&self) -> u64 {
        u64::from(self.began_down.load(Ordering::Acquire))
    }
}

impl Drop for Start {
    fn drop(&mut self) {
        self.ended();
    }
}
