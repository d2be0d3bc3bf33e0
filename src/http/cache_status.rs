//! The RFC 9211 `Cache-Status` member this layer adds to a response.
//!
//! `Cache-Status` is a list with one member per cache that handled the
//! response, the cache nearest the origin first (RFC 9211 §2): a value an
//! upstream cache put on the origin's response is kept on a response that
//! comes straight from the origin (each line that parses as a list; one
//! that does not is dropped, or it would swallow what follows), and this
//! layer's member goes after it.
//! An entry is stored without the upstream members:
//! they told how one past request was handled, and replayed on a hit they
//! would lie (a stored `fwd=miss` is not what happened to the hit).
//!
//! | how the request was answered | member |
//! |---|---|
//! | a fresh entry (a `304` made from it too) | `hit; ttl=<seconds of freshness left>` |
//! | a stale entry while it is revalidated | `hit; ttl=-<seconds stale>` |
//! | the rebuild it started | `fwd=uri-miss; stored` (`fwd=stale` if an expired entry was there; `fwd-status=304` when the origin renewed it) |
//! | another request's rebuild | `fwd=uri-miss; collapsed` |
//! | a stale entry standing in for a failed rebuild | `fwd=stale; fwd-status=<the origin's status, or 502 when this request did not see it (a waiter) or there was none (an error, a timeout)>; ttl=-<seconds>; detail=stale-if-error`, and `collapsed` for a waiter |
//! | passed through: a method the cache does not take | `fwd=method` |
//! | passed through: credentials, `no-store` in the request | `fwd=request` |
//! | passed through for another reason | `fwd=bypass; detail="<reason>"` |
//! | an origin answer that could not be shared | `fwd=uri-miss; detail="<reason>"` |

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::HeaderValue;
use http::{HeaderMap, HeaderName};

use crate::engine::{Held, Status};

use super::passes::Pass;
use super::response::CachedResponse;
use super::rfc::structured;
use super::tags::TagRules;

/// The header's name.
pub(crate) const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// The cache name the member starts with unless the route sets another.
pub(crate) const DEFAULT_NAME: &str = "stampede-guard";

/// Freshness left, in seconds, whose hit values are made once and kept: an
/// hour, the range of the kept `Age` values (an entry's values are made on
/// their first use only).
const KEPT_FRESH: usize = 3600;
/// Staleness, in seconds, whose hit values are made once and kept.
const KEPT_STALE: usize = 300;

/// The largest magnitude of a structured-field integer (RFC 8941 §3.3.1).
const SF_INTEGER_MAX: i64 = 999_999_999_999_999;

/// The members one cache name gives.
pub(crate) struct Rfc9211 {
    /// The name as a structured-field item: a token if it is one, else a
    /// string.
    name: Box<str>,
    /// `<name>; hit; ttl=<n>`, each made on its first use, so that a hit
    /// allocates nothing: index `n` for `ttl=n` (fresh), `KEPT_FRESH + s` for
    /// `ttl=-s` (stale).
    hits: Box<[OnceLock<HeaderValue>]>,
}

impl std::fmt::Debug for Rfc9211 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Rfc9211 {
    /// The members of a cache called `name`. Characters a structured-field
    /// string cannot hold (controls, non-ASCII) are left out.
    pub(crate) fn new(name: &str) -> Arc<Self> {
        Arc::new(Rfc9211 {
            name: sf_item(name).into_boxed_str(),
            hits: (0..=KEPT_FRESH + KEPT_STALE)
                .map(|_| OnceLock::new())
                .collect(),
        })
    }

    /// The default cache's members, shared by every route that keeps the name.
    pub(crate) fn default_name() -> Arc<Self> {
        static DEFAULT: OnceLock<Arc<Rfc9211>> = OnceLock::new();
        DEFAULT.get_or_init(|| Rfc9211::new(DEFAULT_NAME)).clone()
    }

