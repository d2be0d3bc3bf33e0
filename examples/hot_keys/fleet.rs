//! The K instances under test, in one of five modes: no layer, the embedded
//! backend, the Redis backend, nginx in front of the origin, or the ceiling:
//! the same route answering a ready body, with no origin and no cache.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::delay_proxy::{self, DelayProxy, Rtt};
use crate::origin::Origin;
use crate::procs::{Nginx, NginxConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    /// No layer: every request calls the origin.
    None,
    /// The embedded backend in each instance: K independent caches.
    Local,
    /// The Redis backend: one cache and one rebuild per key for the fleet.
    Fleet,
    /// nginx with proxy_cache_lock and use_stale updating, one per instance.
    Nginx,
    /// No layer and no origin: the same route answers a body of the same
    /// size, made once. What serving a hit could cost at best.
    Static,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::None => "none",
            Mode::Local => "local",
            Mode::Fleet => "fleet",
            Mode::Nginx => "nginx",
            Mode::Static => "static",
        })
    }
}

/// The route's policy, the same for every instance of a run.
#[derive(Clone, Copy, Debug)]
pub struct RoutePolicy {
    pub ttl: Duration,
    pub stale_while_revalidate: Option<Duration>,
    pub early_refresh: Option<f64>,
    /// Refresh-ahead: the multiple of the rebuild time, and the floor.
    pub refresh_ahead: Option<(f64, Duration)>,
    /// How long an entry past its ttl may stand in for a failed rebuild.
    pub stale_if_error: Option<Duration>,
    /// The layer's cap on a stored body; `None`: its default.
    pub max_body_bytes: Option<usize>,
}

/// Where the instances find what they need.
#[derive(Clone)]
pub struct Deps {
    pub origin: Arc<Origin>,
    pub redis_url: Option<String>,
    pub nginx: Option<(PathBuf, SocketAddr)>,
    pub clients: usize,
    /// The runtime the instances run on.
    pub runtime: tokio::runtime::Handle,
    /// Added round-trip latency between each instance and Redis: each
    /// instance then reaches Redis through a delay proxy of its own.
    pub redis_rtt: Option<Rtt>,
}

