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

use super::layer::StampedeGuard;
use crate::engine::TagSet;
use crate::store::generations::Field;

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

impl StampedeGuard {
    /// Tags every entry of the route with what `tag_fn` returns for the
    /// request that built it, beside the tags of the response's
    /// [tag headers](Self::tag_headers). Invalidate them with
    /// [`invalidate_tag`](Self::invalidate_tag). Tags are compared exactly
    /// (case matters), without surrounding whitespace; an empty one is none.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// // `/products/42` is tagged `product:42`.
    /// let guard = StampedeGuard::new(Backend::local()).tags(|req| {
    ///     let id = req.uri.path().strip_prefix("/products/").unwrap_or("");
    ///     vec![format!("product:{id}"), "products".to_owned()]
    /// });
    /// # let _ = guard;
    /// ```
    pub fn tags<F>(self, tag_fn: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Vec<String> + Send + Sync + 'static,
    {
        let tag_fn: TagFn = Arc::new(tag_fn);
        self.with(|p| p.tags.tag_fn = Some(tag_fn))
    }

    /// Response headers whose values tag the entry (default `Surrogate-Key`
    /// and `Cache-Tag`; an empty list reads none). Tags are separated by
    /// commas or whitespace (a tag in UTF-8 is read as such; bytes that are
    /// not text never hide the other tags of their line); an answer with
    /// tags in more than 256 of the
    /// 4096 tag buckets is served but not stored.
    pub fn tag_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let headers: Arc<[HeaderName]> = headers.into_iter().collect();
        self.with(|p| p.tags.headers = headers)
    }

    /// Leave the tag headers on the answer of the request that rebuilt the
    /// entry (default: removed, as a CDN removes `Surrogate-Key`). They are
    /// never stored, so hits never carry them.
    pub fn expose_tag_headers(self, on: bool) -> Self {
        self.with(|p| p.tags.expose = on)
    }

    /// Drops every entry tagged `tag` (by any route on this backend, or by
    /// [`tags`](Self::tags)), here and, with a Redis backend, in Redis and
    /// on every instance: O(1), whatever the number of entries (a generation
    /// moves; entries recorded the older one).
    ///
    /// The same barrier as [`invalidate`](Self::invalidate): once it returns
    /// `Ok`, no request that starts afterwards, on any instance, is answered
    /// with a value built before it. Every rebuild running when it is called
    /// (whatever its tags: they are known only when it ends) stores nothing
    /// and answers only the requests already waiting for it.
    ///
    /// Tags share 4096 buckets: invalidating one also drops the entries of
    /// the tags that share its bucket (more misses, never a stale answer).
    ///
    /// # Errors
    ///
    /// When the backend has a Redis tier and the invalidation did not reach
    /// it (Redis down, the deadline passed; it was tried for four
    /// deadlines). It may have reached Redis without an answer, or not at
    /// all: nothing is promised then, and this process holds no memory of
    /// it. Call it again.
    pub async fn invalidate_tag(&self, tag: &str) -> Result<(), crate::Error> {
        self.backend
            .engine
            .invalidate_field(Field::of_tag(tag.trim()))
            .await
    }

    /// Drops every entry of the backend (every route and every
    /// [`Cache`](crate::Cache) on it), here and on every instance: the same
    /// barrier and errors as [`invalidate_tag`](Self::invalidate_tag).
    pub async fn invalidate_all(&self) -> Result<(), crate::Error> {
        self.backend.engine.invalidate_field(Field::All).await
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
