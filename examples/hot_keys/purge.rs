//! The purge-burst scenario: M warm keys invalidated at the same instant
//! through the instances' guards (`StampedeGuard::invalidate`), then P
//! writes at once through the layer (a successful POST invalidates its URL
//! on every instance). What matters is how long one purge takes when many
//! run together, and whether the fleet confirmed each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::fleet::{Deps, Fleet, Mode, RoutePolicy};
use crate::load::{Conn, Status, HOST};
use crate::Error;

/// Connections per instance that warm (and re-read) the keys.
const WARMERS: usize = 32;

/// One mode's purge burst.
pub struct PurgeRun {
    pub mode: Mode,
    pub backend: &'static str,
    pub instances: usize,
    pub purges: usize,
    pub posts: usize,
    /// Origin calls that warmed the keys (one per key for the fleet).
    pub warm_calls: u64,
    pub purge_p50_ms: f64,
    pub purge_p99_ms: f64,
    pub purge_max_ms: f64,
    /// Purges that returned an error.
    pub purge_errors: u64,
    /// Of the purged keys, those the first instance did not find when it
    /// read them again (anything but a HIT): all of them, if every purge
    /// reached it.
    pub missed_after: u64,
    pub post_p50_ms: f64,
    pub post_p99_ms: f64,
    pub post_max_ms: f64,
    /// POSTs not answered 204.
    pub post_errors: u64,
    /// `unconfirmed_invalidations`, per instance, at the end.
    pub unconfirmed_by_instance: Vec<u64>,
    pub redis_errors_by_instance: Vec<u64>,
    pub circuit_openings_by_instance: Vec<u64>,
    /// Backend connections that failed at start-up and were tried again.
    pub failed_starts: u64,
}

impl PurgeRun {
    pub fn json(&self) -> Value {
        json!({
            "scenario": "purge-burst",
            "mode": self.mode.to_string(),
            "backend": self.backend,
            "instances": self.instances,
            "purges": self.purges,
            "posts": self.posts,
            "warm_origin_calls": self.warm_calls,
            "purge_p50_ms": round(self.purge_p50_ms),
            "purge_p99_ms": round(self.purge_p99_ms),
            "purge_max_ms": round(self.purge_max_ms),
            "purge_errors": self.purge_errors,
            "missed_after_purge": self.missed_after,
            "post_p50_ms": round(self.post_p50_ms),
            "post_p99_ms": round(self.post_p99_ms),
            "post_max_ms": round(self.post_max_ms),
            "post_errors": self.post_errors,
            "unconfirmed_invalidations": self.unconfirmed_by_instance.iter().sum::<u64>(),
            "unconfirmed_invalidations_by_instance": self.unconfirmed_by_instance,
            "redis_errors_by_instance": self.redis_errors_by_instance,
            "circuit_openings_by_instance": self.circuit_openings_by_instance,
            "failed_starts": self.failed_starts,
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn quantiles(latencies_us: &[u64]) -> (f64, f64, f64) {
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    for &us in latencies_us {
        h.saturating_record(us.max(1));
    }
    if h.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let ms = |v: u64| v as f64 / 1000.0;
    (
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    )
}

fn path(tag: &str, key: usize) -> String {
    format!("/item/{tag}-p{key}")
}

/// GETs every key once on `addr`, `WARMERS` at a time; returns the answers
/// that were not HITs.
async fn read_all(addr: std::net::SocketAddr, tag: &str, keys: usize) -> Result<u64, Error> {
    let mut tasks = JoinSet::new();
    for w in 0..WARMERS.min(keys) {
        let tag = tag.to_owned();
        tasks.spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            let mut not_hit = 0u64;
            for key in (w..keys).step_by(WARMERS) {
                if conn.get(&path(&tag, key)).await? != Status::Hit {
                    not_hit += 1;
                }
            }
            Ok::<_, Error>(not_hit)
        });
    }
    let mut not_hit = 0;
    while let Some(done) = tasks.join_next().await {
        not_hit += done??;
    }
    Ok(not_hit)
}

/// Runs one purge burst on a fleet of `mode` (local or fleet).
pub async fn run(
    mode: Mode,
    k: usize,
    policy: RoutePolicy,
    deps: &Deps,
    tag: &str,
    purges: usize,
    posts: usize,
) -> Result<PurgeRun, Error> {
    // Long enough that no warm entry expires during the run.
    let policy = RoutePolicy {
        ttl: Duration::from_secs(600),
        ..policy
    };
    let fleet = Fleet::start(mode, k, policy, deps, &format!("hk:{tag}")).await?;
    let origin = deps.origin.clone();
    origin.reset(Instant::now());
    // Every instance holds every key: the first read builds it (once for
    // the fleet on Redis), the others find it.
    for addr in &fleet.addrs {
        read_all(*addr, tag, purges).await?;
    }
    let warm_calls = origin.stats().calls;

    // The purges, all released at once.
    let guards: Vec<_> = fleet.guards().cloned().collect();
    let barrier = Arc::new(Barrier::new(purges + 1));
    let mut tasks = JoinSet::new();
    for key in 0..purges {
        let guard = guards[key % guards.len()].clone();
        let barrier = barrier.clone();
        let request = Request::get(path(tag, key))
            .header(header::HOST, HOST)
            .body(())?;
        tasks.spawn(async move {
            barrier.wait().await;
            let start = Instant::now();
            let result = guard.invalidate(&request).await;
            (start.elapsed().as_micros() as u64, result.is_ok())
        });
    }
    barrier.wait().await;
    let mut purge_us = Vec::with_capacity(purges);
    let mut purge_errors = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((us, ok)) => {
                purge_us.push(us);
                purge_errors += u64::from(!ok);
            }
            Err(_) => purge_errors += 1,
        }
    }
    let (purge_p50_ms, purge_p99_ms, purge_max_ms) = quantiles(&purge_us);
    // Every key, read again on the first instance: two in three were purged
    // through another instance, so a HIT here is a copy a purge missed.
    let missed_after = read_all(fleet.addrs[0], tag, purges).await?;

