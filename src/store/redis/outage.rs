//! What an operator reads while Redis is failing: one WARN when the tier
//! degrades, a summary at most every [`SUMMARY_EVERY`] while it stays
//! degraded, one INFO when it has recovered.
//!
//! "Degraded" is what [`Backend::health`](crate::Backend::health) reports
//! as `Status::Degraded` on a connected tier: a circuit is open, or the
//! subscription is not confirmed live (a gap since a lost link, or its
//! lease ran out). The log follows that one signal: it is read under the
//! outage's lock (see [`Connections::reading`]) by every health report, by
//! the supervisor whenever it wakes and at every keepalive, and by a call
//! that opens a circuit. The first reading that finds the tier degraded
//! logs the WARN; the first that finds it whole again logs the INFO. So
//! every degraded episode a health report shows logs exactly one WARN and
//! one INFO, however short, and each sign of trouble in between is only
//! counted.

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
    /// The subscription is not confirmed live (a gap since a lost link, or
    /// its lease ran out).
    SubscriptionUnconfirmed,
}

impl Sign {
    fn as_str(self) -> &'static str {
        match self {
            Sign::CircuitOpened => "redis calls failing",
            Sign::SubscriberSilent => "redis subscriber not answering",
            Sign::SubscriptionUnconfirmed => "redis subscription not confirmed live",
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
    /// Where Redis is (`host:port`, no password), named by every line, so
    /// the lines of two backends in one process tell which one failed.
    redis: String,
}

impl Outage {
    /// The outage log of the tier at `redis` (an address, no password).
    pub(crate) fn at(redis: String) -> Outage {
        Outage {
            redis,
            ..Outage::default()
        }
    }

    /// Brings the log in line with the tier's state, read by `read` under
    /// the outage's lock (so readings are applied in the order they were
    /// taken): the cause if the tier is degraded, and whatever the caller
    /// wants read at the same instant. A degraded reading with no outage
    /// running begins one, with its WARN (`hint`, if given, names the
    /// cause); a whole one ends the outage running, with its INFO.
    pub(crate) fn follow<T>(
        &self,
        grace: Duration,
        hint: Option<Sign>,
        read: impl FnOnce() -> (Option<Sign>, T),
    ) -> T {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let (cause, value) = read();
        match (cause, current.is_some()) {
            (Some(cause), false) => {
                let cause = hint.unwrap_or(cause);
                self.count.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    redis = %self.redis,
                    cause = cause.as_str(),
                    outage_grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                    "redis unreachable; serving from the in-process tier with local coalescing \
                     (its entries for at most the outage grace past the subscription lease) \
                     until redis answers again"
                );
                let now = Instant::now();
                *current = Some(Began {
                    at: now,
                    summarised: now,
                    circuit_openings: 0,
                    silent_keepalives: 0,
                });
            }
            (None, true) => {
                if let Some(began) = current.take() {
                    tracing::info!(
                        redis = %self.redis,
                        down_for_ms =
                            u64::try_from(began.at.elapsed().as_millis()).unwrap_or(u64::MAX),
                        circuit_openings = began.circuit_openings,
                        silent_keepalives = began.silent_keepalives,
                        "redis answers again and the subscription is confirmed; fleet-wide \
                         protection restored"
                    );
                }
            }
            _ => {}
        }
        value
    }

    /// Counts a sign of trouble in the outage running, if one runs.
    pub(crate) fn sign(&self, sign: Sign) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(began) = current.as_mut() {
            match sign {
                Sign::CircuitOpened => began.circuit_openings += 1,
                Sign::SubscriberSilent => began.silent_keepalives += 1,
                Sign::SubscriptionUnconfirmed => {}
            }
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
            redis = %self.redis,
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
}

/// What a health report reads of a connected tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Every circuit lets calls through.
    pub reachable: bool,
    /// The subscription is confirmed live: no gap, its lease running.
    pub subscription_live: bool,
    /// Circuits open now.
    pub open_circuits: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(outage: &Outage, degraded: bool) {
        let cause = degraded.then_some(Sign::CircuitOpened);
        outage.follow(Duration::ZERO, None, || (cause, ()));
    }

    #[test]
    fn an_outage_is_counted_once_however_many_readings_and_signs() {
        let outage = Outage::default();
        assert!(!outage.is_on());
        outage.sign(Sign::CircuitOpened);
        assert!(!outage.is_on(), "a sign alone begins nothing");
        follow(&outage, true);
        follow(&outage, true);
        outage.sign(Sign::SubscriberSilent);
        outage.sign(Sign::CircuitOpened);
        assert!(outage.is_on());
        assert_eq!(outage.count.load(Ordering::Relaxed), 1);
        follow(&outage, false);
        assert!(!outage.is_on());
        follow(&outage, false);
        follow(&outage, true);
        assert_eq!(outage.count.load(Ordering::Relaxed), 2);
    }
}
