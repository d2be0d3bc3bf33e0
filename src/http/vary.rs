//! A response's `Vary` against the key it would be stored under, and the one
//! thing a route learns from it: that its origin picks a content coding per
//! request.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{ACCEPT_ENCODING, VARY};
use http::{HeaderMap, HeaderName};

use super::key::Keyed;

/// Set once the route's origin answered with `Vary: accept-encoding` (or
/// compression sits inside the guard): from then on its keys include the
/// normalised `Accept-Encoding`, so each coding gets its own entry and the
/// route is protected again. Shared by the services one guard builds; a guard
/// derived from it with a builder starts from what this one knew.
#[derive(Default)]
pub(crate) struct LearnedEncoding(AtomicBool);

impl LearnedEncoding {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self) {
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::info!("origin varies on accept-encoding: the route now keys on it");
        }
    }
}

impl Clone for LearnedEncoding {
    fn clone(&self) -> Self {
        LearnedEncoding(AtomicBool::new(self.get()))
    }
}

/// Whether every header the response varies on is part of the request's key.
pub(crate) fn vary_is_covered(headers: &HeaderMap, vary: &[HeaderName], keyed: Keyed) -> bool {
    for value in headers.get_all(VARY) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let covered = if name.eq_ignore_ascii_case(ACCEPT_ENCODING.as_str()) {
                keyed.accept_encoding
            } else {
                vary.iter().any(|k| k.as_str().eq_ignore_ascii_case(name))
            };
            if name == "*" || !covered {
                return false;
            }
        }
    }
    true
}

/// Whether the response's `Vary` names `header`.
pub(crate) fn names_in_vary(headers: &HeaderMap, header: &HeaderName) -> bool {
    headers
        .get_all(VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|name| name.trim().eq_ignore_ascii_case(header.as_str()))
}

#[cfg(test)]
mod tests {
    use super::super::policy::{classify, Policy, Verdict};
    use super::*;
    use http::{HeaderValue, StatusCode};

    fn varying(on: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(VARY, HeaderValue::from_static(on));
        h
    }

    #[test]
    fn vary_accept_encoding_teaches_the_route_and_is_not_stored_under_the_old_key() {
        let p = Policy::default();
        let before = Keyed::now(&p);
        assert!(!before.accept_encoding);
        let v = classify(&p, StatusCode::OK, &varying("Accept-Encoding"), before);
        assert_eq!(v, Verdict::Pass("vary"));
        let after = Keyed::now(&p);
        assert!(after.accept_encoding, "the route learned");
        // A rebuild keyed before the flag flipped still may not share its
        // answer: its waiters may accept other codings.
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding"), before);
        assert_eq!(v, Verdict::Pass("vary"));
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding"), after);
        assert!(matches!(v, Verdict::Share { store: true, .. }));
        // Learning one header covers only that one.
        let v = classify(&p, StatusCode::OK, &varying("accept-encoding, x-a"), after);
        assert_eq!(v, Verdict::Pass("vary"));
        // Clones made from the route keep what it learned.
        assert!(Keyed::now(&p.clone()).accept_encoding);
    }
}
