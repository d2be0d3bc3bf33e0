//! A flash sale across processes: several worker processes, each with several
//! tasks, sell a limited stock kept in Redis. Each sale reads the stock and
//! writes it back (a read, then a write: the classic lost-update shape) inside
//! `stampede_guard::Lock`, so the stock is never oversold.
//!
//! The lock alone is an efficiency lock: a holder that stalls past its lease
//! (a long pause) overlaps with the next one. So the stock itself checks the
//! guard's fencing token, on the read as well as the write: a read records
//! the token, and a write is refused if a newer holder has read since, or if
//! the stock changed since this holder read it.
//!
//! ```sh
//! cargo run --example flash_sale                      # starts a temporary redis-server
//! cargo run --example flash_sale -- --redis redis://127.0.0.1:6379/ --stock 500
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use stampede_guard::{Backend, Lock};

const STOCK_KEY: &str = "flash-sale:stock";
/// The largest fencing token the stock has seen.
const FENCE_KEY: &str = "flash-sale:fence";

/// Reads the stock for the holder of `ARGV[1]`, and records that token:
/// every older holder is refused from now on. Returns -1 if refused.
const FENCED_READ: &str = "
    local last = tonumber(redis.call('GET', KEYS[2]) or '0')
    if tonumber(ARGV[1]) < last then return -1 end
    redis.call('SET', KEYS[2], ARGV[1])
    return tonumber(redis.call('GET', KEYS[1]) or '0')";

/// Writes `ARGV[3]` if the holder of `ARGV[1]` is still the newest seen and
/// the stock is still `ARGV[2]`, what it read. Returns 1 if written.
const FENCED_WRITE: &str = "
    local last = tonumber(redis.call('GET', KEYS[2]) or '0')
    if tonumber(ARGV[1]) < last then return 0 end
    if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
    redis.call('SET', KEYS[2], ARGV[1])
    redis.call('SET', KEYS[1], ARGV[3])
    return 1";

struct Options {
    redis: Option<String>,
    processes: usize,
    tasks: usize,
    stock: u64,
}

fn options() -> Options {
    let mut o = Options {
        redis: None,
        processes: 4,
        tasks: 8,
        stock: 200,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--redis" => o.redis = Some(value),
            "--processes" => o.processes = value.parse().expect("--processes N"),
            "--tasks" => o.tasks = value.parse().expect("--tasks N"),
            "--stock" => o.stock = value.parse().expect("--stock N"),
            other => panic!("unknown option {other}; see the file's header"),
        }
        i += 2;
    }
    o
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A worker process: `flash_sale --worker URL TASKS`.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let tasks = args[3].parse()?;
        return worker(&args[2], tasks).await;
    }

    let o = options();
    let (url, _server) = match o.redis.clone() {
        Some(url) => (url, None),
        None => {
            let server = TempRedis::start()?;
            println!("started a temporary redis-server on port {}", server.port);
            (server.url(), Some(server))
        }
    };
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = conn.set(STOCK_KEY, o.stock).await?;
    let _: () = conn.del(FENCE_KEY).await?;

    println!(
        "selling {} units with {} processes x {} tasks",
        o.stock, o.processes, o.tasks
    );
    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let workers: Vec<Child> = (0..o.processes)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", &url, &o.tasks.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;

    let mut total = 0u64;
    for (i, worker) in workers.into_iter().enumerate() {
        let output = worker.wait_with_output()?;
        let sold: u64 = String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("SOLD ")?.trim().parse().ok())
            .ok_or("a worker did not report")?;
        println!("  process {i}: sold {sold}");
        total += sold;
    }
    let left: i64 = conn.get(STOCK_KEY).await?;
    println!(
        "sold {total} of {} in {:.2} s; stock left {left}",
        o.stock,
        started.elapsed().as_secs_f64()
    );
    if total == o.stock && left == 0 {
        println!("never oversold: every unit sold exactly once");
        Ok(())
    } else {
        Err(format!("inconsistent sale: sold {total}, left {left}").into())
    }
}

/// Sells until the stock runs out; prints how many units this process sold.
async fn worker(url: &str, tasks: usize) -> Result<(), Box<dyn std::error::Error>> {
    let lock = Lock::new(Backend::redis(url).await?)
        .lease(Duration::from_secs(5))
        .wait_budget(Duration::from_secs(30));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let lock = lock.clone();
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        handles.push(tokio::spawn(async move {
            let (read, write) = (
                redis::Script::new(FENCED_READ),
                redis::Script::new(FENCED_WRITE),
            );
            let mut sold = 0u64;
            loop {
                let guard = lock.acquire("flash-sale").await.expect("lock");
                let fence = guard.fencing_token().0;
                let stock: i64 = read
                    .key(STOCK_KEY)
                    .key(FENCE_KEY)
                    .arg(fence)
                    .invoke_async(&mut conn)
                    .await
                    .expect("read stock");
                if stock == 0 {
                    guard.release().await.expect("release");
                    return sold;
                }
                // The critical section. A stalled holder whose lease ran out
                // is refused here (-1 above, or 0 below) instead of selling a
                // unit another holder sold too.
                let written: i64 = if stock > 0 {
                    write
                        .key(STOCK_KEY)
                        .key(FENCE_KEY)
                        .arg(fence)
                        .arg(stock)
                        .arg(stock - 1)
                        .invoke_async(&mut conn)
                        .await
                        .expect("write stock")
                } else {
                    0
                };
                let _ = guard.release().await;
                sold += written as u64;
            }
        }));
    }
    let mut sold = 0;
    for h in handles {
        sold += h.await?;
    }
    println!("SOLD {sold}");
    Ok(())
}

/// A redis-server of our own on a free loopback port, stopped on drop.
struct TempRedis {
    child: Child,
    port: u16,
}

impl TempRedis {
    fn start() -> Result<Self, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server not found ({e}); install it or pass --redis URL"))?;
        let server = TempRedis { child, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not start".into())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
