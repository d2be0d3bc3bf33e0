//! A body that one task fills and any number of readers read, each at its
//! own pace.
//!
//! It lets the request that started a rebuild stream the origin's bytes as
//! they come while the entry fills, and lets every coalesced waiter share one
//! origin fetch of a body too large to cache.
//!
//! Its memory is bounded, not the body's length: a chunk is kept only until
//! every live reader has passed it, and a [`Hold`] keeps the start for the
//! readers still to join (the waiters of the flight, which drop it once
//! they all have their readers). Once the first chunk is gone nobody may
//! join (a request that comes too late goes to the origin itself). The
//! filling task stops reading while the spool holds `bound` bytes, until
//! the slowest reader (or the hold) moves on.
//!
//! No reader holds the others back for long: while the spool is full, a
//! reader that others read ahead of, and whose next chunk has waited for it
//! longer than [`LAG_LIMIT`], is cut off (its body ends with an error, so
//! its connection closes rather than pretend the body was whole), and the
//! others go on. A reader that is dropped lets go of its chunks at once.
//! Readers that keep within the window, and a reader alone, are never cut:
//! they slow nobody but themselves. A declared `Content-Length` is
//! enforced: a body that runs past it, or ends short of it, fails.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderName};
use http_body::{Body as HttpBody, Frame};
use tokio::time::Instant;

/// How long a chunk may wait for a reader that others read ahead of, while
/// the spool is full, before that reader is cut off. Like a server's send
/// timeout, it bounds how long one client whose window stays shut can
/// stall the others; a client that reads at all keeps up with this easily
/// (it needs to read `bound` bytes in this time, only while it is the one
/// the others wait for).
pub(crate) const LAG_LIMIT: Duration = Duration::from_secs(10);

/// How far the filling task got.
enum End {
    Open,
    /// The origin's body ended, with these trailers.
    Done(Option<HeaderMap>),
    /// The origin's body failed part way, or broke its declared length.
    Failed,
}

struct State {
    /// The chunks still held; `chunks[0]` is the body's chunk number `first`.
    chunks: VecDeque<Bytes>,
    /// When each chunk in `chunks` arrived.
    arrived: VecDeque<Instant>,
    first: usize,
    /// Bytes in `chunks`.
    held: usize,
    /// Bytes read from the origin in all.
    len: usize,
    /// The origin's `Content-Length`, if it sent one.
    declared: Option<u64>,
    /// Bytes held at which the filling task waits for its readers.
    bound: usize,
    end: End,
    wakers: Vec<Waker>,
    /// The filling task, waiting for room.
    pump: Option<Waker>,
    /// Each live reader (and hold): its id and the number of the next chunk
    /// it reads. A reader missing from here came too late, and fails.
    readers: Vec<(u64, usize)>,
    next_id: u64,
    /// How long a full spool waits for a reader others read ahead of.
    lag: Duration,
}

impl State {
    fn end_index(&self) -> usize {
        self.first + self.chunks.len()
    }

    /// Drops the chunks every live reader has passed.
    fn trim(&mut self) {
        let Some(slowest) = self.readers.iter().map(|&(_, at)| at).min() else {
            // Nobody has joined yet: keep the start for whoever does.
            return;
        };
        while self.first < slowest {
            match self.chunks.pop_front() {
                Some(chunk) => self.held -= chunk.len(),
                None => break,
            }
            self.arrived.pop_front();
            self.first += 1;
        }
    }

    fn full(&self) -> bool {
        self.held >= self.bound && !self.readers.is_empty()
    }

    /// When the slowest readers are cut off, if the spool stays full: only
    /// while some reader reads ahead of them (a reader alone, or readers
    /// all at the same place, hold nobody back).
    fn lag_deadline(&self) -> Option<Instant> {
        let slowest = self.readers.iter().map(|&(_, at)| at).min()?;
        if !self.readers.iter().any(|&(_, at)| at > slowest) {
            return None;
        }
        let waiting = self.arrived.get(slowest.checked_sub(self.first)?)?;
        Some(*waiting + self.lag)
    }

    /// Cuts off the slowest readers: their chunks go, and their next read
    /// fails.
    fn cut_slowest(&mut self) -> Vec<Waker> {
        let Some(slowest) = self.readers.iter().map(|&(_, at)| at).min() else {
            return Vec::new();
        };
        let before = self.readers.len();
        self.readers.retain(|&(_, at)| at != slowest);
        tracing::debug!(
            readers = before - self.readers.len(),
            "readers of a shared body cut off: others read ahead while they read nothing"
        );
        self.trim();
        self.wake()
    }

    fn wake(&mut self) -> Vec<Waker> {
        let mut wakers = std::mem::take(&mut self.wakers);
        wakers.extend(self.pump.take());
        wakers
    }

