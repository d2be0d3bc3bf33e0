//! A body that one task fills and any number of readers read, each from the
//! start and at its own pace.
//!
//! It lets the request that started a rebuild stream the origin's bytes as
//! they come while the entry fills, and lets every coalesced waiter share one
//! origin fetch of a body too large to cache. Chunks are kept until the spool
//! is dropped, which is when its last reader (or the flight holding it) is
//! gone: a spool costs the bytes read so far for as long as anyone reads it.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};

/// How far the filling task got.
enum End {
    Open,
    /// The origin's body ended, with these trailers.
    Done(Option<HeaderMap>),
    /// The origin's body failed part way.
    Failed,
}

struct State {
    chunks: Vec<Bytes>,
    len: usize,
    end: End,
    wakers: Vec<Waker>,
}

/// The shared growing buffer.
pub(crate) struct Spool {
    state: Mutex<State>,
}

impl Spool {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Spool {
            state: Mutex::new(State {
                chunks: Vec::new(),
                len: 0,
                end: End::Open,
                wakers: Vec::new(),
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

    pub(crate) fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let wakers = {
            let mut state = self.lock();
            state.len = state.len.saturating_add(chunk.len());
            state.chunks.push(chunk);
            std::mem::take(&mut state.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    fn end(&self, end: End) {
        let wakers = {
            let mut state = self.lock();
            state.end = end;
            std::mem::take(&mut state.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    pub(crate) fn finish(&self, trailers: Option<HeaderMap>) {
        self.end(End::Done(trailers));
    }

    pub(crate) fn fail(&self) {
        self.end(End::Failed);
    }

    fn fail_if_open(&self) {
        if matches!(self.lock().end, End::Open) {
            self.fail();
        }
    }

    /// The whole body in one exactly sized buffer of its own, if it ended
    /// without trailers: what the cache keeps must not pin the (larger)
    /// buffers the chunks are slices of.
    pub(crate) fn to_owned_bytes(&self) -> Option<Bytes> {
        let state = self.lock();
        if !matches!(state.end, End::Done(None)) {
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

    /// Reads the origin's body into the spool on a task of its own, until
    /// it ends or nobody is left to read it.
    pub(crate) fn pump<B>(self: Arc<Self>, body: Pin<Box<B>>, error: OriginError<B::Error>)
    where
        B: HttpBody + Send + 'static,
        B::Data: Buf + Send,
        B::Error: Send + 'static,
    {
        let filling = Filling::new(&self);
        tokio::spawn(async move {
            let _filling = filling;
            let mut body = body;
            loop {
                // Only the pump holds it: no reader, no flight.
                if Arc::strong_count(&self) == 1 {
                    return;
                }
                match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                    None => return self.finish(None),
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(mut data) => self.push(data.copy_to_bytes(data.remaining())),
                        Err(frame) => return self.finish(frame.into_trailers().ok()),
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
            spool.fail_if_open();
        }
    }
}

/// The origin's body error, kept for the one reader allowed to see it (the
/// request that caused the fetch); the others get a [`SharedBodyError`].
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

/// The error a body shared by several requests ends with when the origin's
/// body failed part way.
#[derive(Debug)]
pub struct SharedBodyError;

impl std::fmt::Display for SharedBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the origin's body failed while being streamed")
    }
}

impl std::error::Error for SharedBodyError {}

/// One reader's place in a spool.
pub(crate) struct SpoolReader {
    spool: Arc<Spool>,
    next: usize,
    finished: bool,
}

/// What a reader found.
pub(crate) enum Read {
    Frame(Frame<Bytes>),
    Failed,
}

impl SpoolReader {
    pub(crate) fn new(spool: Arc<Spool>) -> Self {
        SpoolReader {
            spool,
            next: 0,
            finished: false,
        }
    }

    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Read>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let mut state = self.spool.lock();
        if let Some(chunk) = state.chunks.get(self.next) {
            self.next += 1;
            return Poll::Ready(Some(Read::Frame(Frame::data(chunk.clone()))));
        }
        match &state.end {
            End::Open => {
                if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    state.wakers.push(cx.waker().clone());
                }
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

    /// Whether every byte was read and the body ended whole: what comes
    /// next is its trailers or its end.
    pub(crate) fn at_end(&self) -> bool {
        let state = self.spool.lock();
        !self.finished && self.next >= state.chunks.len() && matches!(state.end, End::Done(_))
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        if self.finished {
            return true;
        }
        let state = self.spool.lock();
        self.next >= state.chunks.len() && matches!(state.end, End::Done(None))
    }

    /// Bytes still to read, once the body is complete (and has no trailers,
    /// which a length-delimited message could not carry).
    pub(crate) fn exact_remaining(&self) -> Option<u64> {
        let state = self.spool.lock();
        if !matches!(state.end, End::Done(None)) {
            return None;
        }
        let read: usize = state.chunks.iter().take(self.next).map(Bytes::len).sum();
        Some(state.len.saturating_sub(read) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Noop;

    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    fn read(reader: &mut SpoolReader) -> Poll<Option<Read>> {
        let waker = Waker::from(Arc::new(Noop));
        reader.poll_read(&mut Context::from_waker(&waker))
    }

    fn data(poll: Poll<Option<Read>>) -> Bytes {
        match poll {
            Poll::Ready(Some(Read::Frame(frame))) => frame.into_data().expect("data"),
            _ => panic!("expected data"),
        }
    }

    #[test]
    fn every_reader_reads_from_the_start_at_its_own_pace() {
        let spool = Spool::new();
        let mut early = SpoolReader::new(spool.clone());
        spool.push(Bytes::from_static(b"ab"));
        assert_eq!(data(read(&mut early)), "ab");
        assert!(read(&mut early).is_pending());
        spool.push(Bytes::from_static(b"cd"));
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", "1".parse().unwrap());
        spool.finish(Some(trailers));
        let mut late = SpoolReader::new(spool.clone());
        for reader in [&mut early, &mut late] {
            if reader.next == 0 {
                assert_eq!(data(read(reader)), "ab");
            }
            assert_eq!(data(read(reader)), "cd");
            assert!(matches!(read(reader), Poll::Ready(Some(Read::Frame(f))) if f.is_trailers()));
            assert!(matches!(read(reader), Poll::Ready(None)));
        }
        // Trailers: not a body the cache may keep.
        assert!(spool.to_owned_bytes().is_none());
    }

    #[test]
    fn a_failure_reaches_every_reader_after_the_bytes_read() {
        let spool = Spool::new();
        spool.push(Bytes::from_static(b"ab"));
        spool.fail();
        let mut reader = SpoolReader::new(spool.clone());
        assert_eq!(data(read(&mut reader)), "ab");
        assert!(matches!(read(&mut reader), Poll::Ready(Some(Read::Failed))));
        assert!(matches!(read(&mut reader), Poll::Ready(None)));
        assert!(spool.to_owned_bytes().is_none());
    }

    #[test]
    fn the_kept_body_is_one_exact_buffer() {
        let spool = Spool::new();
        let big = Bytes::from(vec![1u8; 4096]);
        spool.push(big.slice(0..3));
        spool.push(big.slice(10..12));
        spool.finish(None);
        let owned = spool.to_owned_bytes().unwrap();
        assert_eq!(owned.len(), 5);
        // Not a slice of the big buffer.
        assert!(!big.as_ptr_range().contains(&owned.as_ptr()));
    }
}
