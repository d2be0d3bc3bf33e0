//! A body that one task fills and any number of readers read, each at its
//! own pace.
//!
//! It lets the request that started a rebuild stream the origin's bytes as
//! they come while the entry fills, and lets every coalesced waiter share one
//! origin fetch of a body too large to cache.
//!
//! Its memory is bounded, not the body's length: a chunk is kept in memory
//! only until every live reader has passed it, and a [`Hold`] keeps the
//! start for the readers still to join (the waiters of the flight, which
//! drop it once they all have their readers). Once the start is gone nobody
//! may join (a request that comes too late goes to the origin itself). The
//! filling task stops reading while the spool holds `bound` bytes in
//! memory.
//!
//! No reader holds the others back: while the memory is full and another
//! reader waits for more, the oldest chunks go to a spill file (see
//! [`file`]) and the filling task reads on; a reader behind them reads them
//! from the file, the others from memory. The file holds at most the
//! spool's disk cap: a reader (or hold) further behind than that holds the
//! others back until the next chunk has waited [`LAG_LIMIT`], then is cut
//! off (its body ends with an error, so its connection closes rather than
//! pretend the body was whole; a hold's waiters still to join go to the
//! origin). So is a reader that reads nothing for
//! [`LAG_LIMIT`] while the bytes it would read next were already read by
//! another (a client whose window stays shut); a reader that reads at all,
//! however slowly, keeps its place. Without a file (none can be created, or
//! the spool has no disk cap) a full spool waits for its slowest readers,
//! and cuts off those that others read ahead of once their next chunk has
//! waited [`LAG_LIMIT`]. A reader alone, or level with all the others, is
//! never cut off: it slows nobody but itself. A reader that is dropped lets
//! go of its chunks at once. A declared `Content-Length` is enforced: a
//! body that runs past it, or ends short of it, fails.
//!
//! Each read costs a few map operations (logarithmic in the number of
//! readers), and a new chunk wakes only the readers waiting for it.

mod file;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderName};
use http_body::{Body as HttpBody, Frame};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use file::SpillFile;

/// How long a reader may read nothing while the bytes it would read next
/// were already read by another, before it is cut off. Like a server's send
/// timeout, it is the time between two reads, not a pace: a client that
/// reads at all keeps its place.
pub(crate) const LAG_LIMIT: Duration = Duration::from_secs(10);

/// The disk a body's spill file may take, in units of the route's
/// `max_body_bytes` (256 MiB at the default 4 MiB).
pub(crate) const SPILL_FACTOR: u64 = 64;

/// The most one read from the spill file returns.
const FILE_READ: u64 = 16 << 10;

/// The disk cap of a body over `max_body_bytes`: [`SPILL_FACTOR`] times
/// the cap, and never more than the body's declared length.
pub(crate) fn spill_cap(max_body_bytes: usize, declared: Option<u64>) -> u64 {
    let cap = (max_body_bytes as u64).saturating_mul(SPILL_FACTOR);
    declared.map_or(cap, |d| d.min(cap))
}

type Ids<V> = HashMap<u64, V, rapidhash::fast::RandomState>;

/// How far the filling task got.
enum End {
    Open,
    /// The origin's body ended, with these trailers.
    Done(Option<HeaderMap>),
    /// The origin's body failed part way, or broke its declared length.
    Failed,
}

/// A live reader (or hold).
struct Slot {
    /// The byte of the body it reads next.
    pos: u64,
    /// When it joined or last read.
    last: Instant,
}

struct Spill {
    /// The most the file may hold; 0: no file.
    cap: u64,
    file: Option<Arc<SpillFile>>,
    /// Chunks may still go to the file: not once creating or writing it
    /// failed (what it holds already is still read).
    usable: bool,
    /// When chunks last went to the file.
    last: Option<Instant>,
    /// Where the file is made; the system's temporary directory if `None`.
    dir: Option<PathBuf>,
}

