//! The response body the layer returns.
//!
//! A hit is one `Bytes` shared with the cache (no copy). A response that is not
//! cached streams the origin's body through untouched. A response the layer
//! started to buffer but then gave up on (too large, trailers, an error part
//! way) replays what it read and streams the rest, so nothing is lost and a
//! large body is never held whole in memory.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// Body of a response that went through a [`StampedeGuard`](crate::StampedeGuard).
    ///
    /// It implements [`http_body::Body`] with `Bytes` data and the inner body's
    /// error type, so axum and hyper take it as it is.
    pub struct Body<B> where B: http_body::Body {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> where B: http_body::Body {
        Full { data: Option<Bytes> },
        Stream { #[pin] inner: B },
        Replay {
            buffered: VecDeque<Frame<Bytes>>,
            error: Option<B::Error>,
            // The inner body already said it ended while being buffered.
            ended: bool,
            rest: Pin<Box<B>>,
        },
    }
}

impl<B: http_body::Body> Body<B> {
    /// A complete body held in memory.
    pub(crate) fn full(data: Bytes) -> Self {
        Body {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn empty() -> Self {
        Body {
            kind: Kind::Full { data: None },
        }
    }

    /// The inner body, streamed through.
    pub(crate) fn stream(inner: B) -> Self {
        Body {
            kind: Kind::Stream { inner },
        }
    }

    /// Frames already read from `rest`, then whatever `rest` still holds.
    pub(crate) fn replay(
        buffered: VecDeque<Frame<Bytes>>,
        error: Option<B::Error>,
        ended: bool,
        rest: Pin<Box<B>>,
    ) -> Self {
        Body {
            kind: Kind::Replay {
                buffered,
                error,
                ended,
                rest,
            },
        }
    }
}

fn to_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
}

impl<B> http_body::Body for Body<B>
where
    B: http_body::Body,
    B::Data: Buf,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Stream { inner } => inner
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map(to_bytes))),
            KindProj::Replay {
                buffered,
                error,
                ended,
                rest,
            } => {
                if let Some(frame) = buffered.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(e) = error.take() {
                    *ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                if *ended {
                    return Poll::Ready(None);
                }
                rest.as_mut()
                    .poll_frame(cx)
                    .map(|frame| frame.map(|f| f.map(to_bytes)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Stream { inner } => inner.is_end_stream(),
            Kind::Replay {
                buffered,
                error,
                ended,
                rest,
            } => buffered.is_empty() && error.is_none() && (*ended || rest.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Stream { inner } => inner.size_hint(),
            Kind::Replay {
                buffered,
                ended,
                rest,
                ..
            } => {
                let held: u64 = buffered
                    .iter()
                    .filter_map(|f| f.data_ref())
                    .map(|d| d.len() as u64)
                    .sum();
                if *ended {
                    return SizeHint::with_exact(held);
                }
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(held + inner.lower());
                if let Some(upper) = inner.upper() {
                    hint.set_upper(held + upper);
                }
                hint
            }
        }
    }
}

impl<B: http_body::Body> std::fmt::Debug for Body<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stampede_guard::Body")
    }
}
