//! A route's policy (`Policy`: its settings, in pieces by who reads them),
//! and the store rules that decide what may be cached.
//!
//! The defaults are safe for a shared cache: nothing personal is stored or
//! shared. A request with credentials, a response that sets a cookie or says
//! `private`/`no-store`/`no-cache`, or one whose `Vary` can never match
//! (`*`), passes through untouched unless the route opts in explicitly.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_LENGTH, PRAGMA, SET_COOKIE, TRANSFER_ENCODING,
};
use http::{HeaderMap, HeaderName, Method, StatusCode};

use super::cache_status::Presentation;
use super::flight::FlightSettings;
use super::key::{KeySettings, Keyed};
use super::passes::{Pass, PassLog};
use super::rfc::cache_control::{expires_lifetime, targeted, tokens, CacheControl};
use super::tags::TagRules;
use super::vary::{names_in_vary, nominated, Nominated};
use crate::engine::Lifetime;

/// Statuses stored by default: those RFC 9111 lets a cache store without
/// explicit freshness, minus the error-class ones (`501`, `414`, `405`) that a
/// route is better off not remembering. `404` and `410` are kept: caching
/// "not found" stops a herd of requests for a missing key reaching the origin.
pub(crate) const DEFAULT_STATUSES: [u16; 8] = [200, 203, 204, 300, 301, 308, 404, 410];

/// The targeted cache-control fields (RFC 9213) read by default: the one
/// every CDN-like cache is meant to follow.
pub(crate) static DEFAULT_TARGETS: [HeaderName; 1] = [HeaderName::from_static("cdn-cache-control")];

/// A route's whole configuration, by who reads it: the engine its flight
/// settings, the key its key settings, admission its store rules, the
/// answers their presentation and tag rules.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    pub flight: FlightSettings,
    pub keys: KeySettings,
    pub store: StoreRules,
    pub presentation: Presentation,
    /// How the route tags its entries.
    pub tags: TagRules,
    /// The `route` label of the route's metrics, if it gave one.
    pub route_name: Option<Arc<str>>,
    /// Counts passes by reason, and warns once per reason.
    pub passes: PassLog,
}

/// What a route may take from a request and keep of an origin's answer.
#[derive(Clone, Debug)]
pub(crate) struct StoreRules {
    pub lifetime: Lifetime,
    pub max_body_bytes: usize,
    pub statuses: Arc<[StatusCode]>,
    pub respect_cache_control: bool,
    /// Targeted cache-control fields (RFC 9213 §2.1), in order: the first
    /// present and valid one replaces `Cache-Control` and `Expires` for
    /// this cache.
    pub cache_control_targets: Arc<[HeaderName]>,
    pub allow_credentials: bool,
    /// Follow the request's own cache directives (RFC 9111 §5.2.1): off by
    /// default, as a shared cache that did would let any client turn it off.
    pub respect_request_cache_control: bool,
    pub strip_set_cookie: bool,
    pub cache_private: bool,
    pub ignore_vary: bool,
    pub hit_for_miss: Duration,
    /// Drop the target's entries after a successful unsafe method.
    pub invalidate_on_unsafe: bool,
    /// The most an entry may weigh to be kept, when the in-process tier is
    /// the only one that keeps entries (a backend without Redis): a heavier
    /// answer is not stored, and must not say it was.
    pub keep_bound: Option<u64>,
}

impl Default for StoreRules {
    fn default() -> Self {
        StoreRules {
            lifetime: Lifetime {
                ttl: Duration::from_secs(10),
                stale_while_revalidate: Duration::ZERO,
                stale_if_error: Duration::ZERO,
            },
            max_body_bytes: 4 << 20,
            statuses: DEFAULT_STATUSES
                .iter()
                .filter_map(|s| StatusCode::from_u16(*s).ok())
                .collect(),
            respect_cache_control: false,
            cache_control_targets: Arc::from(DEFAULT_TARGETS.as_slice()),
            allow_credentials: false,
            respect_request_cache_control: false,
            strip_set_cookie: false,
            cache_private: false,
            ignore_vary: false,
            hit_for_miss: Duration::from_secs(5),
            invalidate_on_unsafe: true,
            keep_bound: None,
        }
    }
}