struct State {
    /// The chunks in memory; `chunks[0]` is the body's chunk number `first`
    /// and starts at byte `mem_start`. The bytes before it that a reader
    /// still needs are in the spill file.
    chunks: VecDeque<Bytes>,
    /// When each chunk in `chunks` arrived.
    arrived: VecDeque<Instant>,
    /// When a reader first read each chunk in `chunks`.
    first_read: VecDeque<Option<Instant>>,
    first: usize,
    mem_start: u64,
    /// The first byte still to be had, from memory or the file: readers may
    /// join only while it is 0.
    kept_from: u64,
    /// Bytes in `chunks`.
    held: usize,
    /// Bytes read from the origin in all.
    len: usize,
    /// The origin's `Content-Length`, if it sent one.
    declared: Option<u64>,
    /// Bytes held at which the filling task waits for its readers.
    bound: usize,
    end: End,
    /// The readers that read all there is and wait for more.
    waiting: Ids<Waker>,
    /// Each live reader (and hold). A reader missing from here came too
    /// late, or was cut off, and fails.
    slots: Ids<Slot>,
    /// `(pos, id)` of each live reader, slowest first.
    order: BTreeSet<(u64, u64)>,
    /// The furthest any reader has read.
    furthest: u64,
    next_id: u64,
    lag: Duration,
    spill: Spill,
}

/// What the filling task does next to get room.
enum Step {
    Ready,
    /// Readers were cut off: wake them and look again.
    Woke(Vec<Waker>),
    /// Make the spill file.
    Open(PathBuf, u64),
    /// Write the oldest chunks to the file.
    Spill {
        file: Arc<SpillFile>,
        at: u64,
        first: usize,
        chunks: Vec<Bytes>,
    },
    /// Wait for a reader to move, or until this deadline.
    Wait(Option<Instant>),
}

impl State {
    fn end_pos(&self) -> u64 {
        self.len as u64
    }

    fn slowest(&self) -> Option<u64> {
        self.order.first().map(|&(pos, _)| pos)
    }

    fn pop_front(&mut self) {
        if let Some(chunk) = self.chunks.pop_front() {
            self.held -= chunk.len();
            self.mem_start += chunk.len() as u64;
            self.arrived.pop_front();
            self.first_read.pop_front();
            self.first += 1;
        }
    }

    /// Drops the chunks every live reader has passed.
    fn trim(&mut self) {
        let Some(slowest) = self.slowest() else {
            // Nobody has joined yet: keep the start for whoever does.
            return;
        };
        while let Some(chunk) = self.chunks.front() {
            if self.mem_start + chunk.len() as u64 > slowest {
                break;
            }
            self.pop_front();
        }
        self.kept_from = self.kept_from.max(slowest.min(self.mem_start));
    }

    fn full(&self) -> bool {
        self.held >= self.bound && !self.slots.is_empty()
    }

    /// When a reader first read the bytes at `pos` (chunk `next` when in
    /// memory), if one has: no later than the real time.
    fn read_ahead_since(&self, pos: u64, next: usize) -> Option<Instant> {
        if pos < self.mem_start {
            // In the file: read by someone before it went there, and no
            // later than the first chunk still in memory.
            let front = self.first_read.front().copied().flatten();
            return match (front, self.spill.last) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        self.first_read
            .get(next.wrapping_sub(self.first))
            .copied()
            .flatten()
    }

    /// Whether a reader at `pos` that last read at `last` read nothing for
    /// the lag limit while others read ahead of it.
    fn stale(&self, pos: u64, next: usize, last: Instant, now: Instant) -> bool {
        pos < self.furthest
            && self
                .read_ahead_since(pos, next)
                .is_some_and(|ahead| now >= ahead.max(last) + self.lag)
    }

    /// The old rule, without a file: when the slowest readers are cut off,
    /// if the spool stays full: only while some reader reads ahead of them.
    fn lag_deadline(&self) -> Option<Instant> {
        let slowest = self.slowest()?;
        let ahead = self.order.last().map(|&(pos, _)| pos)?;
        if ahead <= slowest {
            return None;
        }
        Some(*self.arrived.front()? + self.lag)
    }

    /// Cuts off every reader that reads before byte `pos`: their chunks go,
    /// and their next read fails.
    fn cut_before(&mut self, pos: u64) -> (usize, Vec<Waker>) {
        let mut cut = 0;
        let mut wakers = Vec::new();
        while let Some(&(at, id)) = self.order.first() {
            if at >= pos {
                break;
            }
            self.order.pop_first();
            self.slots.remove(&id);
            wakers.extend(self.waiting.remove(&id));
            cut += 1;
        }
        self.trim();
        (cut, wakers)
    }

    fn register(&mut self) -> Option<u64> {
        if self.kept_from != 0 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.slots.insert(
            id,
            Slot {
                pos: 0,
                last: Instant::now(),
            },
        );
        self.order.insert((0, id));
        Some(id)
    }

    fn unregister(&mut self, id: u64) {
        if let Some(slot) = self.slots.remove(&id) {
            self.order.remove(&(slot.pos, id));
        }
        self.waiting.remove(&id);
        self.trim();
    }

    /// Reader `id` read on from `from` to `to`.
    fn advance(&mut self, id: u64, from: u64, to: u64, now: Instant) {
        self.order.remove(&(from, id));
        self.order.insert((to, id));
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.pos = to;
            slot.last = now;
        }
        self.waiting.remove(&id);
        self.furthest = self.furthest.max(to);
        self.trim();
    }

