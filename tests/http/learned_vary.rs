//! A `Vary` learned from the response (RFC 9111 §4.1), on both backends and
//! across a fleet: variants selected by the request's values of the
//! nominated headers, one origin call per variant for a herd, a bounded
//! number of variants per URL, and no variant ever served to a request with
//! other values, on any instance.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request};
use stampede_guard::{Backend, StampedeGuard};

#[cfg(feature = "redis")]
use crate::common::backends::redis_backend;
use crate::common::{send, Answer, Origin};

/// `/v`: answers `<foo> #<call>`, `Vary: Foo`, after `delay` (for herds).
fn varying_app(origin: &Origin, backend: Backend, delay: Duration) -> Router {
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    varying_app_with(origin, guard, delay)
}

fn varying_app_with(origin: &Origin, guard: StampedeGuard, delay: Duration) -> Router {
    let origin = origin.clone();
    Router::new()
        .route(
            "/v",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(delay).await;
                    let values: Vec<&str> = headers
                        .get_all("foo")
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    let sent = if values.is_empty() {
                        "-".to_owned()
                    } else {
                        values.join("|")
                    };
                    ([("vary", "Foo")], format!("{sent} #{n}"))
                }
            }),
        )
        .layer(guard)
}

fn with_foo(values: &[&str]) -> Request<Body> {
    let mut request = Request::get("/v").body(Body::empty()).unwrap();
    for value in values {
        request.headers_mut().append("foo", value.parse().unwrap());
    }
    request
}

/// The answer's variant: what it says the request's `Foo` was.
fn variant(answer: &Answer) -> String {
    let text = answer.text();
    text.split(" #").next().unwrap_or_default().to_owned()
}

fn assert_never_presents_the_digest(answer: &Answer) {
    assert!(
        !answer.headers.contains_key("stampede-guard-selected"),
        "the variant digest was presented: {:?}",
        answer.headers
    );
}

async fn variants_are_selected_by_their_values(backend: Backend) {
    let origin = Origin::default();
    let app = varying_app(&origin, backend, Duration::ZERO);
    let one = send(&app, with_foo(&["1"])).await;
    assert_eq!(one.text(), "1 #1");
    let again = send(&app, with_foo(&["1"])).await;
    assert_eq!((again.text().as_str(), again.x_cache()), ("1 #1", "HIT"));
    assert_never_presents_the_digest(&again);
    // Other values, or none: a miss for that variant, never variant 1.
    let two = send(&app, with_foo(&["2"])).await;
    assert_eq!(two.text(), "2 #2");
    let none = send(&app, with_foo(&[])).await;
    assert_eq!(none.text(), "- #3");
    let empty = send(&app, with_foo(&[""])).await;
    assert_eq!(empty.text(), " #4");
    assert_eq!(origin.calls(), 4);
    // Each is stored: all hits now, each its own.
    for (values, text) in [
        (&["1"][..], "1 #1"),
        (&["2"][..], "2 #2"),
        (&[][..], "- #3"),
        (&[""][..], " #4"),
    ] {
        let answer = send(&app, with_foo(values)).await;
        assert_eq!(answer.text(), text, "{values:?}");
        assert_never_presents_the_digest(&answer);
    }
    assert_eq!(origin.calls(), 4);
    // Lines combine and whitespace around members goes (RFC 9111 §4.1):
    // `a, b`, `a,b` and two lines `a` and `b` are one variant.
    let listed = send(&app, with_foo(&["a, b"])).await;
    assert_eq!(listed.text(), "a, b #5");
    for values in [&["a,b"][..], &["a", "b"][..], &[" a , b "][..]] {
        let answer = send(&app, with_foo(values)).await;
        assert_eq!(answer.text(), "a, b #5", "{values:?}");
    }
    // Order within the list still matters.
    assert_eq!(send(&app, with_foo(&["b, a"])).await.text(), "b, a #6");
    assert_eq!(origin.calls(), 6);
}

