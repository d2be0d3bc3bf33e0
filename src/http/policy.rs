//! A route's policy (`Policy`: its settings, in pieces by who reads them),
//! and the store rules that decide what may be cached.
//!
//! The defaults are safe for a shared cache: nothing personal is stored or
//! shared. A request with credentials, a response that sets a cookie or says
//! `private`/`no-store`/`no-cache`, or one whose `Vary` can never match
//! (`*`), passes through untouched unless the route opts in explicitly.
//! The qualified `private="field"` and `no-cache="field"` alone do not keep
//! a response out: it is stored without the fields they name.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, PRAGMA,
    SET_COOKIE, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

use super::cache_status::Presentation;
use super::coding::codings;
use super::flight::FlightSettings;
use super::key::{rewrite_class, KeySettings, Keyed, Rewrite};
use super::passes::{Pass, PassLog};
use super::rfc::cache_control::{expires_lifetime, targeted, tokens, CacheControl};
use super::rfc::headers::SET_COOKIE2;
use super::tags::TagRules;
use super::upgrades::Upgrades;
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
                revalidation: Duration::ZERO,
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
    let mut method_override = false;
    for name in headers.keys() {
        match name.as_str() {
            "authorization" | "cookie" | "proxy-authorization" => credentials = true,
            "upgrade" => upgrade = true,
            "transfer-encoding" | "content-length" => framing = true,
            _ => method_override |= rewrite_class(name) == Some(Rewrite::Method),
        }
    }
    if credentials && !store.allow_credentials {
        return Admission::Pass(Pass::Credentials);
    }
    // A method override (`X-HTTP-Method-Override`, `X-Original-Method`, any
    // name with the word `method`, see `key::rewrites`): a framework that
    // honours it runs another method, whose answer is no GET's to store,
    // and which must reach the handler each time.
    if method_override {
        return Admission::Pass(Pass::MethodOverride);
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
    let cookie = headers.contains_key(SET_COOKIE) || headers.contains_key(SET_COOKIE2);
    if cookie && !store.strip_set_cookie {
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
    // Only the plain `private` and `no-cache` are read here: a response
    // whose only ones are qualified is stored without the fields they name
    // (RFC 9111 §5.2.2.4, §5.2.2.7; `response::take_one_clients`).
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
    // Its codings select it as a `Vary` would (coding.rs): codings no
    // request can be selected by make it one that never matches.
    if headers.contains_key(CONTENT_ENCODING) && codings(headers).is_none() {
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
