//! Per-route settings, and the rules that decide what may be cached.
//!
//! The defaults are safe for a shared cache: nothing personal is stored or
//! shared. A request with credentials, a response that sets a cookie or says
//! `private`/`no-store`/`no-cache`, or one whose `Vary` the route does not key
//! on, passes through untouched unless the route opts in explicitly.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{
    AUTHORIZATION, CACHE_CONTROL, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE, UPGRADE, VARY,
};
use http::{HeaderMap, HeaderName, Method, StatusCode};

use crate::engine::{FlightPolicy, Lifetime, MAX_DELTA};

/// A route's own cache key: receives the request head, returns the key (host,
/// path and query are then left out of it) or `None` to pass the request
/// through uncached.
pub type KeyFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// What a waiter does when the route's wait budget runs out before the
/// rebuild it is waiting on lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitTimeout {
    /// Never an error for the client (the default): a request keeps waiting
    /// for its own process's rebuild, which is itself bounded (it waits for
    /// another instance's rebuild as long as that one may run, then rebuilds
    /// here; a rebuild runs at most the rebuild timeout). Waiters are never
    /// sent to the origin one by one when the budget runs out.
    FailOpen,
    /// Answer with this status and an empty body (503 or 504 are usual).
    Respond(StatusCode),
}

/// Statuses stored by default: those RFC 9111 lets a cache store without
/// explicit freshness, minus the error-class ones (`501`, `414`, `405`) that a
/// route is better off not remembering. `404` and `410` are kept: caching
/// "not found" stops a herd of requests for a missing key reaching the origin.
pub(crate) const DEFAULT_STATUSES: [u16; 8] = [200, 203, 204, 300, 301, 308, 404, 410];

/// How long a rebuild may run by default before it is abandoned as failed.
pub(crate) const DEFAULT_REBUILD_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub(crate) struct Policy {
    pub namespace: Arc<str>,
    pub lifetime: Lifetime,
    pub wait_budget: Duration,
    pub on_wait_timeout: WaitTimeout,
    pub max_body_bytes: usize,
    pub statuses: Arc<[StatusCode]>,
    pub vary: Arc<[HeaderName]>,
    pub key_fn: Option<KeyFn>,
    pub respect_cache_control: bool,
    pub allow_credentials: bool,
    pub strip_set_cookie: bool,
    pub cache_private: bool,
    pub ignore_vary: bool,
    pub hit_for_miss: Duration,
    pub status_header: Option<HeaderName>,
    pub lease: Duration,
    pub rebuild_timeout: Duration,
    pub early_refresh: Option<f64>,
}

impl Policy {
    /// What the engine needs to know to run this route's misses.
    pub(crate) fn flight(&self) -> FlightPolicy {
        FlightPolicy {
            lease: self.lease,
            wait_budget: self.wait_budget,
            fail_open: self.on_wait_timeout == WaitTimeout::FailOpen,
            rebuild_timeout: self.rebuild_timeout,
            early_refresh: self.early_refresh,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            namespace: Arc::from(""),
            lifetime: Lifetime {
                ttl: Duration::from_secs(10),
                stale_while_revalidate: Duration::ZERO,
                stale_if_error: Duration::ZERO,
            },
            wait_budget: Duration::from_secs(10),
            on_wait_timeout: WaitTimeout::FailOpen,
            max_body_bytes: 4 << 20,
            statuses: DEFAULT_STATUSES
                .iter()
                .filter_map(|s| StatusCode::from_u16(*s).ok())
                .collect(),
            vary: Arc::from([]),
            key_fn: None,
            respect_cache_control: false,
            allow_credentials: false,
            strip_set_cookie: false,
            cache_private: false,
            ignore_vary: false,
            hit_for_miss: Duration::from_secs(5),
            status_header: Some(HeaderName::from_static("x-cache")),
            lease: Duration::from_secs(5),
            rebuild_timeout: DEFAULT_REBUILD_TIMEOUT,
            early_refresh: None,
        }
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("namespace", &self.namespace)
            .field("lifetime", &self.lifetime)
            .field("wait_budget", &self.wait_budget)
            .field("on_wait_timeout", &self.on_wait_timeout)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("statuses", &self.statuses)
            .field("vary", &self.vary)
            .field("key_fn", &self.key_fn.as_ref().map(|_| "custom"))
            .field("respect_cache_control", &self.respect_cache_control)
            .field("allow_credentials", &self.allow_credentials)
            .field("strip_set_cookie", &self.strip_set_cookie)
            .field("cache_private", &self.cache_private)
            .field("ignore_vary", &self.ignore_vary)
            .field("hit_for_miss", &self.hit_for_miss)
            .field("lease", &self.lease)
            .field("rebuild_timeout", &self.rebuild_timeout)
            .field("early_refresh", &self.early_refresh)
            .finish()
    }
}

