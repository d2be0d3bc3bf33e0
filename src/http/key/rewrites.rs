//! Request headers that frameworks and proxies honour to rewrite what the
//! request asks for: its URL, path, path prefix, host, port or scheme
//! (`X-Original-URL`, `X-Rewrite-URL`, `X-Forwarded-Host`, `Forwarded`,
//! `X-Envoy-Original-Path`, `Front-End-Https`, …), or its method
//! (`X-HTTP-Method-Override`, `X-Original-Method`, …).
//!
//! The class is told by the header's name, not by a list, so that a
//! spelling a list missed is still caught. A name is read as words split at
//! every character but a letter or digit (CGI, WSGI and PHP read
//! `X_Original_URL` and PHP `X.Original.URL` as `X-Original-URL`):
//!
//! - a name whose last word is `for`, `ip`, `ips`, `addr` or `address`
//!   names the client (`X-Forwarded-For`, `X-Real-IP`): in neither class;
//! - a word `method` or `verb` makes a **method override**;
//! - otherwise a word `forwarded`, `original`, `rewrite`, `rewritten`,
//!   `override`, `script`, `url`, `uri`, `host`, `path`, `query`,
//!   `querystring`, `qs`, `args`, `params`, `route`, `routes`, `matches`,
//!   `matched`, `target`, `location`, `redirect`, `redirected`, `invoke`,
//!   `middleware` or `subrequest`, or a last word
//!   `pathname`, `hostname`, `authority`, `prefix`, `base`, `port`,
//!   `proto`, `protocol`, `scheme`, `ssl`, `https` or `server`, makes a
//!   **target rewrite**. `Host` itself is not one: it is part of the URL's
//!   key.
//!
//! A target rewrite present on a request is keyed, as a variant of the URL
//! (see [`variant_key`](super::variant_key); the five default forwarding
//! headers only as the route's list of them says): the answer built from it is
//! stored for, and served to, only requests with the same values, and a
//! request with one is never answered from a plain request's entry. A
//! method override sends the request past the cache: a framework that
//! honours it answers another method, whose answer is no GET's.

use http::HeaderName;

/// What a request header may make a framework do to the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// It may change the URL, path, prefix, host, port or scheme.
    Target,
    /// It may change the method.
    Method,
}

/// Last words of the names that carry a client's address.
const CLIENT: [&str; 5] = ["for", "ip", "ips", "addr", "address"];

/// Words that, anywhere in a name, mark a target rewrite: the URL and its
/// parts (path, query, host, script), what a router matched (route,
/// matches), and the internal rewrites and redirects of proxies and
/// frameworks (`X-Middleware-Rewrite`, `X-Invoke-Query`,
/// `X-Accel-Redirect`, `X-Middleware-Subrequest`).
const TARGET_ANY: &[&str] = &[
    "forwarded",
    "original",
    "rewrite",
    "rewritten",
    "override",
    "script",
    "url",
    "uri",
    "host",
    "path",
    "query",
    "querystring",
    "qs",
    "args",
    "params",
    "route",
    "routes",
    "matches",
    "matched",
    "target",
    "location",
    "redirect",
    "redirected",
    "invoke",
    "middleware",
    "subrequest",
];

/// Last words that mark a target rewrite.
const TARGET_LAST: &[&str] = &[
    "pathname",
    "hostname",
    "authority",
    "prefix",
    "base",
    "port",
    "proto",
    "protocol",
    "scheme",
    "ssl",
    "https",
    "server",
];

/// The class of a request header's name, if it is in one.
pub(crate) fn rewrite_class(name: &HeaderName) -> Option<Rewrite> {
    let name = name.as_str();
    if name == "host" {
        return None;
    }
    // Every character but a letter or digit separates words: proxies and
    // servers pass `.` (and the other token characters) on, and PHP reads
    // `X.Original.URL` as `X_Original_URL`.
    let words = || {
        name.split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
    };
    let last = words().next_back()?;
    if CLIENT.contains(&last) {
        return None;
    }
    if words().any(|w| w == "method" || w == "verb") {
        return Some(Rewrite::Method);
    }
    if words().any(|w| TARGET_ANY.contains(&w)) || TARGET_LAST.contains(&last) {
        return Some(Rewrite::Target);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str) -> Option<Rewrite> {
        rewrite_class(&HeaderName::from_bytes(name.as_bytes()).unwrap())
    }

    #[test]
    fn names_that_rewrite_the_target() {
        for name in [
            "x-original-url",
            "x-rewrite-url",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-forwarded-prefix",
            "x-forwarded-port",
            "x-forwarded-uri",
            "x-forwarded-path",
            "x-forwarded-server",
            "x-forwarded-scheme",
            "x-forwarded-ssl",
            "x-host",
            "x-original-uri",
            "x-original-host",
            "x-envoy-original-path",
            "forwarded",
            "front-end-https",
            "x-url-scheme",
            "x-arr-ssl",
            "x-script-name",
            "x_original_url",
            "x-invoke-path",
            "x-middleware-rewrite",
            "cloudfront-forwarded-proto",
            "x-forwarded-client-cert",
            "x-http-host-override",
            "x-host-override",
            "x-path-info",
            "x-context-path",
            "x.original.url",
            "X.Forwarded.Host",
            "x-original.url",
            "x~original~url",
            "x+rewrite+url",
            "x-invoke-query",
            "x-invoke-output",
            "x-now-route-matches",
            "x-matched-path",
            "x-nextjs-matched-path",
            "x-query-string",
            "x-querystring",
            "query-string",
            "x-request-target",
            "x-middleware-rewrite",
            "x-middleware-subrequest",
            "x-rewrite",
            "x-accel-redirect",
            "x-original-args",
            "x-route-params",
            "x-location",
        ] {
            assert_eq!(class(name), Some(Rewrite::Target), "{name}");
        }
    }

    #[test]
    fn names_that_override_the_method() {
        for name in [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
            "x-original-method",
            "x-forwarded-method",
            "x_http_method_override",
            "x-http-verb",
            "x.http.method.override",
        ] {
            assert_eq!(class(name), Some(Rewrite::Method), "{name}");
        }
    }

    #[test]
    fn everyday_headers_are_in_neither_class() {
        for name in [
            "host",
            "x-forwarded-for",
            "x-original-forwarded-for",
            "x-real-ip",
            "x-client-ip",
            "true-client-ip",
            "x-envoy-external-address",
            "user-agent",
            "accept",
            "accept-encoding",
            "accept-language",
            "referer",
            "origin",
            "sec-fetch-mode",
            "sec-fetch-site",
            "x-request-id",
            "traceparent",
            "max-forwards",
            "via",
            "if-none-match",
            "cache-control",
            "priority",
            "dnt",
            "x.forwarded.for",
            "sec-fetch-dest",
            "x-requested-with",
            "content-type",
            "if-match",
        ] {
            assert_eq!(class(name), None, "{name}");
        }
    }
}