/// One running instance.
enum Instance {
    App {
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<()>,
        backend: Option<Backend>,
        guard: Option<StampedeGuard>,
        /// The instance's link to Redis, when it has added latency.
        proxy: Option<DelayProxy>,
        /// Origin calls this instance's handler made.
        calls: Arc<AtomicU64>,
    },
    /// Held only to be stopped when dropped.
    Nginx(#[allow(dead_code)] Nginx),
}

pub struct Fleet {
    pub addrs: Vec<SocketAddr>,
    /// What the fleet runs on, for the report: none, local, redis or nginx.
    pub backend: &'static str,
    /// Backend connections that failed at start-up and were tried again.
    pub failed_starts: u64,
    instances: Vec<Instance>,
}

impl Fleet {
    pub async fn start(
        mode: Mode,
        k: usize,
        policy: RoutePolicy,
        deps: &Deps,
        prefix: &str,
    ) -> Result<Fleet, String> {
        let mut fleet = Fleet {
            addrs: Vec::new(),
            backend: match (mode, &deps.redis_url) {
                (Mode::None, _) => "none",
                (Mode::Static, _) => "static",
                (Mode::Local, _) | (Mode::Fleet, None) => "local",
                (Mode::Fleet, Some(_)) => "redis",
                (Mode::Nginx, _) => "nginx",
            },
            failed_starts: 0,
            instances: Vec::new(),
        };
        for _ in 0..k {
            let (addr, instance) = match mode {
                // Starting nginx polls its port with blocking sleeps.
                Mode::Nginx => tokio::task::block_in_place(|| start_nginx(policy, deps))?,
                // On the instances' runtime, so that their connections and
                // background work run there too.
                _ => {
                    let (deps, prefix) = (deps.clone(), prefix.to_owned());
                    let (started, failed) = deps
                        .runtime
                        .clone()
                        .spawn(async move {
                            let mut failed = 0;
                            let started =
                                start_app(mode, policy, &deps, &prefix, &mut failed).await;
                            (started, failed)
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                    fleet.failed_starts += failed;
                    started?
                }
            };
            fleet.addrs.push(addr);
            fleet.instances.push(instance);
        }
        Ok(fleet)
    }

    /// The instances' backends (none for `none` and nginx).
    pub fn backends(&self) -> impl Iterator<Item = &Backend> {
        self.instances.iter().filter_map(|i| match i {
            Instance::App { backend, .. } => backend.as_ref(),
            Instance::Nginx(_) => None,
        })
    }

    /// Origin calls made by each app instance's handler so far, in
    /// instance order (empty for nginx).
    pub fn origin_calls_by_instance(&self) -> Vec<u64> {
        self.instances
            .iter()
            .filter_map(|i| match i {
                Instance::App { calls, .. } => Some(calls.load(Ordering::Relaxed)),
                Instance::Nginx(_) => None,
            })
            .collect()
    }

    /// The instances' guards, in instance order (none for `none`, `static`
    /// and nginx).
    pub fn guards(&self) -> impl Iterator<Item = &StampedeGuard> {
        self.instances.iter().filter_map(|i| match i {
            Instance::App { guard, .. } => guard.as_ref(),
            Instance::Nginx(_) => None,
        })
    }

    /// Stops every instance. Clients must have closed their connections first,
    /// or the graceful shutdown waits for them (bounded all the same).
    pub async fn stop(self) {
        for instance in self.instances {
            match instance {
                Instance::App {
                    mut stop,
                    mut task,
                    backend,
                    guard,
                    proxy,
                    calls: _,
                } => {
                    if let Some(stop) = stop.take() {
                        let _ = stop.send(());
                    }
                    if tokio::time::timeout(Duration::from_secs(2), &mut task)
                        .await
                        .is_err()
                    {
                        task.abort();
                    }
                    drop(guard);
                    drop(backend);
                    drop(proxy);
                }
                // Dropping it stops nginx; that blocks, so not on a runtime worker.
                Instance::Nginx(nginx) => {
                    let _ = tokio::task::spawn_blocking(move || drop(nginx)).await;
                }
            }
        }
    }
}

/// Attempts an instance makes to connect its backend before the run fails.
const CONNECT_TRIES: u32 = 5;

async fn start_app(
    mode: Mode,
    policy: RoutePolicy,
    deps: &Deps,
    prefix: &str,
    failed_starts: &mut u64,
) -> Result<(SocketAddr, Instance), String> {
    let origin = deps.origin.clone();
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    // Each instance's handler calls the shared origin, as K copies of a
    // service would call the same database.
    let handler = match mode {
        Mode::Static => {
            let body = origin.body("static", 1);
            get(move || {
                let body = body.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], body) }
            })
        }
        // A write the origin accepts at once: through the layer, its
        // success invalidates the URL on every instance.
        _ => get(move |Path(key): Path<String>| {
            let origin = origin.clone();
            counted.fetch_add(1, Ordering::Relaxed);
            async move { origin.call(&key).await }
        })
        .post(|| async { http::StatusCode::NO_CONTENT }),
    };
    let mut proxy = None;
    let backend = match (mode, &deps.redis_url) {
        (Mode::None | Mode::Static, _) => None,
        (Mode::Local, _) | (Mode::Fleet, None) => Some(Backend::local()),
        // Every instance connects on its own: its own L1, its own connections.
        (Mode::Fleet, Some(url)) => {
            let url = match deps.redis_rtt {
                None => url.clone(),
                Some(rtt) => {
                    let upstream = delay_proxy::upstream_of(url)
                        .await
                        .ok_or_else(|| format!("no address in {url} to proxy"))?;
                    let started = DelayProxy::start(upstream, rtt)
                        .await
                        .map_err(|e| format!("starting a delay proxy: {e}"))?;
                    let through = delay_proxy::url_through(url, started.addr)
                        .ok_or_else(|| format!("cannot route {url} through a proxy"))?;
                    proxy = Some(started);
                    through
                }
            };
            // A failed start is a finding (counted), not the end of the run:
            // the instance tries again, a few times.
            let mut tries = 0;
            loop {
                match Backend::redis_builder(&url).prefix(prefix).connect().await {
                    Ok(backend) => break Some(backend),
                    Err(e) if tries + 1 < CONNECT_TRIES => {
                        tries += 1;
                        *failed_starts += 1;
                        eprintln!("  an instance did not start ({e}); trying again");
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        (Mode::Nginx, _) => unreachable!("nginx instances are not axum apps"),
    };
    let mut kept_guard = None;
    let route = match &backend {
        None => handler,
        Some(backend) => {
            let mut guard = StampedeGuard::new(backend.clone()).ttl(policy.ttl);
            if let Some(bytes) = policy.max_body_bytes {
                guard = guard.max_body_bytes(bytes);
            }
            if let Some(window) = policy.stale_while_revalidate {
                guard = guard.stale_while_revalidate(window);
            }
            if let Some(beta) = policy.early_refresh {
                guard = guard.early_refresh(beta);
            }
            if let Some((multiple, floor)) = policy.refresh_ahead {
                guard = guard.refresh_ahead(multiple, floor);
            }
            if let Some(window) = policy.stale_if_error {
                guard = guard.stale_if_error(window);
            }
            kept_guard = Some(guard.clone());
            handler.layer(guard)
        }
    };
    let app = Router::new().route("/item/{key}", route);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding an instance: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            eprintln!("instance on {addr} stopped: {e}");
        }
    });
    Ok((
        addr,
        Instance::App {
            stop: Some(stop),
            task,
            backend,
            guard: kept_guard,
            proxy,
            calls,
        },
    ))
}

fn start_nginx(policy: RoutePolicy, deps: &Deps) -> Result<(SocketAddr, Instance), String> {
    let Some((binary, origin)) = &deps.nginx else {
        return Err("nginx mode without nginx".into());
    };
    let config = NginxConfig {
        binary,
        origin_port: origin.port(),
        ttl_secs: policy.ttl.as_millis().div_ceil(1000).max(1) as u64,
        worker_connections: deps.clients + 256,
    };
    let nginx = Nginx::start(&config).map_err(|e| e.to_string())?;
    let addr = SocketAddr::from(([127, 0, 0, 1], nginx.port));
    Ok((addr, Instance::Nginx(nginx)))
}
