//! Admitting an origin response: what may become of it (stored, shared with
//! the waiters, or kept for the request that asked), and its body read into a
//! spool when it may be shared: the request that caused the fetch streams it
//! from there as it arrives, and so do the waiters when it outgrows the cache.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body::Body as HttpBody;
use tokio::sync::oneshot;

use super::body::GuardBody as Body;
use super::cache_status::{CacheStatus, Forward, Fwd, CACHE_STATUS};
use super::key::Keyed;
use super::passes::Pass;
use super::policy::{classify, explicitly_fresh, Policy, Verdict};
use super::respond::tag_with;
use super::response::{take_one_clients, CachedBody, CachedResponse};
use super::revalidation_window::with_revalidation;
use super::rfc::cache_control::initial_age;
use super::spool::{hidden, spill_cap, Filling, Hold, OriginError, Spool};
use crate::engine::{Built, Lifetime, TagSet, Waiters};
use crate::metrics::Labels;

/// How long the origin took to answer, from the request sent to the head
/// received (RFC 9111 §4.2.3 `response_delay`): set by the caller of the
/// origin on its response, read (and removed) where the response's age is.
#[derive(Clone, Copy, Default)]
pub(crate) struct ResponseDelay(pub Duration);

/// What the request that caused a rebuild may have, and nobody else.
pub(crate) enum Private<B: HttpBody, E> {
    /// The origin's response, streamed to it alone.
    Response(Response<Body<B>>),
    /// The inner service's error, as it was.
    Error(E),
    /// Headers added to the shared entry for it alone (its `Set-Cookie`, its
    /// `Authentication-Info`, …: see `response::take_one_clients`).
    Headers(Vec<(HeaderName, HeaderValue)>),
}

pub(crate) type Admitted<B, E> = Built<CachedResponse, Private<B, E>>;

/// Where the request that caused a rebuild takes its response as soon as the
/// origin's head is known to be shareable, before the body is whole.
pub(crate) type Early<B> = oneshot::Sender<Response<Body<B>>>;

/// Decides what the origin's response may become, and reads its body if it
/// may be shared. `early`, if given, gets the response as soon as it may be
/// shared, its body streaming while it fills the entry. `keyed` says what
/// the key the answer would be stored under was made of; `tags`, the
/// request's (the response's tag headers are added).
///
/// Four steps: [`decide`] on the head, [`stream_head`] to the starter,
/// [`fill`] the spool with the body, and make the [`entry`].
pub(crate) async fn admit<B, E>(
    policy: &Policy,
    response: Response<B>,
    keyed: Keyed,
    early: Option<Early<B>>,
    labels: Labels,
    fwd: Fwd,
    mut tags: TagSet,
) -> Admitted<B, E>
where
    B: HttpBody + Send + 'static,
    B::Data: Buf + Send,
    B::Error: Send + 'static,
{
    let (mut parts, body) = response.into_parts();
    // Its age when its head arrived (RFC 9111 §4.2.3: `response_time` is
    // then, not once the body is read). The head is dated by now.
    let delay = parts
        .extensions
        .remove::<ResponseDelay>()
        .unwrap_or_default();
    let initial_age = initial_age(&parts.headers, SystemTime::now(), delay.0);
    // Before anything else: no answer, shared or not, carries them on.
    tags.extend(&policy.tags.take(&mut parts.headers));
    let (lifetime, store) = match decide(policy, &parts, keyed) {
        Decision::Share { lifetime, store } => (lifetime, store),
        Decision::Pass(reason) => return unshared(policy, labels, fwd, reason, parts, body),
        Decision::Requester => {
            tracing::debug!(status = %parts.status, "response not stored: for its requester alone");
            let response =
                Response::from_parts(parts, Body::stream_hiding(body, policy.tags.hidden()));
            let missed = Forward::new(fwd);
            return Built::Unshared {
                private: Private::Response(tag_with(policy, response, CacheStatus::Miss, missed)),
                waiters: Waiters::Relead(policy.store.hit_for_miss),
            };
        }
    };
    // Tags in more buckets than an entry records: served, never stored (and
    // its `Cache-Status` must not say `stored`).
    let store = store && !tags.overflowed();
    let stream = stream_head(
        policy,
        &mut parts,
        body.size_hint().exact(),
        store,
        fwd,
        early,
    );
    let body = match fill(policy, &stream, body).await {
        Filled::Whole => None,
        Filled::OverCap(rest) => Some(rest),
        Filled::Failed => {
            return Built::Failed {
                shared: None,
                private: stream.private(policy, &parts),
                answer: None,
            }
        }
    };
    let kept = Kept {
        lifetime,
        initial_age,
        store,
        tags,
    };
    entry(policy, labels, parts, stream, body, kept)
}

