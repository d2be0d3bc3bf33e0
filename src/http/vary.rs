//! A response's `Vary` against the key it would be stored under. (What a
//! route learns from it, that its origin picks a content coding per request,
//! is kept with the key: `LearnedEncoding`.)

use http::header::{ACCEPT_ENCODING, VARY};
use http::{HeaderMap, HeaderName};

use super::key::Keyed;

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