    /// The member for a hit with `ttl` seconds of freshness left (negative:
    /// stale by that much).
    pub(crate) fn hit(&self, ttl: i64) -> HeaderValue {
        let slot = match ttl {
            0.. => usize::try_from(ttl).ok().filter(|&n| n < KEPT_FRESH),
            _ => usize::try_from(ttl.unsigned_abs())
                .ok()
                .filter(|&s| s <= KEPT_STALE)
                .map(|s| KEPT_FRESH + s),
        };
        let make = || self.value(&Member::Hit { ttl });
        match slot.and_then(|i| self.hits.get(i)) {
            Some(kept) => kept.get_or_init(make).clone(),
            None => make(),
        }
    }

    /// The member, as a header value.
    pub(crate) fn value(&self, member: &Member) -> HeaderValue {
        let mut out = String::with_capacity(64);
        out.push_str(&self.name);
        match member {
            Member::Hit { ttl } => {
                let _ = write!(out, "; hit; ttl={}", clamp(*ttl));
            }
            Member::Forward(f) => {
                out.push_str("; fwd=");
                out.push_str(f.fwd.token());
                if let Some(status) = f.status {
                    let _ = write!(out, "; fwd-status={status}");
                }
                if f.stored {
                    out.push_str("; stored");
                }
                if f.collapsed {
                    out.push_str("; collapsed");
                }
                if let Some(ttl) = f.ttl {
                    let _ = write!(out, "; ttl={}", clamp(ttl));
                }
                if let Some(detail) = f.detail {
                    out.push_str("; detail=");
                    out.push_str(&sf_item(detail));
                }
            }
        }
        // Only visible ASCII and spaces went in.
        HeaderValue::try_from(out).unwrap_or_else(|_| HeaderValue::from_static(DEFAULT_NAME))
    }
}

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

/// How a route shows how it answered: the `x-cache`-style header, and its
/// member of `Cache-Status`.
#[derive(Clone, Debug)]
pub(crate) struct Presentation {
    /// The header that says `HIT`, `MISS`, …, if the route sets one.
    pub status_header: Option<HeaderName>,
    /// The RFC 9211 `Cache-Status` member's cache, if the route adds one.
    pub cache_status: Option<Arc<Rfc9211>>,
}

impl Default for Presentation {
    fn default() -> Self {
        Presentation {
            status_header: Some(HeaderName::from_static("x-cache")),
            cache_status: Some(Rfc9211::default_name()),
        }
    }
}

/// Why a request went forward (RFC 9211 §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fwd {
    /// The cache was configured not to handle this request.
    Bypass,
    /// The method's semantics require forwarding.
    Method,
    /// Nothing stored for the URI.
    UriMiss,
    /// The request's own semantics (credentials, `no-store`) kept the
    /// cache from answering it.
    Request,
    /// What was stored was stale.
    Stale,
}

impl Fwd {
    fn token(self) -> &'static str {
        match self {
            Fwd::Bypass => "bypass",
            Fwd::Method => "method",
            Fwd::UriMiss => "uri-miss",
            Fwd::Request => "request",
            Fwd::Stale => "stale",
        }
    }

    /// Why a request the cache did not take went forward, by the reason it
    /// was passed.
    pub(crate) fn of_bypass(pass: Pass) -> Fwd {
        match pass {
            Pass::Method => Fwd::Method,
            Pass::Credentials | Pass::RequestNoStore | Pass::RequestNoCache => Fwd::Request,
            _ => Fwd::Bypass,
        }
    }
}

/// A request that went forward, and what came of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Forward {
    pub fwd: Fwd,
    /// The status the next hop answered, when it is not the response's.
    pub status: Option<u16>,
    pub stored: bool,
    /// Answered by another request's forward.
    pub collapsed: bool,
    pub ttl: Option<i64>,
    pub detail: Option<&'static str>,
}

impl Forward {
    pub(crate) fn new(fwd: Fwd) -> Self {
        Forward {
            fwd,
            status: None,
            stored: false,
            collapsed: false,
            ttl: None,
            detail: None,
        }
    }
}

/// One cache's member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Member {
    Hit { ttl: i64 },
    Forward(Forward),
}

/// What a request's own rebuild did, as its response tells it: set by the
/// rebuild, read by the request once the flight answered it.
#[derive(Debug, Default)]
pub(crate) struct Forwarded {
    ran: AtomicBool,
    status: AtomicU16,
}

