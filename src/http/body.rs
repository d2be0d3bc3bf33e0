//! The response body the layer returns.
//!
//! A hit is one `Bytes` shared with the cache (no copy). A response that is not
//! cached streams the origin's body through untouched. A response the layer
//! reads while answering is a reader of a [`Spool`]: the bytes reach it as the
//! origin sends them, and a body too large to cache is read from the origin
//! once for every request that waited for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderName;
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;

use super::spool::{hidden, OriginError, Read, Spool, SpoolReader};

/// The error type of a [`GuardBody`]: the inner body's error, or a
/// [`SharedBodyError`] for a request that shared another one's origin body.
/// See [`SharedBodyError`] for an example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Body of a response that went through a [`StampedeGuard`](crate::StampedeGuard).
    /// (Named so as not to clash with `axum::body::Body` in the same
    /// module; it was `stampede_guard::Body`, still there, deprecated.)
    ///
    /// It implements [`http_body::Body`] with `Bytes` data and [`BoxError`]
    /// errors, so axum and hyper take it as it is. A request that read its
    /// own origin body sees that body's error as it was (boxed); a request
    /// that shared someone else's sees a [`SharedBodyError`].
    ///
    /// See [`GuardService`](crate::GuardService) for an example.
    pub struct GuardBody<B> where B: http_body::Body {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> where B: http_body::Body {
        Full { data: Option<Bytes> },
        // No body, standing for one of a length not known (HEAD, 304).
        Unsized,
        // `hide`: fields removed from its trailers (the route's tag fields).
        Stream { #[pin] inner: B, hide: Option<Arc<[HeaderName]>> },
        Spooled {
            reader: SpoolReader,
            // Set for the request whose origin body it is.
            origin_error: Option<OriginError<B::Error>>,
            // Holds back the end of a whole body until it fires.
            end_after: Option<oneshot::Receiver<()>>,
        },
    }
}

impl<B: http_body::Body> GuardBody<B> {
    /// A complete body held in memory.
    pub(crate) fn full(data: Bytes) -> Self {
        GuardBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn empty() -> Self {
        GuardBody {
            kind: Kind::Full { data: None },
        }
    }

    /// No body, in an answer that stands for a body of unknown length (the
    /// head of a chunked one, or its `304`): its size hint is not exact, so
    /// that no router or server writes `Content-Length: 0` for it.
    pub(crate) fn unsized_empty() -> Self {
        GuardBody {
            kind: Kind::Unsized,
        }
    }

    /// The inner body, streamed through without the trailer fields named
    /// in `hide`.
    pub(crate) fn stream_hiding(inner: B, hide: Option<Arc<[HeaderName]>>) -> Self {
        GuardBody {
            kind: Kind::Stream { inner, hide },
        }
    }

    /// A spool, read from its start; `origin_error` for the request whose
    /// origin body fills it.
    pub(crate) fn spooled(spool: Arc<Spool>, origin_error: Option<OriginError<B::Error>>) -> Self {
        GuardBody {
            kind: Kind::Spooled {
                reader: SpoolReader::new(spool),
                origin_error,
                end_after: None,
            },
        }
    }

    /// A spool read from its start, or `None` if its start is already gone
    /// (decided as the reader joins, so no chunk can go in between).
    pub(crate) fn try_spooled(spool: Arc<Spool>) -> Option<Self> {
        let reader = SpoolReader::new(spool);
        reader.joined().then_some(GuardBody {
            kind: Kind::Spooled {
                reader,
                origin_error: None,
                end_after: None,
            },
        })
    }

    /// Holds back the end of a spooled body (not its bytes, not a failure)
    /// until `signal` fires or is dropped.
    pub(crate) fn end_after(&mut self, signal: oneshot::Receiver<()>) {
        if let Kind::Spooled { end_after, .. } = &mut self.kind {
            *end_after = Some(signal);
        }
    }
}

fn to_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
}

impl<B> http_body::Body for GuardBody<B>
where
    B: http_body::Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Unsized => Poll::Ready(None),
            KindProj::Stream { inner, hide } => inner.poll_frame(cx).map(|frame| {
                frame.map(|f| {
                    f.map(|frame| hidden(to_bytes(frame), hide.as_deref()))
                        .map_err(Into::into)
                })
            }),
            KindProj::Spooled {
                reader,
                origin_error,
                end_after,
            } => {
                if let Some(signal) = end_after
                    && reader.at_end()
                {
                    // Fired or dropped: either way, the wait is over.
                    let _ = std::task::ready!(Pin::new(signal).poll(cx));
                    *end_after = None;
                }
                reader.poll_read(cx).map(|read| {
                    read.map(|read| match read {
                        Read::Frame(frame) => Ok(frame),
                        Read::Failed => Err(match origin_error.as_ref().and_then(|e| e.take()) {
                            Some(error) => error.into(),
                            None => Box::new(SharedBodyError) as BoxError,
                        }),
                        Read::CutOff => Err(Box::new(CutOff) as BoxError),
                    })
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Unsized => true,
            Kind::Stream { inner, .. } => inner.is_end_stream(),
            Kind::Spooled {
                reader, end_after, ..
            } => end_after.is_none() && reader.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Unsized => SizeHint::new(),
            Kind::Stream { inner, .. } => inner.size_hint(),
            Kind::Spooled { reader, .. } => match reader.exact_remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::new(),
            },
        }
    }
}

impl<B: http_body::Body> std::fmt::Debug for GuardBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stampede_guard::GuardBody")
    }
}

/// The error a body shared by several requests ends with when the origin's
/// body failed part way.
///
/// ```
/// use stampede_guard::{BoxError, SharedBodyError};
///
/// fn origin_failed_for_someone_else(e: &BoxError) -> bool {
///     e.is::<SharedBodyError>()
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct SharedBodyError;

impl std::fmt::Display for SharedBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the origin's body failed while being streamed")
    }
}

impl std::error::Error for SharedBodyError {}

/// The error a shared body ends with for a request that read nothing for
/// the spool's lag limit while the others sharing it read ahead, or fell
/// further behind them than the spool keeps on disk.
#[derive(Debug)]
struct CutOff;

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the client read nothing for too long, or fell too far behind, to share the origin's body with the others: cut off",
        )
    }
}

impl std::error::Error for CutOff {}