/// Why a request does not use the cache.
pub(crate) fn request_bypass(
    store: &StoreRules,
    method: &Method,
    headers: &HeaderMap,
) -> Option<Pass> {
    if method != Method::GET && method != Method::HEAD {
        return Some(Pass::Method);
    }
    // One pass over the names present (usually a handful, none of these)
    // instead of a lookup per header asked about.
    let (mut credentials, mut upgrade, mut body) = (false, false, false);
    for name in headers.keys() {
        match name.as_str() {
            "authorization" | "cookie" | "proxy-authorization" => credentials = true,
            "upgrade" => upgrade = true,
            "transfer-encoding" | "content-length" => body = true,
            _ => {}
        }
    }
    if credentials && !store.allow_credentials {
        return Some(Pass::Credentials);
    }
    // An upgrade is a connection, not a document. (A range is answered from
    // the whole entry.)
    if upgrade {
        return Some(Pass::Upgrade);
    }
    // A GET or HEAD with a body: the handler may read it, and the answer the
    // leader's body shaped would be stored for everyone.
    let zero = |v: &http::HeaderValue| v.to_str().is_ok_and(|v| v.trim().parse() == Ok(0u64));
    if body
        && (headers.contains_key(TRANSFER_ENCODING)
            || !headers.get_all(CONTENT_LENGTH).iter().all(zero))
    {
        return Some(Pass::RequestBody);
    }
    // A request's own cache directives (`no-store`, `no-cache`,
    // `max-age=0`, `Pragma: no-cache`) are ignored unless the route opts in:
    // on a shared cache any client could otherwise send each request to the
    // origin. Ignored, such a request is served like any other: from a fresh
    // entry, or by joining or starting the key's one flight.
    if store.respect_request_cache_control {
        return request_directives(headers);
    }
    None
}

/// What a request's cache directives ask of a route that follows them
/// (RFC 9111 §5.2.1): `no-store` keeps its answer out of the cache (§5.2.1.5);
/// `no-cache`, `max-age=0` (§5.2.1.4, §5.2.1.1) and, without
/// `Cache-Control`, `Pragma: no-cache` (§5.4) forbid answering from a stored
/// entry without the origin. Both go to the origin on their own; no flight
/// waits on them or stores their answer.
fn request_directives(headers: &HeaderMap) -> Option<Pass> {
    let lines = || headers.get_all(CACHE_CONTROL).iter().map(|v| v.as_bytes());
    if lines().any(|line| tokens(line).any(|t| t.eq_ignore_ascii_case(b"no-store"))) {
        return Some(Pass::RequestNoStore);
    }
    let no_cache = lines().any(|line| {
        line.split(|b| *b == b',').any(|directive| {
            let directive = directive.trim_ascii();
            let (name, value) = match directive.iter().position(|b| *b == b'=') {
                Some(at) => (&directive[..at], Some(&directive[at + 1..])),
                None => (directive, None),
            };
            let name = name.trim_ascii();
            let value = value.map(|v| v.trim_ascii());
            match value {
                None => name.eq_ignore_ascii_case(b"no-cache"),
                Some(v) => {
                    name.eq_ignore_ascii_case(b"no-cache")
                        || (name.eq_ignore_ascii_case(b"max-age") && (v == b"0" || v == b"\"0\""))
                }
            }
        })
    });
    let pragma = !headers.contains_key(CACHE_CONTROL)
        && headers
            .get_all(PRAGMA)
            .iter()
            .any(|line| tokens(line.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"no-cache")));
    (no_cache || pragma).then_some(Pass::RequestNoCache)
}

/// What may be done with an origin response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Waiters may have it if its status is one the route stores (a server
    /// error is a failed rebuild, shared as one; any other status goes to the
    /// request that asked alone); it is cached too when `store` is true.
    Share { lifetime: Lifetime, store: bool },
    /// Nobody but the request that asked may have it, and the key skips
    /// coalescing for a while (hit-for-miss).
    Pass(Pass),
}