impl Forwarded {
    /// The rebuild started; the origin has not answered yet.
    pub(crate) fn ran(&self) {
        self.ran.store(true, Ordering::Release);
    }

    /// The origin answered with `status`.
    pub(crate) fn answered(&self, status: u16) {
        self.status.store(status, Ordering::Release);
    }

    fn status(&self) -> Option<u16> {
        Some(self.status.load(Ordering::Acquire)).filter(|&s| s != 0)
    }
}

/// How a request answered with an entry by the engine went forward (`None`:
/// it did not, a hit). `had_stale`: an expired entry was there when it
/// missed; `forwarded`: what its own rebuild did, if it ran one; `stored`:
/// the engine stored the entry that rebuild made.
pub(crate) fn forward_of(
    status: Status,
    held: &Held<CachedResponse>,
    stored: bool,
    had_stale: bool,
    forwarded: &Forwarded,
    now: Instant,
) -> Option<Forward> {
    let ran = forwarded.ran.load(Ordering::Acquire);
    let missed = if had_stale { Fwd::Stale } else { Fwd::UriMiss };
    match status {
        Status::Hit => None,
        // Served while one refresh runs: a hit, stale.
        Status::Stale if held.entry().servable_while_revalidating(now) => None,
        // Standing in for a failed rebuild. Without the origin's status (an
        // error, a panic, a timeout), 502: what the layer would have said.
        Status::Stale => Some(Forward {
            status: Some(forwarded.status().filter(|_| ran).unwrap_or(502)),
            collapsed: !ran,
            ttl: Some(ttl_of(held, now)),
            detail: Some("stale-if-error"),
            ..Forward::new(Fwd::Stale)
        }),
        Status::Miss => {
            let renewed = forwarded.status() == Some(304);
            Some(Forward {
                status: renewed.then_some(304),
                stored,
                ..Forward::new(if renewed { Fwd::Stale } else { missed })
            })
        }
        Status::Coalesced => Some(Forward {
            collapsed: true,
            ..Forward::new(missed)
        }),
    }
}

/// How a response that did not come from an entry went forward, as far as
/// `status` tells.
pub(crate) fn default_forward(status: CacheStatus) -> Forward {
    match status {
        CacheStatus::Bypass => Forward::new(Fwd::Bypass),
        CacheStatus::Coalesced => Forward {
            collapsed: true,
            ..Forward::new(Fwd::UriMiss)
        },
        CacheStatus::Stale => Forward::new(Fwd::Stale),
        CacheStatus::Hit | CacheStatus::Miss => Forward::new(Fwd::UriMiss),
    }
}

/// The cache-status headers of a response that did not come from an entry.
pub(crate) struct StatusHeaders {
    x_cache: Option<(HeaderName, HeaderValue)>,
    member: Option<HeaderValue>,
    /// The route's tag headers, unless it exposes them: an answer that
    /// passed the cache by never reaches a client with them either.
    tag_headers: Option<Arc<[HeaderName]>>,
}

impl StatusHeaders {
    pub(crate) fn new(
        presentation: &Presentation,
        tags: &TagRules,
        status: CacheStatus,
        forward: Forward,
    ) -> Self {
        StatusHeaders {
            x_cache: presentation
                .status_header
                .clone()
                .map(|name| (name, status.header_value())),
            member: presentation
                .cache_status
                .as_ref()
                .map(|members| members.value(&Member::Forward(forward))),
            tag_headers: (!tags.expose).then(|| tags.headers.clone()),
        }
    }

    /// The fields these headers remove, to remove from the trailers too.
    pub(crate) fn hidden(&self) -> Option<Arc<[HeaderName]>> {
        self.tag_headers.clone()
    }