    fn wake_waiting(&mut self) -> Vec<Waker> {
        self.waiting.drain().map(|(_, w)| w).collect()
    }

    /// What the filling task does next to get room.
    fn room_step(&mut self, now: Instant) -> Step {
        if !self.full() {
            return Step::Ready;
        }
        if self.spill.usable && !self.waiting.is_empty() {
            // Someone waits for more: the oldest chunks go to the file.
            let Some(file) = self.spill.file.clone() else {
                let dir = self.spill.dir.clone().unwrap_or_else(std::env::temp_dir);
                return Step::Open(dir, self.spill.cap);
            };
            let (mut held, mut count, mut bytes) = (self.held, 0, 0u64);
            for chunk in &self.chunks {
                if held < self.bound {
                    break;
                }
                held -= chunk.len();
                bytes += chunk.len() as u64;
                count += 1;
            }
            // The file keeps the last `cap` bytes before the memory window.
            let keep_from = (self.mem_start + bytes).saturating_sub(self.spill.cap);
            if self.slowest().is_some_and(|pos| pos < keep_from) {
                // Someone (a reader, or the hold of waiters still to join)
                // is further behind than the file keeps: wait for it as
                // without a file, until the next chunk has waited the lag
                // limit, then cut it off.
                return match self.arrived.front().map(|at| *at + self.lag) {
                    Some(deadline) if deadline <= now => {
                        let (cut, wakers) = self.cut_before(keep_from);
                        log_cut(cut, "fell further behind than the spool's disk cap");
                        Step::Woke(wakers)
                    }
                    deadline => Step::Wait(deadline),
                };
            }
            self.kept_from = self.kept_from.max(keep_from);
            return Step::Spill {
                file,
                at: self.mem_start,
                first: self.first,
                chunks: self.chunks.iter().take(count).cloned().collect(),
            };
        }
        if self.spill.usable {
            // Nobody waits for more: nobody is held back.
            return Step::Wait(None);
        }
        match self.lag_deadline() {
            Some(deadline) if deadline <= now => {
                let slowest = self.slowest().unwrap_or(0);
                let (cut, wakers) = self.cut_before(slowest.saturating_add(1));
                log_cut(cut, "read nothing while the others waited for it");
                Step::Woke(wakers)
            }
            deadline => Step::Wait(deadline),
        }
    }
}

/// Logs readers cut off: at WARN at most once a minute in the process
/// (a client that stalls is a client's matter, but many of them are the
/// operator's), at DEBUG each time.
fn log_cut(readers: usize, why: &'static str) {
    if readers == 0 {
        return;
    }
    tracing::debug!(readers, why, "readers of a shared body cut off");
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    static NEXT_WARN: AtomicU64 = AtomicU64::new(0);
    let now = EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs();
    let next = NEXT_WARN.load(Ordering::Relaxed);
    if now >= next
        && NEXT_WARN
            .compare_exchange(next, now + 60, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            readers,
            why,
            "readers of a shared body over max_body_bytes cut off (their bodies end with an error); \
             more within a minute are logged at debug"
        );
    }
}

