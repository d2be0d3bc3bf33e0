//! What an axum team is promised of the headers: `Cache-Status` and
//! `x-cache` honest in every state and across guards that share a backend,
//! tag headers never reaching a client, tag purges reaching every entry,
//! the config-built guard behaving as the builder-built one, and the old
//! body type name still compiling.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::status::{cache_status, no_tag_headers};
use crate::common::{get as request, request_with, send, Answer, Origin};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use http::{header, HeaderName, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

/// Whether `line` is one RFC 8941 list member of the shape this layer
/// writes: a token or string name, then `; key[=value]` parameters whose
/// values are integers, tokens or strings.
fn is_sf_member(line: &str) -> bool {
    fn token(s: &str) -> bool {
        let mut c = s.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '*')
            && c.all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c))
    }
    fn string(s: &str) -> bool {
        let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
            return false;
        };
        let mut escaped = false;
        for c in inner.chars() {
            match (escaped, c) {
                (true, '"' | '\\') => escaped = false,
                (true, _) => return false,
                (false, '\\') => escaped = true,
                (false, '"') => return false,
                (false, c) if !(' '..='~').contains(&c) => return false,
                _ => {}
            }
        }
        !escaped
    }
    fn integer(s: &str) -> bool {
        let digits = s.strip_prefix('-').unwrap_or(s);
        !digits.is_empty() && digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit())
    }
    let mut parts = line.split("; ");
    let Some(name) = parts.next() else {
        return false;
    };
    (token(name) || string(name))
        && parts.all(|p| match p.split_once('=') {
            None => p.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
            Some((k, v)) => {
                k.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                    && (integer(v) || token(v) || string(v))
            }
        })
}

/// Our one member, checked for syntax.
fn ours(answer: &Answer) -> String {
    let all = cache_status(answer);
    assert_eq!(all.len(), 1, "exactly one member: {all:?}");
    assert!(
        is_sf_member(&all[0]),
        "not a structured-field member: {:?}",
        all[0]
    );
    all[0].clone()
}

/// `/r` answers `v<n>` with an `ETag`, tags in two header lines and both tag
/// headers, and an upstream `Cache-Status` of its own.
fn app(origin: &Origin, guard: StampedeGuard) -> Router {
    let o = origin.clone();
    Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            async move {
                let (n, _) = origin.enter();
                let mut h = HeaderMap::new();
                h.insert(header::ETAG, "\"e\"".parse().unwrap());
                h.append("surrogate-key", "line-one".parse().unwrap());
                h.append("surrogate-key", "line-two".parse().unwrap());
                h.insert("cache-tag", "ct-a,ct-b".parse().unwrap());
                h.append("cache-status", "upstream; fwd=miss".parse().unwrap());
                h.append("cache-status", "\"odd, \\\"quoted\"; hit".parse().unwrap());
                (h, format!("v{n}"))
            }
        })
        .layer(guard),
    )
}

#[tokio::test]
async fn every_state_has_one_valid_member_and_no_tag_header() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let app = app(&origin, guard.clone());

    // Starters of every shape: HEAD, Range, conditional.
    let head = send(&app, request_with("HEAD", "/r", &[])).await;
    no_tag_headers(&head, "a HEAD miss");
    assert!(
        ours(&head).starts_with("stampede-guard; fwd=uri-miss"),
        "{head:?}"
    );
    assert_eq!(origin.calls(), 1);
    guard.invalidate_all().await.unwrap();
    let range = send(&app, request_with("GET", "/r", &[("range", "bytes=0-0")])).await;
    assert_eq!(range.status, StatusCode::PARTIAL_CONTENT);
    no_tag_headers(&range, "a Range miss");
    ours(&range);
    guard.invalidate_all().await.unwrap();
    let cond = send(
        &app,
        request_with("GET", "/r", &[("if-none-match", "\"e\"")]),
    )
    .await;
    assert_eq!(cond.status, StatusCode::NOT_MODIFIED);
    no_tag_headers(&cond, "a conditional miss");
    ours(&cond);
    guard.invalidate_all().await.unwrap();
    // A plain starter streams the origin's answer: the upstream members
    // stay before ours, and the tags are gone.
    let plain = send(&app, request("/r")).await;
    no_tag_headers(&plain, "a plain miss");
    let all = cache_status(&plain);
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(is_sf_member(&all[2]), "{all:?}");
    assert_eq!(origin.calls(), 4);

    // Hits of every shape: one member of ours, nothing replayed.
    for (what, req) in [
        ("GET", request("/r")),
        ("HEAD", request_with("HEAD", "/r", &[])),
        (
            "Range",
            request_with("GET", "/r", &[("range", "bytes=0-0")]),
        ),
        ("416", request_with("GET", "/r", &[("range", "bytes=99-")])),
        (
            "304",
            request_with("GET", "/r", &[("if-none-match", "W/\"e\"")]),
        ),
    ] {
        let hit = send(&app, req).await;
        no_tag_headers(&hit, what);
        let m = ours(&hit);
        assert!(m.starts_with("stampede-guard; hit; ttl="), "{what}: {m}");
        assert_eq!(hit.x_cache(), "HIT", "{what}");
    }
    assert_eq!(origin.calls(), 4);

    // Every tag of both headers and both lines labels the entry.
    for tag in ["line-one", "line-two", "ct-a", "ct-b"] {
        guard.invalidate_tag(tag).await.unwrap();
        let again = send(&app, request("/r")).await;
        assert_eq!(again.x_cache(), "MISS", "{tag} did not reach the entry");
    }
    assert_eq!(origin.calls(), 8);
}