/// Applies the route's rules to an origin response's status and headers;
/// `keyed` says what the key the response would be stored under was made of.
pub(crate) fn classify(
    policy: &Policy,
    status: StatusCode,
    headers: &HeaderMap,
    keyed: Keyed,
) -> Verdict {
    let (store, keys) = (&policy.store, &policy.keys);
    if headers.contains_key(SET_COOKIE) && !store.strip_set_cookie {
        return Verdict::Pass(Pass::SetCookie);
    }
    let Directives {
        cc,
        unparseable,
        expires_speaks,
    } = directives(store, headers);
    if unparseable {
        return Verdict::Pass(Pass::UnparseableCacheControl);
    }
    // must-understand (RFC 9111 §5.2.2.3): a status whose requirements
    // this cache knows lets `no-store` be ignored; any other is not stored.
    let understood = understands(status);
    let no_store = cc.no_store && !(cc.must_understand && understood);
    if (cc.private || no_store || cc.no_cache) && !store.cache_private {
        return Verdict::Pass(Pass::Private);
    }
    if !keyed.accept_encoding && names_in_vary(headers, &ACCEPT_ENCODING) {
        // The origin picks a coding per request: key on Accept-Encoding from
        // now on. This answer was made under a key without it, so it is not
        // shared (unless the route ignores Vary).
        keys.learned_encoding.set();
    }
    // A header the key does not cover is learned from the response: the
    // entry is stored with a digest of its request's values of those
    // headers, and serves only requests with the same (vary.rs). Not
    // `Accept-Encoding`, which the route learns to key on instead, nor a
    // `Vary` that can never match (`*`).
    if !store.ignore_vary
        && ((!keyed.accept_encoding && names_in_vary(headers, &ACCEPT_ENCODING))
            || nominated(headers, &keys.vary, keyed) == Nominated::Never)
    {
        return Verdict::Pass(Pass::Vary);
    }
    let mut lifetime = store.lifetime;
    let explicit = cc.s_maxage.or(cc.max_age);
    // Without max-age, `Expires` speaks (RFC 9111 §4.2.1), unless a
    // targeted field does (RFC 9213 §2.1). One already past, or invalid
    // (`0`), is stale on arrival: never stored, whatever the route says, as
    // the HTTP/1.0 way of saying "do not cache". A future one sets the
    // lifetime only where the route respects the origin.
    let expires = if explicit.is_none() && expires_speaks {
        expires_lifetime(headers, SystemTime::now())
    } else {
        None
    };
    let expired = expires == Some(Duration::ZERO);
    if store.respect_cache_control {
        if let Some(seconds) = explicit {
            lifetime.ttl = Duration::from_secs(seconds);
        } else if let Some(ttl) = expires {
            lifetime.ttl = ttl;
        }
        if let Some(seconds) = cc.stale_while_revalidate {
            lifetime.stale_while_revalidate = Duration::from_secs(seconds);
        }
        if let Some(seconds) = cc.stale_if_error {
            lifetime.stale_if_error = Duration::from_secs(seconds);
        }
    }
    // RFC 9111 §5.2.2.2, §5.2.2.8, §5.2.2.10: must-revalidate,
    // proxy-revalidate and s-maxage (which implies proxy-revalidate) forbid a
    // shared cache to serve the response stale, whatever the route's windows.
    if cc.s_maxage.is_some() || cc.must_revalidate || cc.proxy_revalidate {
        lifetime.stale_while_revalidate = Duration::ZERO;
        lifetime.stale_if_error = Duration::ZERO;
    }
    // RFC 9111 §3: an answer of any final status may be stored when the
    // origin gave it explicit freshness, where the route follows the
    // origin's freshness. The route's statuses alone are stored on the
    // route's own lifetime (heuristic freshness, or the route's ttl).
    let explicitly_fresh = store.respect_cache_control
        && (explicit.is_some() || expires.is_some())
        && storable_with_explicit_freshness(status);
    let kept = (store.statuses.contains(&status) || explicitly_fresh)
        && !lifetime.ttl.is_zero()
        && !expired
        && (understood || !cc.must_understand);
    Verdict::Share {
        lifetime,
        store: kept,
    }
}

/// The directives that speak for this cache, and how to read the rest.
struct Directives {
    cc: CacheControl,
    /// `Cache-Control` speaks and is not a list of directives.
    unparseable: bool,
    /// `Expires` may set or end the lifetime (no targeted field speaks).
    expires_speaks: bool,
}

