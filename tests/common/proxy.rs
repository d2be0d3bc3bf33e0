//! A loopback TCP proxy in front of one instance's Redis link, so a test can
//! freeze that instance's link alone (bytes stop in both directions, the
//! connection stays open, as in a partition or a stalled network) while
//! the rest of the fleet talks to Redis as usual.

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
