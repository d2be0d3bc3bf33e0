//! Unsafe methods invalidate (RFC 9111 §4.4).
//!
//! A request with a method that may change the resource (anything but GET,
//! HEAD, OPTIONS and TRACE) passes through to the inner service uncached.
//! When its answer is not an error (2xx or 3xx), the guard drops, on every
//! instance and before the response is returned, every variant of:
//!
//! - the request's target URI;
//! - the URIs in `Location` and `Content-Location`, resolved against the URI
//!   the client sent (RFC 3986 §5.2), when they name the same host (another
//!   host's entries are not this origin's to drop).
//!
//! Each key is computed by the same function a GET of that URI uses, so the
//! group dropped is the one a later GET reads. An invalidation that fails
//! (Redis down past its tries) is logged and counted, and never fails the
//! response: this process has dropped its copy all the same.

use http::header::{CONTENT_LOCATION, HOST, LOCATION};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use std::sync::Arc;

use super::key::{rewrite_class, url_key, KeyRules, Keyed, Rewrite};
use super::policy::Policy;
use super::rfc::reference::{resolve, Reference};
use crate::engine::Engine;
use crate::key::Key;
use crate::metrics::{self as m, count, Labels};

/// Whether a request with `method` may change its target, so that a
/// successful answer invalidates it.
pub(crate) fn is_unsafe(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Whether a method override on the request (`X-HTTP-Method-Override`, any
/// header of the class, see `key::rewrites`) may name an unsafe method: any
/// value but a safe method's name (case aside), on any of its lines. A
/// framework that honours it runs that method, so the request invalidates
/// as that method would.
pub(crate) fn overrides_to_unsafe(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .filter(|name| rewrite_class(name) == Some(Rewrite::Method))
        .flat_map(|name| headers.get_all(name))
        .any(|value| {
            let value = String::from_utf8_lossy(value.as_bytes());
            let value = value.trim();
            !["GET", "HEAD", "OPTIONS", "TRACE"]
                .iter()
                .any(|safe| value.eq_ignore_ascii_case(safe))
        })
}

/// What an unsafe request may invalidate once its answer is known: its
/// target's group, and what the request needs to place the URIs the answer
/// names.
pub(crate) struct Targets {
    target: Option<Key>,
    /// The URI the client sent (before a nested router stripped a prefix):
    /// the base its answer's references are relative to.
    scheme: Option<Scheme>,
    authority: Option<Authority>,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
}

impl Targets {
    /// Computes the target's key now, from the request as a GET of the same
    /// URI would be keyed.
    pub(crate) fn of(policy: &Policy, parts: &mut Parts) -> Targets {
        let method = std::mem::replace(&mut parts.method, Method::GET);
        let target = key_of(policy, parts);
        parts.method = method;
        let uri = super::key::target(parts);
        Targets {
            target,
            scheme: uri.scheme().cloned(),
            authority: uri.authority().cloned(),
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
            headers: parts.headers.clone(),
        }
    }

    /// The groups to drop after an answer with `status` and `headers`: none
    /// for an error (or an informational) answer.
    pub(crate) fn keys(
        &self,
        policy: &Policy,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Vec<Key> {
        if !(status.is_success() || status.is_redirection()) {
            return Vec::new();
        }
        let mut keys: Vec<Key> = self.target.into_iter().collect();
        for name in [LOCATION, CONTENT_LOCATION] {
            // One value each; a repeated or unreadable header names nothing.
            let mut values = headers.get_all(&name).iter();
            let (Some(value), None) = (values.next(), values.next()) else {
                continue;
            };
            let Some(uri) = value.to_str().ok().and_then(|v| self.resolve(v)) else {
                continue;
            };
            if let Some(key) = self.key_for(policy, uri)
                && !keys.contains(&key)
            {
                keys.push(key);
            }
        }
        keys
    }

    /// The request's host, as the key reads it.
    fn host(&self) -> Option<&str> {
        match &self.authority {
            Some(authority) => Some(authority.as_str()),
            None => self.headers.get(HOST).and_then(|v| v.to_str().ok()),
        }
    }

    /// `reference` resolved against the URI the client sent (RFC 3986
    /// §5.2), as a URI in the request's own form, if it names the request's
    /// host (and scheme, when both are known).
    fn resolve(&self, reference: &str) -> Option<Uri> {
        let reference = Reference::parse(reference.trim());
        let base = Reference {
            scheme: self.scheme.as_ref().map(Scheme::as_str),
            authority: self.authority.as_ref().map(Authority::as_str),
            path: &self.path,
            query: self.query.as_deref(),
        };
        let resolved = resolve(&base, &reference);
        if reference.scheme.is_some() || reference.authority.is_some() {
            // Absolute ("http://h/p") or network-path ("//h/p"): an http(s)
            // URI of this very authority only, userinfo and port included.
            // (A network-path reference against an origin-form target has
            // the request's scheme, whichever it is.)
            if let Some(theirs) = resolved.scheme.as_deref() {
                let web = ["http", "https"]
                    .iter()
                    .any(|s| theirs.eq_ignore_ascii_case(s));
                let ours = self.scheme.as_ref().map(Scheme::as_str);
                if !web || ours.is_some_and(|ours| !theirs.eq_ignore_ascii_case(ours)) {
                    return None;
                }
            }
            // "mailto:…", "urn:…", "http:g": no authority, not this host's.
            let authority = resolved.authority.as_deref()?;
            if !authority.eq_ignore_ascii_case(self.host()?) {
                return None;
            }
        }
        let mut path_and_query = if resolved.path.is_empty() {
            String::from("/")
        } else {
            resolved.path
        };
        if let Some(query) = &resolved.query {
            path_and_query.push('?');
            path_and_query.push_str(query);
        }
        let path_and_query = PathAndQuery::try_from(path_and_query).ok()?;
        let mut uri = Uri::builder();
        if let (Some(scheme), Some(authority)) = (&self.scheme, &self.authority) {
            uri = uri.scheme(scheme.clone()).authority(authority.clone());
        }
        uri.path_and_query(path_and_query).build().ok()
    }

    /// The key a GET of `uri` would have, with this request's headers.
    fn key_for(&self, policy: &Policy, uri: Uri) -> Option<Key> {
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.uri = uri;
        parts.headers = self.headers.clone();
        key_of(policy, &parts)
    }
}

/// The URL key a GET with `parts` is stored under (its group), or `None`
/// when the route's key function keeps it out of the cache.
fn key_of(policy: &Policy, parts: &Parts) -> Option<Key> {
    let custom = match &policy.keys.key_fn {
        Some(key_fn) => Some(key_fn(parts)?),
        None => None,
    };
    Some(url_key(
        &KeyRules::of(&policy.keys, Keyed::now(&policy.keys)),
        parts,
        custom.as_deref(),
    ))
}

/// Drops every group in `keys`, on every instance, side by side (so a
/// failing Redis delays the response by one invalidation's tries, not one
/// per URI); a failure is logged and counted, never returned. Each runs on
/// its own task: a client that goes away does not cut it short.
pub(crate) async fn invalidate(engine: &Arc<Engine>, keys: Vec<Key>, labels: Labels) {
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let engine = engine.clone();
            tokio::spawn(async move {
                count(m::UNSAFE_INVALIDATIONS, labels);
                if let Err(error) = engine.invalidate(&key, "after an unsafe method").await {
                    count(m::INVALIDATION_FAILURES, labels);
                    tracing::warn!(key = %key, error = %error, "invalidation after an unsafe method failed");
                }
            })
        })
        .collect();
    for task in tasks {
        // A panic in the task is the engine's bug, not the response's.
        let _ = task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(uri: &str, host: &str) -> Targets {
        let (mut parts, ()) = Request::post(uri)
            .header(HOST, host)
            .body(())
            .unwrap()
            .into_parts();
        Targets::of(&Policy::default(), &mut parts)
    }

    #[test]
    fn safe_methods_do_not_invalidate() {
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(!is_unsafe(&m));
        }
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_unsafe(&m));
        }
        assert!(is_unsafe(&Method::from_bytes(b"PURGE").unwrap()));
    }

    #[test]
    fn an_override_naming_an_unsafe_method_is_unsafe() {
        let of = |pairs: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            overrides_to_unsafe(&headers)
        };
        for (name, value) in [
            ("x-http-method-override", "DELETE"),
            ("x-http-method", "put"),
            ("x-method-override", " PATCH "),
            ("x_http_method_override", "POST"),
            ("x-original-method", "PURGE"),
            ("x-http-method-override", ""),
        ] {
            assert!(of(&[(name, value)]), "{name}: {value}");
        }
        assert!(of(&[
            ("x-http-method-override", "GET"),
            ("x-http-method", "DELETE")
        ]));
        for value in ["GET", "head", "OPTIONS", "trace"] {
            assert!(!of(&[("x-http-method-override", value)]), "{value}");
        }
        assert!(!of(&[("x-forwarded-host", "DELETE")]));
        assert!(!of(&[]));
    }

    #[test]
    fn references_resolve_against_the_request_and_stay_on_its_host() {
        let t = targets("/items/5?x=1", "a.example");
        let path = |r: &str| t.resolve(r).map(|u| u.to_string());
        assert_eq!(path("/items/6").as_deref(), Some("/items/6"));
        assert_eq!(path("7").as_deref(), Some("/items/7"));
        assert_eq!(path("http://A.example/z?q").as_deref(), Some("/z?q"));
        assert_eq!(path("//a.example/z").as_deref(), Some("/z"));
        assert_eq!(path("http://b.example/items/5"), None);
        assert_eq!(path("//b.example/x"), None);
        assert_eq!(path("http://a.example:8080/x"), None);
        assert_eq!(path("mailto:x@a.example"), None);
        assert_eq!(path("not a uri"), None);
        assert_eq!(path("other#frag").as_deref(), Some("/items/other"));
        // RFC 3986 §5.2.2: a bare query keeps the base path; dot segments go.
        assert_eq!(path("?y=2").as_deref(), Some("/items/5?y=2"));
        assert_eq!(path("").as_deref(), Some("/items/5?x=1"));
        assert_eq!(path("../lists/1").as_deref(), Some("/lists/1"));
        assert_eq!(path("./6/../7").as_deref(), Some("/items/7"));
        assert_eq!(path("http://a.example/../z").as_deref(), Some("/z"));
        assert_eq!(path("ftp://a.example/z"), None);
        assert_eq!(path("http:z"), None);
    }

    #[test]
    fn errors_invalidate_nothing_and_success_the_target_and_its_locations() {
        let policy = Policy::default();
        let t = targets("/items", "a.example");
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, "/items/9".parse().unwrap());
        headers.insert(
            CONTENT_LOCATION,
            "http://evil.example/items".parse().unwrap(),
        );
        assert!(t
            .keys(&policy, StatusCode::BAD_REQUEST, &headers)
            .is_empty());
        assert!(t
            .keys(&policy, StatusCode::BAD_GATEWAY, &headers)
            .is_empty());
        let keys = t.keys(&policy, StatusCode::CREATED, &headers);
        assert_eq!(keys.len(), 2, "target and Location, not the other host");
        let get = |uri: &str| {
            let (parts, ()) = Request::get(uri)
                .header(HOST, "a.example")
                .body(())
                .unwrap()
                .into_parts();
            url_key(
                &KeyRules::of(&policy.keys, Keyed::now(&policy.keys)),
                &parts,
                None,
            )
        };
        assert_eq!(keys, [get("/items"), get("/items/9")]);
    }
}