/// What the head decided of the entry, carried to [`entry`].
struct Kept {
    lifetime: Lifetime,
    initial_age: Duration,
    store: bool,
    tags: TagSet,
}

/// What the route's rules make of the origin's head.
enum Decision {
    /// Shared with the waiters; stored too when `store`.
    Share { lifetime: Lifetime, store: bool },
    /// Not to be shared, for this reason: the starter alone has it, and the
    /// key skips coalescing for a while (a server error is a failed rebuild).
    Pass(Pass),
    /// A status the route does not store: the starter alone has it, and the
    /// waiters lead again.
    Requester,
}

/// Step 1: what may become of a response with this head.
fn decide(policy: &Policy, parts: &http::response::Parts, keyed: Keyed) -> Decision {
    // A 206 is a slice of a representation, never one: the rebuild asks for
    // the whole, so an origin answering with a part is not to be shared.
    if parts.status == StatusCode::PARTIAL_CONTENT {
        return Decision::Pass(Pass::PartialContent);
    }
    // Only a status the route stores is shared: another (a 403 or 429 for
    // this caller, a 201, a 206) goes to this request alone, and the waiters
    // lead again. It may depend on who asked, so the key gets no hit-for-miss
    // window, whatever its headers (a bot challenge sets a cookie). A server
    // error is a failed rebuild. Unless the origin gave it explicit
    // freshness and the route follows the origin's (RFC 9111 §3): then it
    // is the key's answer, shared and stored like any other.
    if !parts.status.is_server_error()
        && !policy.store.statuses.contains(&parts.status)
        && !explicitly_fresh(&policy.store, parts.status, &parts.headers)
    {
        return Decision::Requester;
    }
    match classify(policy, parts.status, &parts.headers, keyed) {
        Verdict::Pass(reason) => Decision::Pass(reason),
        Verdict::Share { lifetime, store } => Decision::Share { lifetime, store },
    }
}

/// An answer that may not be shared, for `reason`: counted, and streamed to
/// the starter alone.
fn unshared<B, E>(
    policy: &Policy,
    labels: Labels,
    fwd: Fwd,
    reason: Pass,
    parts: http::response::Parts,
    body: B,
) -> Admitted<B, E>
where
    B: HttpBody,
{
    policy.passes.response(reason, labels);
    let failed = parts.status.is_server_error();
    let forward = Forward {
        detail: Some(reason.as_str()),
        ..Forward::new(fwd)
    };
    let body = Body::stream_hiding(body, policy.tags.hidden());
    let response = Response::from_parts(parts, body);
    let response = tag_with(policy, response, CacheStatus::Miss, forward);
    if failed {
        // A server error is a failed rebuild whatever its headers say
        // (error pages are often marked no-store, or carry a session
        // cookie): the waiters share the failure or the stale-if-error
        // copy, and the starter gets its own answer. Sending each waiter
        // to the origin would aim a herd at an origin that is failing.
        // What may be told of it to others is its status alone: its
        // headers and body may belong to its requester (a cookie), or may
        // not be kept (no-store).
        let answer = CachedResponse {
            status: response.status(),
            headers: HeaderMap::new(),
            body: CachedBody::Full(Bytes::new()),
        };
        return Built::Failed {
            shared: None,
            private: Some(Private::Response(response)),
            answer: Some(answer),
        };
    }
    Built::Unshared {
        private: Private::Response(response),
        waiters: Waiters::HitForMiss(policy.store.hit_for_miss),
    }
}

/// A shareable body on its way into the spool, and what the starter was
/// told of it. (Fields drop in this order: the filling mark before the
/// held start.)
struct Stream<B: HttpBody> {
    origin_error: OriginError<B::Error>,
    /// Taken when the rest of the body is handed to a task of its own.
    filling: Option<Filling>,
    /// The start, kept for the waiters until they have their readers.
    hold: Hold,
    spool: Arc<Spool>,
    /// The body's declared length is over the cap.
    over_cap: bool,
    /// A server error: stale-if-error may still answer it.
    failure: bool,
    /// The starter already has its response, streaming from the spool.
    early_sent: bool,
    /// How the starter's response went forward.
    told: Forward,
}

impl<B: HttpBody> Stream<B> {
    /// The starter's own streamed answer, when the entry is not for it.
    fn private<E>(&self, policy: &Policy, parts: &http::response::Parts) -> Option<Private<B, E>> {
        (!self.early_sent).then(|| {
            let body = Body::spooled(self.spool.clone(), Some(self.origin_error.clone()));
            let mut response = Response::new(body);
            *response.status_mut() = parts.status;
            *response.headers_mut() = parts.headers.clone();
            // Only answers that are not stored take this path.
            let told = Forward {
                stored: false,
                ..self.told
            };
            Private::Response(tag_with(policy, response, CacheStatus::Miss, told))
        })
    }
}

