//! Request → cache key.
//!
//! A request's key is the digest of everything that selects its response:
//! namespace, host, path, the query with its pairs sorted, and the values of
//! the route's Vary headers (HEAD shares GET's entry, and nothing else reaches
//! here, so the method adds nothing). The Vary values select a variant within
//! the URL's group ([`RequestKey`]), so that one invalidation drops them all.

use http::header::HOST;
use http::request::Parts;
use http::HeaderName;

use crate::key::{Key, KeyHasher};

/// A request's key in two parts (RFC 9111 §4.1): the URL's key, which names
/// the group an invalidation drops, and the key of the variant the request
/// selects within it, under which the response is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestKey {
    /// Namespace and the request's target (or the route's custom key).
    pub url: Key,
    /// `url` and the values of the route's Vary headers; a member of `url`'s
    /// group (the URL key itself when the route varies on nothing).
    pub key: Key,
}

/// The key of a request. `custom` replaces host, path and query when the route
/// supplies its own key function.
pub(crate) fn request_key(
    namespace: &str,
    parts: &Parts,
    vary: &[HeaderName],
    custom: Option<&str>,
) -> Key {
    split_key(namespace, parts, vary, custom).key
}

/// Both parts of a request's key.
pub(crate) fn split_key(
    namespace: &str,
    parts: &Parts,
    vary: &[HeaderName],
    custom: Option<&str>,
) -> RequestKey {
    let url = url_key(namespace, parts, custom);
    RequestKey {
        url,
        key: variant_key(&url, parts, vary),
    }
}

/// The URL part: what names the resource, whatever the variant.
pub(crate) fn url_key(namespace: &str, parts: &Parts, custom: Option<&str>) -> Key {
    // "h1": responses, key format 1. HEAD is answered from the GET entry and
    // nothing else reaches here, so the method adds nothing to the key.
    let mut h = KeyHasher::new(b"h1");
    h.part(namespace.as_bytes());
    match custom {
        Some(custom) => {
            h.part(b"custom");
            h.part(custom.as_bytes());
        }
        None => {
            let host = parts
                .uri
                .authority()
                .map(|a| a.as_str().as_bytes())
                .or_else(|| parts.headers.get(HOST).map(|v| v.as_bytes()))
                .unwrap_or_default();
            h.part_lowercase(host);
            h.part(parts.uri.path().as_bytes());
            h.part_query(parts.uri.query().unwrap_or(""));
        }
    }
    h.finish()
}

/// The variant part: the URL key and the values of the Vary headers.
pub(crate) fn variant_key(url: &Key, parts: &Parts, vary: &[HeaderName]) -> Key {
    if vary.is_empty() {
        return *url;
    }
    // "h1v": a variant of a response's URL.
    let mut h = KeyHasher::new(b"h1v");
    h.part(url.as_bytes());
    for name in vary {
        h.part(name.as_str().as_bytes());
        let mut values = parts.headers.get_all(name).iter().peekable();
        if values.peek().is_none() {
            // "absent" must differ from "present and empty".
            h.part(b"\x00absent");
        }
        for value in values {
            h.part(value.as_bytes());
        }
    }
    h.finish_in(url)
}

