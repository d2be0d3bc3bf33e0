//! Presenting an answer: a cached entry as a response (its head for HEAD, or
//! `304 Not Modified` when the client already has it), with `Age` and the
//! cache-status header; and the layer's own answers when there is nothing to
//! present.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;

use super::body::GuardBody as Body;
use super::cache_status::{
    default_forward, ttl_of, CacheStatus, Forward, Member, StatusHeaders, CACHE_STATUS,
};
use super::flight::WaitTimeout;
use super::policy::Policy;
use super::range;
use super::response::{CachedBody, CachedResponse};
use super::rfc::date::{http_date, stamp};
use crate::engine::{Failure, FailureKind, Held};

/// Sets the cache-status headers on a response that did not come from an
/// entry, with the member `status` implies.
pub(crate) fn tag<B>(policy: &Policy, response: Response<B>, status: CacheStatus) -> Response<B> {
    tag_with(policy, response, status, default_forward(status))
}

/// Sets the cache-status headers on a response that did not come from an
/// entry: `x-cache`, and this layer's `Cache-Status` member after any the
/// response carries.
pub(crate) fn tag_with<B>(
    policy: &Policy,
    mut response: Response<B>,
    status: CacheStatus,
    forward: Forward,
) -> Response<B> {
    StatusHeaders::new(&policy.presentation, &policy.tags, status, forward)
        .apply(response.headers_mut());
    response
}

/// What the client asked for beyond the entry itself.
#[derive(Clone, Default)]
pub(crate) struct Conditions {
    /// Only the head (HEAD).
    pub head: bool,
    /// Only if the representation is one of these (`If-Match`, every
    /// line). Empty when it sent none.
    pub if_match: Vec<HeaderValue>,
    /// Only if unchanged since this date (`If-Unmodified-Since`), unless it
    /// sent `If-Match`.
    pub if_unmodified_since: Option<SystemTime>,
    /// Only news: the entity tags it already has (`If-None-Match`, every
    /// line). Empty when it sent none.
    pub if_none_match: Vec<HeaderValue>,
    /// Only news: changes after this date (`If-Modified-Since`), unless it
    /// sent `If-None-Match`.
    pub if_modified_since: Option<SystemTime>,
    /// Only part of the body (`Range`, and `If-Range` if any).
    pub range: Option<(HeaderValue, Option<HeaderValue>)>,
}

/// What a request's preconditions make of the answer it would get without
/// them (RFC 9110 §13.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precondition {
    /// None failed: the answer itself.
    Holds,
    /// `If-None-Match` or `If-Modified-Since` says the client has it:
    /// `304 Not Modified`.
    NotModified,
    /// `If-Match` or `If-Unmodified-Since` failed: `412 Precondition
    /// Failed`.
    Failed,
}

/// One date header line, or `None` when absent, repeated or not a date.
fn one_date(headers: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    let mut lines = headers.get_all(name).iter();
    match (lines.next(), lines.next()) {
        (Some(one), None) => http_date(one),
        _ => None,
    }
}

