//! Revalidation of an entry past every window that lets it be served (no
//! stale-while-revalidate, no stale-if-error; or `must-revalidate`): the
//! entry is kept for its revalidation window, never served in it, and the
//! next miss asks the origin conditionally, once per key for the whole
//! fleet. Every waiter is answered from the renewed entry; a `200` replaces
//! it; a client's own conditional request is answered from it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{send, Answer};
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, ETAG, IF_NONE_MATCH};
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

const TTL: Duration = Duration::from_millis(100);
/// Requests sent at once after expiry.
const WAITERS: usize = 24;

/// An origin whose body is `body-<etag>`, with `ETag: "<etag>"` and an
/// `x-version` header that goes up with every call. It answers a matching
/// `If-None-Match` with a 304, takes a while to answer (so that concurrent
/// requests find a flight running), and records every `If-None-Match` it
/// was sent.
#[derive(Clone)]
struct Origin {
    etag: Arc<Mutex<&'static str>>,
    cache_control: &'static str,
    full: Arc<AtomicUsize>,
    not_modified: Arc<AtomicUsize>,
    asked: Arc<Mutex<Vec<String>>>,
    /// While set, every call is answered `503` (`down`).
    failing: Arc<AtomicBool>,
    /// Route windows beside the ttl.
    stale_if_error: Duration,
}

impl Origin {
    fn new(cache_control: &'static str) -> Self {
        Origin {
            etag: Arc::new(Mutex::new("e1")),
            cache_control,
            full: Arc::default(),
            not_modified: Arc::default(),
            asked: Arc::default(),
            failing: Arc::default(),
            stale_if_error: Duration::ZERO,
        }
    }

    fn calls(&self) -> (usize, usize) {
        (
            self.full.load(Ordering::SeqCst),
            self.not_modified.load(Ordering::SeqCst),
        )
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }

    fn change(&self, etag: &'static str) {
        *self.etag.lock().unwrap() = etag;
    }

    fn app(&self, guard: StampedeGuard) -> Router {
        let origin = self.clone();
        let handler = move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let (full, not_modified) = origin.calls();
                let etag = *origin.etag.lock().unwrap();
                let quoted = format!("\"{etag}\"");
                let condition = headers.get(IF_NONE_MATCH).map(|v| {
                    let v = v.to_str().unwrap_or("?").to_owned();
                    origin.asked.lock().unwrap().push(v.clone());
                    v
                });
                if origin.failing.load(Ordering::SeqCst) {
                    return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
                }
                let mut out = HeaderMap::new();
                out.insert("x-version", (full + not_modified + 1).into());
                out.insert(ETAG, quoted.parse().unwrap());
                out.insert(CACHE_CONTROL, origin.cache_control.parse().unwrap());
                if condition.as_deref() == Some(quoted.as_str()) {
                    origin.not_modified.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::NOT_MODIFIED, out).into_response()
                } else {
                    origin.full.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::OK, out, format!("body-{etag}")).into_response()
                }
            }
        };
        // No stale window unless a test sets stale-if-error: past its ttl
        // the entry may not be served.
        let guard = guard.ttl(TTL).stale_if_error(self.stale_if_error);
        Router::new().route("/doc", get(handler).layer(guard))
    }
}

fn doc() -> Request<Body> {
    Request::get("/doc").body(Body::empty()).unwrap()
}