    /// `x-cache` replaced; this layer's member after those already there
    /// (RFC 9211 §2: the cache nearest the origin first).
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        for name in self.tag_headers.iter().flat_map(|names| names.iter()) {
            headers.remove(name);
        }
        if let Some((name, value)) = self.x_cache {
            headers.insert(name, value);
        }
        if let Some(member) = self.member {
            // An upstream line that is not a list would swallow this
            // member when the lines are joined (an open string), or make a
            // parser drop the whole field (RFC 8941 §4.2): only the lines
            // that parse are passed on.
            let upstream = headers.get_all(CACHE_STATUS);
            if upstream
                .iter()
                .any(|line| !structured::is_list(line.as_bytes()))
            {
                let kept: Vec<HeaderValue> = upstream
                    .iter()
                    .filter(|line| structured::is_list(line.as_bytes()))
                    .cloned()
                    .collect();
                headers.remove(CACHE_STATUS);
                for line in kept {
                    headers.append(CACHE_STATUS, line);
                }
            }
            headers.append(CACHE_STATUS, member);
        }
    }
}

/// Seconds of freshness `held` has left at `now`: negative once stale,
/// rounded away from zero then (0.2 s stale is `-1`), towards it while fresh.
pub(crate) fn ttl_of(held: &Held<CachedResponse>, now: Instant) -> i64 {
    let fresh_until = held.entry().fresh_until();
    match fresh_until.checked_duration_since(now) {
        Some(left) if !left.is_zero() => i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
        _ => {
            let late = now.saturating_duration_since(fresh_until);
            let secs = late
                .as_secs()
                .saturating_add(u64::from(late.subsec_nanos() > 0));
            i64::try_from(secs).map_or(i64::MIN, |s| -s)
        }
    }
}

fn clamp(n: i64) -> i64 {
    n.clamp(-SF_INTEGER_MAX, SF_INTEGER_MAX)
}

/// `s` as a structured-field token if it is one (RFC 8941 §3.3.4), else as
/// a string (§3.3.3), without the characters a string cannot hold.
fn sf_item(s: &str) -> String {
    let mut chars = s.chars();
    let token = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '*')
        && chars.all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c));
    if token {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tokens_or_escaped_strings() {
        assert_eq!(sf_item("stampede-guard"), "stampede-guard");
        assert_eq!(sf_item("edge/1:a"), "edge/1:a");
        assert_eq!(sf_item("my cache"), "\"my cache\"");
        assert_eq!(sf_item("1st"), "\"1st\"");
        assert_eq!(sf_item(""), "\"\"");
        assert_eq!(sf_item("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(sf_item("é\r\nx"), "\"x\"", "no control or non-ASCII byte");
    }

    #[test]
    fn members_read_as_rfc_9211_says() {
        let c = Rfc9211::new("edge");
        assert_eq!(c.hit(30), "edge; hit; ttl=30");
        assert_eq!(c.hit(-4), "edge; hit; ttl=-4");
        assert_eq!(c.hit(1_000_000), "edge; hit; ttl=1000000");
        assert_eq!(c.hit(i64::MIN), "edge; hit; ttl=-999999999999999");
        assert_eq!(c.hit(30), c.value(&Member::Hit { ttl: 30 }));
        // The kept values, at their edges, read as the ones made each time.
        for ttl in [0, 1799, 1800, 3599, 3600, -1, -300, -301] {
            assert_eq!(c.hit(ttl), c.value(&Member::Hit { ttl }), "ttl={ttl}");
            assert_eq!(c.hit(ttl), c.value(&Member::Hit { ttl }), "kept ttl={ttl}");
        }
        let f = Forward {
            status: Some(503),
            stored: true,
            collapsed: true,
            ttl: Some(-2),
            detail: Some("stale-if-error"),
            ..Forward::new(Fwd::Stale)
        };
        assert_eq!(
            c.value(&Member::Forward(f)),
            "edge; fwd=stale; fwd-status=503; stored; collapsed; ttl=-2; detail=stale-if-error"
        );
        let bypass = Forward {
            detail: Some("request body"),
            ..Forward::new(Fwd::of_bypass(Pass::RequestBody))
        };
        assert_eq!(
            c.value(&Member::Forward(bypass)),
            "edge; fwd=bypass; detail=\"request body\""
        );
        assert_eq!(Fwd::of_bypass(Pass::Method), Fwd::Method);
        assert_eq!(Fwd::of_bypass(Pass::Credentials), Fwd::Request);
    }
}
