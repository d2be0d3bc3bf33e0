//! The failing-origin scenario: the hot key under steady load, and an origin
//! that answers 503 (no-store) for a while, then recovers. What matters is
//! how often the fleet calls the origin during the episode, and what the
//! clients got meanwhile.
//!
//! The run lasts `--seconds`: healthy for its first fifth, failing until
//! seven tenths, healthy again to the end.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fleet::{Deps, Fleet, Mode, RoutePolicy};
use crate::load::{self, Keys, Load};
use crate::origin::Origin;
use crate::Error;

/// The guard's documented failure backoff: 250 ms, doubling, at most 10 s.
const BACKOFF: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// One mode's run through one failure episode.
pub struct Episode {
    pub mode: Mode,
    pub backend: &'static str,
    pub instances: usize,
    pub fail_ms: u64,
    pub stale_if_error_ms: u64,
    /// Origin calls while the origin was failing.
    pub calls_failing: u64,
    /// Origin calls before and after the episode (healthy).
    pub calls_healthy: u64,
    /// What one caller honouring the backoff would make in the episode.
    pub backoff_steps: u64,
    /// Answers with a 200 from a fresh entry or the origin.
    pub ok: u64,
    /// Answers with a 200 from an entry past its ttl (stale-if-error).
    pub stale: u64,
    /// Answers that were not a 200 (the failure, shared or not).
    pub failed: u64,
    /// From the origin's recovery to the first fresh answer, in ms.
    pub recovered_after_ms: Option<f64>,
    /// Redis calls that failed or passed their deadline (each such miss
    /// fails open: that instance calls the origin without the lease).
    pub redis_errors: u64,
}

impl Episode {
    pub fn json(&self) -> Value {
        json!({
            "scenario": "failing-origin",
            "mode": self.mode.to_string(),
            "backend": self.backend,
            "instances": self.instances,
            "fail_ms": self.fail_ms,
            "stale_if_error_ms": self.stale_if_error_ms,
            "origin_calls_failing": self.calls_failing,
            "origin_calls_healthy": self.calls_healthy,
            "backoff_steps": self.backoff_steps,
            "answers_ok": self.ok,
            "answers_stale": self.stale,
            "answers_failed": self.failed,
            "recovered_after_ms": self.recovered_after_ms,
            "redis_errors": self.redis_errors,
        })
    }
}

/// Calls one caller makes in `window` when it retries after each backoff
/// (each call taking `call`).
pub fn backoff_steps(window: Duration, call: Duration) -> u64 {
    let (mut steps, mut at, mut backoff) = (0, Duration::ZERO, BACKOFF);
    while at < window {
        steps += 1;
        at += call + backoff;
        backoff = (backoff * 2).min(BACKOFF_CAP);
    }
    steps
}

/// Runs the hot key through one episode on a fleet of `mode`.
pub async fn run(
    mode: Mode,
    k: usize,
    policy: RoutePolicy,
    deps: &Deps,
    tag: &str,
    seconds: Duration,
    delay: Duration,
) -> Result<Episode, Error> {
    let fleet = Fleet::start(mode, k, policy, deps, &format!("hk:{tag}")).await?;
    let fail_from = seconds / 5;
    let fail_until = seconds * 7 / 10;
    let origin: Arc<Origin> = deps.origin.clone();
    // Counted from the load's start, when the origin's books start.
    origin.fail_between(Some((fail_from, fail_until)));
    let keys = Keys::One(format!("{tag}-hot").into());
    let load: Load = load::run_timed(&fleet.addrs, deps.clients, seconds, keys, &origin).await;
    origin.fail_between(None);
    let stats = origin.stats();
    let (from_us, until_us) = (fail_from.as_micros() as u64, fail_until.as_micros() as u64);
    let calls_failing = stats
        .starts_us
        .iter()
        .filter(|&&t| t >= from_us && t < until_us)
        .count() as u64;
    let stale = load.samples.iter().filter(|s| s.status.stale()).count() as u64;
    let recovered_after_ms = load
        .samples
        .iter()
        .find(|s| u64::from(s.start_us) >= until_us && !s.status.stale())
        .map(|s| (s.end_us().saturating_sub(until_us)) as f64 / 1000.0);
    let episode = Episode {
        mode,
        backend: fleet.backend,
        instances: k,
        fail_ms: (fail_until - fail_from).as_millis() as u64,
        stale_if_error_ms: policy.stale_if_error.map_or(0, |d| d.as_millis() as u64),
        calls_failing,
        calls_healthy: stats.calls - calls_failing,
        backoff_steps: backoff_steps(fail_until - fail_from, delay),
        ok: load.samples.len() as u64 - stale,
        stale,
        failed: load.errors,
        recovered_after_ms,
        redis_errors: fleet
            .backends()
            .filter_map(|b| b.stats().redis)
            .map(|r| r.errors)
            .sum(),
    };
    fleet.stop().await;
    Ok(episode)
}

/// The episodes as a table.
pub fn table(episodes: &[Episode]) -> String {
    let mut out = String::from(
        "failing origin (503 for the middle half of the run):\n\
         mode    K   fail ms  calls failing  backoff steps  calls healthy        ok     stale    failed  fresh again after  redis errors\n",
    );
    for e in episodes {
        out.push_str(&format!(
            "{:<6} {:>3} {:>9} {:>14} {:>14} {:>14} {:>9} {:>9} {:>9}  {:>17}  {}\n",
            if e.backend == "local" && e.mode == Mode::Fleet {
                "fleet*".to_owned()
            } else {
                e.mode.to_string()
            },
            e.instances,
            e.fail_ms,
            e.calls_failing,
            e.backoff_steps,
            e.calls_healthy,
            e.ok,
            e.stale,
            e.failed,
            e.recovered_after_ms
                .map_or("never".to_owned(), |ms| format!("{ms:.0} ms")),
            e.redis_errors,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_steps_follow_the_doubling() {
        let call = Duration::from_millis(100);
        assert_eq!(backoff_steps(Duration::from_millis(1), call), 1);
        // 0, 350, 950, 2050 ms: four starts within 2.1 s.
        assert_eq!(backoff_steps(Duration::from_millis(2100), call), 4);
    }
}
