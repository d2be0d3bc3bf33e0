//! A TCP proxy that stands for a network between an instance and Redis: every
//! chunk read from one side reaches the other after a random delay, bytes in
//! order, so a request and its answer together cost a round trip in the
//! range asked for.

use std::net::SocketAddr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A round trip's added latency: each direction adds half of a value drawn
/// uniformly from `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rtt {
    pub lo: Duration,
    pub hi: Duration,
}

impl Rtt {
    /// `LO-HI` or `MS`, in milliseconds.
    pub fn parse(text: &str) -> Result<Rtt, String> {
        let ms = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("not a whole number of milliseconds: {s:?}"))
        };
        let (lo, hi) = match text.split_once('-') {
            Some((lo, hi)) => (ms(lo)?, ms(hi)?),
            None => (ms(text)?, ms(text)?),
        };
        if lo > hi {
            return Err(format!("{text}: the low end is above the high end"));
        }
        Ok(Rtt { lo, hi })
    }

    fn one_way(&self, rng: &mut SmallRng) -> Duration {
        let (lo, hi) = (
            self.lo.as_micros() as u64 / 2,
            self.hi.as_micros() as u64 / 2,
        );
        Duration::from_micros(if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        })
    }
}

impl std::fmt::Display for Rtt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{} ms", self.lo.as_millis(), self.hi.as_millis())
    }
}

/// A running proxy; dropping it closes the listener and every connection.
pub struct DelayProxy {
    pub addr: SocketAddr,
    /// Dropping it stops the proxy's thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream`, on a thread of its own: a network is not held up by the
    /// instances' work, and a burst that keeps their cores busy must not
    /// delay the bytes more than the range asked for.
    pub async fn start(upstream: SocketAddr, rtt: Rtt) -> std::io::Result<DelayProxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    let mut conns = JoinSet::new();
                    let mut seed = 0u64;
                    let accept = async {
                        loop {
                            let Ok((client, _)) = listener.accept().await else {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            };
                            seed += 2;
                            conns.spawn(pair(client, upstream, rtt, seed));
                            // Reap finished connections so the set does not grow.
                            while conns.try_join_next().is_some() {}
                        }
                    };
                    tokio::select! {
                        () = accept => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(DelayProxy { addr, _stop: stop })
    }
}

async fn pair(client: TcpStream, upstream: SocketAddr, rtt: Rtt, seed: u64) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either direction ending (a side closed) ends both.
    tokio::select! {
        () = one_way(client_read, server_write, rtt, seed) => {}
        () = one_way(server_read, client_write, rtt, seed + 1) => {}
    }
}

/// Reads chunks from `from` and writes each to `to` once its delay has
/// passed; a chunk never overtakes the one before it.
async fn one_way(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, rtt: Rtt, seed: u64) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + rtt.one_way(&mut rng);
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // The writer drains what the reader queued before the reader ended.
    let (_, ()) = tokio::join!(reader, writer);
}

/// `redis://[userinfo@]host:port[/db]` with `host:port` replaced by `addr`.
pub fn url_through(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    };
    let path = hostpart.find('/').map_or("", |i| &hostpart[i..]);
    Some(format!("{scheme}://{userinfo}{addr}{path}"))
}

/// The `host:port` a plain `redis://` URL points at.
pub async fn upstream_of(url: &str) -> Option<SocketAddr> {
    let (_, rest) = url.split_once("://")?;
    let hostpart = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = hostpart.split('/').next()?;
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    };
    tokio::net::lookup_host(hostport).await.ok()?.next()
}

/// The median of `n` PINGs to the Redis at `url` through a proxy of its
/// own, in ms: what the link this bench built really adds.
pub async fn measured_ping_ms(url: &str, rtt: Rtt, n: usize) -> Option<f64> {
    let proxy = DelayProxy::start(upstream_of(url).await?, rtt).await.ok()?;
    let client = redis::Client::open(url_through(url, proxy.addr)?).ok()?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let start = std::time::Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.ok()?;
        took.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    took.get(n / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_the_bytes_in_order() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).await.unwrap(),
                }
            }
        });
        let rtt = Rtt::parse("0-6").unwrap();
        let proxy = DelayProxy::start(upstream, rtt).await.unwrap();
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        let sent: Vec<u8> = (0..2000u32).flat_map(|i| i.to_le_bytes()).collect();
        // Many small writes, each its own chunk with its own delay.
        for piece in sent.chunks(16) {
            conn.write_all(piece).await.unwrap();
        }
        let mut got = vec![0u8; sent.len()];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }

    #[test]
    fn parses_ranges() {
        let r = Rtt::parse("20-40").unwrap();
        assert_eq!((r.lo.as_millis(), r.hi.as_millis()), (20, 40));
        assert_eq!(Rtt::parse("5").unwrap().hi, Duration::from_millis(5));
        assert!(Rtt::parse("40-20").is_err());
        assert!(Rtt::parse("x").is_err());
    }

    #[test]
    fn rewrites_the_address() {
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            url_through("redis://:pw@10.0.0.1:6379/2", addr).unwrap(),
            "redis://:pw@127.0.0.1:7000/2"
        );
        assert_eq!(
            url_through("redis://127.0.0.1:45295/", addr).unwrap(),
            "redis://127.0.0.1:7000/"
        );
    }
}