fn version(answer: &Answer) -> &str {
    answer
        .headers
        .get("x-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// `WAITERS` requests at once, spread over `apps`.
async fn burst(apps: &[Router], request: impl Fn() -> Request<Body>) -> Vec<Answer> {
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let app = apps[i % apps.len()].clone();
            let request = request();
            tokio::spawn(async move { send(&app, request).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

/// Fills the entry on the first instance and lets its freshness end.
async fn fill_and_expire(origin: &Origin, apps: &[Router]) {
    let first = send(&apps[0], doc()).await;
    assert_eq!((first.text().as_str(), version(&first)), ("body-e1", "1"));
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(origin.calls(), (1, 0));
}

/// After expiry, a burst over every instance costs one conditional request;
/// every answer is the stored body with the 304's headers, none stale.
async fn one_conditional_request_renews_it_for_everyone(
    cache_control: &'static str,
    apps: impl Fn(&Origin) -> Vec<Router>,
) {
    let origin = Origin::new(cache_control);
    let apps = apps(&origin);
    fill_and_expire(&origin, &apps).await;
    let answers = burst(&apps, doc).await;
    assert_eq!(origin.calls(), (1, 1), "one conditional request, no body");
    assert_eq!(origin.asked(), ["\"e1\""], "asked with the stored ETag");
    for a in &answers {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.text(), "body-e1", "the stored body");
        assert_eq!(a.headers[CONTENT_LENGTH], "7");
        assert_eq!(version(a), "2", "the 304's header replaced the stored one");
        assert_ne!(a.x_cache(), "STALE", "never served stale");
    }
    // Renewed with a fresh lifetime, on every instance.
    for app in &apps {
        let hit = send(app, doc()).await;
        assert_eq!((hit.x_cache(), version(&hit)), ("HIT", "2"));
    }
    assert_eq!(origin.calls(), (1, 1));
}

/// A changed representation: the conditional request gets a 200, which
/// replaces the entry for everyone.
async fn a_full_answer_replaces_it(apps: impl Fn(&Origin) -> Vec<Router>) {
    let origin = Origin::new("must-revalidate");
    let apps = apps(&origin);
    fill_and_expire(&origin, &apps).await;
    origin.change("e2");
    let answers = burst(&apps, doc).await;
    assert_eq!(origin.calls(), (2, 0));
    assert_eq!(origin.asked(), ["\"e1\""]);
    for a in &answers {
        assert_eq!(
            (a.text().as_str(), a.headers[ETAG].to_str().unwrap()),
            ("body-e2", "\"e2\"")
        );
    }
    for app in &apps {
        let hit = send(app, doc()).await;
        assert_eq!((hit.x_cache(), hit.text().as_str()), ("HIT", "body-e2"));
    }
}

/// Clients that send their own `If-None-Match` after expiry: the origin is
/// asked once, with the entry's validator, and each client is answered
/// from the renewed entry (a 304 for the one that has it, the body for the
/// one that does not).
async fn a_clients_conditions_are_answered_from_the_renewed_entry(
    apps: impl Fn(&Origin) -> Vec<Router>,
) {
    let origin = Origin::new("must-revalidate");
    let apps = apps(&origin);
    fill_and_expire(&origin, &apps).await;
    let answers = burst(&apps, || {
        Request::get("/doc")
            .header(IF_NONE_MATCH, "\"e1\"")
            .body(Body::empty())
            .unwrap()
    })
    .await;
    assert_eq!(origin.calls(), (1, 1));
    assert_eq!(origin.asked(), ["\"e1\""]);
    for a in &answers {
        assert_eq!(a.status, StatusCode::NOT_MODIFIED);
        assert!(a.body.is_empty());
        assert_eq!(a.headers[ETAG], "\"e1\"");
    }
    let other = Request::get("/doc")
        .header(IF_NONE_MATCH, "\"other\"")
        .body(Body::empty())
        .unwrap();
    let whole = send(&apps[0], other).await;
    assert_eq!(
        (whole.status, whole.text().as_str()),
        (StatusCode::OK, "body-e1")
    );
    assert_eq!(origin.calls(), (1, 1));
}

/// The origin fails after expiry. Within stale-if-error, every request is
/// answered with the stale entry (after one conditional request); a
/// `must-revalidate` entry never is: the origin's own 503 stands.
async fn a_failing_origin_gets_stale_if_error_unless_must_revalidate(
    apps: impl Fn(&Origin) -> Vec<Router>,
) {
    for (cache_control, stale) in [("public", true), ("must-revalidate", false)] {
        let mut origin = Origin::new(cache_control);
        origin.stale_if_error = Duration::from_secs(60);
        let apps = apps(&origin);
        fill_and_expire(&origin, &apps).await;
        origin.failing.store(true, Ordering::SeqCst);
        let answers = burst(&apps, doc).await;
        assert_eq!(
            origin.asked(),
            ["\"e1\""],
            "{cache_control}: one conditional request"
        );
        for a in &answers {
            match stale {
                true => assert_eq!(
                    (a.status, a.text().as_str(), a.x_cache()),
                    (StatusCode::OK, "body-e1", "STALE"),
                    "{cache_control}"
                ),
                false => {
                    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{cache_control}");
                    assert_ne!(a.text(), "body-e1", "{cache_control}: never stale");
                }
            }
        }
    }
}

fn embedded(origin: &Origin) -> Vec<Router> {
    vec![origin.app(StampedeGuard::new(Backend::local()))]
}

#[tokio::test]
async fn an_expired_entry_is_revalidated_once_embedded() {
    one_conditional_request_renews_it_for_everyone("public", embedded).await;
}

#[tokio::test]
async fn a_must_revalidate_entry_is_revalidated_once_embedded() {
    one_conditional_request_renews_it_for_everyone("must-revalidate", embedded).await;
}

#[tokio::test]
async fn a_full_answer_replaces_the_entry_embedded() {
    a_full_answer_replaces_it(embedded).await;
}

#[tokio::test]
async fn client_conditions_after_expiry_embedded() {
    a_clients_conditions_are_answered_from_the_renewed_entry(embedded).await;
}

#[tokio::test]
async fn stale_if_error_on_a_failing_origin_embedded() {
    a_failing_origin_gets_stale_if_error_unless_must_revalidate(embedded).await;
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::backends::redis_backend;
    use crate::common::redis::RedisServer;

    /// Two instances on one Redis. A roomy deadline: these count origin
    /// calls, and a Redis call past a tight deadline on a loaded machine
    /// takes no lease, which costs a call more.
    async fn two(redis: &RedisServer) -> Vec<Backend> {
        let mut backends = Vec::new();
        for _ in 0..2 {
            backends.push(redis_backend(redis).await);
        }
        backends
    }

    fn fleet(backends: Vec<Backend>) -> impl Fn(&Origin) -> Vec<Router> {
        move |origin| {
            backends
                .iter()
                .map(|b| origin.app(StampedeGuard::new(b.clone())))
                .collect()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_entry_is_revalidated_once_for_the_fleet() {
        let redis = RedisServer::start();
        let apps = fleet(two(&redis).await);
        one_conditional_request_renews_it_for_everyone("public", apps).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_must_revalidate_entry_is_revalidated_once_for_the_fleet() {
        let redis = RedisServer::start();
        let apps = fleet(two(&redis).await);
        one_conditional_request_renews_it_for_everyone("must-revalidate", apps).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_answer_replaces_the_entry_for_the_fleet() {
        let redis = RedisServer::start();
        a_full_answer_replaces_it(fleet(two(&redis).await)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn client_conditions_after_expiry_on_the_fleet() {
        let redis = RedisServer::start();
        a_clients_conditions_are_answered_from_the_renewed_entry(fleet(two(&redis).await)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stale_if_error_on_a_failing_origin_for_the_fleet() {
        let redis = RedisServer::start();
        let backends = two(&redis).await;
        a_failing_origin_gets_stale_if_error_unless_must_revalidate(move |origin: &Origin| {
            // A fresh key space per round: each round's guards get a
            // namespace of their own.
            let ns = origin.cache_control;
            backends
                .iter()
                .map(|b| origin.app(StampedeGuard::new(b.clone()).namespace(ns)))
                .collect()
        })
        .await;
    }

    /// An instance that never held the entry asks with the validator of
    /// the copy Redis keeps past its freshness.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cold_instance_revalidates_the_copy_redis_kept() {
        let redis = RedisServer::start();
        let backends = two(&redis).await;
        let origin = Origin::new("must-revalidate");
        let warm = origin.app(StampedeGuard::new(backends[0].clone()));
        fill_and_expire(&origin, std::slice::from_ref(&warm)).await;
        let cold = origin.app(StampedeGuard::new(backends[1].clone()));
        let answer = send(&cold, doc()).await;
        assert_eq!((answer.text().as_str(), version(&answer)), ("body-e1", "2"));
        assert_eq!(origin.calls(), (1, 1));
        assert_eq!(origin.asked(), ["\"e1\""]);
    }
}
