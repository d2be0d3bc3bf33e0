//! A route's policy loaded from the service's own configuration: durations
//! in human form, mistakes rejected with a message that names them, and the
//! values governing a real layer.
#![cfg(feature = "serde")]

use std::time::Duration;

use crate::common::{get as get_req, send, Origin};
use axum::routing::get;
use axum::Router;
use http::{HeaderName, StatusCode};
use stampede_guard::{Backend, RouteConfig, StampedeGuard, WaitTimeout};

fn parse(json: &str) -> Result<RouteConfig, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

#[test]
fn every_field_deserialises_and_round_trips() {
    let config = parse(
        r#"{
            "ttl": "30s",
            "stale_while_revalidate": "1m 30s",
            "stale_if_error": "1h",
            "wait_budget": "250ms",
            "on_wait_timeout": { "respond": 503 },
            "lease": "5s",
            "rebuild_timeout": "20s",
            "hit_for_miss": "2s",
            "early_refresh": 1.5,
            "max_body_bytes": 1048576,
            "cacheable_statuses": [200, 404],
            "vary": ["Accept-Language"],
            "forwarded_headers": [],
            "namespace": "shop",
            "respect_cache_control": true,
            "cache_control_targets": ["Acme-Cache-Control", "cdn-cache-control"],
            "allow_credentials": false,
            "strip_set_cookie": true,
            "cache_private": false,
            "ignore_vary": false,
            "invalidate_on_unsafe": false,
            "refresh_ahead": { "multiple": 2.0, "floor": "50ms" },
            "route_name": "report",
            "cache_status": false,
            "cache_status_name": "edge",
            "tag_headers": ["x-tags"],
            "expose_tag_headers": true
        }"#,
    )
    .expect("a full section");
    assert_eq!(config.ttl, Some(Duration::from_secs(30)));
    assert_eq!(config.stale_while_revalidate, Some(Duration::from_secs(90)));
    assert_eq!(config.stale_if_error, Some(Duration::from_secs(3600)));
    assert_eq!(config.wait_budget, Some(Duration::from_millis(250)));
    assert_eq!(
        config.on_wait_timeout,
        Some(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE))
    );
    assert_eq!(
        config.cacheable_statuses,
        Some(vec![StatusCode::OK, StatusCode::NOT_FOUND])
    );
    // Header names are case-insensitive: stored in their lowercase form.
    assert_eq!(config.vary, Some(vec![http::header::ACCEPT_LANGUAGE]));
    assert_eq!(config.forwarded_headers, Some(Vec::<HeaderName>::new()));
    assert_eq!(config.namespace.as_deref(), Some("shop"));
    assert_eq!(config.invalidate_on_unsafe, Some(false));
    assert_eq!(
        config.cache_control_targets,
        Some(vec![
            HeaderName::from_static("acme-cache-control"),
            HeaderName::from_static("cdn-cache-control")
        ])
    );
    assert_eq!(
        config.refresh_ahead,
        Some(stampede_guard::RefreshAheadConfig::new(
            2.0,
            Duration::from_millis(50)
        ))
    );
    assert_eq!(config.route_name.as_deref(), Some("report"));
    assert_eq!(
        (config.cache_status, config.expose_tag_headers),
        (Some(false), Some(true))
    );
    assert_eq!(config.cache_status_name.as_deref(), Some("edge"));
    assert_eq!(
        config.tag_headers,
        Some(vec![HeaderName::from_static("x-tags")])
    );

    let written = serde_json::to_string(&config).expect("serialises");
    assert_eq!(parse(&written).expect("reads back"), config, "{written}");

    // An empty section changes nothing, and round trips too.
    let empty = parse("{}").expect("empty section");
    assert_eq!(empty, RouteConfig::default());
    let written = serde_json::to_string(&empty).expect("serialises");
    assert_eq!(parse(&written).expect("reads back"), empty, "{written}");
    // Failing open is the word form.
    let open = parse(r#"{ "on_wait_timeout": "fail_open" }"#).expect("fail_open");
    assert_eq!(open.on_wait_timeout, Some(WaitTimeout::FailOpen));
}

