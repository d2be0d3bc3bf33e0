//! The link's round trip, and how long a call may go unanswered before it
//! counts as failed.
//!
//! A call's deadline is a judgement of the server, not of the queue in
//! front of it: on a multiplexed connection a call sent behind a burst (a
//! cache avalanche, every instance asking at once) waits its turn while
//! Redis answers the calls before it, and a link one network hop away
//! takes a round trip longer than loopback's before anything comes back.
//! Neither is Redis failing. So a sent call fails only when its connection
//! has been **silent** for longer than it should be: no reply to it, nor to
//! any call on the same connection, for [`RoundTrip::silence`], the
//! configured deadline or, on a link whose measured round trips need more,
//! twice the smoothed round trip plus four times its variation (the
//! retransmission timeout of RFC 6298, with the smoothing it gives). The
//! round trip is measured by pings that nothing queues behind (the
//! subscriber's keepalive, the probes, one at connect), so a burst does not
//! inflate it. A call that keeps hearing the connection answer others still
//! ends once it has waited the longest any call waits (the connect
//! timeout): Redis is up but too far behind to serve requests, and the
//! breaker counts that like a silence (a Redis that answers slowly but
//! steadily still degrades the service to local protection). That wait
//! runs from the call's send, and the calls under the breaker are sent
//! only while fewer than a bounded number of them are on the connection
//! (`Breaker::admit`): a burst longer than that waits in the process,
//! unjudged, so however long it is, a call sent is answered within about a
//! round trip while Redis keeps up.
//!
//! A process can only judge Redis while it keeps up itself. With every core
//! busy (a burst of requests), the replies to the calls ahead of a waiting
//! one may have been read and wait for their tasks to run, and its own
//! timer may fire late: so before a wait is judged silent, it goes to the
//! back of the run queue behind them and looks again ([`look_again`]), and
//! a timer that fired late ([`behind`]), its own or the short one that
//! look waits out, earns one more look.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Smoothed round trip and its variation, in microseconds; zero until the
/// first sample.
#[derive(Default)]
pub(crate) struct RoundTrip {
    smoothed: AtomicU64,
    variation: AtomicU64,
}

impl RoundTrip {
    /// A ping that nothing queued behind was answered after `rtt`, on a
    /// tier whose deadline is `deadline`. One sample moves the estimate at
    /// most to four times the silence allowed before it: a link that grew
    /// slower is learned in a few pings, while one answer that a pause or a
    /// stall held back does not leave every call waiting for long after.
    pub(crate) fn sample(&self, rtt: Duration, deadline: Duration) {
        let most = self.silence(deadline, Duration::MAX).saturating_mul(4);
        let r = u64::try_from(rtt.min(most).as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let srtt = self.smoothed.load(Ordering::Relaxed);
        if srtt == 0 {
            self.smoothed.store(r, Ordering::Relaxed);
            self.variation.store(r / 2, Ordering::Relaxed);
            return;
        }
        let var = self.variation.load(Ordering::Relaxed);
        let var = (var / 4)
            .saturating_mul(3)
            .saturating_add(srtt.abs_diff(r) / 4);
        let srtt = (srtt / 8).saturating_mul(7).saturating_add(r / 8);
        self.variation.store(var, Ordering::Relaxed);
        self.smoothed.store(srtt.max(1), Ordering::Relaxed);
    }

    /// How long a sent call may go without hearing its connection answer
    /// anything: `deadline`, or more on a link whose round trips need it,
    /// never more than `longest`.
    pub(crate) fn silence(&self, deadline: Duration, longest: Duration) -> Duration {
        let srtt = self.smoothed.load(Ordering::Relaxed);
        let var = self.variation.load(Ordering::Relaxed);
        let needed =
            Duration::from_micros(srtt.saturating_mul(2).saturating_add(var.saturating_mul(4)));
        deadline.max(needed.min(longest))
    }
}

/// Runs behind the tasks that are ready now (the ones whose replies came
/// in), then polls `future` once more; failing that, waits out one short
/// timer, which fires only after the runtime has read its sockets again,
/// and polls it again. `Err`: how much longer than that timer the look
/// took, the process's own lag (a busy runtime reads its sockets between runs of many tasks, so a
/// reply may sit unread while every timer fires on time).
pub(crate) async fn look_again<F: Future + Unpin>(future: &mut F) -> Result<F::Output, Duration> {
    let start = Instant::now();
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    if let Ok(output) = tokio::time::timeout(Duration::ZERO, &mut *future).await {
        return Ok(output);
    }
    tokio::time::sleep(PROBE).await;
    // The whole look, not only the timer: behind a long run queue, the
    // yields take long too.
    let lag = start.elapsed().saturating_sub(PROBE);
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(Duration::ZERO, future)
        .await
        .map_err(|_| lag)
}

/// The timer [`look_again`] waits out.
const PROBE: Duration = Duration::from_millis(1);

/// Whether a timer that fired `late` after its instant, in a wait of
/// `limit`, says the process is behind rather than the link silent.
pub(crate) fn behind(late: Duration, limit: Duration) -> bool {
    late > limit / 8
}

/// `future` under `limit`, judged fairly in a busy process (see the module
/// doc), never longer than `longest`. `None`: it did not answer.
pub(crate) async fn within<F: Future>(
    limit: Duration,
    longest: Duration,
    future: F,
) -> Option<F::Output> {
    let start = Instant::now();
    let end = start + longest.max(limit);
    let mut check = start + limit;
    tokio::pin!(future);
    loop {
        if let Ok(output) = tokio::time::timeout_at(check.min(end).into(), &mut future).await {
            return Some(output);
        }
        let late = Instant::now().saturating_duration_since(check.min(end));
        let late = match look_again(&mut future).await {
            Ok(output) => return Some(output),
            Err(lag) => late.max(lag),
        };
        let now = Instant::now();
        if now >= end || !behind(late, limit) {
            return None;
        }
        check = now + limit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_deadline_stands_on_a_fast_link_and_grows_on_a_slow_one() {
        let rtt = RoundTrip::default();
        let deadline = 50 * MS;
        let longest = 2000 * MS;
        assert_eq!(
            rtt.silence(deadline, longest),
            deadline,
            "nothing measured yet"
        );
        for _ in 0..20 {
            rtt.sample(MS / 4, deadline);
        }
        assert_eq!(rtt.silence(deadline, longest), deadline, "loopback");
        let slow = RoundTrip::default();
        for i in 0..40 {
            slow.sample((20 + (i % 3) * 10) * MS, deadline);
        }
        let silence = slow.silence(deadline, longest);
        assert!(silence > 80 * MS && silence < 200 * MS, "{silence:?}");
        let before = slow.silence(deadline, Duration::MAX);
        slow.sample(Duration::MAX, deadline);
        let after = slow.silence(deadline, Duration::MAX);
        assert!(
            after <= before * 6,
            "one late answer moves it boundedly: {after:?}"
        );
        for _ in 0..20 {
            slow.sample(Duration::MAX, deadline);
        }
        assert_eq!(slow.silence(deadline, longest), longest, "bounded");
        let grown = RoundTrip::default();
        grown.sample(MS / 4, deadline);
        let mut samples = 0;
        while grown.silence(deadline, longest) < 300 * MS {
            grown.sample(300 * MS, deadline);
            samples += 1;
        }
        assert!(
            samples <= 4,
            "a slower link is learned in a few pings: {samples}"
        );
    }
}