/// Step 2: the spool the body fills, and the starter's response streaming
/// from it, sent on `early` as soon as the head is known to be shareable.
/// `exact` is the length the body itself knows.
fn stream_head<B>(
    policy: &Policy,
    parts: &mut http::response::Parts,
    exact: Option<u64>,
    store: bool,
    fwd: Fwd,
    early: Option<Early<B>>,
) -> Stream<B>
where
    B: HttpBody,
{
    let failure = parts.status.is_server_error();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let cap = policy.store.max_body_bytes as u64;
    let over_cap = declared.is_some_and(|n| n > cap);
    // The starter's answer may leave before the body is read: it says
    // `stored` only when its length, declared or known to the body, already
    // tells it fits (a body streamed without one may still outgrow the cap).
    // On a backend without Redis it is also known to fit the in-process
    // tier, which keeps no entry heavier than its whole bound.
    let told = Forward {
        stored: store
            && declared.or(exact).is_some_and(|n| {
                n <= cap
                    && policy.store.keep_bound.is_none_or(|bound| {
                        weight_at_most(parts.status, &parts.headers, n) <= bound
                    })
            }),
        ..Forward::new(fwd)
    };

    strip_hop_by_hop(&mut parts.headers);
    // At most four times the cap held for readers that lag (see `Spool`).
    let spool = Spool::new(
        declared,
        policy.store.max_body_bytes.saturating_mul(4),
        spill_cap(policy.store.max_body_bytes, declared),
    );
    let hold = Hold::new(&spool);
    let filling = Filling::new(&spool);
    let origin_error = OriginError::new();
    // The starter's response, as it would be without the layer but for the
    // hop-by-hop headers. Not for a server error: stale-if-error may still
    // answer it.
    let early_sent = match early {
        Some(early) if !failure => {
            let mut head = Response::new(Body::spooled(spool.clone(), Some(origin_error.clone())));
            *head.status_mut() = parts.status;
            *head.headers_mut() = parts.headers.clone();
            let age = HeaderValue::from_static("0");
            head.headers_mut().entry(header::AGE).or_insert(age);
            early
                .send(tag_with(policy, head, CacheStatus::Miss, told))
                .is_ok()
        }
        _ => false,
    };
    Stream {
        origin_error,
        filling: Some(filling),
        hold,
        spool,
        over_cap,
        failure,
        early_sent,
        told,
    }
}

/// How far the body got into the spool.
enum Filled<B> {
    /// All of it, trailers too.
    Whole,
    /// Past the size cap: the rest is still to read.
    OverCap(Pin<Box<B>>),
    /// It failed, or broke its declared length.
    Failed,
}

/// Step 3: reads the body into the spool, up to the size cap.
async fn fill<B>(policy: &Policy, stream: &Stream<B>, body: B) -> Filled<B>
where
    B: HttpBody,
    B::Data: Buf,
{
    let spool = &stream.spool;
    let mut over_cap = stream.over_cap;
    let mut body = Box::pin(body);
    while !over_cap {
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => {
                spool.finish(None);
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    if !spool.push(data.copy_to_bytes(data.remaining())) {
                        // Past its declared length.
                        break;
                    }
                    over_cap = spool.len() > policy.store.max_body_bytes;
                }
                Err(frame) => {
                    let frame = hidden(frame, policy.tags.hidden().as_deref());
                    spool.finish(frame.into_trailers().ok());
                    break;
                }
            },
            Some(Err(error)) => {
                // The starter gets what was read and the error; the waiters
                // share the failure (or stale-if-error).
                stream.origin_error.put(error);
                spool.fail();
                return Filled::Failed;
            }
        }
    }
    if spool.failed() {
        // It broke its declared length (RFC 9111 §3.3: an incomplete
        // response is not stored as complete): a failed body, as above.
        return Filled::Failed;
    }
    match over_cap {
        true => Filled::OverCap(body),
        false => Filled::Whole,
    }
}

