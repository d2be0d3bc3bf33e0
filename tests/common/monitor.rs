//! Every command a redis-server runs, read with `MONITOR`: round trips and
//! published messages counted by what the server saw.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::redis::RedisServer;

/// Every command the server runs, as `MONITOR` prints it.
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stream: TcpStream,
}

impl Monitor {
    pub fn start(redis: &RedisServer) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("monitor");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("monitor reply");
        assert_eq!(ok.trim_end(), "+OK");
        std::thread::spawn({
            let lines = lines.clone();
            move || {
                for line in reader.lines() {
                    let Ok(line) = line else { return };
                    lines.lock().unwrap().push(line);
                }
            }
        });
        Monitor { lines, stream }
    }

    pub fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// The `fetch_or_lease` calls since `mark` (seven keys, five arguments).
    pub fn fetches(&self, mark: usize) -> Vec<Vec<String>> {
        self.commands(mark)
            .into_iter()
            .filter(|t| t.len() == 15 && t[0].eq_ignore_ascii_case("evalsha") && t[2] == "7")
            .collect()
    }

    /// The messages published since `mark`: (channel, message).
    pub fn published(&self, mark: usize) -> Vec<(String, String)> {
        self.commands(mark)
            .into_iter()
            .filter(|t| t.len() == 3 && t[0].eq_ignore_ascii_case("publish"))
            .map(|t| (t[1].clone(), t[2].clone()))
            .collect()
    }

    pub fn commands(&self, mark: usize) -> Vec<Vec<String>> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .skip(mark)
            .filter_map(|line| {
                let (_, command) = line.split_once("] ")?;
                Some(
                    command
                        .split(' ')
                        .map(|t| t.trim_matches('"').to_owned())
                        .collect(),
                )
            })
            .collect()
    }

    /// Waits (bounded) until everything the server ran so far was read.
    pub async fn settle(&self, redis: &RedisServer) {
        let token = format!("settle-{:x}", rand::random::<u64>());
        redis.raw(&["ECHO", &token]);
        until("the monitor caught up", || {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(&token))
        })
        .await;
    }

    pub async fn await_fetches(&self, mark: usize, count: usize) {
        until("the fetches came", || self.fetches(mark).len() >= count).await;
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Polls `done` every 10 ms, giving up after 20 s.
pub async fn until(what: &str, done: impl FnMut() -> bool) {
    within(what, Duration::from_secs(20), done).await;
}

/// Polls `done` every 10 ms; fails unless it holds within `limit`.
pub async fn within(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    assert!(
        holds_within(limit, done).await,
        "not within {limit:?}: {what}"
    );
}

/// Polls `check` every 10 ms for `limit` at most; whether it held.
pub async fn holds_within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + limit;
    while Instant::now() < give_up {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}
