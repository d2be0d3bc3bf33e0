//! A primary, a replica and a sentinel watching them, all real processes on
//! loopback. Everything is killed and its directory removed on drop.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::RedisServer;
use super::tls::free_port;

/// The name the sentinel knows the primary by.
pub const SERVICE: &str = "cache";

pub struct Sentinel {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

impl Sentinel {
    fn start(primary_port: u16) -> Self {
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
                 sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {SERVICE} 500\n\
                 sentinel failover-timeout {SERVICE} 5000\n\
                 sentinel parallel-syncs {SERVICE} 1\n",
                dir = dir.display()
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

    /// The port the sentinel names as the primary's, if it answers.
    pub fn primary_port(&self) -> Option<u16> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let cmd = format!(
            "*3\r\n$8\r\nSENTINEL\r\n$23\r\nGET-MASTER-ADDR-BY-NAME\r\n${}\r\n{SERVICE}\r\n",
            SERVICE.len()
        );
        stream.write_all(cmd.as_bytes()).ok()?;
        let mut reader = BufReader::new(stream);
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

pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinel: Sentinel,
}

impl SentinelSetup {
    pub fn start() -> Self {
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let port = primary.port().to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .raw(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinel = Sentinel::start(primary.port());
        // The sentinel must know the replica before it can promote it.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let replicas = raw_sentinel(sentinel.port, &["SENTINEL", "REPLICAS", SERVICE]);
            if replicas.contains(&replica.port().to_string()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel did not find the replica"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        SentinelSetup {
            primary,
            replica,
            sentinel,
        }
    }

    /// The crate's URL for the primary behind the sentinel.
    pub fn url(&self) -> String {
        format!(
            "redis-sentinel://127.0.0.1:{}/{SERVICE}",
            self.sentinel.port
        )
    }

    /// Waits until the sentinel names the replica as the primary and the
    /// replica says it is one.
    pub fn wait_for_promotion(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.sentinel.primary_port() == Some(self.replica.port())
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
fn raw_sentinel(port: u16, args: &[&str]) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
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
