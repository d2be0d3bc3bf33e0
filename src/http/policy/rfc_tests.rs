//! What `classify` and `request_bypass` make of RFC 9111 fields: revalidation
//! directives, `Expires`, unparseable `Cache-Control`, a request's `no-store`.

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
fn revalidation_directives_forbid_stale_even_without_respect() {
    let p = Policy {
        store: StoreRules {
            lifetime: Lifetime {
                ttl: Duration::from_secs(10),
                stale_while_revalidate: Duration::from_secs(100),
                stale_if_error: Duration::from_secs(100),
                revalidation: Duration::ZERO,
            },
            ..StoreRules::default()
        },
        ..Policy::default()
    };
    for line in [
        "must-revalidate",
        "proxy-revalidate",
        "s-maxage=5",
        "public; must-revalidate",
    ] {
        for respect in [false, true] {
            let p = Policy {
                store: StoreRules {
                    respect_cache_control: respect,
                    ..p.store.clone()
                },
                ..p.clone()
            };
            let v = classify(
                &p,
                StatusCode::OK,
                &headers(&[("cache-control", line)]),
                Keyed::now(&p.keys),
            );
            let Verdict::Share { lifetime, store } = v else {
                panic!("{line}: {v:?}")
            };
            assert!(store, "{line}");
            assert_eq!(lifetime.stale_while_revalidate, Duration::ZERO, "{line}");
            assert_eq!(lifetime.stale_if_error, Duration::ZERO, "{line}");
        }
    }
}

#[test]
fn unparseable_cache_control_passes() {
    for p in [
        Policy::default(),
        Policy {
            store: StoreRules {
                cache_private: true,
                respect_cache_control: true,
                ..StoreRules::default()
            },
            ..Policy::default()
        },
    ] {
        let v = classify(
            &p,
            StatusCode::OK,
            &headers(&[("cache-control", "max-age=60, \"")]),
            Keyed::now(&p.keys),
        );
        assert!(matches!(v, Verdict::Pass(_)), "{v:?}");
    }
}

#[test]
fn expires_gives_the_lifetime_when_respected() {
    let now = SystemTime::now();
    let at = |t: SystemTime| httpdate::fmt_http_date(t).leak() as &'static str;
    let p = Policy {
        store: StoreRules {
            respect_cache_control: true,
            ..StoreRules::default()
        },
        ..Policy::default()
    };
    let fresh = headers(&[
        ("date", at(now)),
        ("expires", at(now + Duration::from_secs(300))),
    ]);
    let Verdict::Share { lifetime, store } =
        classify(&p, StatusCode::OK, &fresh, Keyed::now(&p.keys))
    else {
        panic!()
    };
    assert!(store);
    assert!(lifetime.ttl > Duration::from_secs(290) && lifetime.ttl <= Duration::from_secs(300));
    // The route's ttl stays without respect_cache_control.
    let Verdict::Share { lifetime, store } = classify(
        &Policy::default(),
        StatusCode::OK,
        &fresh,
        Keyed::now(&Policy::default().keys),
    ) else {
        panic!()
    };
    assert!(store);
    assert_eq!(lifetime.ttl, Policy::default().store.lifetime.ttl);
    // max-age wins over Expires (RFC 9111 §5.3).
    let mut h = headers(&[("expires", "0"), ("cache-control", "max-age=60")]);
    assert!(matches!(
        classify(&p, StatusCode::OK, &h, Keyed::now(&p.keys)),
        Verdict::Share { store: true, .. }
    ));
    // Expired or invalid: never stored, respected or not.
    for expires in [
        "0",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        at(now - Duration::from_secs(5)),
    ] {
        h = headers(&[("expires", expires)]);
        for policy in [&p, &Policy::default()] {
            let v = classify(policy, StatusCode::OK, &h, Keyed::now(&policy.keys));
            assert!(
                matches!(v, Verdict::Share { store: false, .. }),
                "{expires}: {v:?}"
            );
        }
    }
}

#[test]
fn request_directives_change_nothing_by_default() {
    let p = Policy::default();
    let get = Method::GET;
    for (name, line) in [
        ("cache-control", "no-store"),
        ("cache-control", "no-cache"),
        ("cache-control", "max-age=0"),
        ("cache-control", "max-age=0, no-store, no-cache"),
        ("pragma", "no-cache"),
    ] {
        let h = headers(&[(name, line)]);
        assert_eq!(request_bypass(&p.store, &get, &h), None, "{name}: {line}");
    }
}