/// Logs, once in the process, that a spool could not spill to disk.
fn log_spill_failure(error: &io::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            %error,
            "a body over max_body_bytes could not spill to a temporary file: its readers \
             share the memory window alone, and one that lags is cut off (said once)"
        );
    } else {
        tracing::debug!(%error, "a body over max_body_bytes could not spill to a temporary file");
    }
}

/// Runs blocking file work on tokio's blocking threads (inline without a
/// runtime).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime
            .spawn_blocking(work)
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e))),
        Err(_) => work(),
    }
}

/// The shared growing buffer.
pub(crate) struct Spool {
    state: Mutex<State>,
    /// Wakes the filling task when a reader moves, leaves or waits.
    room: Notify,
}

fn wake(wakers: Vec<Waker>) {
    wakers.into_iter().for_each(Waker::wake);
}

impl Spool {
    /// A spool for a body the origin declared `declared` bytes long, if it
    /// did, that holds at most about `bound` bytes in memory for its
    /// readers and spills at most `spill_cap` bytes to disk (0: none).
    pub(crate) fn new(declared: Option<u64>, bound: usize, spill_cap: u64) -> Arc<Self> {
        Arc::new(Spool {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                arrived: VecDeque::new(),
                first_read: VecDeque::new(),
                first: 0,
                mem_start: 0,
                kept_from: 0,
                held: 0,
                len: 0,
                declared,
                bound: bound.max(1),
                end: End::Open,
                waiting: Ids::default(),
                slots: Ids::default(),
                order: BTreeSet::new(),
                furthest: 0,
                next_id: 0,
                lag: LAG_LIMIT,
                spill: Spill {
                    cap: spill_cap,
                    file: None,
                    usable: spill_cap > 0,
                    last: None,
                    dir: None,
                },
            }),
            room: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A reader or writer that panicked left the chunks whole: go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes read from the origin so far.
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }

    /// Adds a chunk; `false` if the body failed (now, by running past its
    /// declared length, or before): read no more.
    pub(crate) fn push(&self, chunk: Bytes) -> bool {
        let wakers = {
            let mut state = self.lock();
            if !matches!(state.end, End::Open) {
                return false;
            }
            if chunk.is_empty() {
                return true;
            }
            let len = state.len.saturating_add(chunk.len());
            if state.declared.is_some_and(|d| len as u64 > d) {
                tracing::debug!("the origin's body ran past its Content-Length");
                state.end = End::Failed;
            } else {
                state.len = len;
                state.held += chunk.len();
                state.chunks.push_back(chunk);
                state.arrived.push_back(Instant::now());
                state.first_read.push_back(None);
            }
            state.wake_waiting()
        };
        wake(wakers);
        !self.failed()
    }

    fn end(&self, end: End) {
        let wakers = {
            let mut state = self.lock();
            if matches!(state.end, End::Open) {
                state.end = end;
            }
            state.wake_waiting()
        };
        wake(wakers);
        self.room.notify_one();
    }

    /// Ends the body, whole if it has its declared length, else failed.
    pub(crate) fn finish(&self, trailers: Option<HeaderMap>) {
        let short = {
            let state = self.lock();
            state.declared.is_some_and(|d| d != state.len as u64)
        };
        if short {
            tracing::debug!("the origin's body ended short of its Content-Length");
            return self.fail();
        }
        self.end(End::Done(trailers));
    }

    pub(crate) fn fail(&self) {
        self.end(End::Failed);
    }

    pub(crate) fn failed(&self) -> bool {
        matches!(self.lock().end, End::Failed)
    }

