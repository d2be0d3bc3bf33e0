//! A route's policy (`Policy`: its settings, in pieces by who reads them),
//! and the store rules that decide what may be cached.
//!
//! The defaults are safe for a shared cache: nothing personal is stored or
//! shared. A request with credentials, a response that sets a cookie or says
//! `private`/`no-store`/`no-cache`, or one whose `Vary` the route does not key
//! on, passes through untouched unless the route opts in explicitly.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_LENGTH, PRAGMA, SET_COOKIE, TRANSFER_ENCODING,
};
use http::{HeaderMap, Method, StatusCode};

use super::cache_status::Presentation;
use super::flight::FlightSettings;
use super::key::{KeySettings, Keyed};
use super::passes::{Pass, PassLog};
use super::rfc::cache_control::{expires_lifetime, tokens, CacheControl};
use super::tags::TagRules;
use super::vary::{names_in_vary, vary_is_covered};
use crate::engine::Lifetime;

/// Statuses stored by default: those RFC 9111 lets a cache store without
/// explicit freshness, minus the error-class ones (`501`, `414`, `405`) that a
/// route is better off not remembering. `404` and `410` are kept: caching
/// "not found" stops a herd of requests for a missing key reaching the origin.
pub(crate) const DEFAULT_STATUSES: [u16; 8] = [200, 203, 204, 300, 301, 308, 404, 410];

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
                revalidation: Duration::ZERO,
            },
            max_body_bytes: 4 << 20,
            statuses: DEFAULT_STATUSES
                .iter()
                .filter_map(|s| StatusCode::from_u16(*s).ok())
                .collect(),
            respect_cache_control: false,
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
    let cc = CacheControl::parse(headers);
    if cc.unparseable {
        return Verdict::Pass(Pass::UnparseableCacheControl);
    }
    if (cc.private || cc.no_store || cc.no_cache) && !store.cache_private {
        return Verdict::Pass(Pass::Private);
    }
    if !keyed.accept_encoding && names_in_vary(headers, &ACCEPT_ENCODING) {
        // The origin picks a coding per request: key on Accept-Encoding from
        // now on. This answer was made under a key without it, so it is not
        // shared (unless the route ignores Vary).
        keys.learned_encoding.set();
    }
    if !store.ignore_vary && !vary_is_covered(headers, &keys.vary, keyed) {
        return Verdict::Pass(Pass::Vary);
    }
    let mut lifetime = store.lifetime;
    let explicit = cc.s_maxage.or(cc.max_age);
    // Without max-age, `Expires` speaks (RFC 9111 §4.2.1). One already past,
    // or invalid (`0`), is stale on arrival: never stored, whatever the route
    // says, as the HTTP/1.0 way of saying "do not cache". A future one sets
    // the lifetime only where the route respects the origin.
    let expires = if explicit.is_none() {
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
    let kept = store.statuses.contains(&status) && !lifetime.ttl.is_zero() && !expired;
    Verdict::Share {
        lifetime,
        store: kept,
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
        // Learning one header covers only that one.
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding, x-a"), after);
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
                    revalidation: Duration::ZERO,
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
                    revalidation: Duration::ZERO,
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