#[test]
fn a_route_that_follows_request_directives_passes_them() {
    let mut p = Policy::default();
    p.store.respect_request_cache_control = true;
    let get = Method::GET;
    for line in [
        "no-store",
        "max-age=0; no-store",
        "No-Store",
        "no-cache no-store",
    ] {
        let h = headers(&[("cache-control", line)]);
        assert_eq!(
            request_bypass(&p.store, &get, &h),
            Some(Pass::RequestNoStore),
            "{line}"
        );
    }
    for (name, line) in [
        ("cache-control", "no-cache"),
        ("cache-control", "max-age=0"),
        ("cache-control", "Max-Age = \"0\" , public"),
        ("cache-control", "no-cache=\"set-cookie\""),
        ("pragma", "no-cache"),
    ] {
        let h = headers(&[(name, line)]);
        assert_eq!(
            request_bypass(&p.store, &get, &h),
            Some(Pass::RequestNoCache),
            "{name}: {line}"
        );
    }
    for (name, line) in [
        ("cache-control", "max-age=10"),
        ("cache-control", "no-storex"),
        ("cache-control", "max-stale"),
        ("pragma", "x-no-cache"),
    ] {
        let h = headers(&[(name, line)]);
        assert_eq!(request_bypass(&p.store, &get, &h), None, "{name}: {line}");
    }
    // RFC 9111 §5.4: with Cache-Control present, Pragma is not read.
    let h = headers(&[("cache-control", "max-age=10"), ("pragma", "no-cache")]);
    assert_eq!(request_bypass(&p.store, &get, &h), None);
    // The safety rules come first, whatever the directives.
    let h = headers(&[("authorization", "x"), ("cache-control", "no-store")]);
    assert_eq!(request_bypass(&p.store, &get, &h), Some(Pass::Credentials));
}

/// A qualified `private` or `no-cache`, alone: the response is stored (its
/// named fields are not, see `response::take_one_clients`), in
/// `Cache-Control` or a targeted field, whether the route follows the
/// origin's freshness or not.
#[test]
fn a_qualified_private_or_no_cache_alone_is_stored() {
    for respect in [false, true] {
        let p = Policy {
            store: StoreRules {
                respect_cache_control: respect,
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        for h in [
            &[("cache-control", "no-cache=\"a\"")][..],
            &[("cache-control", "no-cache=\"a, b\", max-age=3600")],
            &[("cache-control", "private=\"x-user\", max-age=60")],
            &[("cdn-cache-control", "max-age=60, private=\"x-user\"")],
        ] {
            let v = classify(&p, StatusCode::OK, &headers(h), Keyed::now(&p.keys));
            assert!(
                matches!(v, Verdict::Share { store: true, .. }),
                "{respect} {h:?}: {v:?}"
            );
        }
        // Beside the plain form, or a list that cannot be honoured: passed.
        for h in [
            &[("cache-control", "private=\"x-user\", private, max-age=60")][..],
            &[
                ("cache-control", "no-cache=\"a\""),
                ("cache-control", "no-cache"),
            ],
            &[("cache-control", "private=\"\", max-age=60")],
            &[("cache-control", "no-cache=\"vary\", max-age=60")],
            &[(
                "cdn-cache-control",
                "max-age=60, private, private=\"x-user\"",
            )],
        ] {
            let v = classify(&p, StatusCode::OK, &headers(h), Keyed::now(&p.keys));
            assert_eq!(v, Verdict::Pass(Pass::Private), "{respect} {h:?}");
        }
    }
}

fn directive() -> impl Strategy<Value = String> {
    prop_oneof![
        "max-age=[0-9]{1,6}",
        "s-maxage=[0-9]{1,4}",
        Just("public".to_string()),
        Just("must-revalidate".to_string()),
        Just("immutable".to_string()),
        "[a-z][a-z-]{0,8}",
        "[a-z]{1,5}=\"[a-z ,;=]{0,6}\"",
    ]
}

proptest! {
    #[test]
    fn a_forbidding_word_is_never_stored(
        before in proptest::collection::vec(directive(), 0..4),
        after in proptest::collection::vec(directive(), 0..4),
        word in prop::sample::select(vec!["private", "no-store", "no-cache", "PRIVATE", "No-Cache", "private=x", "private=\"\"", "no-cache=\"a b\"", "no-cache=\"vary\""]),
        seps in proptest::collection::vec("[,; \t]{1,3}", 9),
        respect in any::<bool>(),
        strip in any::<bool>(),
    ) {
        let mut parts = before;
        parts.push(word.to_string());
        parts.extend(after);
        let mut line = String::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                line.push_str(&seps[i % seps.len()]);
            }
            line.push_str(part);
        }
        let value = HeaderValue::from_str(&line).unwrap();
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, value);
        let p = Policy {
            store: StoreRules {
                respect_cache_control: respect,
                strip_set_cookie: strip,
                ..StoreRules::default()
            },
            ..Policy::default()
        };
        let v = classify(&p, StatusCode::OK, &h, Keyed::now(&p.keys));
        prop_assert!(matches!(v, Verdict::Pass(_)), "{:?} gave {:?}", line, v);
    }
}