/// Sorts the query's pairs so that `?b=2&a=1` and `?a=1&b=2` share an entry, and
/// drops empty pairs (`?a=1&&`). Values keep their encoding: `%41` and `A` stay
/// different, as an origin may treat them differently. (The key hashes these
/// bytes without building the string; this is its reference form.)
#[cfg(test)]
pub(crate) fn normalize_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if pairs.len() > 1 {
        pairs.sort_unstable();
    }
    pairs.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use proptest::prelude::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::get(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn key(uri: &str, headers: &[(&str, &str)], vary: &[&str]) -> Key {
        let vary: Vec<HeaderName> = vary.iter().map(|v| v.parse().unwrap()).collect();
        request_key("ns", &parts(uri, headers), &vary, None)
    }

    #[test]
    fn query_order_does_not_change_the_key() {
        assert_eq!(key("/r?a=1&b=2", &[], &[]), key("/r?b=2&a=1&", &[], &[]));
        assert_ne!(key("/r?a=1&b=2", &[], &[]), key("/r?a=1&b=3", &[], &[]));
    }

    #[test]
    fn host_path_and_namespace_separate_keys() {
        let h = |host| key("/r", &[("host", host)], &[]);
        assert_ne!(h("a.example"), h("b.example"));
        assert_eq!(h("A.example"), h("a.example"));
        assert_ne!(key("/r", &[], &[]), key("/s", &[], &[]));
        let p = parts("/r", &[]);
        assert_ne!(
            request_key("a", &p, &[], None),
            request_key("b", &p, &[], None)
        );
    }

    #[test]
    fn vary_headers_split_entries_and_absence_is_distinct() {
        let v = |hs: &[(&str, &str)]| key("/r", hs, &["accept-language"]);
        assert_ne!(
            v(&[("accept-language", "en")]),
            v(&[("accept-language", "fr")])
        );
        assert_ne!(v(&[]), v(&[("accept-language", "")]));
        // Headers the route does not vary on do not matter.
        assert_eq!(v(&[("x-other", "1")]), v(&[("x-other", "2")]));
    }

    #[test]
    fn every_variant_belongs_to_its_urls_group() {
        let vary: Vec<HeaderName> = vec!["accept-language".parse().unwrap()];
        let en = split_key(
            "ns",
            &parts("/r", &[("accept-language", "en")]),
            &vary,
            None,
        );
        let fr = split_key(
            "ns",
            &parts("/r", &[("accept-language", "fr")]),
            &vary,
            None,
        );
        let other = split_key(
            "ns",
            &parts("/s", &[("accept-language", "en")]),
            &vary,
            None,
        );
        assert_eq!(en.url, fr.url);
        assert_ne!(en.key, fr.key);
        assert_eq!(en.key.group(), en.url);
        assert_eq!(fr.key.group(), fr.url);
        assert_ne!(other.key.group(), en.url);
        // A variant never takes its URL's own key.
        assert_ne!(en.key, en.url);
        assert!(!en.key.is_group());
        // Without Vary the URL key is the entry's key.
        let plain = split_key("ns", &parts("/r", &[]), &[], None);
        assert_eq!(plain.key, plain.url);
        assert!(plain.key.is_group());
    }

    #[test]
    fn custom_key_replaces_the_url() {
        let p1 = parts("/a?x=1", &[]);
        let p2 = parts("/b?y=2", &[]);
        assert_eq!(
            request_key("ns", &p1, &[], Some("k")),
            request_key("ns", &p2, &[], Some("k"))
        );
    }

    #[test]
    fn value_keys_and_request_keys_never_meet() {
        let p = parts("/k", &[]);
        assert_ne!(
            Key::for_value("ns", b"/k"),
            request_key("ns", &p, &[], None)
        );
    }

    fn hashed_query(query: &str) -> Key {
        let mut h = KeyHasher::new(b"q");
        h.part_query(query);
        h.finish()
    }

    fn hashed_reference(query: &str) -> Key {
        let mut h = KeyHasher::new(b"q");
        h.part(normalize_query(query).as_bytes());
        h.finish()
    }

    proptest! {
        #[test]
        fn hashing_the_query_in_place_matches_its_reference_form(pairs in proptest::collection::vec("[a-z]{0,3}=?[a-z0-9]{0,3}", 0..40)) {
            let query = pairs.join("&");
            prop_assert_eq!(hashed_query(&query), hashed_reference(&query));
        }

        #[test]
        fn normalised_query_is_order_independent(mut pairs in proptest::collection::vec("[a-z]{1,3}=[a-z0-9]{0,3}", 0..8)) {
            let a = normalize_query(&pairs.join("&"));
            pairs.reverse();
            let b = normalize_query(&pairs.join("&"));
            prop_assert_eq!(a, b);
        }
    }
}
