//! Hot keys across a fleet: how often the origin is called, and how long
//! clients wait, with no cache, one cache per instance, the fleet-wide guard
//! on Redis, and nginx, side by side in one run.
//!
//! ```text
//! cargo run --release --example hot_keys -- --help
//! cargo run --release --example hot_keys                      # everything, 10 s each
//! cargo run --release --example hot_keys -- --scenario hot --mode fleet,nginx --json
//! ```
//!
//! K instances (axum apps, each route behind its own `StampedeGuard` with its
//! own L1 and its own Redis connections; or K nginx processes) listen on
//! loopback and call one origin that sleeps `--origin-delay-ms` and counts its
//! calls. C keep-alive clients, round-robin over the instances, drive them for
//! `--seconds`. Everything runs on this machine: the clients share its cores
//! with the servers, so throughput is a floor, not a capacity.

mod cpu;
mod failing;
mod fleet;
mod load;
mod origin;
mod procs;
mod redis_setup;
mod report;
mod round_trips;
mod svg;

use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redis_setup::{setup_redis, RedisSetup};

use fleet::{Deps, Fleet, Mode, RoutePolicy};
use load::Keys;
use origin::Origin;
use report::{RedisRun, RunResult, Setup};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Every request on one key.
    Hot,
    /// All clients fire at one new key at the same instant, `--bursts` times.
    ColdBurst,
    /// Zipf-distributed keys (exponent `--zipf-s`) over `--keys` keys.
    Zipf,
    /// The hot key with stale-while-revalidate on: does anyone still wait?
    Expiry,
    /// Redis calls per request on each path of the fleet mode (needs Redis).
    RoundTrips,
    /// The hot key while the origin answers 503 for the middle half of the
    /// run: origin calls per failure episode, and what clients got.
    FailingOrigin,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Hot => "hot",
            Scenario::ColdBurst => "cold-burst",
            Scenario::Zipf => "zipf",
            Scenario::Expiry => "expiry",
            Scenario::RoundTrips => "round-trips",
            Scenario::FailingOrigin => "failing-origin",
        })
    }
}

