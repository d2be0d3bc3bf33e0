//! A primary, a replica and one or more sentinels watching them, all real
//! processes on loopback. Everything is killed (a frozen process too) and
//! its directory removed on drop, also when a test panics.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::{resp, RedisServer};
use super::tls::free_port;

/// The name the sentinel knows the primary by.
pub const SERVICE: &str = "cache";

pub struct Sentinel {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// The harness's own login on the sentinel, if it wants one.
    login: Option<(String, String)>,
}

/// Who may talk to the sentinels and to the data nodes. The default: no
/// passwords anywhere.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Lines added to each sentinel's config (`requirepass …`, `user …`).
    pub sentinel_conf: Vec<String>,
    /// The harness's login on the sentinels (user, password); the
    /// sentinels also use it with each other.
    pub sentinel_admin: Option<(String, String)>,
    /// The harness's login on the data nodes (user, password), which the
    /// sentinels and the replicas use too. The user itself is defined by
    /// the data nodes' settings (`--user …`).
    pub data_admin: Option<(String, String)>,
}

impl Sentinel {
    fn start(primary_port: u16, quorum: usize, access: &Access) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "stampede-guard-sentinel-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // A sentinel rewrites its config file, so it gets one of its own.
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {SERVICE} 500\n\
                 sentinel failover-timeout {SERVICE} 5000\n\
                 sentinel parallel-syncs {SERVICE} 1\n{secured}",
                dir = dir.display(),
                secured = access.sentinel_lines(),
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel runs");
        let sentinel = Sentinel {
            child: Some(child),
            port,
            dir,
            login: access.sentinel_admin.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if sentinel.primary_port().is_some() {
                return sentinel;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the sentinel did not start");
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(|c| c.id())
            .expect("sentinel running")
    }

    /// SIGSTOP: the sentinel keeps its port (connections are accepted by
    /// the kernel) but answers nothing.
    pub fn freeze(&self) {
        signal(self.pid(), "-STOP");
    }

    pub fn thaw(&self) {
        signal(self.pid(), "-CONT");
    }

    /// Sends a command and returns the reply's text (see [`raw_sentinel`]).
    pub fn raw(&self, args: &[&str]) -> String {
        raw_sentinel(self.port, self.login.as_ref(), args)
    }

    /// The port the sentinel names as the primary's, if it answers.
    pub fn primary_port(&self) -> Option<u16> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut cmd = login_command(self.login.as_ref());
        cmd.push_str(&resp(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]));
        stream.write_all(cmd.as_bytes()).ok()?;
        let mut reader = BufReader::new(stream);
        if self.login.is_some() {
            let mut ok = String::new();
            reader.read_line(&mut ok).ok()?;
        }
        let mut lines = Vec::new();
        for _ in 0..5 {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            lines.push(line.trim_end().to_owned());
        }
        // *2, $len, host, $len, port
        lines.get(4)?.parse().ok()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Access {
    /// What each sentinel's config adds for these settings.
    fn sentinel_lines(&self) -> String {
        let mut lines = String::new();
        if let Some((user, password)) = &self.data_admin {
            lines.push_str(&format!(
                "sentinel auth-user {SERVICE} {user}\nsentinel auth-pass {SERVICE} {password}\n"
            ));
        }
        if let Some((user, password)) = &self.sentinel_admin {
            lines.push_str(&format!(
                "sentinel sentinel-user {user}\nsentinel sentinel-pass {password}\n"
            ));
        }
        for line in &self.sentinel_conf {
            lines.push_str(line);
            lines.push('\n');
        }
        lines
    }
}

/// `AUTH user password` in RESP, or nothing.
fn login_command(login: Option<&(String, String)>) -> String {
    login.map_or_else(String::new, |(user, password)| {
        resp(&["AUTH", user, password])
    })
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    /// The sentinels, in the order the URL lists them.
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    pub fn start() -> Self {
        Self::start_with(1, &[])
    }

    /// `sentinels` sentinels (quorum: a majority of them), and extra
    /// settings for both data nodes (`--user …`).
    pub fn start_with(sentinels: usize, extra: &[&str]) -> Self {
        Self::start_secured(sentinels, extra, &Access::default())
    }

    /// [`start_with`](Self::start_with), with passwords on the sentinels
    /// or the data nodes as `access` says.
    pub fn start_secured(sentinels: usize, extra: &[&str], access: &Access) -> Self {
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(extra);
        if let Some((user, password)) = &access.data_admin {
            args.extend_from_slice(&["--masteruser", user, "--masterauth", password]);
        }
        let login = |server: &mut RedisServer| {
            if let Some((user, password)) = &access.data_admin {
                server.login_as(user, password);
            }
        };
        let mut primary = RedisServer::start_with(&args);
        login(&mut primary);
        let port = primary.port().to_string();
        args.extend_from_slice(&["--replicaof", "127.0.0.1", &port]);
        let mut replica = RedisServer::start_with(&args);
        login(&mut replica);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .raw(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        let quorum = sentinels / 2 + 1;
        let sentinels: Vec<Sentinel> = (0..sentinels)
            .map(|_| Sentinel::start(primary.port(), quorum, access))
            .collect();
        // Each sentinel must know the replica before it can promote it, and
        // the others before they can elect a leader.
        let deadline = Instant::now() + Duration::from_secs(20);
        for sentinel in &sentinels {
            loop {
                let replicas = sentinel.raw(&["SENTINEL", "REPLICAS", SERVICE]);
                let peers = sentinel.raw(&["SENTINEL", "SENTINELS", SERVICE]);
                if replicas.contains(&replica.port().to_string())
                    && peers.matches("runid").count() + 1 >= sentinels.len()
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the sentinels did not find the replica and each other"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        SentinelSetup {
            primary,
            replica,
            sentinels,
        }
    }

    /// The first sentinel.
    pub fn sentinel(&self) -> &Sentinel {
        &self.sentinels[0]
    }

    /// The crate's URL for the primary behind the sentinels.
    pub fn url(&self) -> String {
        self.url_as("")
    }

    /// A backend through the sentinels, probing a lost link every 100 ms.
    #[cfg(feature = "redis")]
    pub async fn probing_backend(&self) -> stampede_guard::Backend {
        stampede_guard::Backend::redis_builder(&self.url())
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("backend through the sentinels")
    }

    /// The URL with credentials for the data nodes (`user:password@`).
    pub fn url_as(&self, userinfo: &str) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-sentinel://{userinfo}{}/{SERVICE}", hosts.join(","))
    }

    /// Waits until the sentinel names the replica as the primary and the
    /// replica says it is one.
    pub fn wait_for_promotion(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let named = self
                .sentinels
                .iter()
                .any(|s| s.primary_port() == Some(self.replica.port()));
            if named
                && self
                    .replica
                    .raw(&["INFO", "replication"])
                    .contains("role:master")
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the replica was not promoted within {limit:?}");
    }
}

/// Sends a command to a sentinel and returns everything it answers in the
/// first read (enough for short replies searched with `contains`).
fn raw_sentinel(port: u16, login: Option<&(String, String)>, args: &[&str]) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut cmd = login_command(login);
    cmd.push_str(&resp(args));
    if stream.write_all(cmd.as_bytes()).is_err() {
        return String::new();
    }
    let mut reader = BufReader::new(stream);
    let mut out = String::new();
    let mut line = String::new();
    while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        out.push_str(&line);
        line.clear();
    }
    out
}

/// Reads one RESP array of bulk strings (a client command), for the
/// fake sentinels of the attack tests; names in upper case.
pub fn read_command(reader: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0u8; len + 2];
        reader.read_exact(&mut buf).ok()?;
        buf.truncate(len);
        args.push(String::from_utf8_lossy(&buf).to_uppercase());
    }
    Some(args)
}