impl Conditions {
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        let method = request.method();
        let headers = request.headers();
        // RFC 9110 §13.1: If-None-Match and If-Modified-Since only for GET
        // and HEAD; If-Modified-Since is ignored next to If-None-Match,
        // If-Unmodified-Since next to If-Match, and either date when it is
        // not one valid date.
        let safe = method == Method::GET || method == Method::HEAD;
        // Most requests carry none of these: one pass over the names present
        // spares a lookup for each.
        let asks = headers.keys().any(|name| {
            name == header::IF_NONE_MATCH
                || name == header::IF_MODIFIED_SINCE
                || name == header::IF_MATCH
                || name == header::IF_UNMODIFIED_SINCE
                || name == header::RANGE
        });
        if !asks {
            return Conditions {
                head: method == Method::HEAD,
                ..Conditions::default()
            };
        }
        let lines = |name| -> Vec<HeaderValue> { headers.get_all(name).iter().cloned().collect() };
        let if_match = lines(header::IF_MATCH);
        let if_unmodified_since = match if_match.is_empty() {
            true => one_date(headers, header::IF_UNMODIFIED_SINCE),
            false => None,
        };
        let if_none_match = match safe {
            true => lines(header::IF_NONE_MATCH),
            false => Vec::new(),
        };
        let if_modified_since = match safe && if_none_match.is_empty() {
            true => one_date(headers, header::IF_MODIFIED_SINCE),
            false => None,
        };
        Conditions {
            head: method == Method::HEAD,
            if_match,
            if_unmodified_since,
            if_none_match,
            if_modified_since,
            range: range_of(headers),
        }
    }

    /// The preconditions against an answer with `status` and `headers`, in
    /// the order of RFC 9110 §13.2.2: `If-Match` (strong comparison; `*`
    /// holds for any representation), else `If-Unmodified-Since` against
    /// `Last-Modified` (ignored without one); then `If-None-Match` (weak
    /// comparison), else `If-Modified-Since` against `Last-Modified` (or
    /// `Date`, RFC 9111 §4.3.2). An answer that is not a `2xx` ignores
    /// them all (§13.2.1).
    pub(crate) fn evaluate(&self, status: StatusCode, headers: &HeaderMap) -> Precondition {
        if !status.is_success() {
            return Precondition::Holds;
        }
        if !self.if_match.is_empty() {
            if !if_match_holds(&self.if_match, headers.get(header::ETAG)) {
                return Precondition::Failed;
            }
        } else if let Some(since) = self.if_unmodified_since {
            let modified = headers.get(header::LAST_MODIFIED).and_then(http_date);
            if modified.is_some_and(|modified| modified > since) {
                return Precondition::Failed;
            }
        }
        if !self.if_none_match.is_empty() {
            return match etag_matches(&self.if_none_match, headers.get(header::ETAG)) {
                true => Precondition::NotModified,
                false => Precondition::Holds,
            };
        }
        let Some(since) = self.if_modified_since else {
            return Precondition::Holds;
        };
        let stored = |name| headers.get(name).and_then(http_date);
        match stored(header::LAST_MODIFIED)
            .or_else(|| stored(header::DATE))
            .is_some_and(|modified| modified <= since)
        {
            true => Precondition::NotModified,
            false => Precondition::Holds,
        }
    }

    /// Whether the client already has `cached` (steps 3 and 4 of RFC 9110
    /// §13.2.2, the earlier ones holding).
    #[cfg(test)]
    fn not_modified(&self, cached: &CachedResponse) -> bool {
        self.evaluate(cached.status, &cached.headers) == Precondition::NotModified
    }
}

