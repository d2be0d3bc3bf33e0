//! The response future of [`GuardService`](super::GuardService).
//!
//! A hit is a ready response and a pass-through is the inner future, neither
//! boxed; only a miss, which waits on a flight, is a boxed future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use http::Response;
use http_body::Body as HttpBody;
use pin_project_lite::pin_project;

use super::body::GuardBody as Body;
use super::cache_status::StatusHeaders;
use super::rfc::date::stamp;

pub(crate) type MissFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<Body<B>>, E>> + Send>>;

pin_project! {
    /// Response future of [`GuardService`](super::GuardService). See
    /// [`GuardService`](super::GuardService) for an example.
    pub struct ResponseFuture<F, B, E> where B: HttpBody {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> where B: HttpBody {
        Ready { response: Option<Response<Body<B>>> },
        Passthrough { #[pin] future: F, status: Option<StatusHeaders> },
        Miss { future: MissFuture<B, E> },
    }
}

impl<F, B: HttpBody, E> ResponseFuture<F, B, E> {
    pub(crate) fn ready(response: Response<Body<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn passthrough(future: F, status: StatusHeaders) -> Self {
        ResponseFuture {
            state: State::Passthrough {
                future,
                status: Some(status),
            },
        }
    }

    pub(crate) fn miss(future: MissFuture<B, E>) -> Self {
        ResponseFuture {
            state: State::Miss { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: HttpBody,
{
    type Output = Result<Response<Body<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Passthrough { future, status } => {
                let response = std::task::ready!(future.poll(cx))?;
                let hide = status.as_ref().and_then(|tags| tags.hidden());
                let mut response = response.map(|body| Body::stream_hiding(body, hide));
                // Forwarded: it carries a `Date` (RFC 9110 §6.6.1), but an
                // interim answer (a protocol switch) needs none.
                if !response.status().is_informational() {
                    stamp(response.headers_mut(), SystemTime::now());
                }
                if let Some(tags) = status.take() {
                    tags.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            StateProj::Miss { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B: HttpBody, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