    /// The whole body in one exactly sized buffer of its own, if it ended
    /// without trailers (and is all still held in memory): what the cache
    /// keeps must not pin the (larger) buffers the chunks are slices of.
    pub(crate) fn to_owned_bytes(&self) -> Option<Bytes> {
        let state = self.lock();
        if !matches!(state.end, End::Done(None)) || state.first != 0 {
            return None;
        }
        if state.len == 0 {
            return Some(Bytes::new());
        }
        let mut all = Vec::with_capacity(state.len);
        for chunk in &state.chunks {
            all.extend_from_slice(chunk);
        }
        Some(Bytes::from(all))
    }

    /// Whether the origin's body ended with trailers.
    pub(crate) fn has_trailers(&self) -> bool {
        matches!(self.lock().end, End::Done(Some(_)))
    }

    /// Waits for room: spills the oldest chunks while a reader waits for
    /// more, and cuts off the readers the spool cannot keep (see the
    /// module's documentation).
    async fn room(&self) {
        loop {
            let step = self.lock().room_step(Instant::now());
            match step {
                Step::Ready => return,
                Step::Woke(wakers) => wake(wakers),
                Step::Open(dir, cap) => {
                    let made = blocking(move || SpillFile::create(&dir, cap)).await;
                    let mut state = self.lock();
                    match made {
                        Ok(file) => state.spill.file = Some(Arc::new(file)),
                        Err(error) => {
                            state.spill.usable = false;
                            drop(state);
                            log_spill_failure(&error);
                        }
                    }
                }
                Step::Spill {
                    file,
                    at,
                    first,
                    chunks,
                } => {
                    let count = chunks.len();
                    let written = blocking(move || file.write(at, &chunks)).await;
                    let mut state = self.lock();
                    match written {
                        Ok(()) => {
                            // Chunks every reader passed meanwhile are gone
                            // already.
                            while state.first < first + count {
                                state.pop_front();
                            }
                            state.spill.last = Some(Instant::now());
                            state.trim();
                        }
                        Err(error) => {
                            state.spill.usable = false;
                            drop(state);
                            log_spill_failure(&error);
                        }
                    }
                }
                Step::Wait(deadline) => {
                    // A reader's wake-up in between is kept as a permit.
                    let moved = self.room.notified();
                    match deadline {
                        Some(deadline) => {
                            tokio::select! {
                                () = moved => {}
                                () = tokio::time::sleep_until(deadline) => {}
                            }
                        }
                        None => moved.await,
                    }
                }
            }
        }
    }

    /// Reads the origin's body into the spool on a task of its own, until
    /// it ends or nobody is left to read it.
    pub(crate) fn pump<B>(
        self: Arc<Self>,
        body: Pin<Box<B>>,
        error: OriginError<B::Error>,
        hide: Option<Arc<[http::HeaderName]>>,
    ) where
        B: HttpBody + Send + 'static,
        B::Data: Buf + Send,
        B::Error: Send + 'static,
    {
        let filling = Filling::new(&self);
        tokio::spawn(async move {
            let _filling = filling;
            let mut body = body;
            loop {
                self.room().await;
                // No reader left, and no flight to hand it to a waiter.
                if Arc::strong_count(&self) == 1 || self.lock().slots.is_empty() {
                    return;
                }
                match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                    None => return self.finish(None),
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(mut data) => {
                            if !self.push(data.copy_to_bytes(data.remaining())) {
                                return;
                            }
                        }
                        Err(frame) => {
                            let frame = hidden(frame, hide.as_deref());
                            return self.finish(frame.into_trailers().ok());
                        }
                    },
                    Some(Err(e)) => {
                        error.put(e);
                        return self.fail();
                    }
                }
            }
        });
    }
}

/// Keeps a spool's start for the readers still to join (the waiters of the
/// flight it answers), as long as it lives.
pub(crate) struct Hold {
    spool: Arc<Spool>,
    id: Option<u64>,
}

impl Hold {
    pub(crate) fn new(spool: &Arc<Spool>) -> Self {
        let id = spool.lock().register();
        Hold {
            spool: spool.clone(),
            id,
        }
    }

    pub(crate) fn spool(&self) -> &Arc<Spool> {
        &self.spool
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.spool.lock().unregister(id);
            self.spool.room.notify_one();
        }
    }
}