    fn register(&mut self) -> Option<u64> {
        if self.first != 0 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.readers.push((id, 0));
        Some(id)
    }

    fn unregister(&mut self, id: u64) {
        self.readers.retain(|&(r, _)| r != id);
        self.trim();
    }
}

/// The shared growing buffer.
pub(crate) struct Spool {
    state: Mutex<State>,
}

fn wake(wakers: Vec<Waker>) {
    wakers.into_iter().for_each(Waker::wake);
}

impl Spool {
    /// A spool for a body the origin declared `declared` bytes long, if it
    /// did, that holds at most about `bound` bytes for its readers.
    pub(crate) fn new(declared: Option<u64>, bound: usize) -> Arc<Self> {
        Arc::new(Spool {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                arrived: VecDeque::new(),
                first: 0,
                held: 0,
                len: 0,
                declared,
                bound: bound.max(1),
                end: End::Open,
                wakers: Vec::new(),
                pump: None,
                readers: Vec::new(),
                next_id: 0,
                lag: LAG_LIMIT,
            }),
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
            }
            state.wake()
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
            state.wake()
        };
        wake(wakers);
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
    /// without trailers (and is all still held): what the cache keeps must
    /// not pin the (larger) buffers the chunks are slices of.
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

    /// Ready when the filling task may read on: the spool holds less than
    /// its bound (or nobody is left to read it). Otherwise it waits for the
    /// slowest reader, or the hold, to move on.
    #[cfg(test)]
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.lock();
        if !state.full() {
            return Poll::Ready(());
        }
        state.pump = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Waits for room, cutting off the readers that hold the others back
    /// past their deadline (see [`LAG_LIMIT`]).
    async fn room(&self) {
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        std::future::poll_fn(|cx| loop {
            let mut state = self.lock();
            if !state.full() {
                return Poll::Ready(());
            }
            let Some(deadline) = state.lag_deadline() else {
                // Woken when a reader moves or leaves.
                state.pump = Some(cx.waker().clone());
                return Poll::Pending;
            };
            if deadline <= Instant::now() {
                let wakers = state.cut_slowest();
                drop(state);
                wake(wakers);
                continue;
            }
            state.pump = Some(cx.waker().clone());
            drop(state);
            let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        })
        .await
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
                if Arc::strong_count(&self) == 1 || self.lock().readers.is_empty() {
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
            let wakers = {
                let mut state = self.spool.lock();
                state.unregister(id);
                state.pump.take()
            };
            wakers.into_iter().for_each(Waker::wake);
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

/// One reader's place in a spool.
pub(crate) struct SpoolReader {
    spool: Arc<Spool>,
    /// `None`: it came too late to read from the start, and fails.
    id: Option<u64>,
    next: usize,
    read: usize,
    finished: bool,
}

/// What a reader found.
pub(crate) enum Read {
    Frame(Frame<Bytes>),
    Failed,
    /// It was cut off for holding the other readers back.
    CutOff,
}

impl SpoolReader {
    /// A reader from the start; one that fails if the start is gone.
    pub(crate) fn new(spool: Arc<Spool>) -> Self {
        let id = spool.lock().register();
        SpoolReader {
            spool,
            id,
            next: 0,
            read: 0,
            finished: false,
        }
    }

    /// Whether it joined at the start (else it reads nothing and fails).
    pub(crate) fn joined(&self) -> bool {
        self.id.is_some()
    }

    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Read>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let mut state = self.spool.lock();
        let place = self
            .id
            .and_then(|id| state.readers.iter().position(|&(r, _)| r == id));
        let Some(place) = place else {
            self.finished = true;
            return Poll::Ready(Some(match self.id {
                // Cut off: it held the others back.
                Some(_) => Read::CutOff,
                // Late: the start was gone.
                None => Read::Failed,
            }));
        };
        let at = self.next.wrapping_sub(state.first);
        if let Some(chunk) = state.chunks.get(at).cloned() {
            self.next += 1;
            self.read += chunk.len();
            state.readers[place].1 = self.next;
            state.trim();
            let pump = state.pump.take();
            drop(state);
            pump.into_iter().for_each(Waker::wake);
            return Poll::Ready(Some(Read::Frame(Frame::data(chunk))));
        }
        match &state.end {
            End::Open => {
                if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    state.wakers.push(cx.waker().clone());
                }
                // It waits for more: the filling task may have to read on.
                let pump = state.pump.take();
                drop(state);
                pump.into_iter().for_each(Waker::wake);
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
        self.id.is_some() && self.next >= state.end_index()
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
        Some(state.len.saturating_sub(self.read) as u64)
    }
}

impl Drop for SpoolReader {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let pump = {
                let mut state = self.spool.lock();
                state.unregister(id);
                state.pump.take()
            };
            pump.into_iter().for_each(Waker::wake);
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
