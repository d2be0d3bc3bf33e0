//! Request → cache key.
//!
//! A request's key is the digest of everything that selects its response:
//! namespace, host, path, the query with its pairs sorted by name, the values
//! of the route's Vary headers and of the forwarding headers the deployment
//! keys on (HEAD shares GET's entry, and nothing else reaches here, so the
//! method adds nothing). The Vary values (and `Accept-Encoding`) select a
//! variant within the URL's group ([`RequestKey`]), so that one invalidation
//! drops them all.
//!
//! The key is what the client asked for, exactly as the handler sees it: the
//! URI before any router stripped a prefix (axum's `OriginalUri`), and the
//! host of an absolute-form target, which the service also writes into `Host`
//! (RFC 9112 §3.2.2) so the handler reads the same one.

use http::header::{ACCEPT_ENCODING, FORWARDED, HOST};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};

use super::headers::{hash_accept_encoding, hash_forwarded};
use super::policy::Policy;
use crate::key::{Key, KeyHasher};

/// The forwarding headers keyed on by default: the ones frameworks read the
/// request's host, scheme, port or path prefix from.
pub(crate) static DEFAULT_FORWARDED: [HeaderName; 5] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    FORWARDED,
];

/// What a request's key was made of, beyond the route's fixed settings: the
/// rebuild judges the origin's `Vary` against the key its waiters share, not
/// against what the route has learned since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keyed {
    pub accept_encoding: bool,
}

impl Keyed {
    /// What keys made now include.
    pub(crate) fn now(policy: &Policy) -> Self {
        Keyed {
            accept_encoding: policy.learned_encoding.get()
                || policy.vary.contains(&ACCEPT_ENCODING),
        }
    }
}

/// What, besides the URL, a route keys on.
pub(crate) struct KeyRules<'a> {
    pub namespace: &'a str,
    /// The route's Vary headers; `accept-encoding` among them is keyed in its
    /// normalised form.
    pub vary: &'a [HeaderName],
    /// The forwarding headers the deployment keys on.
    pub forwarded: &'a [HeaderName],
    /// Key on the normalised `Accept-Encoding` (listed in `vary`, or learned
    /// from the origin's `Vary`).
    pub accept_encoding: bool,
}

impl<'a> KeyRules<'a> {
    /// What `policy` keys on, with `Accept-Encoding` as `keyed` says.
    pub(crate) fn of(policy: &'a Policy, keyed: Keyed) -> Self {
        KeyRules {
            namespace: &policy.namespace,
            vary: &policy.vary,
            forwarded: &policy.forwarded,
            accept_encoding: keyed.accept_encoding,
        }
    }
}

/// The URI the client sent: axum's `OriginalUri` when a router has recorded
/// it (a nested router strips its prefix from the URI its routes see).
pub(crate) fn target(parts: &Parts) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}

/// The host the target names, `host[:port]` without any userinfo, when the
/// request target has an authority (absolute form, or HTTP/2 `:authority`).
pub(crate) fn target_host(parts: &Parts) -> Option<&str> {
    let authority = target(parts)
        .authority()
        .or_else(|| parts.uri.authority())?;
    let host = authority.as_str();
    Some(host.rsplit_once('@').map_or(host, |(_, host)| host))
}

/// RFC 9112 §3.2.2: when the target has an authority, `Host` is ignored and
/// replaced by it, so the handler builds its answer from the host the key was
/// made of. `Err` when that cannot be done, or when the request carries
/// several `Host` lines (which RFC 9112 §3.2 makes invalid): such a request
/// bypasses the cache.
pub(crate) fn align_host(parts: &mut Parts) -> Result<(), &'static str> {
    match target_host(parts) {
        Some(host) => {
            let value = HeaderValue::from_str(host).map_err(|_| "host")?;
            parts.headers.insert(HOST, value);
            Ok(())
        }
        None if parts.headers.get_all(HOST).iter().nth(1).is_some() => Err("host"),
        None => Ok(()),
    }
}

/// A request's key in two parts (RFC 9111 §4.1): the URL's key, which names
/// the group an invalidation drops, and the key of the variant the request
/// selects within it, under which the response is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestKey {
    /// Namespace, the request's target (or the route's custom key) and the
    /// forwarding headers keyed on.
    pub url: Key,
    /// `url` and the values of the route's Vary headers (and the normalised
    /// `Accept-Encoding`); a member of `url`'s group (the URL key itself when
    /// the route varies on nothing).
    pub key: Key,
}

/// The key of a request. `custom` replaces host, path and query when the route
/// supplies its own key function.
pub(crate) fn request_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> Key {
    split_key(rules, parts, custom).key
}