    // The writes, all released at once, each on its own connection.
    let mut conns = Vec::with_capacity(posts);
    for i in 0..posts {
        conns.push(Conn::connect(fleet.addrs[i % fleet.addrs.len()]).await?);
    }
    let barrier = Arc::new(Barrier::new(posts + 1));
    let mut tasks = JoinSet::new();
    for (key, mut conn) in conns.into_iter().enumerate() {
        let barrier = barrier.clone();
        let path = path(tag, key % purges.max(1));
        tasks.spawn(async move {
            barrier.wait().await;
            let start = Instant::now();
            let result = conn.send(Method::POST, &path, StatusCode::NO_CONTENT).await;
            (start.elapsed().as_micros() as u64, result.is_ok())
        });
    }
    barrier.wait().await;
    let mut post_us = Vec::with_capacity(posts);
    let mut post_errors = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((us, ok)) => {
                post_us.push(us);
                post_errors += u64::from(!ok);
            }
            Err(_) => post_errors += 1,
        }
    }
    let (post_p50_ms, post_p99_ms, post_max_ms) = quantiles(&post_us);

    let stats: Vec<_> = fleet.backends().map(|b| b.stats().redis).collect();
    let by = |f: fn(&stampede_guard::RedisStats) -> u64| -> Vec<u64> {
        stats.iter().map(|s| s.as_ref().map_or(0, f)).collect()
    };
    let run = PurgeRun {
        mode,
        backend: fleet.backend,
        instances: k,
        purges,
        posts,
        warm_calls,
        purge_p50_ms,
        purge_p99_ms,
        purge_max_ms,
        purge_errors,
        missed_after,
        post_p50_ms,
        post_p99_ms,
        post_max_ms,
        post_errors,
        unconfirmed_by_instance: by(|s| s.unconfirmed_invalidations),
        redis_errors_by_instance: by(|s| s.errors),
        circuit_openings_by_instance: by(|s| s.circuit_openings),
        failed_starts: fleet.failed_starts,
    };
    fleet.stop().await;
    Ok(run)
}

/// The purge runs as a table.
pub fn table(runs: &[PurgeRun]) -> String {
    let mut out = String::from(
        "purge burst (M invalidate() at once, then P POSTs at once through the layer):\n\
         mode       K  purges  p50 ms  p99 ms  max ms  errors  missed after  unconfirmed (by instance)  posts  p50 ms  p99 ms  max ms  errors  redis errors  openings\n",
    );
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join("/");
    for r in runs {
        out.push_str(&format!(
            "{:<6} {:>5} {:>7} {:>7.1} {:>7.1} {:>7.1} {:>7} {:>13}  {:>25} {:>6} {:>7.1} {:>7.1} {:>7.1} {:>7}  {:>12}  {:>8}\n",
            if r.backend == "local" && r.mode == Mode::Fleet {
                "fleet*".to_owned()
            } else {
                r.mode.to_string()
            },
            r.instances,
            r.purges,
            r.purge_p50_ms,
            r.purge_p99_ms,
            r.purge_max_ms,
            r.purge_errors,
            r.missed_after,
            format!(
                "{} ({})",
                r.unconfirmed_by_instance.iter().sum::<u64>(),
                list(&r.unconfirmed_by_instance)
            ),
            r.posts,
            r.post_p50_ms,
            r.post_p99_ms,
            r.post_max_ms,
            r.post_errors,
            list(&r.redis_errors_by_instance),
            list(&r.circuit_openings_by_instance),
        ));
    }
    out
}