/// Why a request does not use the cache.
pub(crate) fn request_bypass(
    policy: &Policy,
    method: &Method,
    headers: &HeaderMap,
) -> Option<&'static str> {
    if method != Method::GET && method != Method::HEAD {
        return Some("method");
    }
    if !policy.allow_credentials
        && (headers.contains_key(AUTHORIZATION)
            || headers.contains_key(COOKIE)
            || headers.contains_key(PROXY_AUTHORIZATION))
    {
        return Some("credentials");
    }
    // An upgrade is a connection, not a document. (A range is answered from
    // the whole entry.)
    if headers.contains_key(UPGRADE) {
        return Some("upgrade");
    }
    None
}

/// What may be done with an origin response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Waiters may have it; it is cached too when `store` is true.
    Share { lifetime: Lifetime, store: bool },
    /// Nobody but the request that asked may have it.
    Pass(&'static str),
}

/// Applies the route's rules to an origin response's status and headers.
pub(crate) fn classify(policy: &Policy, status: StatusCode, headers: &HeaderMap) -> Verdict {
    if headers.contains_key(SET_COOKIE) && !policy.strip_set_cookie {
        return Verdict::Pass("set-cookie");
    }
    let cc = CacheControl::parse(headers);
    if (cc.private || cc.no_store || cc.no_cache) && !policy.cache_private {
        return Verdict::Pass("private, no-store or no-cache");
    }
    if !policy.ignore_vary && !vary_is_covered(headers, &policy.vary) {
        return Verdict::Pass("vary");
    }
    let mut lifetime = policy.lifetime;
    if policy.respect_cache_control {
        if let Some(seconds) = cc.s_maxage.or(cc.max_age) {
            lifetime.ttl = Duration::from_secs(seconds);
        }
        if let Some(seconds) = cc.stale_while_revalidate {
            lifetime.stale_while_revalidate = Duration::from_secs(seconds);
        }
        if let Some(seconds) = cc.stale_if_error {
            lifetime.stale_if_error = Duration::from_secs(seconds);
        }
        // RFC 9111 §5.2.2.10: s-maxage implies proxy-revalidate, which, like
        // must-revalidate, forbids a shared cache to serve the response stale.
        if cc.s_maxage.is_some() || cc.must_revalidate || cc.proxy_revalidate {
            lifetime.stale_while_revalidate = Duration::ZERO;
            lifetime.stale_if_error = Duration::ZERO;
        }
    }
    let store = policy.statuses.contains(&status) && !lifetime.ttl.is_zero();
    Verdict::Share { lifetime, store }
}

/// Whether every header the response varies on is part of the route's key.
fn vary_is_covered(headers: &HeaderMap, keyed: &[HeaderName]) -> bool {
    for value in headers.get_all(VARY) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" || !keyed.iter().any(|k| k.as_str().eq_ignore_ascii_case(name)) {
                return false;
            }
        }
    }
    true
}

/// The `Cache-Control` directives a shared cache acts on.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
}

impl CacheControl {
    /// Reads every `Cache-Control` line. Unknown directives are ignored; a
    /// freshness value that is not a number counts as zero (RFC 9111 §1.2.2:
    /// an invalid lifetime means stale), a malformed stale window as absent.
    pub(crate) fn parse(headers: &HeaderMap) -> Self {
        let mut cc = CacheControl::default();
        for line in headers.get_all(CACHE_CONTROL) {
            let line = String::from_utf8_lossy(line.as_bytes());
            for directive in split_directives(&line) {
                let (name, arg) = match directive.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (directive.trim(), None),
                };
                let seconds = || arg.map(delta_seconds);
                match name.to_ascii_lowercase().as_str() {
                    "no-store" => cc.no_store = true,
                    // The qualified forms (`no-cache="field"`, `private="field"`)
                    // are treated like the plain ones: safer than storing
                    // without the named fields.
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "max-age" => cc.max_age = Some(seconds().flatten().unwrap_or(0)),
                    "s-maxage" => cc.s_maxage = Some(seconds().flatten().unwrap_or(0)),
                    "stale-while-revalidate" => cc.stale_while_revalidate = seconds().flatten(),
                    "stale-if-error" => cc.stale_if_error = seconds().flatten(),
                    _ => {}
                }
            }
        }
        cc
    }
}

