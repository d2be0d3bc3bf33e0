//! Admitting an origin response: what may become of it (stored, shared with
//! the waiters, or kept for the request that asked), and its body buffered
//! when it may be shared.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::time::SystemTime;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Response};
use http_body::{Body as HttpBody, Frame};

use super::body::Body;
use super::cache_control::initial_age;
use super::key::Keyed;
use super::policy::{classify, Policy, Verdict};
use super::respond::{tag, CacheStatus};
use super::response::CachedResponse;
use crate::engine::{Built, Waiters};

/// What the request that caused a rebuild may have, and nobody else.
pub(crate) enum Private<B: HttpBody, E> {
    /// The origin's response, streamed to it alone.
    Response(Response<Body<B>>),
    /// The inner service's error, as it was.
    Error(E),
    /// Headers added to the shared entry for it alone (its `Set-Cookie`).
    Headers(Vec<(HeaderName, HeaderValue)>),
}

pub(crate) type Admitted<B, E> = Built<CachedResponse, Private<B, E>>;

/// Decides what the origin's response may become, and buffers its body if it
/// may be shared.
/// `keyed` says what the key the answer would be stored under was made of.
pub(crate) async fn admit<B, E>(
    policy: &Policy,
    response: Response<B>,
    keyed: Keyed,
) -> Admitted<B, E>
where
    B: HttpBody,
    B::Data: Buf,
{
    let (mut parts, body) = response.into_parts();
    let unshared = |reason: &'static str, parts: http::response::Parts, body| {
        policy.passes.response(reason);
        let failed = parts.status.is_server_error();
        let response = tag(policy, Response::from_parts(parts, body), CacheStatus::Miss);
        if failed {
            // A server error is a failed rebuild whatever its headers say
            // (error pages are often marked no-store, or carry a session
            // cookie): the waiters share the failure or the stale-if-error
            // copy, and the starter gets its own answer. Sending each waiter
            // to the origin would aim a herd at an origin that is failing.
            return Built::Failed {
                shared: None,
                private: Some(Private::Response(response)),
            };
        }
        Built::Unshared {
            private: Private::Response(response),
            waiters: Waiters::HitForMiss(policy.hit_for_miss),
        }
    };

    // Only a status the route stores is shared: another (a 403 or 429 for
    // this caller, a 201, a 206) goes to this request alone, and the waiters
    // lead again. It may depend on who asked, so the key gets no hit-for-miss
    // window, whatever its headers (a bot challenge sets a cookie). A server
    // error is a failed rebuild.
    if !parts.status.is_server_error() && !policy.statuses.contains(&parts.status) {
        tracing::debug!(status = %parts.status, "response not stored: for its requester alone");
        let response = Response::from_parts(parts, Body::stream(body));
        return Built::Unshared {
            private: Private::Response(tag(policy, response, CacheStatus::Miss)),
            waiters: Waiters::Relead(policy.hit_for_miss),
        };
    }
    let (lifetime, store) = match classify(policy, parts.status, &parts.headers, keyed) {
        Verdict::Pass(reason) => return unshared(reason, parts, Body::stream(body)),
        Verdict::Share { lifetime, store } => (lifetime, store),
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > policy.max_body_bytes as u64) {
        return unshared("body larger than max_body_bytes", parts, Body::stream(body));
    }

    // Read the body, giving up (and streaming the rest) past the size cap.
    let mut body = Box::pin(body);
    let mut frames: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => {
                let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                let trailers = frame.is_trailers();
                len = len.saturating_add(frame.data_ref().map_or(0, Bytes::len));
                frames.push_back(frame);
                if trailers || len > policy.max_body_bytes {
                    let body = Body::replay(frames, None, false, body);
                    return unshared("body too large or has trailers", parts, body);
                }
            }
            Some(Err(error)) => {
                // The starter gets what was read and the error; the waiters
                // share the failure (or stale-if-error).
                let body = Body::replay(frames, Some(error), true, body);
                let response = tag(policy, Response::from_parts(parts, body), CacheStatus::Miss);
                return Built::Failed {
                    shared: None,
                    private: Some(Private::Response(response)),
                };
            }
        }
    }
    let body = concat(frames, len);

    strip_hop_by_hop(&mut parts.headers);
    let initial_age = initial_age(&parts.headers, SystemTime::now());
    parts.headers.remove(header::AGE);
    let mut cookies = Vec::new();
    if policy.strip_set_cookie {
        // The stored copy loses every cookie; the starter's own answer keeps them.
        cookies.extend(
            parts
                .headers
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|v| (header::SET_COOKIE, v.clone())),
        );
        parts.headers.remove(header::SET_COOKIE);
    }
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    // Slots for the headers every hit fills in: replacing a value in the
    // cloned map is cheaper than growing it.
    parts
        .headers
        .insert(header::AGE, HeaderValue::from_static("0"));
    if let Some(name) = &policy.status_header {
        parts
            .headers
            .insert(name.clone(), CacheStatus::Hit.header_value());
    }
    let failure = parts.status.is_server_error();
    Built::Value {
        value: CachedResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        },
        lifetime,
        initial_age,
        store,
        failure,
        private: (!cookies.is_empty()).then_some(Private::Headers(cookies)),
    }
}

/// One `Bytes` from the data frames: no copy when the origin sent one chunk.
fn concat(frames: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    let mut chunks = frames.into_iter().filter_map(|f| f.into_data().ok());
    match (chunks.next(), chunks.next()) {
        (None, _) => Bytes::new(),
        (Some(only), None) => only,
        (Some(first), Some(second)) => {
            let mut all = BytesMut::with_capacity(len);
            all.extend_from_slice(&first);
            all.extend_from_slice(&second);
            for chunk in chunks {
                all.extend_from_slice(&chunk);
            }
            all.freeze()
        }
    }
}

/// Removes the headers that describe one connection, not the resource
/// (RFC 9110 §7.6.1), including any the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}
