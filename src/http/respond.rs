//! Presenting an answer: a cached entry as a response (its head for HEAD, or
//! `304 Not Modified` when the client already has it), with `Age` and the
//! cache-status header; and the layer's own answers when there is nothing to
//! present.

use std::sync::OnceLock;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;

use super::body::Body;
use super::policy::{Policy, WaitTimeout};
use super::range;
use super::response::{CachedBody, CachedResponse};
use crate::engine::{FailureKind, Held, Status};

/// How a response was answered, as told in the cache-status header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheStatus {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
}

impl CacheStatus {
    pub(crate) fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Stale => "STALE",
            CacheStatus::Miss => "MISS",
            CacheStatus::Coalesced => "COALESCED",
            CacheStatus::Bypass => "BYPASS",
        })
    }
}

impl From<Status> for CacheStatus {
    fn from(status: Status) -> Self {
        match status {
            Status::Hit => CacheStatus::Hit,
            Status::Stale => CacheStatus::Stale,
            Status::Miss => CacheStatus::Miss,
            Status::Coalesced => CacheStatus::Coalesced,
        }
    }
}

/// What the client asked for beyond the entry itself.
#[derive(Clone, Default)]
pub(crate) struct Conditions {
    /// Only the head (HEAD).
    pub head: bool,
    /// Only news: the entity tags it already has (`If-None-Match`).
    pub if_none_match: Option<HeaderValue>,
    /// Only part of the body (`Range`, and `If-Range` if any).
    pub range: Option<(HeaderValue, Option<HeaderValue>)>,
}

impl Conditions {
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        Conditions {
            head: request.method() == Method::HEAD,
            if_none_match: request.headers().get(header::IF_NONE_MATCH).cloned(),
            range: request.headers().get(header::RANGE).map(|range| {
                (
                    range.clone(),
                    request.headers().get(header::IF_RANGE).cloned(),
                )
            }),
        }
    }
}

/// A response from a cached entry.
pub(crate) fn present<B: HttpBody>(
    policy: &Policy,
    conditions: &Conditions,
    held: &Held<CachedResponse>,
    status: CacheStatus,
    now: Instant,
) -> Response<Body<B>> {
    let cached = held.value();
    let not_modified = cached.status == StatusCode::OK
        && conditions
            .if_none_match
            .as_ref()
            .is_some_and(|tags| etag_matches(tags, cached.headers.get(header::ETAG)));
    let body = if conditions.head || not_modified {
        Body::empty()
    } else {
        match &cached.body {
            CachedBody::Full(bytes) => Body::full(bytes.clone()),
            CachedBody::Spooled(spool) => Body::spooled(spool.clone(), None),
        }
    };
    let mut response = Response::new(body);
    *response.headers_mut() = cached.headers.clone();
    // A 304 carries the headers of the 200 it stands for (RFC 9110 §15.4.5),
    // Content-Length included: it may, as long as it is the 200's (§8.6).
    *response.status_mut() = if not_modified {
        StatusCode::NOT_MODIFIED
    } else {
        cached.status
    };
    let headers = response.headers_mut();
    headers.insert(header::AGE, age_value(held.entry().age(now).as_secs()));
    // Range applies to GET only (RFC 9110 §14.2), after the preconditions.
    if let (Some((range, if_range)), false) = (&conditions.range, conditions.head || not_modified) {
        range::answer(&mut response, cached, range, if_range.as_ref());
    }
    tag(policy, response, status)
}

/// The layer's own answer when a rebuild gave nothing to present: the
/// route's status for a wait that ran out, else 502 for an origin error,
/// 500 for a panic, 504 for a rebuild past its timeout.
pub(crate) fn failure<B: HttpBody>(
    policy: &Policy,
    kind: FailureKind,
    status: CacheStatus,
) -> Response<Body<B>> {
    let code = match kind {
        FailureKind::WaitTimeout => match policy.on_wait_timeout {
            WaitTimeout::Respond(code) => code,
            WaitTimeout::FailOpen => StatusCode::GATEWAY_TIMEOUT,
        },
        FailureKind::Error => StatusCode::BAD_GATEWAY,
        FailureKind::Panic => StatusCode::INTERNAL_SERVER_ERROR,
        FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    tag(policy, response, status)
}

/// Sets the cache-status header, if the route has one.
pub(crate) fn tag<B>(
    policy: &Policy,
    mut response: Response<B>,
    status: CacheStatus,
) -> Response<B> {
    if let Some(name) = &policy.status_header {
        response
            .headers_mut()
            .insert(name.clone(), status.header_value());
    }
    response
}

/// `If-None-Match` against a stored `ETag`, by weak comparison (RFC 9110
/// §13.1.2): `W/"a"` matches `"a"`; `*` matches any tag.
fn etag_matches(if_none_match: &HeaderValue, etag: Option<&HeaderValue>) -> bool {
    let Some(etag) = etag.and_then(|e| e.to_str().ok()) else {
        return false;
    };
    fn opaque(tag: &str) -> &str {
        tag.trim().trim_start_matches("W/")
    }
    let stored = opaque(etag);
    match if_none_match.to_str() {
        Ok(list) => list
            .split(',')
            .any(|tag| tag.trim() == "*" || opaque(tag) == stored),
        Err(_) => false,
    }
}

/// `Age` values, made once: formatting a number into a fresh header value on
/// every hit would allocate.
fn age_value(seconds: u64) -> HeaderValue {
    static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let ages = AGES.get_or_init(|| (0..3600u64).map(HeaderValue::from).collect());
    match usize::try_from(seconds).ok().and_then(|s| ages.get(s)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(seconds),
    }
}