#[tokio::test]
async fn variants_are_selected_by_their_values_embedded() {
    variants_are_selected_by_their_values(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn variants_are_selected_by_their_values_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    variants_are_selected_by_their_values(redis_backend(&redis).await).await;
}

/// A cold herd of two variants, however it interleaves: two origin calls,
/// and each request gets its own variant.
async fn a_herd_of_two_variants_costs_two_calls(apps: &[Router], origin: &Origin) {
    let mut tasks = Vec::new();
    for i in 0..40 {
        let app = apps[i % apps.len()].clone();
        let value = if i % 2 == 0 { "en" } else { "fr" };
        tasks.push(tokio::spawn(async move {
            (value, send(&app, with_foo(&[value])).await)
        }));
    }
    for task in tasks {
        let (value, answer) = task.await.expect("request");
        assert_eq!(variant(&answer), value, "{}", answer.text());
        assert_never_presents_the_digest(&answer);
    }
    assert_eq!(origin.calls(), 2, "one origin call per variant");
    // Later requests of either variant, on any instance: hits.
    for app in apps {
        for value in ["en", "fr"] {
            assert_eq!(variant(&send(app, with_foo(&[value])).await), value);
        }
    }
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_of_two_variants_costs_two_calls_embedded() {
    let origin = Origin::default();
    let app = varying_app(&origin, Backend::local(), Duration::from_millis(200));
    a_herd_of_two_variants_costs_two_calls(&[app], &origin).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_of_two_variants_costs_two_calls_for_the_fleet() {
    let redis = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let backend = redis_backend(&redis).await;
        apps.push(varying_app(&origin, backend, Duration::from_millis(200)));
    }
    a_herd_of_two_variants_costs_two_calls(&apps, &origin).await;
}

/// What one instance learned, another reads from Redis with the entry: it
/// serves the stored variant to the same values and never to others.
#[cfg(feature = "redis")]
#[tokio::test]
async fn every_instance_selects_the_variants_another_stored() {
    let redis = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let a = varying_app(&origin, redis_backend(&redis).await, Duration::ZERO);
    let b = varying_app(&origin, redis_backend(&redis).await, Duration::ZERO);
    assert_eq!(send(&a, with_foo(&["1"])).await.text(), "1 #1");
    // B has nothing in its own tier: the URL's entry comes from Redis.
    assert_eq!(send(&b, with_foo(&["1"])).await.text(), "1 #1");
    assert_eq!(origin.calls(), 1);
    // B's entry for the URL is variant 1: another value is its own miss.
    assert_eq!(send(&b, with_foo(&["2"])).await.text(), "2 #2");
    assert_eq!(send(&a, with_foo(&["2"])).await.text(), "2 #2");
    assert_eq!(send(&a, with_foo(&[])).await.text(), "- #3");
    assert_eq!(send(&b, with_foo(&[])).await.text(), "- #3");
    assert_eq!(send(&b, with_foo(&["1"])).await.text(), "1 #1");
    assert_eq!(origin.calls(), 3);
}

/// An attacker sending a new value each time: each costs its origin call
/// (it is a new variant), but the URL never holds more than its own entry
/// and 64 slots, in Redis as in the in-process tier, and the variants it
/// does hold still answer only their own values.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_url_holds_a_bounded_number_of_variants() {
    let redis = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let app = varying_app(&origin, redis_backend(&redis).await, Duration::ZERO);
    for i in 0..300 {
        let value = format!("random-{i}");
        let answer = send(&app, with_foo(&[&value])).await;
        assert_eq!(variant(&answer), value);
    }
    assert_eq!(origin.calls(), 300);
    let entries: usize = redis
        .raw(&["KEYS", "*:v"])
        .trim_start_matches('*')
        .parse()
        .expect("a count of keys");
    assert!(
        (1..=65).contains(&entries),
        "{entries} entries stored for one URL"
    );
    // Whatever is stored answers its own value only.
    for i in (0..300).step_by(7) {
        let value = format!("random-{i}");
        assert_eq!(variant(&send(&app, with_foo(&[&value])).await), value);
    }
}

/// `Vary: *` never matches: never stored, on either backend.
async fn vary_star_is_never_stored(backend: Backend) {
    let origin = Origin::default();
    let guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(60))
        .hit_for_miss(Duration::ZERO);
    let counted = origin.clone();
    let app = Router::new()
        .route(
            "/s",
            get(move || {
                let origin = counted.clone();
                async move {
                    let (n, _running) = origin.enter();
                    ([("vary", "foo"), ("vary", "*")], format!("#{n}"))
                }
            }),
        )
        .layer(guard);
    for n in 1..=3 {
        let request = Request::get("/s").body(Body::empty()).unwrap();
        assert_eq!(send(&app, request).await.text(), format!("#{n}"));
    }
}

#[tokio::test]
async fn vary_star_is_never_stored_embedded() {
    vary_star_is_never_stored(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn vary_star_is_never_stored_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    vary_star_is_never_stored(redis_backend(&redis).await).await;
}

/// A route that ignores `Vary` keeps one entry per key and serves it to
/// every request, whatever its values.
#[tokio::test]
async fn a_route_that_ignores_vary_serves_one_entry_to_all() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(60))
        .ignore_vary(true);
    let app = varying_app_with(&origin, guard, Duration::ZERO);
    assert_eq!(send(&app, with_foo(&["1"])).await.text(), "1 #1");
    let other = send(&app, with_foo(&["2"])).await;
    assert_eq!(other.text(), "1 #1");
    assert_never_presents_the_digest(&other);
    assert_eq!(origin.calls(), 1);
}
