//! What an operator reads while Redis is failing: one WARN when the tier
//! degrades, a summary at most every [`SUMMARY_EVERY`] while it stays
//! degraded, one INFO when it has recovered.
//!
//! The tier degrades when calls fail enough to open a circuit, or when the
//! subscriber stops answering its keepalive; it has recovered once every
//! circuit is closed and the subscription is confirmed live again. Each
//! sign of trouble in between is only counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two summaries of one outage.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// What was seen to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sign {
    /// Calls failed enough to open a circuit.
    CircuitOpened,
    /// The subscriber did not answer its keepalive.
    SubscriberSilent,
}

impl Sign {
    fn as_str(self) -> &'static str {
        match self {
            Sign::CircuitOpened => "redis calls failing",
            Sign::SubscriberSilent => "redis subscriber not answering",
        }
    }
}

/// One outage: when it began and what it has cost so far.
struct Began {
    at: Instant,
    summarised: Instant,
    circuit_openings: u64,
    silent_keepalives: u64,
}

/// The tier's outage, if one runs.
#[derive(Default)]
pub(crate) struct Outage {
    current: Mutex<Option<Began>>,
    /// Outages since the tier connected.
    pub(crate) count: AtomicU64,
}

impl Outage {
    /// A sign of trouble: the first one of an outage logs the WARN, the
    /// others are counted.
    pub(crate) fn sign(&self, sign: Sign, grace: Duration) {
        let now = Instant::now();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let began = current.get_or_insert_with(|| {
            self.count.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                cause = sign.as_str(),
                outage_grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                "redis unreachable; serving from the in-process tier with local coalescing \
                 (its entries for at most the outage grace past the subscription lease) \
                 until redis answers again"
            );
            Began {
                at: now,
                summarised: now,
                circuit_openings: 0,
                silent_keepalives: 0,
            }
        });
        match sign {
            Sign::CircuitOpened => began.circuit_openings += 1,
            Sign::SubscriberSilent => began.silent_keepalives += 1,
        }
    }

    /// Logs a summary if an outage runs and the last one is old enough.
    pub(crate) fn summarise(&self) {
        let now = Instant::now();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let Some(began) = current.as_mut() else {
            return;
        };
        if now.saturating_duration_since(began.summarised) < SUMMARY_EVERY {
            return;
        }
        began.summarised = now;
        tracing::warn!(
            down_for_s = now.saturating_duration_since(began.at).as_secs(),
            circuit_openings = began.circuit_openings,
            silent_keepalives = began.silent_keepalives,
            "redis still unreachable; serving from the in-process tier"
        );
    }

    /// Whether an outage runs.
    #[cfg(test)]
    pub(crate) fn is_on(&self) -> bool {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Redis answers and the subscription is confirmed: ends the outage,
    /// with its INFO, if one ran.
    pub(crate) fn recovered(&self) {
        let began = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(began) = began {
            tracing::info!(
                down_for_ms = u64::try_from(began.at.elapsed().as_millis()).unwrap_or(u64::MAX),
                circuit_openings = began.circuit_openings,
                silent_keepalives = began.silent_keepalives,
                "redis answers again and the subscription is confirmed; fleet-wide \
                 protection restored"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_counted_once_however_many_signs() {
        let outage = Outage::default();
        assert!(!outage.is_on());
        outage.sign(Sign::SubscriberSilent, Duration::ZERO);
        outage.sign(Sign::SubscriberSilent, Duration::ZERO);
        outage.sign(Sign::CircuitOpened, Duration::ZERO);
        assert!(outage.is_on());
        assert_eq!(outage.count.load(Ordering::Relaxed), 1);
        outage.recovered();
        assert!(!outage.is_on());
        outage.recovered();
        outage.sign(Sign::CircuitOpened, Duration::ZERO);
        assert_eq!(outage.count.load(Ordering::Relaxed), 2);
    }
}
