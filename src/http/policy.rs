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
    ACCEPT_ENCODING, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, PRAGMA, SET_COOKIE,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version};

use super::cache_status::Presentation;
use super::flight::FlightSettings;
use super::key::{KeySettings, Keyed};
use super::passes::{Pass, PassLog};
use super::rfc::cache_control::{expires_lifetime, tokens, CacheControl};
use super::tags::TagRules;
use super::upgrades::Upgrades;
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
    /// What the handler did with each key's protocol switches.
    pub upgrades: Arc<Upgrades>,
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

/// How the cache takes a request: the one place that decides it.
///
/// Nothing a client adds to a GET or HEAD may cost the origin more than the
/// one miss per key the cache costs anyway, except what must reach the
/// handler to be answered right: another method, credentials, a protocol
/// switch, or request directives on a route that opts in to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// From an entry, or the key's one flight.
    Cache,
    /// The same once the request's content is read and thrown away: a GET
    /// or HEAD's content has no defined meaning (RFC 9110 §9.3.1), so the
    /// handler sees the request without it (its framing headers are
    /// already removed), and no answer it shapes can be stored.
    Discard,
    /// A protocol switch (see [`is_upgrade`]): the handler may accept it,
    /// unless the key's handler is known to answer it as a plain GET.
    Upgrade,
    /// Passed through: only the handler may answer it.
    Pass(Pass),
}

/// How the cache takes a request with this method, version and headers,
/// whose body `body_ended` says has no data. An `Upgrade` that asks for no
/// switch (see [`is_upgrade`]) is removed from a request the cache takes:
/// the handler of a miss answers the plain GET the cache takes it for.
pub(crate) fn admission(
    store: &StoreRules,
    method: &Method,
    version: Version,
    headers: &mut HeaderMap,
    body_ended: bool,
) -> Admission {
    if method != Method::GET && method != Method::HEAD {
        return Admission::Pass(Pass::Method);
    }
    // One pass over the names present (usually a handful, none of these)
    // instead of a lookup per header asked about.
    let (mut credentials, mut upgrade, mut framing) = (false, false, false);
    for name in headers.keys() {
        match name.as_str() {
            "authorization" | "cookie" | "proxy-authorization" => credentials = true,
            "upgrade" => upgrade = true,
            "transfer-encoding" | "content-length" => framing = true,
            _ => {}
        }
    }
    if credentials && !store.allow_credentials {
        return Admission::Pass(Pass::Credentials);
    }
    // A protocol switch the handler may accept (a WebSocket, say, on a path
    // whose plain GET is cacheable): answered from an entry, it would be
    // refused without the handler ever seeing it.
    if upgrade {
        if is_upgrade(version, headers) {
            return Admission::Upgrade;
        }
        headers.remove(UPGRADE);
    }
    // A request's own cache directives (`no-store`, `no-cache`,
    // `max-age=0`, `Pragma: no-cache`) are ignored unless the route opts in:
    // on a shared cache any client could otherwise send each request to the
    // origin. Ignored, such a request is served like any other: from a fresh
    // entry, or by joining or starting the key's one flight.
    if store.respect_request_cache_control
        && let Some(pass) = request_directives(headers)
    {
        return Admission::Pass(pass);
    }
    // A GET or HEAD with a body: content in a GET has no defined meaning
    // (RFC 9110 §9.3.1), so the layer discards it (as Varnish does) and
    // takes the request as the body-less GET the handler then sees: it
    // costs what any GET costs.
    if !body_ended || (framing && has_body(headers)) {
        headers.remove(CONTENT_LENGTH);
        headers.remove(TRANSFER_ENCODING);
        return Admission::Discard;
    }
    Admission::Cache
}

/// Why a request does not go the whole way through the cache, if it does
/// not: a pass, or an answer from a fresh entry only.
#[cfg(test)]
pub(crate) fn request_bypass(
    store: &StoreRules,
    method: &Method,
    headers: &HeaderMap,
) -> Option<Pass> {
    match admission(store, method, Version::HTTP_11, &mut headers.clone(), true) {
        Admission::Cache => None,
        Admission::Discard => Some(Pass::RequestBody),
        Admission::Upgrade => Some(Pass::Upgrade),
        Admission::Pass(pass) => Some(pass),
    }
}

/// Whether the request asks to switch protocols (RFC 9110 §7.8): an
/// `Upgrade` naming a protocol, with the `upgrade` option in `Connection`,
/// which a sender of `Upgrade` must send, over HTTP/1.1 (an HTTP/1.0
/// `Upgrade` must be ignored; HTTP/2 and HTTP/3 forbid both fields). Any
/// other `Upgrade` is no upgrade, and the cache treats the request as if it
/// had none.
pub(crate) fn is_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && headers
            .get_all(UPGRADE)
            .iter()
            .any(|line| tokens(line.as_bytes()).next().is_some())
        && headers
            .get_all(CONNECTION)
            .iter()
            .any(|line| tokens(line.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"upgrade")))
}

