//! Unit tests of the request key: what splits entries, what shares them,
//! and the in-place query hashing against its reference form.

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
        guard: 0,
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
    // Names a lossy parser decodes to one (U+FFFD): no pair moves.
    assert_ne!(k("/r?%FF=1&%FE=2"), k("/r?%FE=2&%FF=1"));
    assert_ne!(k("/r?b=1&a=2&%C3=3"), k("/r?a=2&b=1&%C3=3"));
    // Nor a query with any name beyond ASCII, valid UTF-8 or not: an origin
    // may fold `%C3%89` and `%C3%A9` to one name.
    assert_ne!(k("/r?%C3%A9=1&a=2"), k("/r?a=2&%C3%A9=1"));
}

fn url_of(p: &Parts) -> Key {
    split_key(&rules("ns", &[]), p, None).url
}

#[test]
fn absolute_form_target_names_the_host_and_host_follows_it() {
    let mut p = parts("http://victim.test/old", &[("host", "evil.test")]);
    let before = key_of(&p, &[]);
    assert_eq!(
        url_of(&p),
        url_of(&parts("/old", &[("host", "victim.test")]))
    );
    align_host(&mut p).unwrap();
    assert_eq!(p.headers.get_all(HOST).iter().count(), 1);
    assert_eq!(p.headers[HOST], "victim.test");
    assert_eq!(key_of(&p, &[]), before);
    // Userinfo is no part of the host.
    let mut p = parts("http://user:pw@Victim.test:8080/old", &[]);
    align_host(&mut p).unwrap();
    assert_eq!(p.headers[HOST], "Victim.test:8080");
    assert_eq!(
        url_of(&p),
        url_of(&parts("/old", &[("host", "victim.test:8080")]))
    );
}

#[test]
fn the_scheme_and_forwarding_headers_select_variants_of_one_url() {
    let h = [("host", "a.test")];
    let origin_form = split_key(&rules("ns", &[]), &parts("/r", &h), None);
    let http = split_key(&rules("ns", &[]), &parts("http://a.test/r", &h), None);
    let https = split_key(&rules("ns", &[]), &parts("https://a.test/r", &h), None);
    let upper = split_key(&rules("ns", &[]), &parts("HTTPS://a.test/r", &h), None);
    // Absent, http and https are three entries...
    assert_ne!(origin_form.key, http.key);
    assert_ne!(origin_form.key, https.key);
    assert_ne!(http.key, https.key);
    assert_eq!(https.key, upper.key);
    // ...of one URL, which an invalidation without a scheme drops.
    assert_eq!(http.url, origin_form.url);
    assert_eq!(https.url, origin_form.url);
    assert_eq!(http.key.group(), origin_form.url);
    let proto = split_key(
        &rules("ns", &[]),
        &parts("/r", &[("host", "a.test"), ("x-forwarded-proto", "http")]),
        None,
    );
    assert_ne!(proto.key, origin_form.key);
    assert_eq!(proto.url, origin_form.url);
    assert_eq!(proto.key.group(), origin_form.url);
    // With nothing to split it, the URL key is the entry's key.
    assert_eq!(origin_form.key, origin_form.url);
}

#[test]
fn two_host_lines_are_refused() {
    let mut p = parts("/r", &[("host", "a.test"), ("host", "b.test")]);
    assert_eq!(align_host(&mut p), Err(Pass::Host));
    let mut p = parts("/r", &[("host", "a.test")]);
    assert_eq!(align_host(&mut p), Ok(()));
    assert_eq!(p.headers[HOST], "a.test");
    // Whatever the target: an absolute form does not make them one.
    let mut p = parts("http://a.test/r", &[("host", "a.test"), ("host", "b.test")]);
    assert_eq!(align_host(&mut p), Err(Pass::Host));
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
    // A deployment that strips them at its edge keys on none of the five;
    // the rest of the class is told by name, and keyed whatever the route
    // lists; a header outside it is keyed only when listed.
    let none = KeyRules {
        forwarded: &[],
        ..rules("ns", &[])
    };
    let plain = request_key(&none, &parts("/r", &[]), None);
    assert_eq!(
        request_key(&none, &parts("/r", &[("x-forwarded-host", "a")]), None),
        plain
    );
    assert_ne!(
        request_key(&none, &parts("/r", &[("x-original-url", "/a")]), None),
        plain
    );
    assert_eq!(
        request_key(&none, &parts("/r", &[("x-site", "a")]), None),
        plain
    );
    let site = [HeaderName::from_static("x-site")];
    let listed = KeyRules {
        forwarded: &site,
        ..rules("ns", &[])
    };
    assert_ne!(
        request_key(&listed, &parts("/r", &[("x-site", "a")]), None),
        request_key(&listed, &parts("/r", &[]), None)
    );
}

