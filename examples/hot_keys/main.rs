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
mod delay_proxy;
mod failing;
mod fleet;
mod load;
mod origin;
mod procs;
mod purge;
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
    /// `--keys` cold keys (default 1,000), each asked on every instance at
    /// the same instant, `--rounds` times: origin calls per key.
    Avalanche,
    /// One new key with a `--body-bytes` body asked by `--value-clients`
    /// clients at once, `--rounds` times: origin calls per burst, peak memory.
    BigValue,
    /// `--purges` warm keys invalidated at once through the guards, then
    /// `--posts` POSTs at once through the layer: how long each took.
    PurgeBurst,
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
            Scenario::Avalanche => "avalanche",
            Scenario::BigValue => "big-value",
            Scenario::PurgeBurst => "purge-burst",
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
    /// Keys in the zipf scenario (default 10,000), cold keys per round in
    /// the avalanche scenario (default 1,000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    keys: Option<u32>,
    /// Rounds of the avalanche and big-value scenarios, each on new keys.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Clients asking for the big value at once (over the instances).
    #[arg(long, default_value_t = 21, value_parser = clap::value_parser!(u32).range(1..))]
    value_clients: u32,
    /// Concurrent invalidations in the purge-burst scenario.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    purges: u32,
    /// Concurrent POSTs through the layer in the purge-burst scenario.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..))]
    posts: u32,
    /// Added round-trip time between each fleet instance and Redis, `LO-HI`
    /// in ms (or one value): each instance reaches Redis through a TCP proxy
    /// of its own that delays every chunk, each way, by a random half of it.
    #[arg(long, value_parser = delay_proxy::Rtt::parse)]
    redis_rtt_ms: Option<delay_proxy::Rtt>,
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
    let mut most_clients = clients;
    if scenarios.contains(&Scenario::Avalanche) {
        most_clients = most_clients.max(avalanche_keys(&args) * k);
    }
    if scenarios.contains(&Scenario::PurgeBurst) {
        most_clients = most_clients.max(args.posts as usize + 32 * k);
    }
    let wanted = (most_clients * 2 + 1024) as u64;
    let nofile = procs::raise_nofile(wanted);
    if nofile < wanted {
        eprintln!(
            "warning: open-file limit {nofile} is below the {wanted} this run may need; \
             raise it (ulimit -n) or use fewer --clients"
        );
    }

    if args.redis_rtt_ms.is_some() && args.redis_cluster {
        return Err(
            "--redis-rtt-ms proxies one server; it does not follow a cluster's \
                    redirections"
                .into(),
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

    if let (Some(rtt), Some(r)) = (args.redis_rtt_ms, redis.as_ref()) {
        let measured = delay_proxy::measured_ping_ms(&r.url, rtt, 21)
            .await
            .map_or("not measured".to_owned(), |ms| format!("{ms:.1} ms"));
        eprintln!(
            "redis: every fleet instance reaches Redis through a delay proxy of its own \
             adding {rtt} per round trip (median PING through one: {measured})"
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
    let mut purges = Vec::new();
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
                    redis_rtt: args.redis_rtt_ms,
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
                        redis_rtt: args.redis_rtt_ms,
                    };
                    let policy = expiry_policy(&args);
                    round_trips = round_trips::probe(&deps, redis, policy, delay).await?;
                }
                None => eprintln!("round-trips: skipped, it needs Redis"),
            }
            continue;
        }
        if *scenario == Scenario::PurgeBurst {
            // Purges need a guard: the layer's modes only.
            for mode in modes
                .iter()
                .filter(|m| matches!(m, Mode::Local | Mode::Fleet))
            {
                run_no += 1;
                let deps = Deps {
                    origin: origin.clone(),
                    redis_url: redis_url.clone(),
                    nginx: None,
                    clients,
                    runtime: servers.clone(),
                    redis_rtt: args.redis_rtt_ms,
                };
                let tag = format!("r{}-{run_no}", std::process::id());
                let run = purge::run(
                    *mode,
                    k,
                    plain_policy(&args),
                    &deps,
                    &tag,
                    args.purges as usize,
                    args.posts as usize,
                )
                .await?;
                eprintln!(
                    "{:<10} {:<6} purges {} p99 {:.1} ms  unconfirmed {}  posts {} p99 {:.1} ms",
                    scenario.to_string(),
                    mode.to_string(),
                    run.purges,
                    run.purge_p99_ms,
                    run.unconfirmed_by_instance.iter().sum::<u64>(),
                    run.posts,
                    run.post_p99_ms
                );
                purges.push(run);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            continue;
        }
        let new_scenario = matches!(scenario, Scenario::Avalanche | Scenario::BigValue);
        for mode in &modes {
            // The flood scenarios compare the layer with no layer; nginx and
            // the static route are for the steady-load ones.
            if new_scenario && matches!(mode, Mode::Nginx | Mode::Static) {
                continue;
            }
            run_no += 1;
            let deps = Deps {
                origin: origin.clone(),
                redis_url: redis_url.clone(),
                nginx: nginx.clone(),
                clients: scenario_clients(&args, *scenario, k),
                runtime: servers.clone(),
                redis_rtt: args.redis_rtt_ms,
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
    if results
        .iter()
        .any(|r| r.redis.is_some() || r.rss.is_some() || r.non_ok > 0)
    {
        human.push_str("\nper instance (a/b/c), answers not 200, peak memory of this process:\n");
        human.push_str(&report::redis_table(&results));
    }
    if !episodes.is_empty() {
        human.push('\n');
        human.push_str(&failing::table(&episodes));
    }
    if !purges.is_empty() {
        human.push('\n');
        human.push_str(&purge::table(&purges));
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
        for p in &purges {
            writeln!(out, "{}", p.json())?;
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
        max_body_bytes: None,
    }
}

/// The avalanche's cold keys per round.
fn avalanche_keys(args: &Args) -> usize {
    args.keys.unwrap_or(1_000) as usize
}

/// Connections a scenario's load opens.
fn scenario_clients(args: &Args, scenario: Scenario, k: usize) -> usize {
    match scenario {
        Scenario::Avalanche => avalanche_keys(args) * k,
        Scenario::BigValue => args.value_clients as usize,
        _ => args.clients as usize,
    }
}

/// The layer's default cap on a stored body.
const DEFAULT_MAX_BODY: usize = 4 << 20;

/// The route's ttl and nothing else.
fn plain_policy(args: &Args) -> RoutePolicy {
    RoutePolicy {
        ttl: Duration::from_millis(args.ttl_ms),
        stale_while_revalidate: None,
        early_refresh: None,
        refresh_ahead: None,
        stale_if_error: None,
        max_body_bytes: None,
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
        // Room for the body (and its headers) in the stored entry.
        Scenario::BigValue => RoutePolicy {
            max_body_bytes: Some((args.body_bytes.saturating_mul(3) / 2).max(DEFAULT_MAX_BODY)),
            ..plain_policy(args)
        },
        _ => plain_policy(args),
    };
    let k = usize::from(args.instances);
    let clients = scenario_clients(args, scenario, k);
    // A prefix of its own per run: no run sees another's entries or leases.
    let fleet = Fleet::start(mode, k, policy, deps, &format!("hk:{tag}")).await?;
    let on_redis = fleet.backend == "redis";
    let before = match redis.as_deref_mut() {
        Some(r) if on_redis => r.evalsha().await,
        _ => None,
    };
    let calls_before = fleet.origin_calls_by_instance();
    let failed_starts = fleet.failed_starts;
    let cpu_before = cpu::Snapshot::take();
    let sampler = CircuitSampler::start(fleet.backends().cloned().collect());
    let rss_before = (scenario == Scenario::BigValue)
        .then(report::Rss::start)
        .flatten();
    let load = match scenario {
        Scenario::Hot | Scenario::Expiry => {
            let keys = Keys::One(format!("{tag}-hot").into());
            load::run_timed(&fleet.addrs, clients, seconds, keys, &deps.origin).await
        }
        Scenario::Zipf => {
            let keys = Keys::zipf(tag, args.keys.unwrap_or(10_000) as usize, args.zipf_s);
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
        Scenario::Avalanche => {
            // Client i asks instance i mod K for key i div K: every key on
            // every instance, all at once.
            let prefix: std::sync::Arc<str> = tag.into();
            let path = move |client: usize, round: usize| {
                format!("/item/{prefix}-a{round}-{}", client / k)
            };
            let gap = Duration::from_millis(200);
            load::run_bursts_with(
                &fleet.addrs,
                clients,
                args.rounds as usize,
                gap,
                &deps.origin,
                path,
                |_| {},
            )
            .await
        }
        Scenario::BigValue => {
            let prefix: std::sync::Arc<str> = tag.into();
            let path = move |_client: usize, round: usize| format!("/item/{prefix}-big-{round}");
            let gap = Duration::from_millis(200);
            load::run_bursts_with(
                &fleet.addrs,
                clients,
                args.rounds as usize,
                gap,
                &deps.origin,
                path,
                |_| {},
            )
            .await
        }
        Scenario::RoundTrips | Scenario::FailingOrigin | Scenario::PurgeBurst => {
            unreachable!("run on their own")
        }
    };
    let rss = (scenario == Scenario::BigValue)
        .then(|| report::Rss::finish(rss_before))
        .flatten();
    let open_pct = sampler.stop().await;
    let origin_calls_by_instance: Vec<u64> = fleet
        .origin_calls_by_instance()
        .iter()
        .zip(calls_before.iter().chain(std::iter::repeat(&0)))
        .map(|(after, before)| after.saturating_sub(*before))
        .collect();
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
                run.errors_by_instance.push(stats.errors);
                run.circuit_openings_by_instance
                    .push(stats.circuit_openings);
                run.unconfirmed_by_instance
                    .push(stats.unconfirmed_invalidations);
            }
        }
        run.open_pct_by_instance = open_pct;
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
        bursts: match scenario {
            Scenario::ColdBurst => Some(args.bursts as usize),
            Scenario::Avalanche | Scenario::BigValue => Some(args.rounds as usize),
            _ => None,
        },
        keys_per_burst: (scenario == Scenario::Avalanche).then(|| avalanche_keys(args)),
    };
    fleet.stop().await;
    let mut result = RunResult::new(setup, load, origin, redis_run);
    result.cpu = cpu;
    result.rss = rss;
    result.origin_calls_by_instance = origin_calls_by_instance;
    result.failed_starts = failed_starts;
    Ok(result)
}

/// Samples every 50 ms whether each instance has a circuit open.
struct CircuitSampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<f64>>,
}

impl CircuitSampler {
    fn start(backends: Vec<stampede_guard::Backend>) -> CircuitSampler {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let redis: Vec<_> = backends
                .into_iter()
                .filter(|b| b.stats().redis.is_some())
                .collect();
            let (mut samples, mut open) = (0u64, vec![0u64; redis.len()]);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {
                        samples += 1;
                        for (b, n) in redis.iter().zip(&mut open) {
                            if b.stats().redis.is_some_and(|r| r.open_circuits > 0) {
                                *n += 1;
                            }
                        }
                    }
                }
            }
            open.iter()
                .map(|n| *n as f64 * 100.0 / samples.max(1) as f64)
                .collect()
        });
        CircuitSampler { stop, task }
    }

    async fn stop(self) -> Vec<f64> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
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