/// Whether the framing headers announce content: a `Transfer-Encoding`, or
/// a `Content-Length` other than zero (a list of zeros is zero).
fn has_body(headers: &HeaderMap) -> bool {
    let zero = |v: &HeaderValue| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .all(|n| n.trim().parse::<u64>().is_ok_and(|n| n == 0))
        })
    };
    headers.contains_key(TRANSFER_ENCODING) || !headers.get_all(CONTENT_LENGTH).iter().all(zero)
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
    use http::HeaderName;

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
        for h in [("authorization", "Bearer x"), ("cookie", "a=b")] {
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

    /// Every request property a client controls, on a GET: what the cache
    /// makes of it.
    #[test]
    fn what_a_client_adds_to_a_get_costs_at_most_a_miss() {
        let p = Policy::default();
        let take = |version, h: &[(&'static str, &'static str)], ended| {
            admission(&p.store, &Method::GET, version, &mut headers(h), ended)
        };
        let v11 = Version::HTTP_11;
        let fresh = Admission::Discard;
        for (h, ended, expected) in [
            // No switch asked: an `Upgrade` alone, or `Connection: upgrade`
            // alone, is nothing.
            (&[("upgrade", "h2c")][..], true, Admission::Cache),
            (
                &[("upgrade", "websocket"), ("connection", "close")],
                true,
                Admission::Cache,
            ),
            (&[("connection", "upgrade")], true, Admission::Cache),
            (
                &[("connection", "upgrade"), ("upgrade", " , ")],
                true,
                Admission::Cache,
            ),
            // A switch: only the handler can make it (or say it never does).
            (
                &[
                    ("upgrade", "websocket"),
                    ("connection", "keep-alive, Upgrade"),
                ],
                true,
                Admission::Upgrade,
            ),
            // Framing that announces no content.
            (&[("content-length", "0")], true, Admission::Cache),
            (&[("content-length", "0, 0")], true, Admission::Cache),
            (
                &[("content-length", "0"), ("content-length", " 0 ")],
                true,
                Admission::Cache,
            ),
            (&[("expect", "100-continue")], true, Admission::Cache),
            // Hop-by-hop and forwarding fields that change nothing.
            (
                &[("te", "trailers"), ("connection", "te")],
                true,
                Admission::Cache,
            ),
            (&[("max-forwards", "0")], true, Admission::Cache),
            (
                &[("connection", "cache-control, host")],
                true,
                Admission::Cache,
            ),
            // Content, announced or not: discarded, then cached like any GET.
            (&[("content-length", "1")], false, fresh),
            (&[("content-length", "1")], true, fresh),
            (&[("content-length", "0, 1")], true, fresh),
            (&[("content-length", "x")], true, fresh),
            (&[("content-length", "-0")], true, fresh),
            (&[("transfer-encoding", "chunked")], true, fresh),
            (&[("transfer-encoding", "identity")], true, fresh),
            (
                &[("expect", "100-continue"), ("content-length", "3")],
                false,
                fresh,
            ),
            (&[], false, fresh),
        ] {
            assert_eq!(take(v11, h, ended), expected, "{h:?} ended {ended}");
        }
        // An `Upgrade` that asks for nothing is gone before the handler; a
        // switch keeps it.
        let mut h = headers(&[("upgrade", "h2c")]);
        assert_eq!(
            admission(&p.store, &Method::GET, v11, &mut h, true),
            Admission::Cache
        );
        assert!(!h.contains_key(UPGRADE));
        let mut h = headers(&[("upgrade", "h2c"), ("connection", "upgrade")]);
        admission(&p.store, &Method::GET, v11, &mut h, true);
        assert!(h.contains_key(UPGRADE));
        // Over HTTP/1.0 (which must ignore it) and HTTP/2 (which forbids
        // it), `Upgrade` is no switch.
        let switch = [("upgrade", "websocket"), ("connection", "upgrade")];
        for version in [Version::HTTP_10, Version::HTTP_2, Version::HTTP_3] {
            assert_eq!(
                take(version, &switch, true),
                Admission::Cache,
                "{version:?}"
            );
        }
        // HEAD alike; another method (in any case) is no GET.
        let mut body = headers(&[("content-length", "1")]);
        assert_eq!(
            admission(&p.store, &Method::HEAD, v11, &mut body, false),
            fresh
        );
        let lower = Method::from_bytes(b"get").unwrap();
        assert_eq!(
            admission(&p.store, &lower, v11, &mut HeaderMap::new(), true),
            Admission::Pass(Pass::Method)
        );
        // Credentials and a switch outrank a body: they must reach the handler.
        let both = [("authorization", "x"), ("content-length", "1")];
        assert_eq!(take(v11, &both, false), Admission::Pass(Pass::Credentials));
        let both = [
            ("upgrade", "h2c"),
            ("connection", "upgrade"),
            ("content-length", "1"),
        ];
        assert_eq!(take(v11, &both, false), Admission::Upgrade);
        // Discarded content leaves no framing for the handler to read.
        let mut h = headers(&[("content-length", "1"), ("transfer-encoding", "chunked")]);
        assert_eq!(
            admission(&p.store, &Method::GET, v11, &mut h, false),
            Admission::Discard
        );
        assert!(!h.contains_key(CONTENT_LENGTH) && !h.contains_key(TRANSFER_ENCODING));
    }
}

#[cfg(test)]
mod rfc_tests;