/// Fails a spool still open when dropped: a fill abandoned part way (a
/// rebuild past its timeout, a runtime shutting down) must not leave its
/// readers waiting for bytes that will never come. It holds the spool weakly,
/// so that it does not count as a reader.
pub(crate) struct Filling(Option<Weak<Spool>>);

impl Filling {
    pub(crate) fn new(spool: &Arc<Spool>) -> Self {
        Filling(Some(Arc::downgrade(spool)))
    }

    /// The fill goes on elsewhere (the pump has its own guard).
    pub(crate) fn hand_over(mut self) {
        self.0 = None;
    }
}

impl Drop for Filling {
    fn drop(&mut self) {
        if let Some(spool) = self.0.take().and_then(|s| s.upgrade()) {
            spool.fail();
        }
    }
}

/// A read from the spill file.
enum FileRead {
    Running(JoinHandle<io::Result<Bytes>>),
    /// Done inline (no runtime to run it on).
    Done(Option<io::Result<Bytes>>),
}

impl FileRead {
    fn start(file: Arc<SpillFile>, pos: u64, len: usize) -> Self {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => FileRead::Running(runtime.spawn_blocking(move || file.read(pos, len))),
            Err(_) => FileRead::Done(Some(file.read(pos, len))),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        match self {
            FileRead::Running(task) => Pin::new(task)
                .poll(cx)
                .map(|done| done.unwrap_or_else(|e| Err(io::Error::other(e)))),
            FileRead::Done(done) => Poll::Ready(
                done.take()
                    .unwrap_or_else(|| Err(io::Error::other("read twice"))),
            ),
        }
    }
}

/// One reader's place in a spool.
pub(crate) struct SpoolReader {
    spool: Arc<Spool>,
    /// `None`: it came too late to read from the start, and fails.
    id: Option<u64>,
    /// The byte it reads next.
    pos: u64,
    /// The number of the chunk it reads next, while it reads from memory.
    next: usize,
    finished: bool,
    /// A read from the spill file under way.
    reading: Option<FileRead>,
}

/// What a reader found.
pub(crate) enum Read {
    Frame(Frame<Bytes>),
    Failed,
    /// It was cut off: it read nothing for too long while others read
    /// ahead, or fell further behind than the spool keeps.
    CutOff,
}

impl SpoolReader {
    /// A reader from the start; one that fails if the start is gone.
    pub(crate) fn new(spool: Arc<Spool>) -> Self {
        let id = spool.lock().register();
        SpoolReader {
            spool,
            id,
            pos: 0,
            next: 0,
            finished: false,
            reading: None,
        }
    }

    /// Whether it joined at the start (else it reads nothing and fails).
    pub(crate) fn joined(&self) -> bool {
        self.id.is_some()
    }

