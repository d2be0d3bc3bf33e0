//! What a run measured, and how it is shown: a table for people, one JSON
//! object per line for scripts.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::cpu::Usage;
use crate::fleet::Mode;
use crate::load::{Load, Sample, Status};
use crate::origin::OriginStats;
use crate::Scenario;

/// The Redis side of a fleet run, summed over the instances.
#[derive(Clone, Debug, Default)]
pub struct RedisRun {
    /// EVALSHA calls the server counted during the run (`INFO commandstats`).
    pub evalsha: Option<u64>,
    pub errors: u64,
    pub wakeups_by_message: u64,
    pub wakeups_by_timeout: u64,
    /// Whether every instance's circuit was closed at the end.
    pub available: bool,
    /// Per instance, in instance order.
    pub errors_by_instance: Vec<u64>,
    pub circuit_openings_by_instance: Vec<u64>,
    pub unconfirmed_by_instance: Vec<u64>,
    /// Share of the run (sampled every 50 ms) during which the instance
    /// had a circuit open, in %.
    pub open_pct_by_instance: Vec<f64>,
}

/// The process's resident memory around a run, in KiB (`/proc/self/status`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rss {
    pub before_kib: u64,
    /// The peak during the run (`VmHWM`, reset before it).
    pub peak_kib: u64,
    pub after_kib: u64,
}

impl Rss {
    /// Resets the peak to the current size, where the kernel allows it,
    /// and reads the current size.
    pub fn start() -> Option<u64> {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        read_status("VmRSS:")
    }

    pub fn finish(before_kib: Option<u64>) -> Option<Rss> {
        Some(Rss {
            before_kib: before_kib?,
            peak_kib: read_status("VmHWM:")?,
            after_kib: read_status("VmRSS:")?,
        })
    }

    pub fn peak_growth_mib(&self) -> f64 {
        self.peak_kib.saturating_sub(self.before_kib) as f64 / 1024.0
    }
}

fn read_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Settings a run was made with, echoed in its report.
#[derive(Clone, Debug)]
pub struct Setup {
    pub scenario: Scenario,
    pub mode: Mode,
    pub backend: &'static str,
    pub instances: usize,
    pub clients: usize,
    pub ttl_ms: u64,
    pub origin_delay_ms: u64,
    pub stale_while_revalidate_ms: Option<u64>,
    pub early_refresh: Option<f64>,
    /// Refresh-ahead margin, as a multiple of the rebuild time.
    pub refresh_ahead: Option<f64>,
    /// Bursts fired (cold-burst, big-value; avalanche: rounds).
    pub bursts: Option<usize>,
    /// Distinct keys per burst (avalanche), or none.
    pub keys_per_burst: Option<usize>,
}

pub struct RunResult {
    pub setup: Setup,
    pub seconds: f64,
    pub requests: u64,
    pub rps: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub origin: OriginStats,
    /// Expiry windows the run spans: seconds * 1000 / ttl_ms; for cold-burst,
    /// the number of bursts (each is one new key's first fill).
    pub windows: f64,
    pub origin_calls_per_window: f64,
    pub stale_served: u64,
    pub waited: u64,
    /// Waited, among requests sent after the first origin call returned.
    pub waited_after_fill: u64,
    /// Took at least half the origin's delay: waited for an origin call,
    /// whatever the response says.
    pub slow: u64,
    /// Slow, among requests sent after the first origin call returned.
    pub slow_after_fill: u64,
    /// The slowest answer to a request sent before the first origin call
    /// returned, per instance: how long the first fill took to reach each
    /// instance's clients.
    pub first_fill_ms: Vec<f64>,
    pub statuses: Vec<(Status, u64)>,
    pub redis: Option<RedisRun>,
    pub samples: Vec<Sample>,
    /// When each burst was fired (cold-burst only), microseconds after the start.
    pub bursts_us: Vec<u64>,
    /// CPU used outside the bench during the run.
    pub cpu: Option<Usage>,
    /// Answers that came with a status other than 200 (among `errors`).
    pub non_ok: u64,
    /// The process's memory around the run (big-value).
    pub rss: Option<Rss>,
    /// Origin calls made by each instance (app modes; during the load).
    pub origin_calls_by_instance: Vec<u64>,
    /// Instances whose backend failed to connect at start-up (then tried again).
    pub failed_starts: u64,
}

