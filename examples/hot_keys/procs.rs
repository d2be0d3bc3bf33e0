//! Child processes the bench starts (a temporary redis-server or Redis
//! Cluster, nginx), and the open-file limit it needs.
//!
//! Every child is registered so that Ctrl-C stops it too: a bench that leaves
//! servers bound to loopback ports behind would skew the next run.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Children alive now, with the signal that stops each cleanly.
static LIVE: Mutex<Vec<(u32, libc::c_int)>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<(u32, libc::c_int)>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; the
    // pid is one of our own children that has not been reaped yet.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops every registered child; for Ctrl-C, when no destructor will run.
pub fn stop_all() {
    for (pid, sig) in live().drain(..) {
        signal(pid, sig);
    }
}

/// A child that is stopped (and reaped) when dropped.
struct Managed {
    child: Child,
    stop: libc::c_int,
}

impl Managed {
    fn new(child: Child, stop: libc::c_int) -> Self {
        live().push((child.id(), stop));
        Managed { child, stop }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let pid = self.child.id();
        live().retain(|(p, _)| *p != pid);
        if self.exited() {
            return;
        }
        signal(pid, self.stop);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.exited() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port, as the OS hands it out. Another process could take
/// it before we bind it again, so callers retry on failure.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The first `name` on `PATH` that is a file.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A fresh directory under the system temp dir, removed by the owner.
fn temp_dir(what: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "hot-keys-{what}-{}-{}",
        std::process::id(),
        free_port()?
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn wait_until(deadline: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + deadline;
    while Instant::now() < give_up {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A temporary redis-server on a free loopback port, without persistence.
/// Killed when dropped: its data is throwaway.
pub struct RedisServer {
    // Dropped before `dir` is removed (fields drop in order).
    process: Option<Managed>,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    pub fn start(binary: &Path) -> std::io::Result<Self> {
        Self::start_with(binary, &[])
    }

    /// The same, with extra settings (`--cluster-enabled yes`, ...).
    fn start_with(binary: &Path, extra: &[String]) -> std::io::Result<Self> {
        let dir = temp_dir("redis")?;
        for _ in 0..5 {
            let port = free_port()?;
            let child = Command::new(binary)
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut process = Managed::new(child, libc::SIGKILL);
            let up = wait_until(Duration::from_secs(10), || {
                process.exited() || redis_ping(port)
            });
            if up && !process.exited() {
                return Ok(RedisServer {
                    process: Some(process),
                    port,
                    dir,
                });
            }
            // Most likely the port was taken in between: try another.
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(std::io::Error::other("redis-server did not start"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// A temporary Redis Cluster of `masters` primaries (no replicas) on free
/// loopback ports, each node in its own temp dir. Every node is killed and
/// its dir removed when this is dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(server: &Path, cli: &Path, masters: usize) -> std::io::Result<Self> {
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            // The bus port is chosen too: the default (port + 10000) can
            // fall outside the port range for ports the OS hands out.
            let extra = [
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                "nodes.conf".to_owned(),
                "--cluster-port".to_owned(),
                free_port()?.to_string(),
            ];
            nodes.push(RedisServer::start_with(server, &extra)?);
        }
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .chain(String::from_utf8_lossy(&output.stderr).lines())
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("no output")
            )));
        }
        // The slots are assigned at once, but each node only reports the
        // cluster usable once gossip has reached it.
        let ok = wait_until(Duration::from_secs(20), || {
            nodes.iter().all(|n| {
                redis_inline(n.port, "CLUSTER INFO").is_some_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                })
            })
        });
        if !ok {
            return Err(std::io::Error::other(
                "the cluster did not reach cluster_state:ok within 20 s",
            ));
        }
        Ok(RedisCluster { nodes })
    }

    /// The crate's URL form for a cluster.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.process.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One inline command on a node, its bulk-string reply as text.
fn redis_inline(port: u16, command: &str) -> Option<String> {
    use std::io::Read as _;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    let len: usize = header.strip_prefix('$')?.trim().parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
}

fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// What an nginx instance is told.
pub struct NginxConfig<'a> {
    pub binary: &'a Path,
    pub origin_port: u16,
    /// proxy_cache_valid, in whole seconds: nginx's cache clock has no finer unit.
    pub ttl_secs: u64,
    pub worker_connections: usize,
}

/// One nginx (a master and one worker) with its own config and cache in a
/// temp dir, listening on a loopback port. Stopped with SIGTERM when dropped.
pub struct Nginx {
    process: Option<Managed>,
    pub port: u16,
    dir: PathBuf,
}

impl Nginx {
    pub fn start(config: &NginxConfig<'_>) -> std::io::Result<Self> {
        let dir = temp_dir("nginx")?;
        // The worker runs as an unprivileged user when we are root: it must be
        // able to reach its cache and temp dirs.
        set_mode(&dir, 0o755)?;
        for _ in 0..5 {
            let port = free_port()?;
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(config, &dir, port))?;
            let child = Command::new(config.binary)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(dir.join("error.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let mut process = Managed::new(child, libc::SIGTERM);
            let up = wait_until(Duration::from_secs(10), || {
                process.exited() || TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
            if up && !process.exited() {
                return Ok(Nginx {
                    process: Some(process),
                    port,
                    dir,
                });
            }
        }
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        Err(std::io::Error::other(format!(
            "nginx did not start: {}",
            log.lines().last().unwrap_or("no error log")
        )))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.process.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The config the "why not just nginx?" comparison runs: one worker, a cache
/// lock so one request per node fills a key, stale answers while a background
/// update runs, and keep-alive both ways so connection set-up is not measured.
fn nginx_conf(config: &NginxConfig<'_>, dir: &Path, port: u16) -> String {
    let dir = dir.display();
    let NginxConfig {
        origin_port,
        ttl_secs,
        worker_connections,
        ..
    } = config;
    let files = worker_connections * 2 + 64;
    format!(
        r#"daemon off;
worker_processes 1;
worker_rlimit_nofile {files};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections {worker_connections};
}}

http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy_temp;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;

    proxy_cache_path {dir}/cache levels=1:2 keys_zone=hot:16m max_size=512m inactive=10m use_temp_path=off;

    upstream origin {{
        server 127.0.0.1:{origin_port};
        keepalive 64;
    }}

    server {{
        listen 127.0.0.1:{port};

        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache hot;
            proxy_cache_key $uri;
            proxy_cache_valid 200 {ttl_secs}s;
            proxy_cache_lock on;
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
            add_header x-cache $upstream_cache_status always;
        }}
    }}
}}
"#
    )
}

/// Raises the soft open-file limit towards `wanted` (never past the hard
/// limit). Returns the soft limit in force afterwards.
pub fn raise_nofile(wanted: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // rlim_t is u64 on Linux but not on every platform.
    #[allow(clippy::unnecessary_cast)]
    // SAFETY: getrlimit/setrlimit read and write only the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        let current = limit.rlim_cur as u64;
        if current >= wanted {
            return current;
        }
        let target = if limit.rlim_max == libc::RLIM_INFINITY {
            wanted
        } else {
            wanted.min(limit.rlim_max as u64)
        };
        limit.rlim_cur = target as libc::rlim_t;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return current;
        }
        target
    }
}
