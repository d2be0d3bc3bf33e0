//! Probabilistic early refresh (XFetch; Vattani, Chierichetti and Lowenstein,
//! "Optimal Probabilistic Cache Stampede Prevention", VLDB 2015).
//!
//! A fresh entry is declared due for refresh when
//! `now - delta * beta * ln(rand()) >= expiry`, where `delta` is how long the
//! last rebuild took. The chance rises as expiry nears and is higher for
//! values that are slow to build, so a hot key is usually rebuilt, by one
//! request, before it ever expires. `beta = 1` is the paper's optimum; larger
//! values refresh earlier.
//!
//! The paper draws once per request. At tens of thousands of hits per second
//! that makes an early refresh all but certain as soon as the chance is not
//! tiny, far earlier than intended; so each process draws at most eight times
//! per rebuild time per entry (see `Entry::claim_draw`). With `beta = 1` a hot
//! key is then refreshed about two rebuild times before it expires, however
//! many requests it gets.

use std::time::{Duration, Instant};

/// Lease-based refresh-ahead, the deterministic alternative to XFetch: a
/// fresh entry is refreshed in the background once its freshness left is
/// within `multiple` times its last rebuild time, and never less than
/// `floor`. The first request to see it so takes the right to refresh (the
/// process's flight, then the fleet's lease); everyone keeps being served
/// the entry, which is still fresh.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RefreshAhead {
    pub multiple: f64,
    pub floor: Duration,
}

impl RefreshAhead {
    /// The margin before expiry at which an entry that took `rebuild` to
    /// build is refreshed. Saturates.
    pub(crate) fn margin(&self, rebuild: Duration) -> Duration {
        let scaled = Duration::try_from_secs_f64(rebuild.as_secs_f64() * self.multiple)
            .unwrap_or(Duration::MAX);
        scaled.max(self.floor)
    }
}

/// Whether an entry that is fresh until `fresh_until`, and took `delta` to
/// build, should be refreshed now. `draw` is uniform in (0, 1].
pub(crate) fn due(
    now: Instant,
    fresh_until: Instant,
    delta: Duration,
    beta: f64,
    draw: f64,
) -> bool {
    if now >= fresh_until {
        return true;
    }
    let left = fresh_until.duration_since(now).as_secs_f64();
    // -ln(draw) is exponentially distributed with mean 1.
    let gap = delta.as_secs_f64() * beta * -draw.max(f64::MIN_POSITIVE).ln();
    gap >= left
}

/// One draw in (0, 1].
pub(crate) fn draw() -> f64 {
    1.0 - crate::random::unit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_from_expiry_a_cheap_value_is_not_due() {
        let now = Instant::now();
        let expiry = now + Duration::from_secs(60);
        assert!(!due(now, expiry, Duration::from_millis(10), 1.0, 0.5));
    }

    #[test]
    fn the_refresh_ahead_margin_scales_with_rebuild_time_above_its_floor() {
        let ahead = RefreshAhead {
            multiple: 2.0,
            floor: Duration::from_millis(50),
        };
        assert_eq!(ahead.margin(Duration::ZERO), Duration::from_millis(50));
        assert_eq!(
            ahead.margin(Duration::from_millis(100)),
            Duration::from_millis(200)
        );
        // Saturates rather than panics.
        assert_eq!(ahead.margin(Duration::MAX), Duration::MAX);
        let huge = RefreshAhead {
            multiple: f64::MAX,
            floor: Duration::ZERO,
        };
        assert_eq!(huge.margin(Duration::from_secs(1)), Duration::MAX);
    }

    #[test]
    fn expired_is_always_due() {
        let now = Instant::now();
        assert!(due(now, now, Duration::ZERO, 1.0, 1.0));
    }

    #[test]
    fn the_chance_rises_as_expiry_nears() {
        let now = Instant::now();
        let delta = Duration::from_millis(100);
        let share = |left_ms: u64| {
            let expiry = now + Duration::from_millis(left_ms);
            let n = 10_000;
            (1..=n)
                .filter(|i| due(now, expiry, delta, 1.0, *i as f64 / n as f64))
                .count() as f64
                / n as f64
        };
        // P(due) = exp(-left / (delta * beta)).
        assert!((share(100) - (-1.0f64).exp()).abs() < 0.01);
        assert!(share(10) > share(100));
        assert!(share(1000) < 0.001);
    }
}