/// Both parts of a request's key.
pub(crate) fn split_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> RequestKey {
    let url = url_key(rules, parts, custom);
    RequestKey {
        url,
        key: variant_key(&url, rules, parts),
    }
}

/// The URL part: what names the resource, whatever the variant.
pub(crate) fn url_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> Key {
    // "h2": responses, key format 2 (query sorted by name only, forwarding
    // headers, variants in the URL's group). HEAD is answered from the GET
    // entry and nothing else reaches here, so the method adds nothing.
    let mut h = KeyHasher::new(b"h2");
    h.part(rules.namespace.as_bytes());
    match custom {
        Some(custom) => {
            h.part(b"custom");
            h.part(custom.as_bytes());
        }
        None => {
            let uri = target(parts);
            let host = target_host(parts)
                .map(str::as_bytes)
                .or_else(|| parts.headers.get(HOST).map(|v| v.as_bytes()));
            match host {
                Some(host) => h.part_lowercase(host),
                // No host differs from an empty one: a handler may fall back
                // to a default host for the one, not the other.
                None => h.part(b"\x00absent"),
            }
            h.part(uri.path().as_bytes());
            h.part_query(uri.query().unwrap_or(""));
        }
    }
    // Forwarding headers are usually absent: only the present ones are
    // written (name, count, values), so a typical key stays short. They name
    // the URL the client used (its host, scheme, prefix), so they belong to
    // the URL part.
    h.part(b"\x00forwarded");
    for name in rules.forwarded {
        if parts.headers.contains_key(name) {
            hash_values(&mut h, parts, name);
        }
    }
    h.finish()
}

/// The variant part: the URL key and the values of the Vary headers.
pub(crate) fn variant_key(url: &Key, rules: &KeyRules<'_>, parts: &Parts) -> Key {
    let others = rules.vary.iter().any(|name| name != ACCEPT_ENCODING);
    if !others && !rules.accept_encoding {
        return *url;
    }
    // "h2v": a variant of a response's URL.
    let mut h = KeyHasher::new(b"h2v");
    h.part(url.as_bytes());
    for name in rules.vary {
        if name != ACCEPT_ENCODING {
            hash_values(&mut h, parts, name);
        }
    }
    if rules.accept_encoding {
        hash_accept_encoding(&mut h, &parts.headers);
    }
    h.finish_in(url)
}

/// A header's name, how many lines it has (none: absent, which differs from
/// one empty line), and each line. The count keeps a value from passing for
/// the next header's name.
fn hash_values(h: &mut KeyHasher, parts: &Parts, name: &HeaderName) {
    h.part(name.as_str().as_bytes());
    let values = parts.headers.get_all(name);
    h.count(values.iter().count());
    for value in values {
        if name == FORWARDED {
            hash_forwarded(h, value.as_bytes());
        } else {
            h.part(value.as_bytes());
        }
    }
}