/// Parses delta-seconds; a value too large saturates (RFC 9111 §1.2.2).
fn delta_seconds(arg: &str) -> Option<u64> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let max = MAX_DELTA.as_secs();
    Some(arg.parse::<u64>().map_or(max, |n| n.min(max)))
}

/// Splits a header line at commas that are not inside a quoted string.
fn split_directives(line: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut cuts = Vec::new();
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                cuts.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    cuts.push(&line[start..]);
    cuts.into_iter().map(str::trim).filter(|d| !d.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn parses_directives_across_lines_and_quotes() {
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "public, max-age=60, private=\"a, b\""),
            (
                "cache-control",
                "Stale-While-Revalidate=30, stale-if-error=600",
            ),
        ]));
        assert_eq!(cc.max_age, Some(60));
        assert!(cc.private);
        assert_eq!(cc.stale_while_revalidate, Some(30));
        assert_eq!(cc.stale_if_error, Some(600));
        assert!(!cc.no_store);
    }

    #[test]
    fn invalid_max_age_means_stale_and_huge_saturates() {
        let cc = CacheControl::parse(&headers(&[("cache-control", "max-age=abc")]));
        assert_eq!(cc.max_age, Some(0));
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=99999999999999999999999",
        )]));
        assert_eq!(cc.max_age, Some(1 << 31));
        // A number that fits a u64 but not RFC 9111's bound is clamped too.
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=16871334070874663069",
        )]));
        assert_eq!(cc.max_age, Some(1 << 31));
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
                    classify(&p, StatusCode::OK, &headers(&[h])),
                    Verdict::Pass(_)
                ),
                "{h:?} must pass"
            );
        }
    }

    #[test]
    fn vary_listed_by_the_route_is_stored() {
        let p = Policy {
            vary: Arc::from([HeaderName::from_static("accept-encoding")]),
            ..Policy::default()
        };
        let v = classify(&p, StatusCode::OK, &headers(&[("vary", "Accept-Encoding")]));
        assert!(matches!(v, Verdict::Share { store: true, .. }));
    }

    #[test]
    fn s_maxage_wins_and_forbids_stale() {
        let p = Policy {
            respect_cache_control: true,
            lifetime: Lifetime {
                ttl: Duration::from_secs(1),
                stale_while_revalidate: Duration::from_secs(100),
                stale_if_error: Duration::from_secs(100),
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
            respect_cache_control: true,
            ..Policy::default()
        };
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[(
                "cache-control",
                "max-age=5, stale-while-revalidate=30, stale-if-error=60",
            )]),
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
        );
        assert!(matches!(v, Verdict::Share { store: false, .. }));
    }

    #[test]
    fn uncacheable_status_is_shared_but_not_stored() {
        let v = classify(
            &Policy::default(),
            StatusCode::INTERNAL_SERVER_ERROR,
            &HeaderMap::new(),
        );
        assert!(matches!(v, Verdict::Share { store: false, .. }));
    }

    #[test]
    fn credentials_range_and_methods_bypass() {
        let p = Policy::default();
        let get = Method::GET;
        assert_eq!(request_bypass(&p, &get, &HeaderMap::new()), None);
        assert_eq!(request_bypass(&p, &Method::HEAD, &HeaderMap::new()), None);
        let range = headers(&[("range", "bytes=0-1")]);
        assert_eq!(request_bypass(&p, &get, &range), None);
        assert!(request_bypass(&p, &Method::POST, &HeaderMap::new()).is_some());
        for h in [
            ("authorization", "Bearer x"),
            ("cookie", "a=b"),
            ("upgrade", "websocket"),
        ] {
            assert!(request_bypass(&p, &get, &headers(&[h])).is_some(), "{h:?}");
        }
        let opted = Policy {
            allow_credentials: true,
            ..Policy::default()
        };
        assert_eq!(
            request_bypass(&opted, &get, &headers(&[("authorization", "x")])),
            None
        );
    }

    proptest! {
        #[test]
        fn parsing_any_header_never_panics(line in "\\PC{0,64}") {
            if let Ok(v) = HeaderValue::from_str(&line) {
                let mut h = HeaderMap::new();
                h.insert(CACHE_CONTROL, v);
                let _ = CacheControl::parse(&h);
            }
        }
    }
}