/// Two guards on one backend, as two instances of a fleet with different
/// settings (a rolling config change): the one with the headers turned off
/// must not emit them on the other's entries, nor emit the other's header
/// name.
#[tokio::test]
async fn a_guard_without_the_headers_emits_none_on_anothers_entries() {
    // Guards on one backend share the entries of requests that name a host
    // (a host-less request is keyed under the guard that got it).
    let request = |uri: &str| {
        let mut r = request(uri);
        r.headers_mut()
            .insert(header::HOST, "shop.test".parse().unwrap());
        r
    };
    let origin = Origin::default();
    let backend = Backend::local();
    let loud = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
    let quiet = StampedeGuard::new(backend.clone())
        .ttl(Duration::from_secs(60))
        .cache_status(false)
        .x_cache_header(None);
    let renamed = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(60))
        .x_cache_header(Some(HeaderName::from_static("x-edge")));
    let loud = app(&origin, loud);
    let quiet = app(&origin, quiet);
    let renamed = app(&origin, renamed);

    let built = send(&loud, request("/r")).await;
    assert_eq!(built.x_cache(), "MISS");
    let hit = send(&quiet, request("/r")).await;
    assert_eq!(hit.text(), "v1", "the shared entry");
    assert!(hit.headers.get("x-cache").is_none(), "{:?}", hit.headers);
    assert!(cache_status(&hit).is_empty(), "{:?}", hit.headers);

    let other = send(&renamed, request("/r")).await;
    assert_eq!(other.text(), "v1");
    assert_eq!(other.headers.get("x-edge").unwrap(), "HIT");
    assert!(
        other.headers.get("x-cache").is_none(),
        "{:?}",
        other.headers
    );

    // The other way round: the quiet guard builds, the loud one hits and
    // its headers say so.
    let built = send(&quiet, request("/r?q")).await;
    assert!(built.headers.get("x-cache").is_none());
    // Only the origin's upstream members, passed on: none of ours.
    assert_eq!(cache_status(&built).len(), 2, "{:?}", built.headers);
    assert!(!cache_status(&built)
        .iter()
        .any(|m| m.starts_with("stampede-guard")));
    let hit = send(&loud, request("/r?q")).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert!(ours(&hit).starts_with("stampede-guard; hit; ttl="));
}

/// An entry renewed by a `304` that carries no tags keeps its tags (from
/// the header and from the request): a purge of either still drops it.
#[tokio::test]
async fn a_renewed_entry_is_still_purged_by_its_tags() {
    for tag in ["from-header", "path:/p"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let guard = StampedeGuard::new(Backend::local())
            .ttl(Duration::from_millis(300))
            .stale_if_error(Duration::from_secs(60))
            .tags(|parts| vec![format!("path:{}", parts.uri.path())]);
        let app = Router::new().route(
            "/p",
            get(move |headers: HeaderMap| {
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if headers.get("if-none-match").is_some() {
                        // A bare 304: no tags.
                        let mut h = HeaderMap::new();
                        h.insert(header::ETAG, "\"e\"".parse().unwrap());
                        return (StatusCode::NOT_MODIFIED, h, String::new());
                    }
                    let mut h = HeaderMap::new();
                    h.insert(header::ETAG, "\"e\"".parse().unwrap());
                    h.insert("surrogate-key", "from-header".parse().unwrap());
                    (StatusCode::OK, h, format!("v{n}"))
                }
            })
            .layer(guard.clone()),
        );
        assert_eq!(send(&app, request("/p")).await.text(), "v1");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let renewed = send(&app, request("/p")).await;
        assert_eq!(renewed.text(), "v1", "renewed by the 304");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(send(&app, request("/p")).await.x_cache(), "HIT");
        guard.invalidate_tag(tag).await.unwrap();
        let after = send(&app, request("/p")).await;
        assert_eq!(after.x_cache(), "MISS", "{tag}: the renewed entry survived");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}