#[test]
fn mistakes_are_rejected_with_a_message_that_names_them() {
    let cases = [
        // A misspelt knob must not be silently ignored.
        (r#"{ "tll": "30s" }"#, "unknown field `tll`"),
        // (serde_json says where: a one-key map was expected.)
        (
            r#"{ "on_wait_timeout": { "respond": 503, "body": "x" } }"#,
            "line 1 column 37",
        ),
        (r#"{ "on_wait_timeout": "fail_closed" }"#, "fail_closed"),
        // Durations: a unit that does not exist, a bare number, a negative.
        (
            r#"{ "ttl": "30 parsecs" }"#,
            "unknown time unit \"parsecs\"",
        ),
        (
            r#"{ "ttl": 30 }"#,
            "invalid type: integer `30`, expected a string",
        ),
        (r#"{ "lease": "-5s" }"#, "\"-5s\" is not a duration"),
        (
            r#"{ "wait_budget": "" }"#,
            "\"\" is not a duration (value was empty)",
        ),
        // Statuses and header names are checked on load, not at first use.
        (
            r#"{ "cacheable_statuses": [200, 1000] }"#,
            "1000 is not an HTTP status code",
        ),
        (
            r#"{ "on_wait_timeout": { "respond": 42 } }"#,
            "42 is not an HTTP status code",
        ),
        (
            r#"{ "vary": ["accept language"] }"#,
            "\"accept language\" is not a valid header name",
        ),
        (
            r#"{ "forwarded_headers": ["x-ok", "bad:name"] }"#,
            "bad:name",
        ),
        (r#"{ "max_body_bytes": -1 }"#, "-1"),
        (
            r#"{ "cache_control_targets": ["acme cache control"] }"#,
            "\"acme cache control\" is not a valid header name",
        ),
        (
            r#"{ "cache_control_targets": ["Cache-Control"] }"#,
            "\"cache-control\" is not a targeted cache-control field",
        ),
        (
            r#"{ "cache_control_targets": ["a-cache-control", "A-Cache-Control"] }"#,
            "\"a-cache-control\" is listed twice",
        ),
        // The same knob twice is a mistake, not "the last one wins".
        (r#"{ "ttl": "1s", "ttl": "1h" }"#, "duplicate field `ttl`"),
        // A duration past what a u64 of seconds holds.
        (
            r#"{ "ttl": "99999999999999999999s" }"#,
            "number is too large",
        ),
    ];
    for (json, expected) in cases {
        let message = parse(json).expect_err(json);
        assert!(message.contains(expected), "{json}: {message}");
    }
}

fn app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move |headers: http::HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let language = headers
                    .get("accept-language")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                ([("vary", "accept-language")], format!("{language} #{n}"))
            }
        })
        .layer(guard),
    )
}

fn with_language(language: &str) -> http::Request<axum::body::Body> {
    let mut request = get_req("/report");
    request
        .headers_mut()
        .insert("accept-language", language.parse().unwrap());
    request
}