/// Sorts the query's pairs by name, stably, so that `?b=2&a=1` and `?a=1&b=2`
/// share an entry while `?s=1&s=2` and `?s=2&s=1` (a list whose order the
/// origin may use) do not, nor `?%73=1&s=2` and `?s=2&%73=1` (names are
/// compared decoded and case-folded), and drops empty pairs (`?a=1&&`).
/// Values keep their bytes: `%41` and `A` stay different, as an origin may
/// treat them differently. (The key hashes these bytes without building the string; this
/// is its reference form.)
#[cfg(test)]
pub(crate) fn normalize_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_by(|a, b| crate::key::cmp_query_names(a, b));
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

    fn rules<'a>(namespace: &'a str, vary: &'a [HeaderName]) -> KeyRules<'a> {
        KeyRules {
            namespace,
            vary,
            forwarded: &DEFAULT_FORWARDED,
            accept_encoding: vary.contains(&ACCEPT_ENCODING),
        }
    }

    fn key_of(p: &Parts, vary: &[&str]) -> Key {
        let vary: Vec<HeaderName> = vary.iter().map(|v| v.parse().unwrap()).collect();
        request_key(&rules("ns", &vary), p, None)
    }

    fn key(uri: &str, headers: &[(&str, &str)], vary: &[&str]) -> Key {
        key_of(&parts(uri, headers), vary)
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
        assert_ne!(h(""), key("/r", &[], &[]));
        assert_ne!(key("/r", &[], &[]), key("/s", &[], &[]));
        let p = parts("/r", &[]);
        assert_ne!(
            request_key(&rules("a", &[]), &p, None),
            request_key(&rules("b", &[]), &p, None)
        );
    }

    #[test]
    fn a_value_never_passes_for_the_next_header() {
        let v = |hs: &[(&str, &str)]| key("/r", hs, &["x-a", "x-b"]);
        assert_ne!(
            v(&[("x-a", "x-b"), ("x-b", "x-b"), ("x-b", "v")]),
            v(&[("x-a", "x-b"), ("x-a", "x-b"), ("x-b", "v")])
        );
        let f = |hs: &[(&str, &str)]| key("/r", hs, &[]);
        assert_ne!(
            f(&[
                ("x-forwarded-host", "x-forwarded-proto"),
                ("x-forwarded-proto", "http")
            ]),
            f(&[
                ("x-forwarded-host", "x-forwarded-proto"),
                ("x-forwarded-host", "http")
            ])
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
        let split = |uri, lang| {
            split_key(
                &rules("ns", &vary),
                &parts(uri, &[("accept-language", lang)]),
                None,
            )
        };
        let (en, fr, other) = (split("/r", "en"), split("/r", "fr"), split("/s", "en"));
        assert_eq!(en.url, fr.url);
        assert_ne!(en.key, fr.key);
        assert_eq!(en.key.group(), en.url);
        assert_eq!(fr.key.group(), fr.url);
        assert_ne!(other.key.group(), en.url);
        // A variant never takes its URL's own key.
        assert_ne!(en.key, en.url);
        assert!(!en.key.is_group());
        // Without Vary the URL key is the entry's key.
        let plain = split_key(&rules("ns", &[]), &parts("/r", &[]), None);
        assert_eq!(plain.key, plain.url);
        assert!(plain.key.is_group());
        // A normalised Accept-Encoding is a variant too.
        let ae = [ACCEPT_ENCODING];
        let gz = split_key(
            &rules("ns", &ae),
            &parts("/r", &[("accept-encoding", "gzip")]),
            None,
        );
        assert_eq!(gz.url, plain.url);
        assert_eq!(gz.key.group(), plain.url);
        assert_ne!(gz.key, plain.key);
    }

    #[test]
    fn custom_key_replaces_the_url() {
        let p1 = parts("/a?x=1", &[]);
        let p2 = parts("/b?y=2", &[]);
        assert_eq!(
            request_key(&rules("ns", &[]), &p1, Some("k")),
            request_key(&rules("ns", &[]), &p2, Some("k"))
        );
    }

    #[test]
    fn value_keys_and_request_keys_never_meet() {
        let p = parts("/k", &[]);
        assert_ne!(
            Key::for_value("ns", b"/k"),
            request_key(&rules("ns", &[]), &p, None)
        );
    }

    #[test]
    fn repeated_names_keep_their_order() {
        let k = |uri| key(uri, &[], &[]);
        assert_ne!(k("/r?sort=price&sort=name"), k("/r?sort=name&sort=price"));
        assert_eq!(
            k("/r?sort=price&a=1&sort=name"),
            k("/r?a=1&sort=price&sort=name")
        );
        // Values keep their bytes.
        assert_ne!(k("/r?a=%41"), k("/r?a=A"));
        assert_ne!(k("/r?a"), k("/r?a="));
        // Names an origin may decode or case-fold to one are one name.
        assert_ne!(k("/r?%61=1&a=2"), k("/r?a=2&%61=1"));
        assert_ne!(k("/r?A=1&a=2"), k("/r?a=2&A=1"));
        assert_ne!(k("/r?a+b=1&a%20b=2"), k("/r?a%20b=2&a+b=1"));
        assert_eq!(k("/r?b=1&A=2"), k("/r?A=2&b=1"));
    }

    #[test]
    fn absolute_form_target_names_the_host_and_host_follows_it() {
        let mut p = parts("http://victim.test/old", &[("host", "evil.test")]);
        let before = key_of(&p, &[]);
        assert_eq!(before, key("/old", &[("host", "victim.test")], &[]));
        align_host(&mut p).unwrap();
        assert_eq!(p.headers.get_all(HOST).iter().count(), 1);
        assert_eq!(p.headers[HOST], "victim.test");
        assert_eq!(key_of(&p, &[]), before);
        // Userinfo is no part of the host.
        let mut p = parts("http://user:pw@Victim.test:8080/old", &[]);
        align_host(&mut p).unwrap();
        assert_eq!(p.headers[HOST], "Victim.test:8080");
        assert_eq!(
            key_of(&p, &[]),
            key("/old", &[("host", "victim.test:8080")], &[])
        );
    }

    #[test]
    fn two_host_lines_are_refused() {
        let mut p = parts("/r", &[("host", "a.test"), ("host", "b.test")]);
        assert_eq!(align_host(&mut p), Err("host"));
        let mut p = parts("/r", &[("host", "a.test")]);
        assert_eq!(align_host(&mut p), Ok(()));
        assert_eq!(p.headers[HOST], "a.test");
    }

    #[cfg(feature = "axum")]
    #[test]
    fn original_uri_is_keyed_not_the_stripped_one() {
        let mut v1 = parts("/items?a=1", &[]);
        v1.extensions
            .insert(axum::extract::OriginalUri("/v1/items?a=1".parse().unwrap()));
        let mut v2 = parts("/items?a=1", &[]);
        v2.extensions
            .insert(axum::extract::OriginalUri("/v2/items?a=1".parse().unwrap()));
        assert_ne!(key_of(&v1, &[]), key_of(&v2, &[]));
        assert_eq!(key_of(&v1, &[]), key("/v1/items?a=1", &[], &[]));
    }

    #[test]
    fn forwarding_headers_are_keyed_by_default() {
        let plain = key("/r", &[], &[]);
        for (name, value) in [
            ("x-forwarded-host", "evil.test"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-port", "8443"),
            ("x-forwarded-prefix", "/evil"),
            ("forwarded", "host=evil.test"),
            ("forwarded", "proto=http"),
        ] {
            assert_ne!(key("/r", &[(name, value)], &[]), plain, "{name}: {value}");
        }
        // Per-client values split nothing.
        assert_eq!(key("/r", &[("x-forwarded-for", "192.0.2.1")], &[]), plain);
        assert_eq!(
            key("/r", &[("forwarded", "for=192.0.2.1;proto=https")], &[]),
            key("/r", &[("forwarded", "for=198.51.100.7;proto=https")], &[])
        );
        // A deployment that strips them at its edge keys on none.
        let none = KeyRules {
            forwarded: &[],
            ..rules("ns", &[])
        };
        assert_eq!(
            request_key(&none, &parts("/r", &[("x-forwarded-host", "a")]), None),
            request_key(&none, &parts("/r", &[]), None)
        );
    }

    #[test]
    fn accept_encoding_in_vary_is_normalised() {
        let v = |ae: &str| key("/r", &[("accept-encoding", ae)], &["accept-encoding"]);
        assert_eq!(v("gzip, br"), v("br,gzip"));
        assert_eq!(v("gzip, br"), v("br;q=1, gzip"));
        assert_ne!(v("gzip, br"), v("gzip"));
        assert_ne!(v("gzip"), key("/r", &[], &["accept-encoding"]));
        // Not keyed at all while the route neither lists nor learned it.
        assert_eq!(
            key("/r", &[("accept-encoding", "gzip")], &[]),
            key("/r", &[("accept-encoding", "br")], &[])
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
        fn hashing_the_query_in_place_matches_its_reference_form(pairs in proptest::collection::vec("[a-c]{0,2}=?[a-z0-9=]{0,3}", 0..40)) {
            let query = pairs.join("&");
            prop_assert_eq!(hashed_query(&query), hashed_reference(&query));
        }

        #[test]
        fn normalised_query_ignores_the_order_of_distinct_names(pairs in proptest::collection::btree_map("[a-z]{1,3}", "[a-z0-9=]{0,3}", 0..8)) {
            let mut pairs: Vec<String> = pairs.into_iter().map(|(n, v)| format!("{n}={v}")).collect();
            let a = normalize_query(&pairs.join("&"));
            pairs.reverse();
            let b = normalize_query(&pairs.join("&"));
            prop_assert_eq!(a, b);
        }

        /// Two queries share a key exactly when each name has the same
        /// sequence of pairs in both.
        #[test]
        fn queries_share_a_key_only_when_each_name_has_the_same_values(
            a in proptest::collection::vec(("(a|A|%61|b|\\+|%2B)", "(=?[xy]{0,2})"), 0..6),
            b in proptest::collection::vec(("(a|A|%61|b|\\+|%2B)", "(=?[xy]{0,2})"), 0..6),
        ) {
            let query = |pairs: &[(String, String)]| pairs.iter().map(|(n, v)| format!("{n}{v}")).collect::<Vec<_>>().join("&");
            // Names as the loosest origin reads them: decoded, case-folded.
            fn per_name(q: &str) -> std::collections::BTreeMap<String, Vec<&str>> {
                let mut map = std::collections::BTreeMap::<String, Vec<&str>>::new();
                for pair in q.split('&').filter(|p| !p.is_empty()) {
                    let name = crate::key::query_name(pair).replace("%61", "a").replace("%2B", "+").to_ascii_lowercase();
                    map.entry(name).or_default().push(pair);
                }
                map
            }
            let (qa, qb) = (query(&a), query(&b));
            prop_assert_eq!(per_name(&qa) == per_name(&qb), hashed_query(&qa) == hashed_query(&qb));
        }
    }
}
