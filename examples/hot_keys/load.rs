//! The load: C clients, each on its own keep-alive HTTP/1.1 connection to one
//! instance (round-robin), recording every request it makes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::net::TcpStream;
use tokio::sync::{watch, Barrier};
use tokio::task::JoinSet;

use crate::origin::Origin;

/// Every request carries the same Host: the guard keys on it, and the
/// instances stand for one service behind one name, not K different sites.
pub const HOST: &str = "hot-keys.test";
/// A request that takes longer than this counts as an error, so a wedged
/// instance cannot hold the run open.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How a response was answered, from the layer's `x-cache` or nginx's
/// `$upstream_cache_status` in the same header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Hit,
    Stale,
    Updating,
    Miss,
    Coalesced,
    Expired,
    Revalidated,
    Bypass,
    /// No header: no layer in front of the origin.
    Origin,
    Other,
}

impl Status {
    pub const ALL: [Status; 10] = [
        Status::Hit,
        Status::Stale,
        Status::Updating,
        Status::Miss,
        Status::Coalesced,
        Status::Expired,
        Status::Revalidated,
        Status::Bypass,
        Status::Origin,
        Status::Other,
    ];

    fn parse(value: Option<&HeaderValue>) -> Status {
        let Some(value) = value else {
            return Status::Origin;
        };
        match value.as_bytes() {
            b"HIT" => Status::Hit,
            b"STALE" => Status::Stale,
            b"UPDATING" => Status::Updating,
            b"MISS" => Status::Miss,
            b"COALESCED" => Status::Coalesced,
            b"EXPIRED" => Status::Expired,
            b"REVALIDATED" => Status::Revalidated,
            b"BYPASS" => Status::Bypass,
            _ => Status::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Hit => "HIT",
            Status::Stale => "STALE",
            Status::Updating => "UPDATING",
            Status::Miss => "MISS",
            Status::Coalesced => "COALESCED",
            Status::Expired => "EXPIRED",
            Status::Revalidated => "REVALIDATED",
            Status::Bypass => "BYPASS",
            Status::Origin => "(none)",
            Status::Other => "(other)",
        }
    }

    /// Answered after waiting for an origin call: the layer's MISS and
    /// COALESCED, nginx's MISS and EXPIRED, and anything that went to the
    /// origin itself (no layer, or a bypass).
    pub fn waited(self) -> bool {
        matches!(
            self,
            Status::Miss | Status::Coalesced | Status::Expired | Status::Bypass | Status::Origin
        )
    }

    /// Answered with a copy past its ttl: the layer's STALE, nginx's STALE
    /// and UPDATING.
    pub fn stale(self) -> bool {
        matches!(self, Status::Stale | Status::Updating)
    }
}

/// One answered request.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When it was sent, in microseconds after the run's start.
    pub start_us: u32,
    pub latency_us: u32,
    pub status: Status,
    /// Which instance answered it.
    pub instance: u8,
}

impl Sample {
    pub fn end_us(&self) -> u64 {
        u64::from(self.start_us) + u64::from(self.latency_us)
    }
}

/// Which keys the clients ask for.
#[derive(Clone)]
pub enum Keys {
    /// Every request on one key.
    One(Arc<str>),
    /// Zipf-distributed ranks over `cdf.len()` keys.
    Zipf { prefix: Arc<str>, cdf: Arc<[f64]> },
}

impl Keys {
    /// Zipf with exponent `s` over `n` keys: rank k is drawn with probability
    /// proportional to 1/k^s.
    pub fn zipf(prefix: &str, n: usize, s: f64) -> Keys {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                total += 1.0 / (k as f64).powf(s);
                total
            })
            .collect();
        for c in &mut cdf {
            *c /= total;
        }
        Keys::Zipf {
            prefix: prefix.into(),
            cdf: cdf.into(),
        }
    }

    fn path(&self, rng: &mut SmallRng) -> String {
        match self {
            Keys::One(key) => format!("/item/{key}"),
            Keys::Zipf { prefix, cdf } => {
                let u: f64 = rng.random();
                let rank = cdf.partition_point(|&c| c < u).min(cdf.len() - 1) + 1;
                format!("/item/{prefix}-{rank}")
            }
        }
    }
}