/// Which field speaks (RFC 9213 §2.1): where the route follows the
/// origin's freshness, the first valid targeted field replaces
/// `Cache-Control` and `Expires` entirely. Where the route keeps its own
/// lifetime, only the words that forbid storing or serving stale are read,
/// and a forbidding word in either field counts: the route's ttl is not the
/// origin's to extend, and a safer reading costs at most a miss.
fn directives(store: &StoreRules, headers: &HeaderMap) -> Directives {
    let own = CacheControl::parse(headers);
    let target = match store.cache_control_targets.is_empty() {
        true => None,
        false => targeted(headers, &store.cache_control_targets),
    };
    match target {
        Some(target) if store.respect_cache_control => Directives {
            cc: target,
            unparseable: false,
            expires_speaks: false,
        },
        Some(target) => {
            let unparseable = own.unparseable;
            let mut cc = own;
            cc.private |= target.private;
            cc.no_store |= target.no_store;
            cc.no_cache |= target.no_cache;
            cc.must_revalidate |= target.must_revalidate;
            cc.proxy_revalidate |= target.proxy_revalidate;
            Directives {
                cc,
                unparseable,
                expires_speaks: true,
            }
        }
        None => Directives {
            unparseable: own.unparseable,
            cc: own,
            expires_speaks: true,
        },
    }
}

/// The statuses RFC 9110 defines (§15), whose caching requirements this
/// cache knows, for `must-understand`.
fn understands(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        100..=101 | 200..=206 | 300..=305 | 307..=308 | 400..=417 | 421..=422 | 426 | 500..=505
    )
}

/// A final status whose answer is a whole representation, storable with
/// explicit freshness (RFC 9111 §3): not a part (`206`), not a `304`
/// (which only refreshes a stored answer), not an interim one.
fn storable_with_explicit_freshness(status: StatusCode) -> bool {
    status.as_u16() >= 200
        && status != StatusCode::PARTIAL_CONTENT
        && status != StatusCode::NOT_MODIFIED
}