/// Cache stampede bench: origin calls and latency for hot keys across K
/// instances, with no cache, per-instance caches, the Redis-backed fleet
/// guard, and nginx.
#[derive(Parser, Debug)]
#[command(name = "hot_keys")]
struct Args {
    /// Instances (HTTP servers) behind the load.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    instances: u16,
    /// Keep-alive clients, each on its own connection, round-robin over the instances.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    clients: u32,
    /// How long each time-driven run lasts.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// The route's ttl (nginx rounds it up to whole seconds).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    ttl_ms: u64,
    /// How long one origin call takes.
    #[arg(long, default_value_t = 100)]
    origin_delay_ms: u64,
    /// Scenarios to run (repeat or comma-separate; default: all).
    #[arg(long = "scenario", value_enum, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// Modes to run side by side (repeat or comma-separate; default: all).
    #[arg(long = "mode", value_enum, value_delimiter = ',')]
    modes: Vec<Mode>,
    /// Bursts in the cold-burst scenario.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    bursts: u32,
    /// Keys in the zipf scenario.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    keys: u32,
    /// Exponent of the zipf scenario.
    #[arg(long, default_value_t = 1.1)]
    zipf_s: f64,
    /// Stale-while-revalidate window of the expiry scenario.
    #[arg(long, default_value_t = 10_000)]
    swr_ms: u64,
    /// Probabilistic early refresh (XFetch beta) in the expiry scenario; off by default.
    #[arg(long)]
    early_refresh: Option<f64>,
    /// Lease-based refresh-ahead in the expiry scenario, with this multiple
    /// of the rebuild time as its margin (`--refresh-ahead-floor-ms` at
    /// least); replaces `--early-refresh`. Off by default.
    #[arg(long)]
    refresh_ahead: Option<f64>,
    /// Stale-if-error window of the failing-origin scenario (0: none, the
    /// clients see the failure).
    #[arg(long, default_value_t = 0)]
    stale_if_error_ms: u64,
    /// The floor of the refresh-ahead margin.
    #[arg(long, default_value_t = 50)]
    refresh_ahead_floor_ms: u64,
    /// Redis for the fleet mode: a URL (`redis://`, or `redis-cluster://` with
    /// its nodes comma-separated), `auto` (start a temporary redis-server if
    /// one is installed) or `none` (embedded backend).
    #[arg(long, default_value = "auto")]
    redis: String,
    /// Run the fleet mode on a temporary local 3-master Redis Cluster
    /// (loopback ports, temp dirs, removed at exit) instead of `--redis`.
    #[arg(long, conflicts_with = "redis")]
    redis_cluster: bool,
    /// The nginx binary for the nginx mode.
    #[arg(long, default_value = "nginx")]
    nginx: String,
    /// Worker threads of the runtime the instances (and the origin) run on;
    /// 0 runs them on the load generator's runtime.
    #[arg(long, default_value_t = default_threads())]
    server_threads: usize,
    /// Size of the origin's response body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Print one JSON object per line per (scenario, mode) on stdout; the
    /// table then goes to stderr.
    #[arg(long)]
    json: bool,
    /// Draw origin calls and latency over time into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        eprintln!("--seconds must be in (0, 3600]");
        return ExitCode::from(2);
    }
    let runtime = |name: &str, threads: usize| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()
    };
    // The load generator and the instances get runtimes of their own, as
    // nginx's workers are processes of their own: neither queues behind the
    // other's tasks, and the kernel shares the cores between them.
    let load = match runtime("load", default_threads()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let servers = match args.server_threads {
        0 => None,
        n => match runtime("instances", n) {
            Ok(rt) => Some(rt),
            Err(e) => {
                eprintln!("error: starting the runtime: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let handle = servers
        .as_ref()
        .map_or_else(|| load.handle().clone(), |rt| rt.handle().clone());
    let code = load.block_on(async {
        tokio::spawn(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: stopping the servers this bench started");
                procs::stop_all();
                std::process::exit(130);
            }
        });
        match run(args, handle).await {
            // Missed targets are findings, reported above, not failures of the bench.
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    });
    // Runtimes must not be dropped inside async code; their leftover tasks
    // (the origin server) end here.
    drop(servers);
    code
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

async fn run(args: Args, servers: tokio::runtime::Handle) -> Result<(), Error> {
    let k = usize::from(args.instances);
    let clients = args.clients as usize;
    let seconds = Duration::from_secs_f64(args.seconds);
    let delay = Duration::from_millis(args.origin_delay_ms);
    let mut scenarios = args.scenarios.clone();
    if scenarios.is_empty() {
        scenarios = vec![
            Scenario::Hot,
            Scenario::ColdBurst,
            Scenario::Zipf,
            Scenario::Expiry,
            Scenario::RoundTrips,
            Scenario::FailingOrigin,
        ];
    }
    // Each once, in the order given.
    let mut seen = Vec::new();
    scenarios.retain(|s| {
        let first = !seen.contains(s);
        seen.push(*s);
        first
    });
    let mut modes = args.modes.clone();
    if modes.is_empty() {
        modes = vec![
            Mode::None,
            Mode::Local,
            Mode::Fleet,
            Mode::Nginx,
            Mode::Static,
        ];
    }
    modes.sort();
    modes.dedup();

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "machine: {cores} cores, {}; the load generator shares them with the servers",
        cpu_model()
    );

    // Each client holds a socket, and so does the instance that serves it.
    let wanted = (clients * 2 + 1024) as u64;
    let nofile = procs::raise_nofile(wanted);
    if nofile < wanted {
        eprintln!(
            "warning: open-file limit {nofile} is below the {wanted} this run may need; \
             raise it (ulimit -n) or use fewer --clients"
        );
    }

    let needs_redis = modes.contains(&Mode::Fleet) || scenarios.contains(&Scenario::RoundTrips);
    let mut redis = if needs_redis {
        setup_redis(&args.redis, args.redis_cluster).await?
    } else {
        None
    };
    if needs_redis && redis.is_none() {
        eprintln!(
            "redis: none (no redis-server installed, or --redis none): mode fleet runs on the \
             embedded backend, so the fleet is {k} independent caches; pass --redis URL or \
             install redis-server for the fleet-wide guard"
        );
    }

    let origin = Origin::new(delay, args.body_bytes);
    let mut nginx = None;
    if modes.contains(&Mode::Nginx) {
        match procs::find_on_path(&args.nginx) {
            Some(binary) => {
                let addr = servers.spawn(origin::serve_http(origin.clone())).await??;
                if !args.ttl_ms.is_multiple_of(1000) {
                    eprintln!(
                        "nginx: proxy_cache_valid takes whole seconds; its ttl is {} s",
                        args.ttl_ms.div_ceil(1000)
                    );
                }
                eprintln!(
                    "nginx: {} in front of the origin at http://{addr}",
                    binary.display()
                );
                nginx = Some((binary, addr));
            }
            None => {
                eprintln!(
                    "nginx: not installed, skipping mode nginx (apt-get install nginx to compare)"
                );
                modes.retain(|m| *m != Mode::Nginx);
            }
        }
    }
    eprintln!(
        "setup: {k} instances, {clients} clients, {} s per run, ttl {} ms, origin {} ms, \
         stale-while-revalidate (expiry) {} ms, early refresh (expiry) {}, refresh-ahead (expiry) {}",
        args.seconds,
        args.ttl_ms,
        args.origin_delay_ms,
        args.swr_ms,
        args.early_refresh
            .map_or("off".to_owned(), |b| format!("beta {b}")),
        args.refresh_ahead.map_or("off".to_owned(), |m| format!(
            "{m} x rebuild, floor {} ms",
            args.refresh_ahead_floor_ms
        )),
    );

    // Owned, so the stats connection can be borrowed mutably beside it.
    let redis_url = redis.as_ref().map(|r| r.url.clone());
    let mut results = Vec::new();
    let mut round_trips = Vec::new();
    let mut episodes = Vec::new();
    let mut run_no = 0u32;
    for scenario in &scenarios {
        if *scenario == Scenario::FailingOrigin {
            // The ceiling has no origin to fail.
            for mode in modes.iter().filter(|m| **m != Mode::Static) {
                run_no += 1;
                let deps = Deps {
                    origin: origin.clone(),
                    redis_url: redis_url.clone(),
                    nginx: nginx.clone(),
                    clients,
                    runtime: servers.clone(),
                };
                let tag = format!("r{}-{run_no}", std::process::id());
                let policy = RoutePolicy {
                    stale_if_error: (args.stale_if_error_ms > 0)
                        .then(|| Duration::from_millis(args.stale_if_error_ms)),
                    ..plain_policy(&args)
                };
                let episode = failing::run(*mode, k, policy, &deps, &tag, seconds, delay).await?;
                eprintln!(
                    "{:<10} {:<6} origin calls while failing {:>6} (backoff steps {})  \
                     answers ok {} stale {} failed {}",
                    scenario.to_string(),
                    mode.to_string(),
                    episode.calls_failing,
                    episode.backoff_steps,
                    episode.ok,
                    episode.stale,
                    episode.failed
                );
                episodes.push(episode);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            continue;
        }
        if *scenario == Scenario::RoundTrips {
            match redis.as_mut() {
                Some(redis) => {
                    let deps = Deps {
                        origin: origin.clone(),
                        redis_url: redis_url.clone(),
                        nginx: None,
                        clients,
                        runtime: servers.clone(),
                    };
                    let policy = expiry_policy(&args);
                    round_trips = round_trips::probe(&deps, redis, policy, delay).await?;
                }
                None => eprintln!("round-trips: skipped, it needs Redis"),
            }
            continue;
        }
        for mode in &modes {
            run_no += 1;
            let deps = Deps {
                origin: origin.clone(),
                redis_url: redis_url.clone(),
                nginx: nginx.clone(),
                clients,
                runtime: servers.clone(),
            };
            let tag = format!("r{}-{run_no}", std::process::id());
            let result = run_one(
                &args,
                *scenario,
                *mode,
                &deps,
                redis.as_mut(),
                &tag,
                seconds,
            )
            .await?;
            eprintln!(
                "{:<10} {:<6} {:>8.0} req/s  p99 {:>8.2} ms  max {:>8.2} ms  origin calls {:>6}  \
                 max concurrent {:>3}  waited {:>7}  errors {}",
                scenario.to_string(),
                mode.to_string(),
                result.rps,
                result.p99_ms,
                result.max_ms,
                result.origin.calls,
                result.origin.max_concurrent_per_key,
                result.waited,
                result.errors
            );
            if let Some(cpu) = result.cpu.filter(|c| c.other_pct + c.steal_pct > 5.0) {
                eprintln!(
                    "  warning: other processes used {:.0}% and the hypervisor took {:.0}% of the \
                     CPU during this run: its numbers are disturbed",
                    cpu.other_pct, cpu.steal_pct
                );
            }
            results.push(result);
            // Let the sockets of the last run close before the next starts.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    let mut human = String::new();
    if !results.is_empty() {
        human.push('\n');
        human.push_str(&report::table(&results));
        if results
            .iter()
            .any(|r| r.setup.mode == Mode::Fleet && r.setup.backend != "redis")
        {
            human.push_str("fleet*: embedded backend (no Redis): K independent caches\n");
        }
    }
    if !episodes.is_empty() {
        human.push('\n');
        human.push_str(&failing::table(&episodes));
    }
    if !round_trips.is_empty() {
        human.push_str("\nRedis round trips (EVALSHA per request, INFO commandstats), by path:\n");
        human.push_str(&report::round_trip_table(&round_trips));
    }
    let checks = targets(&args, &results);
    if !checks.is_empty() {
        human.push_str("\ntargets:\n");
        human.push_str(&checks);
    }

    if args.json {
        let mut out = std::io::stdout().lock();
        for r in &results {
            writeln!(out, "{}", r.json())?;
        }
        for r in &round_trips {
            writeln!(out, "{}", r.json())?;
        }
        for e in &episodes {
            writeln!(out, "{}", e.json())?;
        }
        eprint!("{human}");
    } else {
        print!("{human}");
    }
    if let Some(path) = &args.svg {
        svg::draw(path, &results, args.origin_delay_ms)
            .map_err(|e| format!("drawing {}: {e}", path.display()))?;
        eprintln!("svg: wrote {}", path.display());
    }
    Ok(())
}

fn expiry_policy(args: &Args) -> RoutePolicy {
    RoutePolicy {
        ttl: Duration::from_millis(args.ttl_ms),
        stale_while_revalidate: Some(Duration::from_millis(args.swr_ms)),
        early_refresh: args.early_refresh,
        refresh_ahead: args
            .refresh_ahead
            .map(|m| (m, Duration::from_millis(args.refresh_ahead_floor_ms))),
        stale_if_error: None,
    }
}

/// The route's ttl and nothing else.
fn plain_policy(args: &Args) -> RoutePolicy {
    RoutePolicy {
        ttl: Duration::from_millis(args.ttl_ms),
        stale_while_revalidate: None,
        early_refresh: None,
        refresh_ahead: None,
        stale_if_error: None,
    }
}

async fn run_one(
    args: &Args,
    scenario: Scenario,
    mode: Mode,
    deps: &Deps,
    mut redis: Option<&mut RedisSetup>,
    tag: &str,
    seconds: Duration,
) -> Result<RunResult, Error> {
    let policy = match scenario {
        Scenario::Expiry => expiry_policy(args),
        _ => plain_policy(args),
    };
    let k = usize::from(args.instances);
    let clients = args.clients as usize;
    // A prefix of its own per run: no run sees another's entries or leases.
    let fleet = Fleet::start(mode, k, policy, deps, &format!("hk:{tag}")).await?;
    let on_redis = fleet.backend == "redis";
    let before = match redis.as_deref_mut() {
        Some(r) if on_redis => r.evalsha().await,
        _ => None,
    };
    let cpu_before = cpu::Snapshot::take();
    let load = match scenario {
        Scenario::Hot | Scenario::Expiry => {
            let keys = Keys::One(format!("{tag}-hot").into());
            load::run_timed(&fleet.addrs, clients, seconds, keys, &deps.origin).await
        }
        Scenario::Zipf => {
            let keys = Keys::zipf(tag, args.keys as usize, args.zipf_s);
            load::run_timed(&fleet.addrs, clients, seconds, keys, &deps.origin).await
        }
        Scenario::ColdBurst => {
            let gap = Duration::from_millis(50);
            load::run_bursts(
                &fleet.addrs,
                clients,
                args.bursts as usize,
                tag,
                gap,
                &deps.origin,
            )
            .await
        }
        Scenario::RoundTrips | Scenario::FailingOrigin => unreachable!("run on their own"),
    };
    let cpu = cpu::Snapshot::take()
        .zip(cpu_before)
        .map(|(after, before)| after.since(&before));
    let origin = deps.origin.stats();
    let after = match redis {
        Some(r) if on_redis => r.evalsha().await,
        _ => None,
    };
    let redis_run = on_redis.then(|| {
        let mut run = RedisRun {
            evalsha: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
            available: true,
            ..RedisRun::default()
        };
        for backend in fleet.backends() {
            if let Some(stats) = backend.stats().redis {
                run.errors += stats.errors;
                run.wakeups_by_message += stats.wakeups_by_message;
                run.wakeups_by_timeout += stats.wakeups_by_timeout;
                run.available &= stats.available;
            }
        }
        run
    });
    let setup = Setup {
        scenario,
        mode,
        backend: fleet.backend,
        instances: k,
        clients,
        ttl_ms: args.ttl_ms,
        origin_delay_ms: args.origin_delay_ms,
        stale_while_revalidate_ms: policy.stale_while_revalidate.map(|d| d.as_millis() as u64),
        early_refresh: policy.early_refresh,
        refresh_ahead: policy.refresh_ahead.map(|(m, _)| m),
        bursts: (scenario == Scenario::ColdBurst).then_some(args.bursts as usize),
    };
    fleet.stop().await;
    let mut result = RunResult::new(setup, load, origin, redis_run);
    result.cpu = cpu;
    Ok(result)
}

/// Checks the targets this bench exists to track, and reports them.
fn targets(args: &Args, results: &[RunResult]) -> String {
    let delay = args.origin_delay_ms as f64;
    let find = |scenario: Scenario, mode: Mode| {
        results
            .iter()
            .find(|r| r.setup.scenario == scenario && r.setup.mode == mode)
    };
    let mut out = String::new();
    let mut check = |met: bool, text: String| {
        out.push_str(if met { "  [met]    " } else { "  [MISSED] " });
        out.push_str(&text);
        out.push('\n');
    };
    let fleet = |scenario| find(scenario, Mode::Fleet).filter(|r| r.setup.backend == "redis");

    for scenario in [Scenario::Hot, Scenario::Expiry] {
        if let Some(r) = fleet(scenario) {
            check(
                r.origin_calls_per_window <= 1.05 && r.origin.max_concurrent_per_key == 1,
                format!(
                    "{scenario}/fleet: {:.2} origin calls per ttl window (<= 1.05), \
                     at most {} at once per key (= 1)",
                    r.origin_calls_per_window, r.origin.max_concurrent_per_key
                ),
            );
        }
    }
    if let Some(r) = fleet(Scenario::ColdBurst) {
        let limit = delay + 5.0;
        let by = r.p99_ms - limit;
        check(
            r.p99_ms <= limit,
            format!(
                "cold-burst/fleet: p99 {:.2} ms (<= {limit:.0} ms: origin + 5 ms){}; \
                 {:.2} origin calls per burst",
                r.p99_ms,
                if by > 0.0 {
                    format!(", over by {by:.2} ms")
                } else {
                    String::new()
                },
                r.origin_calls_per_window,
            ),
        );
    }
    if let Some(r) = fleet(Scenario::Expiry) {
        let limit = delay + 15.0;
        check(
            r.waited_after_fill == 0 && r.slow_after_fill == 0 && r.max_ms <= limit,
            format!(
                "expiry/fleet: after the first fill {} requests waited (x-cache) and {} took \
                 over half the origin's time (both = 0); max {:.2} ms (<= {limit:.0} ms)",
                r.waited_after_fill, r.slow_after_fill, r.max_ms
            ),
        );
    }
    if let (Some(f), Some(n)) = (fleet(Scenario::Hot), find(Scenario::Hot, Mode::Nginx)) {
        check(
            f.rps >= n.rps && f.p99_ms <= n.p99_ms,
            format!(
                "hot: fleet {:.0} req/s, p99 {:.2} ms vs nginx {:.0} req/s, p99 {:.2} ms \
                 (req/s {:+.1}%, p99 {:+.2} ms)",
                f.rps,
                f.p99_ms,
                n.rps,
                n.p99_ms,
                (f.rps / n.rps.max(1.0) - 1.0) * 100.0,
                f.p99_ms - n.p99_ms
            ),
        );
    }
    // The ceiling: the same route answering a ready body, no cache at all.
    if let (Some(f), Some(s)) = (fleet(Scenario::Hot), find(Scenario::Hot, Mode::Static)) {
        out.push_str(&format!(
            "  [info]   hot: fleet {:.0} req/s, p99 {:.2} ms vs static {:.0} req/s, p99 {:.2} ms \
             (fleet/static req/s {:.3})\n",
            f.rps,
            f.p99_ms,
            s.rps,
            s.p99_ms,
            f.rps / s.rps.max(1.0)
        ));
    }
    // Context, not targets. nginx serves stale while it updates in every
    // scenario, so the like-for-like comparison is expiry, where the guard
    // does too.
    if let (Some(f), Some(n)) = (fleet(Scenario::Expiry), find(Scenario::Expiry, Mode::Nginx)) {
        out.push_str(&format!(
            "  [info]   expiry (both serve stale during the refresh): fleet {:.0} req/s, p99 {:.2} ms \
             vs nginx {:.0} req/s, p99 {:.2} ms\n",
            f.rps, f.p99_ms, n.rps, n.p99_ms
        ));
    }
    // What the alternatives do on the same load.
    for scenario in [Scenario::Hot, Scenario::Expiry] {
        for mode in [Mode::None, Mode::Local, Mode::Nginx] {
            if let Some(r) = find(scenario, mode) {
                out.push_str(&format!(
                    "  [info]   {scenario}/{mode}: {:.2} origin calls per window, {} at once per key\n",
                    r.origin_calls_per_window, r.origin.max_concurrent_per_key
                ));
            }
        }
    }
    out
}
