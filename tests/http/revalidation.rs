//! Revalidation with the origin: a refresh of an entry with a validator asks
//! conditionally, and a `304` renews the entry (headers updated from the
//! 304, a fresh lifetime, no body sent), committed fleet-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{send, Answer};
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{CONTENT_LENGTH, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

const TTL: Duration = Duration::from_millis(100);
const MODIFIED: &str = "Sun, 01 Nov 2026 00:00:00 GMT";

/// Which validator the origin gives.
#[derive(Clone, Copy)]
enum Validator {
    ETag,
    LastModified,
    None,
}

/// An origin whose content never changes, but whose `x-version` header goes
/// up with every call; it counts full (200) and conditional (304) answers,
/// and the conditions it was sent.
#[derive(Clone)]
struct Origin {
    validator: Validator,
    full: Arc<AtomicUsize>,
    not_modified: Arc<AtomicUsize>,
    conditions_seen: Arc<AtomicUsize>,
    /// Every `If-None-Match` the origin was sent.
    tags_seen: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Origin {
    fn new(validator: Validator) -> Self {
        Origin {
            validator,
            full: Arc::default(),
            not_modified: Arc::default(),
            conditions_seen: Arc::default(),
            tags_seen: Arc::default(),
        }
    }

    fn full(&self) -> usize {
        self.full.load(Ordering::SeqCst)
    }

    fn not_modified(&self) -> usize {
        self.not_modified.load(Ordering::SeqCst)
    }

    fn app(&self, guard: StampedeGuard) -> Router {
        let origin = self.clone();
        let handler = move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let calls = origin.full() + origin.not_modified() + 1;
                let conditional =
                    headers.contains_key(IF_NONE_MATCH) || headers.contains_key(IF_MODIFIED_SINCE);
                if conditional {
                    origin.conditions_seen.fetch_add(1, Ordering::SeqCst);
                }
                for tag in headers.get_all(IF_NONE_MATCH) {
                    let tag = tag.to_str().unwrap_or("?").to_owned();
                    origin.tags_seen.lock().unwrap().push(tag);
                }
                let unchanged = match origin.validator {
                    Validator::ETag => headers.get(IF_NONE_MATCH).is_some_and(|v| v == "\"c1\""),
                    Validator::LastModified => headers
                        .get(IF_MODIFIED_SINCE)
                        .is_some_and(|v| v == MODIFIED),
                    Validator::None => false,
                };
                let mut out = HeaderMap::new();
                out.insert("x-version", calls.into());
                match origin.validator {
                    Validator::ETag => {
                        out.insert(ETAG, "\"c1\"".parse().unwrap());
                    }
                    Validator::LastModified => {
                        out.insert(LAST_MODIFIED, MODIFIED.parse().unwrap());
                    }
                    Validator::None => {}
                }
                if unchanged {
                    origin.not_modified.fetch_add(1, Ordering::SeqCst);
                    // A 304 that also claims an empty body must not empty
                    // the stored one.
                    out.insert(CONTENT_LENGTH, 0.into());
                    (StatusCode::NOT_MODIFIED, out).into_response()
                } else {
                    origin.full.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::OK, out, "the body").into_response()
                }
            }
        };
        let guard = guard
            .ttl(TTL)
            .stale_while_revalidate(Duration::from_secs(60));
        Router::new().route("/doc", get(handler).layer(guard))
    }
}

fn doc() -> Request<Body> {
    Request::get("/doc").body(Body::empty()).unwrap()
}

