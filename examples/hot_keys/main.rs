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
mod fleet;
mod load;
mod origin;
mod procs;
mod report;
mod svg;

use std::fmt;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redis::aio::MultiplexedConnection;

use fleet::{Deps, Fleet, Mode, RoutePolicy};
use load::{Conn, Keys, Status};
use origin::Origin;
use report::{RedisRun, RoundTrips, RunResult, Setup};

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
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Hot => "hot",
            Scenario::ColdBurst => "cold-burst",
            Scenario::Zipf => "zipf",
            Scenario::Expiry => "expiry",
            Scenario::RoundTrips => "round-trips",
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

/// Where the fleet mode's Redis is, and how to read its counters.
struct RedisSetup {
    url: String,
    /// One connection per node: a cluster counts its commands node by node.
    stats: Vec<MultiplexedConnection>,
    /// The temporary server, when we started one; stopped when dropped.
    _server: Option<procs::RedisServer>,
    /// The temporary cluster, when we started one; stopped when dropped.
    _cluster: Option<procs::RedisCluster>,
}

impl RedisSetup {
    /// EVALSHA calls so far, from `INFO commandstats`, summed over the
    /// nodes; every script call of the layer is one EVALSHA, so this counts
    /// its round trips.
    async fn evalsha(&mut self) -> Option<u64> {
        let mut total = 0;
        for conn in &mut self.stats {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(conn)
                .await
                .ok()?;
            let calls: Option<u64> = info
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
                .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
                .and_then(|n| n.trim().parse().ok());
            // No line yet: no EVALSHA on this node since the last reset.
            total += calls.unwrap_or(0);
        }
        Some(total)
    }
}

async fn setup_redis(choice: &str, start_cluster: bool) -> Result<Option<RedisSetup>, Error> {
    let (url, server, cluster) = match choice {
        _ if start_cluster => {
            let server = procs::find_on_path("redis-server")
                .ok_or("--redis-cluster needs redis-server on PATH")?;
            let cli = procs::find_on_path("redis-cli")
                .ok_or("--redis-cluster needs redis-cli on PATH")?;
            let started = tokio::task::spawn_blocking(move || {
                procs::RedisCluster::start(&server, &cli, CLUSTER_MASTERS)
            });
            let cluster = started
                .await?
                .map_err(|e| format!("starting a Redis Cluster: {e}"))?;
            eprintln!(
                "redis: started a temporary {CLUSTER_MASTERS}-master Redis Cluster at {} \
                 (loopback, temp dirs; killed and removed at exit)",
                cluster.url()
            );
            (cluster.url(), None, Some(cluster))
        }
        "none" => return Ok(None),
        "auto" => {
            let Some(binary) = procs::find_on_path("redis-server") else {
                return Ok(None);
            };
            let started = tokio::task::spawn_blocking(move || procs::RedisServer::start(&binary));
            let server = match started.await? {
                Ok(server) => server,
                Err(e) => {
                    eprintln!("redis: redis-server is installed but did not start: {e}");
                    return Ok(None);
                }
            };
            eprintln!(
                "redis: started a temporary redis-server at {} (stopped at exit)",
                server.url()
            );
            (server.url(), Some(server), None)
        }
        url => (url.to_owned(), None, None),
    };
    let stats = match cluster_seeds(&url) {
        Some(seeds) => cluster_stats(&url, &seeds).await?,
        None => vec![connect_stats(&url).await?],
    };
    Ok(Some(RedisSetup {
        url,
        stats,
        _server: server,
        _cluster: cluster,
    }))
}

/// Primaries of the cluster `--redis-cluster` starts: the fewest Redis
/// Cluster accepts.
const CLUSTER_MASTERS: usize = 3;

async fn connect_stats(url: &str) -> Result<MultiplexedConnection, Error> {
    let client = redis::Client::open(url)?;
    let conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| format!("no answer from Redis at {url}"))??;
    Ok(conn)
}

/// For `redis[s]-cluster://[userinfo@]host:port,...`: one plain URL per
/// seed node, with the same scheme and credentials.
fn cluster_seeds(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.strip_suffix("-cluster")?;
    let rest = rest.trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    };
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{userinfo}{h}/"))
            .collect(),
    )
}