    fn cut_off(&mut self) -> Poll<Option<Read>> {
        self.finished = true;
        Poll::Ready(Some(Read::CutOff))
    }

    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Read>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let Some(id) = self.id else {
            // Late: the start was gone.
            self.finished = true;
            return Poll::Ready(Some(Read::Failed));
        };
        if let Some(reading) = self.reading.as_mut() {
            let done = std::task::ready!(reading.poll(cx));
            self.reading = None;
            let mut state = self.spool.lock();
            if !state.slots.contains_key(&id) {
                // Cut off while it read: what it read may be overwritten.
                drop(state);
                return self.cut_off();
            }
            return match done {
                Ok(bytes) if !bytes.is_empty() => {
                    let to = self.pos + bytes.len() as u64;
                    state.advance(id, self.pos, to, Instant::now());
                    self.pos = to;
                    drop(state);
                    self.spool.room.notify_one();
                    Poll::Ready(Some(Read::Frame(Frame::data(bytes))))
                }
                Ok(_) => {
                    drop(state);
                    self.cut_off()
                }
                Err(error) => {
                    state.unregister(id);
                    drop(state);
                    self.spool.room.notify_one();
                    tracing::warn!(%error, "reading a shared body's spill file failed: its reader is cut off");
                    self.cut_off()
                }
            };
        }
        let now = Instant::now();
        let mut state = self.spool.lock();
        let Some(last) = state.slots.get(&id).map(|slot| slot.last) else {
            // Cut off: it held the others back.
            drop(state);
            return self.cut_off();
        };
        if self.pos == state.mem_start {
            self.next = state.first;
        }
        if state.stale(self.pos, self.next, last, now) {
            state.unregister(id);
            drop(state);
            self.spool.room.notify_one();
            log_cut(1, "read nothing while the others read ahead");
            return self.cut_off();
        }
        if self.pos < state.mem_start {
            // Its bytes went to the file.
            let Some(file) = state.spill.file.clone() else {
                drop(state);
                return self.cut_off();
            };
            let len = (state.mem_start - self.pos).min(FILE_READ) as usize;
            drop(state);
            self.reading = Some(FileRead::start(file, self.pos, len));
            return self.poll_read(cx);
        }
        let at = self.next.wrapping_sub(state.first);
        if let Some(chunk) = state.chunks.get(at).cloned() {
            if let Some(read) = state.first_read.get_mut(at) {
                read.get_or_insert(now);
            }
            let to = self.pos + chunk.len() as u64;
            state.advance(id, self.pos, to, now);
            self.pos = to;
            self.next += 1;
            drop(state);
            self.spool.room.notify_one();
            return Poll::Ready(Some(Read::Frame(Frame::data(chunk))));
        }
        match &state.end {
            End::Open => {
                state.waiting.insert(id, cx.waker().clone());
                drop(state);
                // It waits for more: the filling task may have to make room.
                self.spool.room.notify_one();
                Poll::Pending
            }
            End::Done(trailers) => {
                self.finished = true;
                Poll::Ready(trailers.clone().map(|t| Read::Frame(Frame::trailers(t))))
            }
            End::Failed => {
                self.finished = true;
                Poll::Ready(Some(Read::Failed))
            }
        }
    }

    fn all_read(&self, state: &State) -> bool {
        self.id.is_some() && self.pos >= state.end_pos()
    }

    /// Whether every byte was read and the body ended whole: what comes
    /// next is its trailers or its end.
    pub(crate) fn at_end(&self) -> bool {
        let state = self.spool.lock();
        !self.finished && self.all_read(&state) && matches!(state.end, End::Done(_))
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        if self.finished {
            return true;
        }
        let state = self.spool.lock();
        self.all_read(&state) && matches!(state.end, End::Done(None))
    }

    /// Bytes still to read, once the body is complete (and has no trailers,
    /// which a length-delimited message could not carry).
    pub(crate) fn exact_remaining(&self) -> Option<u64> {
        let state = self.spool.lock();
        if !matches!(state.end, End::Done(None)) || self.id.is_none() {
            return None;
        }
        Some(state.end_pos().saturating_sub(self.pos))
    }
}

impl Drop for SpoolReader {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.spool.lock().unregister(id);
            self.spool.room.notify_one();
        }
    }
}

/// `frame` without the trailer fields named in `hide`.
pub(crate) fn hidden<D>(mut frame: Frame<D>, hide: Option<&[HeaderName]>) -> Frame<D> {
    if let (Some(names), Some(trailers)) = (hide, frame.trailers_mut()) {
        for name in names {
            trailers.remove(name);
        }
    }
    frame
}

/// The origin's body error, kept for the one reader allowed to see it (the
/// request that caused the fetch); the others get a [`SharedBodyError`](super::SharedBodyError).
pub(crate) struct OriginError<E>(Arc<Mutex<Option<E>>>);

impl<E> Clone for OriginError<E> {
    fn clone(&self) -> Self {
        OriginError(self.0.clone())
    }
}

impl<E> OriginError<E> {
    pub(crate) fn new() -> Self {
        OriginError(Arc::new(Mutex::new(None)))
    }

    pub(crate) fn put(&self, error: E) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    pub(crate) fn take(&self) -> Option<E> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

#[cfg(test)]
mod tests;