/// An answer that went to the request alone (not from an entry: one the
/// cache may not share), as its preconditions make it: itself, its head as
/// a `304`, or a `412`. The origin answered it without them, since what it
/// asked the origin was the whole representation.
pub(crate) fn answer_alone<B: HttpBody>(
    policy: &Policy,
    conditions: &Conditions,
    mut response: Response<Body<B>>,
) -> Response<Body<B>> {
    let verdict = conditions.evaluate(response.status(), response.headers());
    if verdict == Precondition::Holds {
        return response;
    }
    let status_header = policy.presentation.status_header.as_ref();
    let old = std::mem::take(response.headers_mut());
    let not_modified = verdict == Precondition::NotModified;
    let sized = old.contains_key(header::CONTENT_LENGTH);
    for (name, value) in &old {
        // `Date` on either: a 412 is dated as any 4xx (RFC 9110 §6.6.1).
        let kept = name == CACHE_STATUS
            || name == header::DATE
            || Some(name) == status_header
            || (not_modified && (NOT_MODIFIED_FIELDS.contains(name) || name == header::SET_COOKIE));
        if kept {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    match not_modified {
        true => {
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            *response.body_mut() = match sized {
                true => Body::empty(),
                false => Body::unsized_empty(),
            };
        }
        false => {
            *response.status_mut() = StatusCode::PRECONDITION_FAILED;
            response.headers_mut().remove(header::CONTENT_LENGTH);
            *response.body_mut() = Body::empty();
        }
    }
    response
}

/// `Range` and `If-Range`, when the client sent exactly one line of each it
/// sent. Several `Range` lines combine into one list of several ranges (RFC
/// 9110 §5.3), which the layer answers whole; several `If-Range` lines are
/// invalid (it is a single value). Either way there is no range to answer.
fn range_of(headers: &HeaderMap) -> Option<(HeaderValue, Option<HeaderValue>)> {
    let mut ranges = headers.get_all(header::RANGE).iter();
    let range = match (ranges.next(), ranges.next()) {
        (Some(one), None) => one.clone(),
        _ => return None,
    };
    let mut if_ranges = headers.get_all(header::IF_RANGE).iter();
    match (if_ranges.next(), if_ranges.next()) {
        (if_range, None) => Some((range, if_range.cloned())),
        _ => None,
    }
}

/// What a `304 Not Modified` carries of the 200 it stands for: the fields
/// RFC 9110 §15.4.5 asks for, and `Last-Modified` to guide the client's
/// cache; nothing else describing the missing body (no `Content-Type`).
/// `Content-Length` is kept, deliberately: it is the 200's, which §8.6
/// allows, and without it a router that fills in the length of the body it
/// sees (axum's) would add `Content-Length: 0`, a lie about the
/// representation.
const NOT_MODIFIED_FIELDS: [HeaderName; 8] = [
    header::CACHE_CONTROL,
    header::CONTENT_LENGTH,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::LAST_MODIFIED,
    header::VARY,
];

/// A response from a cached entry. `forward`: how the request went forward
/// to get it, or `None` for a hit.
pub(crate) fn present<B: HttpBody>(
    policy: &Policy,
    conditions: &Conditions,
    held: &Held<CachedResponse>,
    status: CacheStatus,
    forward: Option<Forward>,
    now: Instant,
) -> Response<Body<B>> {
    try_present(policy, conditions, held, status, forward, now)
        .unwrap_or_else(|| failure(policy, FailureKind::Error, status))
}

/// [`present`], or `None` if the entry is a body streaming past the size
/// cap whose start is already gone (dropped once every reader that had
/// joined passed it, within the spool's bound): it cannot be read whole
/// any more, and the caller goes to the origin instead.
pub(crate) fn try_present<B: HttpBody>(
    policy: &Policy,
    conditions: &Conditions,
    held: &Held<CachedResponse>,
    status: CacheStatus,
    forward: Option<Forward>,
    now: Instant,
) -> Option<Response<Body<B>>> {
    let cached = held.value();
    let verdict = conditions.evaluate(cached.status, &cached.headers);
    if verdict == Precondition::Failed {
        return Some(precondition_failed(policy, held, status, forward, now));
    }
    let not_modified = verdict == Precondition::NotModified;
    let head_only = conditions.head || not_modified;
    let body = if head_only {
        // Without a stored length (a chunked body over the cap), an exact
        // empty body would be framed as `Content-Length: 0`: a lie.
        match cached.headers.contains_key(header::CONTENT_LENGTH) {
            true => Body::empty(),
            false => Body::unsized_empty(),
        }
    } else {
        match &cached.body {
            CachedBody::Full(bytes) => Body::full(bytes.clone()),
            CachedBody::Spooled(hold) => Body::try_spooled(hold.spool().clone())?,
        }
    };
    let mut response = Response::new(body);
    if not_modified {
        let mut headers = HeaderMap::with_capacity(NOT_MODIFIED_FIELDS.len() + 2);
        for name in &NOT_MODIFIED_FIELDS {
            for value in cached.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        *response.headers_mut() = headers;
        *response.status_mut() = StatusCode::NOT_MODIFIED;
    } else {
        *response.headers_mut() = cached.headers.clone();
        // The digest that selects a variant is the layer's own.
        response.headers_mut().remove(&super::vary::SELECTED);
        // An entry another guard stored (other tag headers: a config
        // rolling out across a fleet) may hold what this route's tag
        // headers are: a hit never carries them.
        if policy.tags.any_in(&cached.headers) {
            policy.tags.strip(response.headers_mut());
        }
        *response.status_mut() = cached.status;
    }
    let age = held.entry().age(now);
    let headers = response.headers_mut();
    headers.insert(header::AGE, age_value(age.as_secs()));
    if !cached.headers.contains_key(header::DATE) {
        // Every entry this layer stores has a `Date` (the origin's, or when
        // the first instance received it); one stored without (by an older
        // release, or the failure an origin answered) is dated when it was
        // received, as its age tells, not when it is served.
        let received = SystemTime::now()
            .checked_sub(age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        stamp(headers, received);
    }
    // Range applies to GET only (RFC 9110 §14.2), after the preconditions.
    if let (Some((range, if_range)), false) = (&conditions.range, head_only) {
        range::answer(&mut response, cached, range, if_range.as_ref());
    }
    if let Some(members) = &policy.presentation.cache_status {
        // The entry's slot (or nothing, on a 304): this layer's member
        // alone, never one stored from upstream.
        let member = match forward {
            None => members.hit(ttl_of(held, now)),
            Some(forward) => members.value(&Member::Forward(forward)),
        };
        response.headers_mut().insert(CACHE_STATUS, member);
    } else {
        // The slot the storing guard left (an entry never keeps an upstream
        // member): a route with `Cache-Status` off sends none.
        response.headers_mut().remove(CACHE_STATUS);
    }
    if let Some(name) = &policy.presentation.status_header {
        response
            .headers_mut()
            .insert(name.clone(), status.header_value());
    }
    Some(response)
}

/// `412 Precondition Failed` for a request whose `If-Match` or
/// `If-Unmodified-Since` the entry fails: no body, and nothing of the
/// entry's head (its freshness is not the 412's).
fn precondition_failed<B: HttpBody>(
    policy: &Policy,
    held: &Held<CachedResponse>,
    status: CacheStatus,
    forward: Option<Forward>,
    now: Instant,
) -> Response<Body<B>> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::PRECONDITION_FAILED;
    // The layer's own answer: dated now (RFC 9110 §6.6.1, a 4xx).
    stamp(response.headers_mut(), SystemTime::now());
    if let Some(members) = &policy.presentation.cache_status {
        let member = match forward {
            None => members.hit(ttl_of(held, now)),
            Some(forward) => members.value(&Member::Forward(forward)),
        };
        response.headers_mut().insert(CACHE_STATUS, member);
    }
    if let Some(name) = &policy.presentation.status_header {
        response
            .headers_mut()
            .insert(name.clone(), status.header_value());
    }
    response
}

/// The answer to a request whose rebuild gave nothing to present: the
/// origin's own answer to the failure when the fleet kept one (a request
/// during the fleet's failure backoff, or waiting on another instance's
/// failed rebuild), with its status, headers and body; else the layer's
/// [`failure`].
pub(crate) fn failed<B: HttpBody>(
    policy: &Policy,
    conditions: &Conditions,
    failed: &Failure,
    status: CacheStatus,
) -> Response<Body<B>> {
    if let Some(held) = failed.answer.clone().and_then(Held::<CachedResponse>::new) {
        let forward = Forward {
            detail: Some("backoff"),
            ..default_forward(status)
        };
        // Its head alone for HEAD; no precondition or range applies to a
        // failure.
        let asked = Conditions {
            head: conditions.head,
            ..Conditions::default()
        };
        let now = Instant::now();
        if let Some(response) = try_present(policy, &asked, &held, status, Some(forward), now) {
            return response;
        }
    }
    failure(policy, failed.kind, status)
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
        FailureKind::WaitTimeout => match policy.flight.on_wait_timeout {
            WaitTimeout::Respond(code) => code,
            WaitTimeout::FailOpen => StatusCode::GATEWAY_TIMEOUT,
        },
        FailureKind::Error => StatusCode::BAD_GATEWAY,
        FailureKind::Panic => StatusCode::INTERNAL_SERVER_ERROR,
        FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    // The layer's own answer, dated now as any answer it sends (RFC 9110
    // §6.6.1 asks it of a 4xx, such as a wait timeout's configured status).
    stamp(response.headers_mut(), SystemTime::now());
    let detail = match kind {
        FailureKind::WaitTimeout => "wait-timeout",
        FailureKind::Error => "error",
        FailureKind::Panic => "panic",
        FailureKind::Timeout => "timeout",
    };
    let member = Forward {
        detail: Some(detail),
        ..default_forward(status)
    };
    tag_with(policy, response, status, member)
}

/// `If-None-Match` against a stored `ETag`, by weak comparison (RFC 9110
/// §13.1.2, §8.8.3.2): `W/"a"` matches `"a"`; `*` alone matches any
/// representation, with a tag or without. Commas may stand inside a tag
/// (`"a,b"`). A line that is not a list of entity tags, or a stored `ETag`
/// that is not one, never matches.
fn etag_matches(if_none_match: &[HeaderValue], etag: Option<&HeaderValue>) -> bool {
    let stored = etag.and_then(|e| single_etag(e.as_bytes()));
    let mut matched = false;
    for line in if_none_match {
        let line = line.as_bytes().trim_ascii();
        if line == b"*" {
            matched = true;
            continue;
        }
        match etag_list(line) {
            Some(tags) => {
                matched |= stored.is_some_and(|(_, ours)| tags.iter().any(|(_, t)| *t == ours))
            }
            None => return false,
        }
    }
    matched
}

/// `If-Match` against a stored `ETag`, by strong comparison (RFC 9110
/// §13.1.1): neither tag weak, the same opaque part; `*` holds for any
/// representation. A line that is not a list of entity tags fails it.
fn if_match_holds(if_match: &[HeaderValue], etag: Option<&HeaderValue>) -> bool {
    let stored = etag.and_then(|e| single_etag(e.as_bytes()));
    let mut holds = false;
    for line in if_match {
        let line = line.as_bytes().trim_ascii();
        if line == b"*" {
            holds = true;
            continue;
        }
        let Some(tags) = etag_list(line) else {
            return false;
        };
        holds |=
            stored.is_some_and(|(weak, ours)| !weak && tags.iter().any(|(w, t)| !*w && *t == ours));
    }
    holds
}

/// One entity tag from `input`: whether it is weak, its opaque part, and
/// what follows it.
fn entity_tag(input: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let (weak, input) = match input.strip_prefix(b"W/") {
        Some(rest) => (true, rest),
        None => (false, input),
    };
    let rest = input.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let opaque = &rest[..end];
    // etagc = %x21 / %x23-7E / obs-text
    if !opaque
        .iter()
        .all(|&b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
    {
        return None;
    }
    Some((weak, opaque, &rest[end + 1..]))
}

/// A stored `ETag`: exactly one entity tag (its weakness, its opaque part).
fn single_etag(value: &[u8]) -> Option<(bool, &[u8])> {
    match entity_tag(value.trim_ascii())? {
        (weak, opaque, b"") => Some((weak, opaque)),
        _ => None,
    }
}

/// `1#entity-tag`, empty elements allowed; `None` if malformed.
fn etag_list(mut line: &[u8]) -> Option<Vec<(bool, &[u8])>> {
    let mut tags = Vec::new();
    loop {
        line = line.trim_ascii_start();
        if let Some(rest) = line.strip_prefix(b",") {
            line = rest;
            continue;
        }
        if line.is_empty() {
            break;
        }
        let (weak, tag, rest) = entity_tag(line)?;
        tags.push((weak, tag));
        line = rest.trim_ascii_start();
        if !line.is_empty() && !line.starts_with(b",") {
            return None;
        }
    }
    (!tags.is_empty()).then_some(tags)
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn inm(lines: &[&'static str]) -> Vec<HeaderValue> {
        lines.iter().map(|l| HeaderValue::from_static(l)).collect()
    }

    fn matches(lines: &[&'static str], etag: &'static str) -> bool {
        etag_matches(&inm(lines), Some(&HeaderValue::from_static(etag)))
    }

    #[test]
    fn entity_tags_compare_weakly_and_may_hold_commas() {
        assert!(matches(&[r#""a,b""#], r#""a,b""#));
        assert!(!matches(&[r#""a,b""#], r#""a""#));
        assert!(!matches(&[r#""a,b""#], r#""b""#));
        assert!(matches(&[r#"W/"x""#], r#""x""#));
        assert!(matches(&[r#""x""#], r#"W/"x""#));
        assert!(matches(&[r#""p", W/"x" , ,"q""#], r#""x""#));
        assert!(matches(&[r#""p""#, r#""x""#], r#""x""#));
        assert!(matches(&["*"], r#""anything""#));
        assert!(matches(&[" * "], r#"W/"anything""#));
    }

    #[test]
    fn a_malformed_list_or_stored_tag_never_matches() {
        for bad in [
            r#"x"#,
            r#""x"#,
            r#""x" "y""#,
            r#"*, "x""#,
            r#"w/"x""#,
            r#""x"y"#,
            "",
            ",",
        ] {
            assert!(!matches(&[bad], r#""x""#), "{bad}");
            assert!(
                !matches(&[r#""x""#, bad], r#""x""#),
                "{bad} spoils the list"
            );
        }
        // `""` is a valid (empty) tag: it matches only itself.
        assert!(!matches(&[r#""""#], r#""x""#));
        assert!(matches(&[r#""""#], r#""""#));
        assert!(!matches(&[r#""x""#], "x"));
        assert!(!matches(&[r#""x""#], r#""x", "y""#));
        // `*` holds for any representation, with a tag or without.
        assert!(etag_matches(&inm(&["*"]), None));
    }

    fn cached(headers: &[(&'static str, &'static str)]) -> CachedResponse {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(*k, HeaderValue::from_static(v));
        }
        CachedResponse {
            status: StatusCode::OK,
            headers: map,
            body: Bytes::from_static(b"body").into(),
        }
    }

    fn conditions(method: Method, headers: &[(&'static str, &'static str)]) -> Conditions {
        let mut request = Request::builder().method(method).uri("/");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        Conditions::of(&request.body(()).unwrap())
    }

    #[test]
    fn if_modified_since_uses_last_modified_then_date() {
        let stored = cached(&[("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT")]);
        let at = |d| conditions(Method::GET, &[("if-modified-since", d)]);
        assert!(at("Sun, 06 Nov 1994 08:49:37 GMT").not_modified(&stored));
        assert!(at("Sunday, 06-Nov-94 08:49:37 GMT").not_modified(&stored));
        assert!(at("Mon, 07 Nov 1994 00:00:00 GMT").not_modified(&stored));
        assert!(!at("Sat, 05 Nov 1994 00:00:00 GMT").not_modified(&stored));
        assert!(!at("yesterday").not_modified(&stored));
        let dated = cached(&[("date", "Sun, 06 Nov 1994 08:49:37 GMT")]);
        assert!(at("Mon, 07 Nov 1994 00:00:00 GMT").not_modified(&dated));
        assert!(!at("Mon, 07 Nov 1994 00:00:00 GMT").not_modified(&cached(&[])));
        // Two dates: ignored.
        let two = conditions(
            Method::GET,
            &[
                ("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT"),
                ("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT"),
            ],
        );
        assert!(!two.not_modified(&stored));
        // Next to If-None-Match, it is ignored.
        let both = conditions(
            Method::GET,
            &[
                ("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT"),
                ("if-none-match", r#""other""#),
            ],
        );
        assert!(!both.not_modified(&stored));
        // Only for GET and HEAD.
        let post = conditions(
            Method::POST,
            &[("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT")],
        );
        assert!(!post.not_modified(&stored));
        let head = conditions(
            Method::HEAD,
            &[("if-modified-since", "Mon, 07 Nov 1994 00:00:00 GMT")],
        );
        assert!(head.not_modified(&stored));
    }
}