#[test]
fn target_rewrites_are_keyed_whatever_their_order() {
    let plain = key("/r", &[], &[]);
    for (name, value) in [
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("x-original-uri", "/admin"),
        ("x-envoy-original-path", "/admin"),
        ("x-forwarded-uri", "/admin"),
        ("x-forwarded-path", "/admin"),
        ("x-forwarded-server", "evil"),
        ("x-host", "evil.test"),
        ("x_original_url", "/admin"),
        ("front-end-https", "on"),
    ] {
        let with = key("/r", &[(name, value)], &[]);
        assert_ne!(with, plain, "{name}");
        assert_ne!(with, key("/r", &[(name, "/other")], &[]), "{name}");
    }
    assert_eq!(
        key("/r", &[("x-original-url", "/a"), ("x-host", "b")], &[]),
        key("/r", &[("x-host", "b"), ("x-original-url", "/a")], &[])
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
    fn hashing_the_query_in_place_matches_its_reference_form(pairs in proptest::collection::vec("([a-c]|%FF|%C3){0,2}=?[a-z0-9=]{0,3}", 0..40)) {
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

#[test]
fn a_request_without_a_host_is_keyed_under_its_guard() {
    let of = |guard: u64, headers: &[(&str, &str)]| {
        let rules = KeyRules {
            guard,
            ..rules("ns", &[])
        };
        let p = parts("/r?x", headers);
        split_key(&rules, &p, None)
    };
    // No host, and an empty one: the guard's ordinal splits them, and the
    // two stay apart.
    assert_ne!(of(0, &[]).url, of(1, &[]).url);
    assert_ne!(of(0, &[("host", "")]).url, of(1, &[("host", "")]).url);
    assert_ne!(of(0, &[]).url, of(0, &[("host", "")]).url);
    assert_eq!(of(3, &[]), of(3, &[]));
    // A host: keyed without the ordinal.
    assert_eq!(of(0, &[("host", "a.test")]), of(7, &[("host", "a.test")]));
}

#[test]
fn names_an_origin_may_fold_together_keep_their_order() {
    // One name to some origin: never reordered relative to each other.
    for (one, other) in [
        ("a_b=1&a.b=2", "a.b=2&a_b=1"),
        ("a_b=1&a%20b=2", "a%20b=2&a_b=1"),
        ("a_b=1&%20a_b=2", "%20a_b=2&a_b=1"),
        ("a_b=1&a+b=2", "a+b=2&a_b=1"),
        ("a_b=1&a[b=2", "a[b=2&a_b=1"),
        ("a=1&a[x]=2", "a[x]=2&a=1"),
        ("a=1&a.x=2", "a.x=2&a=1"),
        ("a=1&a%00=2", "a%00=2&a=1"),
        ("a=1&%2561=2", "%2561=2&a=1"),
        ("x=1;a=2&a=3", "a=3&x=1;a=2"),
        ("a=3&x=1%3Ba=2;", "x=1%3Ba=2;&a=3"),
    ] {
        assert_ne!(
            key(&format!("/r?{one}"), &[], &[]),
            key(&format!("/r?{other}"), &[], &[]),
            "{one} / {other}"
        );
    }
    // Names no origin folds together still share an entry in any order.
    assert_eq!(key("/r?b_c=1&a=2", &[], &[]), key("/r?a=2&b_c=1", &[], &[]));
    assert_eq!(normalize_query("z=1&a-b=2"), "a-b=2&z=1");
}