/// A stats connection to every primary of a cluster. The seeds in a URL
/// need not be all the nodes, so the list comes from `CLUSTER NODES` on the
/// first seed that answers. Replicas are left out: scripts run on primaries.
async fn cluster_stats(url: &str, seeds: &[String]) -> Result<Vec<MultiplexedConnection>, Error> {
    let mut last_error: Error = format!("no seed nodes in {url}").into();
    for seed in seeds {
        let mut conn = match connect_stats(seed).await {
            Ok(conn) => conn,
            Err(e) => {
                last_error = e;
                continue;
            }
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await?;
        // The seed's scheme and credentials, with each primary's address.
        let prefix = match seed.rsplit_once('@') {
            Some((prefix, _)) => format!("{prefix}@"),
            None => format!("{}://", seed.split_once("://").map_or("redis", |(s, _)| s)),
        };
        let mut conns = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.contains("master") || flags.contains("fail") || flags.contains("noaddr") {
                continue;
            }
            // `ip:port@bus-port[,hostname]`
            let host = addr.split(['@', ',']).next().unwrap_or(addr);
            conns.push(connect_stats(&format!("{prefix}{host}/")).await?);
        }
        if conns.is_empty() {
            return Err(format!("CLUSTER NODES at {seed} lists no primaries").into());
        }
        return Ok(conns);
    }
    Err(last_error)
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
    let mut run_no = 0u32;
    for scenario in &scenarios {
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
                    round_trips = probe_round_trips(&deps, redis, policy, delay).await?;
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
        _ => RoutePolicy {
            ttl: Duration::from_millis(args.ttl_ms),
            stale_while_revalidate: None,
            early_refresh: None,
            refresh_ahead: None,
        },
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
        Scenario::RoundTrips => unreachable!("probed on its own"),
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

/// The x-cache values of a batch, as "HIT", or "MISS 1, COALESCED 19".
fn tally(statuses: &[Status]) -> String {
    let mut counts: Vec<(Status, usize)> = Vec::new();
    for s in statuses {
        match counts.iter_mut().find(|(c, _)| c == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((*s, 1)),
        }
    }
    counts.sort();
    if statuses.len() == 1 {
        return statuses[0].name().to_owned();
    }
    counts
        .iter()
        .map(|(s, n)| format!("{} {n}", s.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` GETs of `path` at once on `addr`, each on its own connection.
async fn concurrent(addr: SocketAddr, path: &str, n: usize) -> Result<Vec<Status>, Error> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Conn::connect(addr).await?);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let path = path.to_owned();
            tokio::spawn(async move { c.get(&path).await })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// Redis calls per request, path by path, on two instances of the fleet
/// mode: each step is run alone and the server's EVALSHA count read before
/// and after it.
async fn probe_round_trips(
    deps: &Deps,
    redis: &mut RedisSetup,
    policy: RoutePolicy,
    delay: Duration,
) -> Result<Vec<RoundTrips>, Error> {
    let tag = format!("rt{}", std::process::id());
    let fleet = Fleet::start(Mode::Fleet, 2, policy, deps, &format!("hk:{tag}")).await?;
    let (a, b) = (fleet.addrs[0], fleet.addrs[1]);
    let mut conn_a = Conn::connect(a).await?;
    let mut conn_b = Conn::connect(b).await?;
    let mut rows = Vec::new();
    let key = format!("/item/{tag}-key");
    // Background work (a refresh, its commit) ends within the origin's delay
    // plus a few Redis calls; this is comfortably more.
    let settle = delay + Duration::from_millis(200);

    macro_rules! step {
        ($path:expr, $requests:expr, $body:expr) => {{
            let before = redis.evalsha().await.unwrap_or(0);
            let statuses: Vec<Status> = $body;
            tokio::time::sleep(settle).await;
            let after = redis.evalsha().await.unwrap_or(0);
            rows.push(RoundTrips {
                path: $path,
                requests: $requests,
                evalsha: after.saturating_sub(before),
                x_cache: tally(&statuses),
            });
        }};
    }

    step!("miss: the fleet's one rebuild (leader)", 1, {
        vec![conn_a.get(&key).await?]
    });
    step!("hit in this instance's L1", 1000, {
        let mut s = Vec::new();
        for _ in 0..1000 {
            s.push(conn_a.get(&key).await?);
        }
        s
    });
    step!("hit in Redis (another instance built it)", 1, {
        vec![conn_b.get(&key).await?]
    });
    let burst_key = format!("/item/{tag}-burst");
    step!("miss + 19 local waiters, one instance", 20, {
        concurrent(a, &burst_key, 20).await?
    });
    let waiter_key = format!("/item/{tag}-waiter");
    step!("miss on A + 1 waiter on B (woken by publish)", 2, {
        let leader = {
            let key = waiter_key.clone();
            tokio::spawn(async move {
                let mut c = Conn::connect(a).await?;
                c.get(&key).await
            })
        };
        tokio::time::sleep(delay / 4).await;
        let waiter = conn_b.get(&waiter_key).await?;
        vec![leader.await??, waiter]
    });
    let many_key = format!("/item/{tag}-many");
    step!("miss on A + 10 waiters on B", 11, {
        let leader = {
            let key = many_key.clone();
            tokio::spawn(async move {
                let mut c = Conn::connect(a).await?;
                c.get(&key).await
            })
        };
        tokio::time::sleep(delay / 4).await;
        let mut s = concurrent(b, &many_key, 10).await?;
        s.push(leader.await??);
        s
    });
    // Let the first key go stale (inside its stale-while-revalidate window).
    tokio::time::sleep(policy.ttl + Duration::from_millis(50)).await;
    step!(
        "stale on A: served at once, refreshed in the background",
        1,
        { vec![conn_a.get(&key).await?] }
    );
    step!("stale on B: refresh finds A's new entry in Redis", 1, {
        vec![conn_b.get(&key).await?]
    });
    drop((conn_a, conn_b));
    fleet.stop().await;
    Ok(rows)
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