fn version(answer: &Answer) -> String {
    answer
        .headers
        .get("x-version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Asks until the answer carries a version other than `old`, at most 50
/// times.
async fn renewed(app: &Router, old: &str) -> Answer {
    let mut answer = send(app, doc()).await;
    for _ in 0..50 {
        if version(&answer) != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        answer = send(app, doc()).await;
    }
    answer
}

/// After expiry the refresh is answered 304: clients keep the body, the
/// 304's header appears, and the origin sent the body once.
async fn a_304_renews_the_entry(validator: Validator, a: Backend, b: Option<Backend>) {
    let origin = Origin::new(validator);
    let app = origin.app(StampedeGuard::new(a));
    let first = send(&app, doc()).await;
    assert_eq!(
        (first.text().as_str(), version(&first).as_str()),
        ("the body", "1")
    );
    tokio::time::sleep(TTL * 2).await;
    let stale = send(&app, doc()).await;
    assert_eq!(stale.x_cache(), "STALE");
    assert_eq!(stale.text(), "the body");
    let after = renewed(&app, "1").await;
    assert_eq!(after.status, StatusCode::OK);
    assert_eq!(after.text(), "the body", "the stored body stays");
    assert_eq!(after.headers[CONTENT_LENGTH], "8");
    assert_eq!(
        version(&after),
        "2",
        "the 304's header replaced the stored one"
    );
    assert_eq!(after.x_cache(), "HIT", "a fresh lifetime");
    assert_eq!(origin.full(), 1, "the body crossed the wire once");
    assert_eq!(origin.not_modified(), 1);
    if let Some(b) = b {
        // Committed fleet-wide: a cold instance reads the renewed entry.
        let cold = origin.app(StampedeGuard::new(b));
        let answer = send(&cold, doc()).await;
        assert_eq!(answer.text(), "the body");
        assert_eq!(version(&answer), "2");
        assert_eq!(origin.full() + origin.not_modified(), 2);
    }
}

#[tokio::test]
async fn an_etag_is_revalidated_embedded() {
    a_304_renews_the_entry(Validator::ETag, Backend::local(), None).await;
}

#[tokio::test]
async fn a_last_modified_is_revalidated_embedded() {
    a_304_renews_the_entry(Validator::LastModified, Backend::local(), None).await;
}

#[tokio::test]
async fn without_a_validator_the_refresh_asks_for_everything() {
    let origin = Origin::new(Validator::None);
    let app = origin.app(StampedeGuard::new(Backend::local()));
    send(&app, doc()).await;
    tokio::time::sleep(TTL * 2).await;
    send(&app, doc()).await;
    let after = renewed(&app, "1").await;
    assert_eq!(version(&after), "2");
    assert_eq!(origin.full(), 2);
    assert_eq!(origin.conditions_seen.load(Ordering::SeqCst), 0);
}

/// A client's own conditions never reach the origin: a cold miss with
/// `If-None-Match` gets the whole response from the origin (the client may
/// then get its 304 from the layer), and the entry holds the body.
#[tokio::test]
async fn a_clients_conditions_are_not_sent_to_the_origin() {
    let origin = Origin::new(Validator::ETag);
    let app = origin.app(StampedeGuard::new(Backend::local()));
    let conditional = Request::get("/doc")
        .header(IF_NONE_MATCH, "\"c1\"")
        .body(Body::empty())
        .unwrap();
    let answer = send(&app, conditional).await;
    assert_eq!(answer.status, StatusCode::NOT_MODIFIED);
    assert_eq!(origin.conditions_seen.load(Ordering::SeqCst), 0);
    assert_eq!(origin.full(), 1);
    let plain = send(&app, doc()).await;
    assert_eq!(plain.text(), "the body");
    assert_eq!(plain.x_cache(), "HIT");
}

/// A client whose stale hit starts the refresh cannot choose what the
/// origin is asked: its own `If-None-Match` is replaced by the entry's.
#[tokio::test]
async fn the_refresh_asks_with_the_entrys_validator_not_the_clients() {
    let origin = Origin::new(Validator::ETag);
    let app = origin.app(StampedeGuard::new(Backend::local()));
    send(&app, doc()).await;
    tokio::time::sleep(TTL * 2).await;
    let attacker = Request::get("/doc")
        .header(IF_NONE_MATCH, "\"forged\"")
        .header(IF_MODIFIED_SINCE, MODIFIED)
        .body(Body::empty())
        .unwrap();
    let stale = send(&app, attacker).await;
    assert_eq!(stale.x_cache(), "STALE");
    let after = renewed(&app, "1").await;
    assert_eq!(after.text(), "the body");
    assert_eq!(*origin.tags_seen.lock().unwrap(), ["\"c1\""]);
    assert_eq!((origin.full(), origin.not_modified()), (1, 1));
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    #[tokio::test]
    async fn a_304_renewal_is_committed_for_the_fleet() {
        let redis = RedisServer::start();
        a_304_renews_the_entry(
            Validator::ETag,
            connect(&redis).await,
            Some(connect(&redis).await),
        )
        .await;
    }

    /// The stale copy in Redis is a validator too: an instance that never
    /// held the entry revalidates it instead of fetching the body again.
    #[tokio::test]
    async fn the_redis_stale_copy_is_revalidated() {
        let redis = RedisServer::start();
        let origin = Origin::new(Validator::ETag);
        let a = origin.app(StampedeGuard::new(connect(&redis).await));
        send(&a, doc()).await;
        tokio::time::sleep(TTL * 2).await;
        let cold = origin.app(StampedeGuard::new(connect(&redis).await));
        let stale = send(&cold, doc()).await;
        assert_eq!(stale.text(), "the body");
        let after = renewed(&cold, "1").await;
        assert_eq!(after.text(), "the body");
        assert_eq!(version(&after), "2");
        assert_eq!((origin.full(), origin.not_modified()), (1, 1));
    }
}