/// The configured ttl (1 s, under the guard's 60 s) decides when the entry
/// expires; the configured Vary decides what is keyed (without it, the
/// route learns the header from the response's `Vary`, URL by URL).
#[tokio::test]
async fn configured_values_govern_a_real_layer() {
    let config = parse(r#"{ "ttl": "1s", "vary": ["accept-language"] }"#).unwrap();
    let base = || StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let origin = Origin::default();
    let configured = app(&origin, base().with_config(&config));
    let control_origin = Origin::default();
    let control = app(
        &control_origin,
        base()
            .ttl(Duration::from_secs(60))
            .vary([http::header::ACCEPT_LANGUAGE]),
    );

    for (app, origin) in [(&configured, &origin), (&control, &control_origin)] {
        assert_eq!(send(app, with_language("en")).await.text(), "en #1");
        assert_eq!(send(app, with_language("fr")).await.text(), "fr #2");
        assert_eq!(send(app, with_language("en")).await.text(), "en #1");
        assert_eq!(origin.calls(), 2);
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Past the configured ttl: rebuilt. The control, on 60 s, still hits.
    assert_eq!(send(&configured, with_language("en")).await.text(), "en #3");
    assert_eq!(origin.calls(), 3);
    assert_eq!(send(&control, with_language("en")).await.text(), "en #1");
    assert_eq!(control_origin.calls(), 2);

    // Without the configured Vary the route does not key on the language:
    // it learns it from the response's Vary, per URL. The same language is
    // a hit; another is a variant of its own.
    let unkeyed_origin = Origin::default();
    let unkeyed = app(
        &unkeyed_origin,
        base().with_config(&parse(r#"{ "ttl": "1s" }"#).unwrap()),
    );
    send(&unkeyed, with_language("en")).await;
    assert_eq!(send(&unkeyed, with_language("en")).await.text(), "en #1");
    assert_eq!(unkeyed_origin.calls(), 1);
    assert_eq!(send(&unkeyed, with_language("fr")).await.text(), "fr #2");
    assert_eq!(unkeyed_origin.calls(), 2);
}

/// Durations far past anything sensible (a config typo of a unit) are
/// refused when read, naming the field; set in code, they are clamped,
/// never an overflow on the request path.
#[tokio::test]
async fn absurd_durations_are_refused_when_read_and_clamped_in_code() {
    let message = parse(r#"{ "ttl": "30s", "lease": "500000000years" }"#).unwrap_err();
    assert!(message.contains("`lease`"), "{message}");
    assert!(message.contains("2^31"), "{message}");

    let mut config = RouteConfig::default();
    let absurd = Some(Duration::from_secs(500_000_000 * 365 * 86_400));
    config.ttl = absurd;
    config.stale_while_revalidate = absurd;
    config.stale_if_error = absurd;
    config.wait_budget = absurd;
    config.lease = absurd;
    config.rebuild_timeout = absurd;
    config.hit_for_miss = absurd;
    assert_eq!(config.validate().unwrap_err().field(), "ttl");
    let origin = Origin::default();
    let app = app(
        &origin,
        StampedeGuard::new(Backend::local())
            .vary([http::header::ACCEPT_LANGUAGE])
            .with_config(&config),
    );
    assert_eq!(send(&app, with_language("en")).await.text(), "en #1");
    assert_eq!(send(&app, with_language("en")).await.text(), "en #1");
    assert_eq!(origin.calls(), 1);
}

/// A targeted field named in the configuration speaks for the cache: with
/// the origin's freshness respected, `Acme-Cache-Control: max-age=600`
/// beside `Cache-Control: no-store` is stored; on the default targets it
/// is not.
#[tokio::test]
async fn a_configured_cache_control_target_governs_a_real_layer() {
    let make = |origin: &Origin, config: &RouteConfig| {
        let origin = origin.clone();
        let guard = StampedeGuard::new(Backend::local())
            .ttl(Duration::from_secs(60))
            .with_config(config);
        Router::new().route(
            "/report",
            get(move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    (
                        [
                            ("cache-control", "no-store"),
                            ("acme-cache-control", "max-age=600"),
                        ],
                        format!("v{n}"),
                    )
                }
            })
            .layer(guard),
        )
    };
    let targeted = parse(
        r#"{ "respect_cache_control": true, "cache_control_targets": ["acme-cache-control"] }"#,
    )
    .unwrap();
    let origin = Origin::default();
    let app = make(&origin, &targeted);
    for _ in 0..3 {
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    }
    assert_eq!(origin.calls(), 1);
    let default_origin = Origin::default();
    let app = make(
        &default_origin,
        &parse(r#"{ "respect_cache_control": true }"#).unwrap(),
    );
    for _ in 0..3 {
        send(&app, get_req("/report")).await;
    }
    assert_eq!(default_origin.calls(), 3);
}

/// Values that parse but mean nothing are refused: the message names the
/// field, the value and what the field accepts.
#[test]
fn nonsense_is_refused_naming_the_field_the_value_and_the_range() {
    let cases: [(&str, &[&str]); 13] = [
        (r#"{ "ttl": "100years" }"#, &["`ttl`", "2^31 s"]),
        (r#"{ "lease": "0s" }"#, &["`lease`", "0s", "from 1ms"]),
        (
            r#"{ "rebuild_timeout": "0ms" }"#,
            &["`rebuild_timeout`", "0s"],
        ),
        (
            r#"{ "stale_if_error": "100years" }"#,
            &["`stale_if_error`", "2^31 s"],
        ),
        (
            r#"{ "cacheable_statuses": [200, 999] }"#,
            &["`cacheable_statuses`", "999", "100..=599"],
        ),
        (
            r#"{ "on_wait_timeout": { "respond": 101 } }"#,
            &["`on_wait_timeout`", "101", "200..=599"],
        ),
        (
            r#"{ "early_refresh": -1.0 }"#,
            &["`early_refresh`", "-1", "at least 0"],
        ),
        (
            r#"{ "refresh_ahead": { "multiple": -2.0, "floor": "50ms" } }"#,
            &["`refresh_ahead.multiple`", "-2"],
        ),
        (
            r#"{ "max_body_bytes": 0 }"#,
            &["`max_body_bytes`", "at least 1"],
        ),
        (r#"{ "route_name": "" }"#, &["`route_name`", "at least one"]),
        // Errors of form name the field too.
        (r#"{ "ttl": 30 }"#, &["`ttl`", "expected"]),
        (r#"{ "ttl": "30 parsecs" }"#, &["`ttl`", "parsecs"]),
        (
            r#"{ "cacheable_statuses": [200, 1000] }"#,
            &["`cacheable_statuses", "1000"],
        ),
    ];
    for (json, expected) in cases {
        let message = parse(json).expect_err(json);
        for part in expected {
            assert!(message.contains(part), "{json}: {message} (wanted {part})");
        }
    }
    // The edges are accepted.
    parse(
        r#"{ "ttl": "0s", "stale_if_error": "0s", "cacheable_statuses": [100, 599],
             "on_wait_timeout": { "respond": 599 }, "early_refresh": 0.0,
             "lease": "2147483648s" }"#,
    )
    .expect("the edges of each range");
}
