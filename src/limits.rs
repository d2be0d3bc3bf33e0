//! The range of every number the builders take: one table, read by the
//! builder methods ([`StampedeGuard`](crate::StampedeGuard),
//! [`Cache`](crate::Cache), [`Lock`](crate::Lock)), which bring a value
//! into its range, and by [`RouteConfig::validate`](crate::RouteConfig::validate),
//! which refuses a value outside it. A knob never means one thing in code
//! and another in a configuration file.
//!
//! Durations, byte counts and ratios are clamped by the builders, never
//! refused with a panic: they are what a service reads from its
//! environment, and a value out of range must not keep it from starting.
//! A status code out of its range panics in the builder: it is a constant
//! written in code (a `StatusCode`), and a wrong one is a programmer error
//! best seen at construction rather than in answers.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::engine::MAX_DELTA;

/// A duration knob: from `min` to 2^31 s, the longest any lifetime may be
/// (RFC 9111 §1.2.2).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub min: Duration,
    /// What the knob accepts, as an error message and the docs say it.
    pub accepted: &'static str,
}

impl Span {
    /// The longest duration any knob takes.
    pub(crate) const MAX: Duration = MAX_DELTA;

    /// `d` brought into the range: below it the least, above it 2^31 s.
    pub(crate) fn clamp(self, d: Duration) -> Duration {
        d.clamp(self.min, Self::MAX)
    }

    /// Whether `d` is in the range.
    pub(crate) fn holds(self, d: Duration) -> bool {
        (self.min..=Self::MAX).contains(&d)
    }
}

const ANY: Span = Span {
    min: Duration::ZERO,
    accepted: "a duration from 0s to 2147483648s (2^31 s)",
};

const POSITIVE: Span = Span {
    min: Duration::from_millis(1),
    accepted: "a duration from 1ms to 2147483648s (2^31 s)",
};

/// How long an answer is fresh. 0 stores nothing on the route's own
/// lifetime: requests still coalesce, and with the origin's
/// `Cache-Control` respected, what it gives freshness to is stored.
pub(crate) const TTL: Span = Span {
    min: Duration::ZERO,
    accepted:
        "a duration from 0s (nothing stored on the route's own lifetime) to 2147483648s (2^31 s)",
};
/// The stale windows after the ttl (0: none).
pub(crate) const STALE_WHILE_REVALIDATE: Span = ANY;
/// See [`STALE_WHILE_REVALIDATE`].
pub(crate) const STALE_IF_ERROR: Span = ANY;
/// How long a request waits on another's rebuild.
pub(crate) const WAIT_BUDGET: Span = ANY;
/// How long a key is marked after an answer it could not share (0: never).
pub(crate) const HIT_FOR_MISS: Span = ANY;
/// A rebuild lease: renewed every third of it, so never zero.
pub(crate) const LEASE: Span = POSITIVE;
/// The longest a rebuild may run: zero would fail every rebuild.
pub(crate) const REBUILD_TIMEOUT: Span = POSITIVE;
/// The least margin of refresh-ahead.
pub(crate) const REFRESH_AHEAD_FLOOR: Span = ANY;
/// The Redis backend's call deadline, connect timeout and probe interval:
/// each is multiplied or waited on by its timers, so never zero.
#[cfg(feature = "redis")]
pub(crate) const REDIS_TIMER: Span = POSITIVE;
/// How long an instance cut off from the fleet's invalidations keeps
/// serving its in-process tier (0: not past the subscription lease).
#[cfg(feature = "redis")]
pub(crate) const OUTAGE_GRACE: Span = ANY;
/// A lock's lease: renewed every third of it, at least a millisecond apart.
pub(crate) const LOCK_LEASE: Span = Span {
    min: Duration::from_millis(3),
    accepted: "a duration from 3ms to 2147483648s (2^31 s)",
};
/// How long a lock acquisition waits (0: one try).
pub(crate) const LOCK_WAIT_BUDGET: Span = ANY;
/// The longest a lock is kept once acquired.
pub(crate) const LOCK_MAX_HOLD: Span = ANY;
/// How long a lock acquisition waits for replicas.
pub(crate) const LOCK_SYNCED_TIMEOUT: Span = ANY;

/// What a ratio (`early_refresh`'s beta, `refresh_ahead`'s multiple)
/// accepts.
pub(crate) const RATIO_ACCEPTED: &str = "a finite number, at least 0 (0: off)";

/// A ratio brought into its range: a finite number at least 0. NaN, the
/// infinities and negative numbers are 0 (off): no value read from the
/// environment turns a refresh on for every request.
pub(crate) fn ratio(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Whether `x` is in a ratio's range.
pub(crate) fn ratio_holds(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

/// The largest body a route stores: at least one byte.
pub(crate) const MAX_BODY_BYTES: RangeInclusive<usize> = 1..=usize::MAX;
/// What `max_body_bytes` accepts.
pub(crate) const MAX_BODY_BYTES_ACCEPTED: &str = "at least 1 byte";

/// The statuses a route may store: those RFC 9110 defines.
pub(crate) const STORED_STATUS: RangeInclusive<u16> = 100..=599;
/// What `cacheable_statuses` accepts.
pub(crate) const STORED_STATUS_ACCEPTED: &str = "status codes in 100..=599";
/// The status a waiter answers with when its budget runs out: a final
/// answer (a 1xx is not one, and a server would turn it into a 500).
pub(crate) const ANSWER_STATUS: RangeInclusive<u16> = 200..=599;
/// What `on_wait_timeout` accepts.
pub(crate) const ANSWER_STATUS_ACCEPTED: &str =
    "\"fail_open\" or a status code in 200..=599 (a final answer)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_clamped_duration_is_held_and_held_ones_are_kept() {
        let spans = [
            TTL,
            STALE_WHILE_REVALIDATE,
            WAIT_BUDGET,
            HIT_FOR_MISS,
            LEASE,
            REBUILD_TIMEOUT,
            REFRESH_AHEAD_FLOOR,
            LOCK_LEASE,
        ];
        let values = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1),
            Duration::from_secs(30),
            Span::MAX,
            Span::MAX + Duration::from_nanos(1),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ];
        for span in spans {
            for d in values {
                assert!(span.holds(span.clamp(d)), "{span:?} {d:?}");
                assert_eq!(span.holds(d), span.clamp(d) == d, "{span:?} {d:?}");
            }
        }
    }

    #[test]
    fn ratios_out_of_range_are_off() {
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, -0.0, 0.0] {
            assert_eq!(ratio(x), 0.0, "{x}");
        }
        assert_eq!(ratio(2.5), 2.5);
        assert_eq!(ratio(f64::MAX), f64::MAX);
        assert!(!ratio_holds(f64::NAN) && !ratio_holds(f64::INFINITY) && !ratio_holds(-1.0));
    }
}
