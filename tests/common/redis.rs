//! A real `redis-server` per test: started on a free loopback port, stopped
//! (killed) when dropped. Fault tests kill, freeze and restart it for real.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// The user and password [`raw`](Self::raw) logs in with, if any.
    login: Option<(String, String)>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line settings (`--requirepass x`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start_with(extra).unwrap_or_else(|| {
            panic!("could not start redis-server (is it installed? scripts/test installs it)")
        })
    }

    /// [`start_with`](Self::start_with), or `None` if the server did not
    /// come up on any of five free ports (another port in `extra` may be
    /// taken: the caller picks it again).
    pub fn try_start_with(extra: &[&str]) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!(
            "stampede-guard-redis-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            login: None,
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return Some(server);
            }
        }
        let _ = std::fs::remove_dir_all(&server.dir);
        None
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap_or(".")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            panic!("redis-server not found on PATH (scripts/test installs it)");
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false; // port taken, most likely
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Never leave a server behind that did not become ready.
        self.kill();
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("server running")
    }

    /// SIGKILL: the server is gone at once, with everything it held.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty, like a crash restart).
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "redis-server restarts on port {}", self.port);
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// SIGSTOP: the server keeps its port but answers nothing.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Makes [`raw`](Self::raw) log in as `user` first: for a server whose
    /// `default` user is off or has a password.
    pub fn login_as(&mut self, user: &str, password: &str) {
        self.login = Some((user.to_owned(), password.to_owned()));
    }

    /// Sends one command in RESP and returns the raw reply.
    pub fn raw(&self, args: &[&str]) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut cmd = String::new();
        if let Some((user, password)) = &self.login {
            cmd.push_str(&resp(&["AUTH", user, password]));
        }
        cmd.push_str(&resp(args));
        stream.write_all(cmd.as_bytes()).expect("write");
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        if self.login.is_some() {
            reader.read_line(&mut first).expect("AUTH reply");
            assert_eq!(first.trim_end(), "+OK", "the harness's login");
            first.clear();
        }
        reader.read_line(&mut first).expect("reply");
        if let Some(len) = first.strip_prefix('$') {
            let len: i64 = len.trim().parse().unwrap_or(-1);
            if len < 0 {
                return String::new();
            }
            let mut body = vec![0u8; len as usize + 2];
            reader.read_exact(&mut body).expect("bulk");
            body.truncate(len as usize);
            return String::from_utf8_lossy(&body).into_owned();
        }
        first.trim_end().to_string()
    }

    pub fn ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream.write_all(b"PING\r\n").is_err() {
            return false;
        }
        // A server with a password answers -NOAUTH: alive all the same.
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).is_ok()
            && (line.starts_with("+PONG") || line.starts_with("-NOAUTH"))
    }

    /// `calls` per command from `INFO commandstats`.
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let info = self.raw(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
                Some((name.to_string(), calls.parse().ok()?))
            })
            .collect()
    }

    /// The ids of the server's clients (`CLIENT LIST`), but the one asking.
    pub fn client_ids(&self) -> HashSet<String> {
        self.raw(&["CLIENT", "LIST"])
            .lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .filter_map(|l| l.split_whitespace().next()?.strip_prefix("id="))
            .map(str::to_owned)
            .collect()
    }

    /// How many scripts ran by their hash (`EVALSHA`) on the server.
    pub fn evalsha_calls(&self) -> u64 {
        self.command_calls().get("evalsha").copied().unwrap_or(0)
    }

    pub fn reset_stats(&self) {
        assert_eq!(self.raw(&["CONFIG", "RESETSTAT"]), "+OK");
    }
}

/// One command in RESP.
pub fn resp(args: &[&str]) -> String {
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    cmd
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a frozen (stopped) server too.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
