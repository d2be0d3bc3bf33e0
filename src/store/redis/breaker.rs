//! A circuit breaker in front of Redis.
//!
//! A Redis that fails or hangs must not make every request pay the deadline:
//! after a run of consecutive failures the circuit opens and the layer runs on
//! its in-process tier alone. The tier's supervisor then pings Redis until it
//! answers, and closes the circuit. Requests never probe; they only read an
//! atomic flag.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::metrics::CIRCUIT_OPEN;

/// Consecutive failures that open the circuit.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

/// The most calls under the breaker a process has on a node's connection at
/// once (see [`Breaker::admit`]): enough to keep a pipeline one network hop
/// away full, few enough that what is sent is answered in one round trip
/// plus a moment of Redis's time.
pub(crate) const IN_FLIGHT: usize = 128;

pub(crate) struct Breaker {
    failures: AtomicU32,
    /// When the node last answered a call, in microseconds since `base`
    /// (see [`super::round_trip`]: a call is judged by its connection's
    /// silence, not by its own wait).
    heard: AtomicU64,
    /// When the last failure that counted was recorded, in microseconds
    /// since `base`: a call sent before it failed in the same episode.
    faulted: AtomicU64,
    /// Until when a call known to keep the connection busy (a big entry on
    /// its way, a `WAIT`) may leave the calls behind it unanswered, in
    /// microseconds since `base` (zero: none).
    busy: AtomicU64,
    base: Instant,
    open: AtomicBool,
    /// Set from the opening until the close, so the opening is reported to
    /// the supervisor once.
    probing: AtomicBool,
    /// Times this circuit opened.
    openings: AtomicU64,
    /// Room for calls under the breaker on the node's connection.
    in_flight: Semaphore,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: AtomicU32::new(0),
            heard: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            base: Instant::now(),
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            openings: AtomicU64::new(0),
            in_flight: Semaphore::new(IN_FLIGHT),
        }
    }
}

impl Breaker {
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    /// The node answered a call (a reply, or an error reply) at `at`.
    pub(crate) fn heard(&self, at: Instant) {
        self.heard.fetch_max(self.micros(at), Ordering::Relaxed);
    }

    /// A call that may keep the node's connection busy until `until` was
    /// sent: the calls queued behind it are not silent before then. Returns
    /// what [`Breaker::not_busy`] takes once it is answered.
    pub(crate) fn busy_until(&self, until: Instant) -> u64 {
        let until = self.micros(until);
        self.busy.fetch_max(until, Ordering::Relaxed);
        until
    }

    /// The call marked by [`Breaker::busy_until`] was answered (or given
    /// up): unless a later one marked the connection busy longer, it is not.
    pub(crate) fn not_busy(&self, mark: u64) {
        let _ = self
            .busy
            .compare_exchange(mark, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Until when the node's connection may be busy with a long call.
    pub(crate) fn busy(&self) -> Option<Instant> {
        match self.busy.load(Ordering::Relaxed) {
            0 => None,
            us => self.base.checked_add(Duration::from_micros(us)),
        }
    }

    /// When the node last answered a call, if it ever did.
    pub(crate) fn last_heard(&self) -> Option<Instant> {
        match self.heard.load(Ordering::Relaxed) {
            0 => None,
            us => self.base.checked_add(Duration::from_micros(us)),
        }
    }

    /// Waits for room on the node's connection for one call under the
    /// breaker, first come first served; the room is given back when the
    /// returned permit is dropped. A burst (a cache avalanche, every
    /// instance asking at once) so queues in the process, where waiting
    /// costs nothing and is judged by nobody, rather than on the socket,
    /// where a call's time runs from its send: what is sent is answered
    /// promptly while Redis keeps up, and the calls that make no queue (a
    /// lease's renewal, a commit, owed past the breaker) are never behind
    /// more than [`IN_FLIGHT`] of them. The wait ends: every call admitted
    /// ends within its own limit (answered, or failed as silent or too
    /// far behind), and once failures open the circuit the calls admitted
    /// after are refused at once.
    pub(crate) async fn admit(&self) -> Option<SemaphorePermit<'_>> {
        self.in_flight.acquire().await.ok()
    }

    /// Whether calls may go to Redis.
    pub(crate) fn is_closed(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    /// Times this circuit opened.
    pub(crate) fn openings(&self) -> u64 {
        self.openings.load(Ordering::Relaxed)
    }

    pub(crate) fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// Records the failure of a call sent at `sent`. Returns true when this
    /// failure opened the circuit and the caller must ask the supervisor to
    /// probe.
    ///
    /// Only a call sent after the last failure that counted is new evidence:
    /// the calls in flight when a connection went silent all fail together,
    /// and count once. So the circuit opens after failures in several
    /// episodes in a row (a Redis that stays down or silent while requests
    /// keep asking), not on one stall, however many calls it held.
    pub(crate) fn failure(&self, sent: Instant) -> bool {
        let now = self.micros(Instant::now());
        let sent = self.micros(sent);
        let last = self.faulted.load(Ordering::Relaxed);
        if last != 0 && sent < last {
            return false;
        }
        if self
            .faulted
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Another failure of the same moment counted.
            return false;
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < FAILURES_TO_OPEN {
            return false;
        }
        self.open();
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Opens the circuit; true when this opened it (it was closed).
    fn open(&self) -> bool {
        if self.open.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.openings.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(CIRCUIT_OPEN).increment(1.0);
        true
    }

    /// Opens the circuit at once, without a run of failed calls: the
    /// supervisor found the link dropped and Redis refusing a new one.
    /// Returns true when this opened it (it was closed).
    pub(crate) fn trip(&self) -> bool {
        let opened = self.open();
        if opened {
            self.probing.store(true, Ordering::Release);
        }
        opened
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
        assert!(!b.failure(Instant::now()));
        b.success();
        assert!(!b.failure(Instant::now()));
        assert!(!b.failure(Instant::now()));
        assert!(b.is_closed());
        assert!(
            b.failure(Instant::now()),
            "third in a row opens and asks for a probe"
        );
        assert!(!b.is_closed());
        assert!(!b.failure(Instant::now()), "a probe already runs");
        assert_eq!(b.openings(), 1);
        b.close();
        let stalled = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(!b.failure(Instant::now()));
        assert!(
            !b.failure(stalled) && !b.failure(stalled),
            "calls in flight in the same episode count once"
        );
        assert!(!b.failure(Instant::now()));
        assert!(b.failure(Instant::now()), "a third episode opens it");
        b.close();
        assert!(b.is_closed());
        assert_eq!(b.openings(), 2);
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
                a.failure(Instant::now());
                b.failure(Instant::now());
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