/// An answer that came, but not with a 200.
#[derive(Debug)]
pub struct NotOk(pub StatusCode);

impl std::fmt::Display for NotOk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {}", self.0)
    }
}

impl std::error::Error for NotOk {}

/// One keep-alive HTTP/1.1 connection, driven by its own task.
pub struct Conn {
    sender: SendRequest<Empty<Bytes>>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Result<Conn, Error> {
        let stream = TcpStream::connect(addr).await?;
        // Small requests and answers: Nagle would add delay, not save packets.
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn { sender })
    }

    /// GETs `path`, reads the whole body, and says how it was answered.
    pub async fn get(&mut self, path: &str) -> Result<Status, Error> {
        self.send(Method::GET, path, StatusCode::OK).await
    }

    /// Sends `method` to `path` with an empty body, reads the whole answer
    /// and says how it was answered; a status other than `ok` is a [`NotOk`].
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        ok: StatusCode,
    ) -> Result<Status, Error> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, HOST)
            .body(Empty::new())?;
        let exchange = async {
            self.sender.ready().await?;
            let response = self.sender.send_request(request).await?;
            let status = Status::parse(response.headers().get("x-cache"));
            let code = response.status();
            // Read frame by frame and drop each: a big body costs the
            // client one frame at a time, not a copy of the whole.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                frame?;
            }
            if code != ok {
                return Err(Box::new(NotOk(code)) as Error);
            }
            Ok::<_, Error>(status)
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| "request timed out")?
    }
}

/// What the clients recorded.
#[derive(Default)]
pub struct Load {
    pub samples: Vec<Sample>,
    pub errors: u64,
    /// Of the errors, answers that came with a status other than 200.
    pub non_ok: u64,
    /// How long the load ran.
    pub elapsed: Duration,
    /// When each burst was fired, in microseconds after the run's start
    /// (cold-burst only).
    pub bursts_us: Vec<u64>,
}

#[derive(Default)]
struct ClientOut {
    samples: Vec<Sample>,
    errors: u64,
    non_ok: u64,
    instance: u8,
}

