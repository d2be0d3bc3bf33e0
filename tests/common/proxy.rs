//! A loopback TCP proxy in front of one instance's Redis link, so a test can
//! freeze that instance's link alone (bytes stop in both directions, the
//! connection stays open, as in a partition or a stalled network) while
//! the rest of the fleet talks to Redis as usual; or delay its bytes, as a
//! Redis one network hop away would (see [`Proxy::delayed`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; dropping it stops accepting (open links end with the test).
pub struct Proxy {
    port: u16,
    /// Holds the bytes going to Redis.
    requests: Arc<AtomicBool>,
    /// Holds the bytes coming back.
    replies: Arc<AtomicBool>,
    /// Holds a close from either side too, while frozen.
    closes: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Proxies 127.0.0.1:<new port> to 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(AtomicBool::new(false));
        let closes = Arc::new(AtomicBool::new(false));
        let task = {
            let (up, down, held) = (requests.clone(), replies.clone(), closes.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        continue;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, up.clone(), held.clone()));
                    tokio::spawn(pump(sr, cw, down.clone(), held.clone()));
                }
            })
        };
        Proxy {
            port,
            requests,
            replies,
            closes,
            task,
        }
    }

    /// Proxies 127.0.0.1:<new port> to 127.0.0.1:`upstream`, each chunk of
    /// bytes held for a delay drawn from `one_way` (milliseconds) in each
    /// direction, in order: a round trip costs twice that, as on a link
    /// one network hop away. Throughput is not limited.
    ///
    /// It runs on a thread of its own, as a network does: a burst that keeps
    /// the test's runtime busy does not hold its bytes back.
    pub async fn delayed(upstream: u16, one_way: std::ops::RangeInclusive<u64>) -> Proxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let port = std_listener.local_addr().expect("addr").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                tokio::select! {
                    () = forward_late(listener, upstream, one_way, port) => {}
                    _ = stopped => {}
                }
            });
        });
        let task = tokio::spawn(async move {
            // Dropping the proxy aborts this task, which drops `stop`.
            let _stop = stop;
            std::future::pending::<()>().await;
        });
        let unused = || Arc::new(AtomicBool::new(false));
        Proxy {
            port,
            requests: unused(),
            replies: unused(),
            closes: unused(),
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops forwarding bytes (both ways) until `thaw`.
    pub fn freeze(&self) {
        self.requests.store(true, Ordering::SeqCst);
        self.replies.store(true, Ordering::SeqCst);
    }

    /// Like `freeze`, and a connection Redis closes meanwhile stays open on
    /// the client's side until `thaw` (its FIN is held like its bytes): the
    /// client cannot tell that Redis dropped it.
    pub fn freeze_closes_too(&self) {
        self.closes.store(true, Ordering::SeqCst);
        self.freeze();
    }

    /// Holds only what Redis sends back: commands still run at once, their
    /// replies arrive late.
    pub fn freeze_replies(&self) {
        self.replies.store(true, Ordering::SeqCst);
    }

    pub fn thaw(&self) {
        self.closes.store(false, Ordering::SeqCst);
        self.requests.store(false, Ordering::SeqCst);
        self.replies.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
    closes: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                while closes.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                return;
            }
            Ok(n) => n,
        };
        // Held, not dropped: a frozen link delivers late, as TCP would.
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Forwards `from` to `to`, each chunk `one_way` milliseconds late (drawn
/// per chunk, never overtaking the one before).
async fn late(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    one_way: std::ops::RangeInclusive<u64>,
    mut seed: u64,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let (low, high) = (*one_way.start(), *one_way.end());
    let mut last = tokio::time::Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let ms = low + seed % (high.saturating_sub(low) + 1);
        let due = (tokio::time::Instant::now() + Duration::from_millis(ms)).max(last);
        last = due;
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Accepts on `listener`, forwarding each connection to `upstream` through
/// [`late`].
async fn forward_late(
    listener: TcpListener,
    upstream: u16,
    one_way: std::ops::RangeInclusive<u64>,
    port: u16,
) {
    let mut seed = u64::from(port) | 1;
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        for (from, to) in [(cr, sw), (sr, cw)] {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            tokio::spawn(late(from, to, one_way.clone(), seed));
        }
    }
}