/// Whether an answer of a status the route does not list may still be
/// stored: the route follows the origin's freshness, and the origin gave
/// this one explicit freshness (`max-age`, `s-maxage` or a future
/// `Expires`, in the field that speaks) that is not zero.
pub(crate) fn explicitly_fresh(
    store: &StoreRules,
    status: StatusCode,
    headers: &HeaderMap,
) -> bool {
    if !store.respect_cache_control || !storable_with_explicit_freshness(status) {
        return false;
    }
    let Directives {
        cc, expires_speaks, ..
    } = directives(store, headers);
    if cc.must_understand && !understands(status) {
        return false;
    }
    match cc.s_maxage.or(cc.max_age) {
        Some(seconds) => seconds > 0,
        None => {
            expires_speaks
                && expires_lifetime(headers, SystemTime::now()).is_some_and(|ttl| !ttl.is_zero())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn varying(on: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::VARY, HeaderValue::from_static(on));
        h
    }

    #[test]
    fn vary_accept_encoding_teaches_the_route_and_is_not_stored_under_the_old_key() {
        let p = Policy::default();
        let before = Keyed::now(&p.keys);
        assert!(!before.accept_encoding);
        let v = classify(&p, StatusCode::OK, &varying("Accept-Encoding"), before);
        assert_eq!(v, Verdict::Pass(Pass::Vary));
        let after = Keyed::now(&p.keys);
        assert!(after.accept_encoding, "the route learned");
        // A rebuild keyed before the flag flipped still may not share its
        // answer: its waiters may accept other codings.
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding"), before);
        assert_eq!(v, Verdict::Pass(Pass::Vary));
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding"), after);
        assert!(matches!(v, Verdict::Share { store: true, .. }));
        // Another header is learned per URL: stored, selected by its values.
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding, x-a"), after);
        assert!(matches!(v, Verdict::Share { store: true, .. }));
        let v = classify(&p, StatusCode::OK, &varying("x-a, *"), after);
        assert_eq!(v, Verdict::Pass(Pass::Vary));
        // Clones made from the route keep what it learned.
        assert!(Keyed::now(&p.clone().keys).accept_encoding);
    }

    #[test]
    fn private_no_store_no_cache_and_set_cookie_pass_by_default() {
        let p = Policy::default();
        for h in [
            ("cache-control", "private"),
            ("cache-control", "no-store"),
            ("cache-control", "no-cache"),
            ("set-cookie", "a=b"),
            ("vary", "*"),
            ("vary", "accept-encoding"),
        ] {
            assert!(
                matches!(
                    classify(&p, StatusCode::OK, &headers(&[h]), Keyed::now(&p.keys)),
                    Verdict::Pass(_)
                ),
                "{h:?} must pass"
            );
        }
    }

    #[test]
    fn vary_listed_by_the_route_is_stored() {
        let p = Policy {
            keys: KeySettings {
                vary: Arc::from([HeaderName::from_static("accept-encoding")]),
                ..KeySettings::default()
            },
            ..Policy::default()
        };
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[("vary", "Accept-Encoding")]),
            Keyed::now(&p.keys),
        );
        assert!(matches!(v, Verdict::Share { store: true, .. }));
    }

    #[test]
    fn s_maxage_wins_and_forbids_stale() {
        let p = Policy {
            store: StoreRules {
                respect_cache_control: true,
                lifetime: Lifetime {
                    ttl: Duration::from_secs(1),
                    stale_while_revalidate: Duration::from_secs(100),
                    stale_if_error: Duration::from_secs(100),
                },
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[(
                "cache-control",
                "max-age=5, s-maxage=50, stale-while-revalidate=9",
            )]),
            Keyed::now(&p.keys),
        );
        let Verdict::Share { lifetime, store } = v else {
            panic!("{v:?}")
        };
        assert!(store);
        assert_eq!(lifetime.ttl, Duration::from_secs(50));
        assert_eq!(lifetime.stale_while_revalidate, Duration::ZERO);
        assert_eq!(lifetime.stale_if_error, Duration::ZERO);
    }

    #[test]
    fn origin_stale_windows_are_used_when_respected() {
        let p = Policy {
            store: StoreRules {
                respect_cache_control: true,
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[(
                "cache-control",
                "max-age=5, stale-while-revalidate=30, stale-if-error=60",
            )]),
            Keyed::now(&p.keys),
        );
        assert_eq!(
            v,
            Verdict::Share {
                lifetime: Lifetime {
                    ttl: Duration::from_secs(5),
                    stale_while_revalidate: Duration::from_secs(30),
                    stale_if_error: Duration::from_secs(60),
                },
                store: true
            }
        );
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[("cache-control", "max-age=0")]),
            Keyed::now(&p.keys),
        );
        assert!(matches!(v, Verdict::Share { store: false, .. }));
    }

    #[test]
    fn must_understand_overrides_no_store_for_known_statuses_only() {
        let p = Policy {
            store: StoreRules {
                respect_cache_control: true,
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        let mu = headers(&[("cache-control", "max-age=60, no-store, must-understand")]);
        let v = classify(&p, StatusCode::OK, &mu, Keyed::now(&p.keys));
        assert!(matches!(v, Verdict::Share { store: true, .. }), "{v:?}");
        let status = StatusCode::from_u16(599).unwrap();
        let v = classify(&p, status, &mu, Keyed::now(&p.keys));
        assert_eq!(v, Verdict::Pass(Pass::Private));
        let fresh = headers(&[("cache-control", "max-age=60, must-understand")]);
        let v = classify(&p, status, &fresh, Keyed::now(&p.keys));
        assert!(matches!(v, Verdict::Share { store: false, .. }), "{v:?}");
        assert!(!explicitly_fresh(&p.store, status, &fresh));
        let v = classify(&p, StatusCode::NOT_FOUND, &fresh, Keyed::now(&p.keys));
        assert!(matches!(v, Verdict::Share { store: true, .. }), "{v:?}");
    }

    #[test]
    fn uncacheable_status_is_shared_but_not_stored() {
        let v = classify(
            &Policy::default(),
            StatusCode::INTERNAL_SERVER_ERROR,
            &HeaderMap::new(),
            Keyed::now(&Policy::default().keys),
        );
        assert!(matches!(v, Verdict::Share { store: false, .. }));
    }

    #[test]
    fn credentials_range_and_methods_bypass() {
        let p = Policy::default();
        let get = Method::GET;
        assert_eq!(request_bypass(&p.store, &get, &HeaderMap::new()), None);
        assert_eq!(
            request_bypass(&p.store, &Method::HEAD, &HeaderMap::new()),
            None
        );
        let range = headers(&[("range", "bytes=0-1")]);
        assert_eq!(request_bypass(&p.store, &get, &range), None);
        assert!(request_bypass(&p.store, &Method::POST, &HeaderMap::new()).is_some());
        for h in [
            ("authorization", "Bearer x"),
            ("cookie", "a=b"),
            ("upgrade", "websocket"),
        ] {
            assert!(
                request_bypass(&p.store, &get, &headers(&[h])).is_some(),
                "{h:?}"
            );
        }
        let opted = Policy {
            store: StoreRules {
                allow_credentials: true,
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        assert_eq!(
            request_bypass(&opted.store, &get, &headers(&[("authorization", "x")])),
            None
        );
    }
}

#[cfg(test)]
mod rfc_tests;