/// A guard built from a config behaves as the builder-built one.
#[cfg(feature = "serde")]
#[tokio::test]
async fn a_configured_guard_answers_as_the_built_one() {
    use stampede_guard::RouteConfig;
    let config: RouteConfig = serde_json::from_str(
        r#"{ "ttl": "60s", "vary": ["Accept-Language"], "cacheable_statuses": [200, 404],
             "max_body_bytes": 2 }"#,
    )
    .unwrap();
    let built = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(60))
        .vary([header::ACCEPT_LANGUAGE])
        .cacheable_statuses([StatusCode::OK, StatusCode::NOT_FOUND])
        .max_body_bytes(2);
    let configured = StampedeGuard::new(Backend::local()).with_config(&config);
    let mut seen = Vec::new();
    for guard in [built, configured] {
        let origin = Origin::default();
        let app = app(&origin, guard);
        let mut trace = Vec::new();
        for lang in ["en", "fr", "en", "EN"] {
            let a = send(
                &app,
                request_with("GET", "/r", &[("accept-language", lang)]),
            )
            .await;
            trace.push(format!("{} {} {}", a.status, a.x_cache(), a.text()));
        }
        trace.push(origin.calls().to_string());
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1]);
    // Duplicated and unknown fields are refused, as are odd names.
    for bad in [
        r#"{ "ttl": "1s", "ttl": "2s" }"#,
        r#"{ "tll": "1s" }"#,
        r#"{ "vary": ["accept language"] }"#,
        r#"{ "ttl": "-1s" }"#,
        r#"{ "ttl": 30 }"#,
    ] {
        assert!(serde_json::from_str::<RouteConfig>(bad).is_err(), "{bad}");
    }
}

/// Code written against the old name still compiles.
#[allow(deprecated)]
#[test]
fn the_old_body_name_still_compiles() {
    use stampede_guard::Body;
    fn takes(_: Option<http::Response<Body<axum::body::Body>>>) {}
    takes(None);
    let _same: Option<stampede_guard::GuardBody<axum::body::Body>> = None::<Body<axum::body::Body>>;
}

/// The same across two instances on one real Redis: the quiet instance
/// takes the loud one's entry from Redis and adds no header it turned off.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_fleet_a_quiet_instance_adds_no_status_header() {
    let redis = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let loud = StampedeGuard::new(crate::common::driver::connect(&redis).await)
        .ttl(Duration::from_secs(60));
    let quiet = StampedeGuard::new(crate::common::driver::connect(&redis).await)
        .ttl(Duration::from_secs(60))
        .cache_status(false)
        .x_cache_header(None);
    let loud = app(&origin, loud);
    let quiet = app(&origin, quiet);
    assert_eq!(send(&loud, request("/r")).await.x_cache(), "MISS");
    let hit = send(&quiet, request("/r")).await;
    assert_eq!(hit.text(), "v1", "taken from Redis");
    assert_eq!(origin.calls(), 1);
    assert!(hit.headers.get("x-cache").is_none(), "{:?}", hit.headers);
    assert!(cache_status(&hit).is_empty(), "{:?}", hit.headers);
    no_tag_headers(&hit, "a hit from Redis");
}

/// What the crate writes it reads back: a config serialised from any value
/// in a field's range loads again to the same value, and one out of range is
/// refused by name, never clamped and never a panic.
#[cfg(feature = "serde")]
#[test]
fn a_serialised_config_loads_back() {
    use stampede_guard::RouteConfig;
    let accepted = Duration::from_millis(1)..=Duration::from_secs(1 << 31);
    for d in [
        Duration::MAX,
        Duration::from_nanos(1),
        Duration::ZERO,
        Duration::from_secs(u64::MAX / 2),
        Duration::new(1, 999_999_999),
        Duration::from_millis(1),
        Duration::from_secs(1 << 31),
    ] {
        let mut config = RouteConfig::default();
        config.ttl = Some(d);
        config.lease = Some(d);
        let text = serde_json::to_string(&config).unwrap();
        let back: Result<RouteConfig, _> = serde_json::from_str(&text);
        if accepted.contains(&d) {
            let back = back.unwrap_or_else(|e| panic!("{d:?} written as {text}: {e}"));
            assert_eq!((back.ttl, back.lease), (Some(d), Some(d)), "{text}");
        } else {
            let message = back.expect_err(&text).to_string();
            // The lease's range is the narrower one (a ttl may be 0).
            assert!(
                message.contains("`ttl`") || message.contains("`lease`"),
                "{d:?}: {message}"
            );
        }
    }
}
