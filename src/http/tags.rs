//! Tagging a route's entries, and purging them by tag or all at once.
//!
//! An entry's tags come from the origin's response headers (by default
//! `Surrogate-Key` and `Cache-Tag`) and from a function of the request. Tag
//! headers are read before anything else and removed from the response: they
//! are never stored in an entry, and (unless the route exposes them) never
//! reach a client. A response's tags label that response's entry only: they
//! invalidate nothing by themselves.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};

use crate::engine::TagSet;

/// A route's tags for a request.
pub(crate) type TagFn = Arc<dyn Fn(&http::request::Parts) -> Vec<String> + Send + Sync>;

/// How a route tags its entries.
#[derive(Clone)]
pub(crate) struct TagRules {
    /// Response headers whose values are tags, separated by commas or
    /// whitespace.
    pub headers: Arc<[HeaderName]>,
    /// Leave those headers on the responses sent to clients.
    pub expose: bool,
    /// Tags from the request.
    pub tag_fn: Option<TagFn>,
}

impl Default for TagRules {
    fn default() -> Self {
        TagRules {
            headers: Arc::from([
                HeaderName::from_static("surrogate-key"),
                HeaderName::from_static("cache-tag"),
            ]),
            expose: false,
            tag_fn: None,
        }
    }
}

impl std::fmt::Debug for TagRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagRules")
            .field("headers", &self.headers)
            .field("expose", &self.expose)
            .field("tag_fn", &self.tag_fn.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl TagRules {
    /// The tags the route's tag headers carry, removed from `headers`
    /// unless the route exposes them.
    pub(crate) fn take(&self, headers: &mut HeaderMap) -> TagSet {
        let tags = self.read(headers);
        if !self.expose {
            self.strip(headers);
        }
        tags
    }

    /// The fields to remove from the trailers of the answers sent to
    /// clients: the tag headers, unless the route exposes them. (Trailer
    /// fields tag nothing: a body with trailers is never stored.)
    pub(crate) fn hidden(&self) -> Option<Arc<[HeaderName]>> {
        (!self.expose && !self.headers.is_empty()).then(|| self.headers.clone())
    }

    /// Removes the tag headers: what an entry stores never has them.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) {
        for name in self.headers.iter() {
            headers.remove(name);
        }
    }

    /// Whether `headers` hold any of the tag headers. A walk over the few
    /// names a stored response has, comparing them, costs less than hashing
    /// each tag header's name for a lookup.
    pub(crate) fn any_in(&self, headers: &HeaderMap) -> bool {
        headers.keys().any(|name| self.headers.contains(name))
    }

    fn read(&self, headers: &HeaderMap) -> TagSet {
        let mut tags = TagSet::default();
        for name in self.headers.iter() {
            for value in headers.get_all(name) {
                // Tag by tag: one that is not ASCII (UTF-8, or bytes that are
                // not text, read lossily) hides none of the others.
                let parts = value
                    .as_bytes()
                    .split(|&b| b == b',' || b.is_ascii_whitespace());
                for tag in parts {
                    tags.insert(&String::from_utf8_lossy(tag));
                }
            }
        }
        tags
    }

    /// The tags the route gives this request.
    pub(crate) fn of_request(&self, parts: &http::request::Parts) -> TagSet {
        let mut tags = TagSet::default();
        if let Some(tag_fn) = &self.tag_fn {
            for tag in tag_fn(parts) {
                tags.insert(&tag);
            }
        }
        tags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderValue, CONTENT_TYPE};

    #[test]
    fn any_in_finds_a_tag_header_among_the_names() {
        let rules = TagRules::default();
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(!rules.any_in(&headers));
        headers.append("cache-tag", HeaderValue::from_static("a"));
        headers.append("cache-tag", HeaderValue::from_static("b"));
        assert!(rules.any_in(&headers));
        rules.strip(&mut headers);
        assert!(!rules.any_in(&headers));
        assert_eq!(headers.len(), 1);
    }
}