/// Step 4: the entry the waiters share (and the tiers keep, when `store`).
/// `rest`: the body past the size cap, still to read.
fn entry<B, E>(
    policy: &Policy,
    labels: Labels,
    mut parts: http::response::Parts,
    stream: Stream<B>,
    rest: Option<Pin<Box<B>>>,
    kept: Kept,
) -> Admitted<B, E>
where
    B: HttpBody + Send + 'static,
    B::Data: Buf + Send,
    B::Error: Send + 'static,
{
    let Kept {
        lifetime,
        initial_age,
        store,
        tags,
    } = kept;
    parts.headers.remove(header::AGE);
    // The stored copy loses every field that belongs to the one client (its
    // cookies, its authentication, the fields a qualified `private` or
    // `no-cache` names); the starter's own answer keeps them.
    let cookies = take_one_clients(
        &mut parts.headers,
        policy.store.strip_set_cookie,
        &policy.store.cache_control_targets,
    );
    let cookies = (!cookies.is_empty()).then_some(Private::Headers(cookies));

    if let Some(rest) = rest {
        // Too large to cache: the rest is read on a task of its own, and
        // every request that waited reads this one fetch.
        let mut stream = stream;
        if let Some(filling) = stream.filling.take() {
            filling.hand_over();
        }
        let hide = policy.tags.hidden();
        stream
            .spool
            .clone()
            .pump(rest, stream.origin_error.clone(), hide);
        if stream.failure {
            return Built::Failed {
                shared: None,
                private: stream.private(policy, &parts),
                answer: None,
            };
        }
        // Counted, and said once per route at WARN: the key is not
        // protected while its answers are this large.
        policy.passes.response(Pass::OverCap, labels);
        // Exposed tag headers are for the starter's answer alone.
        policy.tags.strip(&mut parts.headers);
        return Built::Value {
            value: CachedResponse {
                status: parts.status,
                headers: parts.headers,
                body: CachedBody::Spooled(Arc::new(stream.hold)),
            },
            lifetime,
            initial_age,
            store: false,
            failure: false,
            private: cookies,
            tags,
            // Never stored: later requests for the key pass straight
            // through for a while rather than queue behind one such body.
            hit_for_miss: Some(policy.store.hit_for_miss),
        };
    }
    let Some(bytes) = stream.spool.to_owned_bytes() else {
        // Trailers cannot be kept in an entry: the starter alone has them.
        debug_assert!(stream.spool.has_trailers());
        return Built::Unshared {
            // Already streaming to the starter if `None`.
            private: stream
                .private(policy, &parts)
                .unwrap_or(Private::Headers(Vec::new())),
            waiters: Waiters::HitForMiss(policy.store.hit_for_miss),
        };
    };

    // What the cache keeps owns its bytes: a header value read by hyper is a
    // slice of its whole read buffer, which would otherwise stay alive.
    let mut headers = owned(&parts.headers);
    policy.tags.strip(&mut headers);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    // Slots for the headers every hit fills in: replacing a value in the
    // cloned map is cheaper than growing it. None for the status header:
    // its name is the serving route's, which may not be the storing one's.
    headers.insert(header::AGE, HeaderValue::from_static("0"));
    // Upstream caches' members told how this one request was handled: not
    // stored, so no hit replays them (each hit gets this layer's own).
    headers.remove(CACHE_STATUS);
    if policy.presentation.cache_status.is_some() {
        headers.insert(CACHE_STATUS, HeaderValue::from_static(""));
    }
    Built::Value {
        lifetime: with_revalidation(lifetime, parts.status, &headers),
        value: CachedResponse {
            status: parts.status,
            headers,
            body: CachedBody::Full(bytes),
        },
        initial_age,
        store,
        failure: stream.failure,
        private: cookies,
        tags,
        hit_for_miss: None,
    }
}

/// The most the entry of an answer with `headers` and a body of `len`
/// bytes weighs in the in-process tier: its headers only lose lines before
/// they are kept (`Age`, cookies, tag headers, upstream `Cache-Status`
/// members), and gain the three slots added below, as at the end of
/// [`admit`].
fn weight_at_most(status: StatusCode, headers: &HeaderMap, len: u64) -> u64 {
    use crate::engine::CacheValue as _;
    let mut kept = owned(headers);
    kept.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    kept.insert(header::AGE, HeaderValue::from_static("0"));
    kept.insert(CACHE_STATUS, HeaderValue::from_static(""));
    let head = CachedResponse {
        status,
        headers: kept,
        body: CachedBody::Full(bytes::Bytes::new()),
    };
    u64::try_from(head.weight())
        .unwrap_or(u64::MAX)
        .saturating_add(len)
        .saturating_add(crate::store::local::SLOT_OVERHEAD as u64)
}

/// A copy of `headers` whose values own their bytes.
fn owned(headers: &HeaderMap) -> HeaderMap {
    // Room for the three slots added after.
    let mut out = HeaderMap::with_capacity(headers.len().saturating_add(3));
    for (name, value) in headers {
        let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        out.append(name.clone(), copy);
    }
    out
}

/// Removes the headers that describe one connection, not the resource
/// (RFC 9110 §7.6.1), including any the `Connection` header names, but
/// `Vary`: the answer was judged by it, and an entry stored without it
/// would be served to every request, whatever its values.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_named(headers) {
        if name != header::VARY {
            headers.remove(name);
        }
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

/// The fields a message's `Connection` header names: they describe its
/// connection, not the resource.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}
