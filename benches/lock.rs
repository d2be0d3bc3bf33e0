//! Lock costs on a real redis-server (started by the bench on a free loopback
//! port): an uncontended acquire + release, and the hand-off latency from a
//! release to the waiter that was woken by its publish.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use stampede_guard::{Backend, Lock};

struct TempRedis(Child, u16);

impl TempRedis {
    fn start() -> Option<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
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
            .ok()?;
        let server = TempRedis(child, port);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lock(c: &mut Criterion) {
    let Some(redis) = TempRedis::start() else {
        eprintln!("redis-server not available: skipping the lock benches");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("redis://127.0.0.1:{}/", redis.1);
    let lock = runtime.block_on(async {
        Lock::new(Backend::redis(&url).await.expect("redis")).lease(Duration::from_secs(30))
    });
    let local = Lock::new(Backend::local());

    let mut group = c.benchmark_group("lock");
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("redis_acquire_release", |b| {
        b.to_async(&runtime).iter(|| async {
            let guard = lock.acquire("bench").await.expect("lock");
            guard.release().await.expect("release");
        })
    });
    group.bench_function("embedded_acquire_release", |b| {
        b.to_async(&runtime).iter(|| async {
            let guard = local.acquire("bench").await.expect("lock");
            guard.release().await.expect("release");
        })
    });
    // From the holder's release to the waiter holding the lock: the publish,
    // the wake-up and the waiter's acquiring round trip.
    group.bench_function("redis_handoff", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let lock = lock.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let held = lock.acquire("handoff").await.expect("lock");
                    let waiter = {
                        let lock = lock.clone();
                        tokio::spawn(async move {
                            let guard = lock.acquire("handoff").await.expect("lock");
                            let at = Instant::now();
                            guard.release().await.expect("release");
                            at
                        })
                    };
                    // Let the waiter queue and sleep on its wake-up.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let released = Instant::now();
                    held.release().await.expect("release");
                    total += waiter.await.expect("waiter").duration_since(released);
                }
                total
            }
        })
    });
    group.finish();
}

criterion_group!(benches, lock);
criterion_main!(benches);