impl RunResult {
    pub fn new(setup: Setup, load: Load, origin: OriginStats, redis: Option<RedisRun>) -> Self {
        let mut histogram =
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        for s in &load.samples {
            // Saturates instead of failing on a value past an hour.
            histogram.saturating_record(u64::from(s.latency_us).max(1));
        }
        let ms = |q: f64| {
            if histogram.is_empty() {
                0.0
            } else {
                histogram.value_at_quantile(q) as f64 / 1000.0
            }
        };
        let seconds = load.elapsed.as_secs_f64();
        let requests = load.samples.len() as u64;
        let windows = match (setup.bursts, setup.keys_per_burst) {
            (Some(bursts), keys) => (bursts * keys.unwrap_or(1)) as f64,
            (None, _) => seconds * 1000.0 / setup.ttl_ms.max(1) as f64,
        };
        let slow_us = setup.origin_delay_ms * 1000 / 2;
        let filled = origin.first_done_us.unwrap_or(u64::MAX);
        let after_fill = |s: &&Sample| u64::from(s.start_us) > filled;
        let waited = |s: &&Sample| s.status.waited();
        let slow = |s: &&Sample| u64::from(s.latency_us) >= slow_us;
        let statuses = Status::ALL
            .iter()
            .map(|st| {
                (
                    *st,
                    load.samples.iter().filter(|s| s.status == *st).count() as u64,
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let instances = load
            .samples
            .iter()
            .map(|s| s.instance as usize + 1)
            .max()
            .unwrap_or(0);
        let mut first_fill_ms = vec![0.0f64; instances];
        for s in load
            .samples
            .iter()
            .filter(|s| u64::from(s.start_us) <= filled)
        {
            let slot = &mut first_fill_ms[s.instance as usize];
            *slot = slot.max(f64::from(s.latency_us) / 1000.0);
        }
        RunResult {
            first_fill_ms,
            seconds,
            requests,
            rps: if seconds > 0.0 {
                requests as f64 / seconds
            } else {
                0.0
            },
            errors: load.errors,
            non_ok: load.non_ok,
            rss: None,
            origin_calls_by_instance: Vec::new(),
            failed_starts: 0,
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: if histogram.is_empty() {
                0.0
            } else {
                histogram.max() as f64 / 1000.0
            },
            origin_calls_per_window: origin.calls as f64 / windows.max(f64::MIN_POSITIVE),
            windows,
            stale_served: load.samples.iter().filter(|s| s.status.stale()).count() as u64,
            waited: load.samples.iter().filter(waited).count() as u64,
            waited_after_fill: load
                .samples
                .iter()
                .filter(after_fill)
                .filter(waited)
                .count() as u64,
            slow: load.samples.iter().filter(slow).count() as u64,
            slow_after_fill: load.samples.iter().filter(after_fill).filter(slow).count() as u64,
            statuses,
            redis,
            origin,
            samples: load.samples,
            bursts_us: load.bursts_us,
            cpu: None,
            setup,
        }
    }

    pub fn json(&self) -> Value {
        let s = &self.setup;
        let statuses: serde_json::Map<String, Value> = self
            .statuses
            .iter()
            .map(|(st, n)| (st.name().to_owned(), json!(n)))
            .collect();
        let mut v = json!({
            "scenario": s.scenario.to_string(),
            "mode": s.mode.to_string(),
            "backend": s.backend,
            "instances": s.instances,
            "clients": s.clients,
            "seconds": round(self.seconds, 3),
            "ttl_ms": s.ttl_ms,
            "origin_delay_ms": s.origin_delay_ms,
            "requests": self.requests,
            "rps": round(self.rps, 1),
            "errors": self.errors,
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "p999_ms": round(self.p999_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "origin_calls": self.origin.calls,
            "origin_max_concurrent": self.origin.max_concurrent_per_key,
            "origin_max_concurrent_all_keys": self.origin.max_concurrent,
            "origin_keys": self.origin.keys,
            "windows": round(self.windows, 3),
            "origin_calls_per_window": round(self.origin_calls_per_window, 3),
            "stale_served": self.stale_served,
            "waited": self.waited,
            "waited_after_fill": self.waited_after_fill,
            "slow": self.slow,
            "slow_after_fill": self.slow_after_fill,
            "first_fill_max_ms_by_instance": self.first_fill_ms.iter().map(|v| round(*v, 2)).collect::<Vec<_>>(),
            "x_cache": statuses,
        });
        let extra = v.as_object_mut().expect("an object");
        if let Some(swr) = s.stale_while_revalidate_ms {
            extra.insert("stale_while_revalidate_ms".into(), json!(swr));
        }
        if let Some(beta) = s.early_refresh {
            extra.insert("early_refresh".into(), json!(beta));
        }
        if let Some(multiple) = s.refresh_ahead {
            extra.insert("refresh_ahead".into(), json!(multiple));
        }
        if let Some(bursts) = s.bursts {
            extra.insert("bursts".into(), json!(bursts));
        }
        if let Some(keys) = s.keys_per_burst {
            extra.insert("keys_per_burst".into(), json!(keys));
        }
        extra.insert("non_200".into(), json!(self.non_ok));
        extra.insert("failed_starts".into(), json!(self.failed_starts));
        if !self.origin_calls_by_instance.is_empty() {
            extra.insert(
                "origin_calls_by_instance".into(),
                json!(self.origin_calls_by_instance),
            );
        }
        if let Some(rss) = &self.rss {
            extra.insert("rss_before_kib".into(), json!(rss.before_kib));
            extra.insert("rss_peak_kib".into(), json!(rss.peak_kib));
            extra.insert("rss_after_kib".into(), json!(rss.after_kib));
            extra.insert(
                "rss_peak_growth_mib".into(),
                json!(round(rss.peak_growth_mib(), 1)),
            );
        }
        if let Some(cpu) = &self.cpu {
            extra.insert("other_cpu_pct".into(), json!(round(cpu.other_pct, 1)));
            extra.insert("steal_pct".into(), json!(round(cpu.steal_pct, 1)));
        }
        if let Some(r) = &self.redis {
            extra.insert("redis_evalsha".into(), json!(r.evalsha));
            extra.insert(
                "redis_evalsha_per_request".into(),
                json!(r
                    .evalsha
                    .map(|n| round(n as f64 / self.requests.max(1) as f64, 5))),
            );
            extra.insert("redis_errors".into(), json!(r.errors));
            extra.insert("wakeups_by_message".into(), json!(r.wakeups_by_message));
            extra.insert("wakeups_by_timeout".into(), json!(r.wakeups_by_timeout));
            extra.insert("redis_available".into(), json!(r.available));
            extra.insert(
                "redis_errors_by_instance".into(),
                json!(r.errors_by_instance),
            );
            extra.insert(
                "circuit_openings_by_instance".into(),
                json!(r.circuit_openings_by_instance),
            );
            extra.insert(
                "circuit_openings".into(),
                json!(r.circuit_openings_by_instance.iter().sum::<u64>()),
            );
            extra.insert(
                "circuit_open_pct_by_instance".into(),
                json!(r
                    .open_pct_by_instance
                    .iter()
                    .map(|p| round(*p, 1))
                    .collect::<Vec<_>>()),
            );
            extra.insert(
                "unconfirmed_invalidations".into(),
                json!(r.unconfirmed_by_instance.iter().sum::<u64>()),
            );
        }
        v
    }
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// Thousands separators, for counts a reader compares at a glance.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn millis(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub fn table(results: &[RunResult]) -> String {
    let header = [
        "scenario",
        "mode",
        "req/s",
        "errors",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "origin calls",
        "per window",
        "max conc",
        "waited",
        "stale",
        "slow",
        "other cpu",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mode = if r.setup.backend == "local" && r.setup.mode == Mode::Fleet {
                "fleet*".to_owned()
            } else {
                r.setup.mode.to_string()
            };
            vec![
                r.setup.scenario.to_string(),
                mode,
                grouped(r.rps.round() as u64),
                grouped(r.errors),
                millis(r.p50_ms),
                millis(r.p90_ms),
                millis(r.p99_ms),
                millis(r.p999_ms),
                millis(r.max_ms),
                grouped(r.origin.calls),
                format!("{:.2}", r.origin_calls_per_window),
                r.origin.max_concurrent_per_key.to_string(),
                grouped(r.waited),
                grouped(r.stale_served),
                grouped(r.slow),
                r.cpu.map_or("-".to_owned(), |c| {
                    format!("{:.0}%", c.other_pct + c.steal_pct)
                }),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (c, cell) in cells.iter().enumerate() {
            // Names to the left, numbers to the right.
            if c < 2 {
                let _ = write!(out, "{cell:<w$}  ", w = widths[c]);
            } else {
                let _ = write!(out, "{cell:>w$}  ", w = widths[c]);
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    line(&mut out, &header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(
        &mut out,
        &rule.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut previous = None;
    for (r, row) in results.iter().zip(&rows) {
        if previous.is_some_and(|p| p != r.setup.scenario) {
            out.push('\n');
        }
        previous = Some(r.setup.scenario);
        line(
            &mut out,
            &row.iter().map(String::as_str).collect::<Vec<_>>(),
        );
    }
    out
}

/// The Redis side of the runs, per instance, and what the table above
/// leaves out: answers that were not a 200, and the process's peak memory.
pub fn redis_table(results: &[RunResult]) -> String {
    let list = |v: &[u64]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
        }
    };
    let mut out = format!(
        "{:<12}  {:<6}  {:>11}  {:>12}  {:>18}  {:>9}  {:>7}  {:>18}  {:>14}  {:>18}  {:>11}  {:>14}\n",
        "scenario",
        "mode",
        "start fails",
        "origin calls",
        "by instance",
        "per unit",
        "non-200",
        "redis errors",
        "openings",
        "circuit open %",
        "unconfirmed",
        "peak RSS +MiB"
    );
    for r in results {
        let unit = match (r.setup.bursts, r.setup.keys_per_burst) {
            (Some(_), Some(_)) => "key",
            (Some(_), None) => "burst",
            (None, _) => "window",
        };
        let (errors, openings, open, unconfirmed) = match &r.redis {
            Some(redis) => (
                list(&redis.errors_by_instance),
                list(&redis.circuit_openings_by_instance),
                if redis.open_pct_by_instance.is_empty() {
                    "-".to_owned()
                } else {
                    redis
                        .open_pct_by_instance
                        .iter()
                        .map(|p| format!("{p:.0}"))
                        .collect::<Vec<_>>()
                        .join("/")
                },
                redis
                    .unconfirmed_by_instance
                    .iter()
                    .sum::<u64>()
                    .to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "{:<12}  {:<6}  {:>11}  {:>12}  {:>18}  {:>9}  {:>7}  {:>18}  {:>14}  {:>18}  {:>11}  {:>14}",
            r.setup.scenario.to_string(),
            r.setup.mode.to_string(),
            r.failed_starts,
            grouped(r.origin.calls),
            list(&r.origin_calls_by_instance),
            format!("{:.2}/{unit}", r.origin_calls_per_window),
            grouped(r.non_ok),
            errors,
            openings,
            open,
            unconfirmed,
            r.rss
                .map_or("-".to_owned(), |m| format!("{:.1}", m.peak_growth_mib())),
        );
    }
    out
}

/// One row of the round-trip probe: what a path costs in Redis calls.
pub struct RoundTrips {
    pub path: &'static str,
    pub requests: u64,
    pub evalsha: u64,
    pub x_cache: String,
}

impl RoundTrips {
    pub fn per_request(&self) -> f64 {
        self.evalsha as f64 / self.requests.max(1) as f64
    }

    pub fn json(&self) -> Value {
        json!({
            "scenario": "round-trips",
            "mode": "fleet",
            "path": self.path,
            "requests": self.requests,
            "x_cache": self.x_cache,
            "evalsha": self.evalsha,
            "evalsha_per_request": round(self.per_request(), 3),
        })
    }
}

pub fn round_trip_table(rows: &[RoundTrips]) -> String {
    let width = rows.iter().map(|r| r.path.len()).max().unwrap_or(4).max(4);
    let xw = rows
        .iter()
        .map(|r| r.x_cache.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let mut out = format!(
        "{:<width$}  {:<xw$}  {:>8}  {:>7}  {:>11}\n",
        "path", "x-cache", "requests", "evalsha", "per request"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:<xw$}  {:>8}  {:>7}  {:>11.2}",
            r.path,
            r.x_cache,
            r.requests,
            r.evalsha,
            r.per_request()
        );
    }
    out
}