impl ClientOut {
    fn record(&mut self, t0: Instant, start: Instant, result: Result<Status, Error>) -> bool {
        match result {
            Ok(status) => {
                self.samples.push(Sample {
                    start_us: micros(start.saturating_duration_since(t0)),
                    latency_us: micros(start.elapsed()),
                    status,
                    instance: self.instance,
                });
                true
            }
            Err(e) => {
                self.errors += 1;
                if e.downcast_ref::<NotOk>().is_some() {
                    self.non_ok += 1;
                }
                false
            }
        }
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

async fn connect_retrying(addr: SocketAddr) -> Option<Conn> {
    for _ in 0..3 {
        if let Ok(conn) = Conn::connect(addr).await {
            return Some(conn);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Sends one request after another, on one connection, until `seconds` have
/// passed; replaces the connection if it fails.
async fn timed_client(
    instance: usize,
    addr: SocketAddr,
    keys: Keys,
    seed: u64,
    ready: Arc<Barrier>,
    mut go: watch::Receiver<Option<Instant>>,
    seconds: Duration,
) -> ClientOut {
    let mut conn = connect_retrying(addr).await;
    ready.wait().await;
    let Ok(t0) = go
        .wait_for(Option::is_some)
        .await
        .map(|t| t.unwrap_or_else(Instant::now))
    else {
        return ClientOut::default();
    };
    let end = t0 + seconds;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = ClientOut {
        instance: instance as u8,
        ..ClientOut::default()
    };
    loop {
        let start = Instant::now();
        if start >= end {
            break;
        }
        let path = keys.path(&mut rng);
        let result = match conn.as_mut() {
            Some(c) => c.get(&path).await,
            None => Err("not connected".into()),
        };
        if !out.record(t0, start, result) {
            // Back off a little so a dead instance does not turn the client
            // into a busy loop.
            tokio::time::sleep(Duration::from_millis(10)).await;
            conn = connect_retrying(addr).await;
        }
    }
    out
}

/// Runs `clients` keep-alive clients, round-robin over `addrs`, for
/// `seconds`. Connections are opened before the clock starts; the origin's
/// books start with it.
pub async fn run_timed(
    addrs: &[SocketAddr],
    clients: usize,
    seconds: Duration,
    keys: Keys,
    origin: &Origin,
) -> Load {
    let ready = Arc::new(Barrier::new(clients + 1));
    let (go_tx, go_rx) = watch::channel(None);
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        tasks.spawn(timed_client(
            i % addrs.len(),
            addrs[i % addrs.len()],
            keys.clone(),
            i as u64,
            ready.clone(),
            go_rx.clone(),
            seconds,
        ));
    }
    ready.wait().await;
    let t0 = Instant::now();
    origin.reset(t0);
    let _ = go_tx.send(Some(t0));
    let mut load = gather(tasks).await;
    load.elapsed = seconds;
    load
}

/// Fires `bursts` bursts: every client sends one request for the burst's new
/// key at the same instant; the next burst starts once all are answered and
/// `gap` has passed.
pub async fn run_bursts(
    addrs: &[SocketAddr],
    clients: usize,
    bursts: usize,
    key_prefix: &str,
    gap: Duration,
    origin: &Origin,
) -> Load {
    let prefix: Arc<str> = key_prefix.into();
    let path = move |_client: usize, burst: usize| format!("/item/{prefix}-burst-{burst}");
    run_bursts_with(addrs, clients, bursts, gap, origin, path, |_| {}).await
}

/// As [`run_bursts`], with client `i` (on instance `i mod K`) asking for
/// `path(i, burst)`; `between(burst)` runs after each burst is answered,
/// before the gap.
pub async fn run_bursts_with(
    addrs: &[SocketAddr],
    clients: usize,
    bursts: usize,
    gap: Duration,
    origin: &Origin,
    path: impl Fn(usize, usize) -> String + Clone + Send + 'static,
    mut between: impl FnMut(usize),
) -> Load {
    let ready = Arc::new(Barrier::new(clients + 1));
    let done = Arc::new(Barrier::new(clients + 1));
    let (fire_tx, fire_rx) = watch::channel::<Option<(usize, Instant, Instant)>>(None);
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        let instance = i % addrs.len();
        let addr = addrs[instance];
        let (ready, done, mut fire) = (ready.clone(), done.clone(), fire_rx.clone());
        let path_of = path.clone();
        tasks.spawn(async move {
            let mut conn = connect_retrying(addr).await;
            ready.wait().await;
            let mut out = ClientOut {
                instance: instance as u8,
                ..ClientOut::default()
            };
            for burst in 0..bursts {
                let Ok(Some((_, t0, at))) = fire
                    .wait_for(|f| f.is_some_and(|(n, _, _)| n == burst))
                    .await
                    .map(|f| *f)
                else {
                    break;
                };
                tokio::time::sleep_until(at.into()).await;
                let start = Instant::now();
                let path = path_of(i, burst);
                let result = match conn.as_mut() {
                    Some(c) => c.get(&path).await,
                    None => Err("not connected".into()),
                };
                if !out.record(t0, start, result) {
                    conn = connect_retrying(addr).await;
                }
                done.wait().await;
            }
            out
        });
    }
    ready.wait().await;
    let t0 = Instant::now();
    origin.reset(t0);
    let mut bursts_us = Vec::with_capacity(bursts);
    for burst in 0..bursts {
        // A short lead lets every client be asleep on the same instant
        // before it comes.
        let at = Instant::now() + Duration::from_millis(20);
        bursts_us.push(at.duration_since(t0).as_micros() as u64);
        let _ = fire_tx.send(Some((burst, t0, at)));
        done.wait().await;
        between(burst);
        tokio::time::sleep(gap).await;
    }
    let elapsed = t0.elapsed();
    let mut load = gather(tasks).await;
    load.elapsed = elapsed;
    load.bursts_us = bursts_us;
    load
}

async fn gather(mut tasks: JoinSet<ClientOut>) -> Load {
    let mut load = Load::default();
    while let Some(result) = tasks.join_next().await {
        match result {
            Ok(out) => {
                load.samples.extend(out.samples);
                load.errors += out.errors;
                load.non_ok += out.non_ok;
            }
            Err(e) => {
                eprintln!("a client task failed: {e}");
                load.errors += 1;
            }
        }
    }
    load.samples.sort_unstable_by_key(|s| s.start_us);
    load
}
