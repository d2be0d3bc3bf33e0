//! A flash sale across processes: several worker processes, each with several
//! tasks, sell a limited stock kept in Redis. Each sale reads the stock and
//! writes it back (a plain GET then SET, the classic lost-update shape) inside
//! `stampede_guard::Lock`, so the stock is never oversold.
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
            let mut sold = 0u64;
            loop {
                let guard = lock.acquire("flash-sale").await.expect("lock");
                let stock: i64 = conn.get(STOCK_KEY).await.expect("read stock");
                if stock <= 0 {
                    guard.release().await.expect("release");
                    return sold;
                }
                // The critical section: nobody else can read the stock
                // between this read and this write.
                let _: () = conn.set(STOCK_KEY, stock - 1).await.expect("write stock");
                guard.release().await.expect("release");
                sold += 1;
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
