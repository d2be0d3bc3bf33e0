//! Unsafe methods invalidate (RFC 9111 §4.4): a successful POST, PUT, PATCH
//! or DELETE through the guard drops its target's entries, and those of the
//! same-host URIs in `Location` and `Content-Location`, on every instance,
//! before its response is returned.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{send, Answer};
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::{ACCEPT_LANGUAGE, CONTENT_LOCATION, HOST, LOCATION};
use http::{Method, Request, Uri};
use stampede_guard::{Backend, StampedeGuard};

/// The origin: a version that writes move, and a count of GET calls.
#[derive(Clone, Default)]
struct Store {
    version: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
}

impl Store {
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

/// What a write answers, from its query: `status` (default 200),
/// `location`, `content_location`.
struct Write {
    status: Option<u16>,
    location: Option<String>,
    content_location: Option<String>,
}

impl Write {
    fn of(uri: &Uri) -> Write {
        let mut w = Write {
            status: None,
            location: None,
            content_location: None,
        };
        for pair in uri.query().unwrap_or("").split('&') {
            match pair.split_once('=') {
                Some(("status", v)) => w.status = v.parse().ok(),
                Some(("location", v)) => w.location = Some(v.to_owned()),
                Some(("content_location", v)) => w.content_location = Some(v.to_owned()),
                _ => {}
            }
        }
        w
    }
}

/// `/item` (GET reads, POST/PUT/PATCH/DELETE write) and `/other` (GET), all
/// behind the guard; `/item` varies on Accept-Language.
fn app(store: &Store, guard: StampedeGuard) -> Router {
    app_with(store, guard.vary([ACCEPT_LANGUAGE]))
}

/// [`app`] with the guard as given.
fn app_with(store: &Store, guard: StampedeGuard) -> Router {
    let read = {
        let store = store.clone();
        move |headers: HeaderMap| {
            let store = store.clone();
            async move {
                store.reads.fetch_add(1, Ordering::SeqCst);
                let lang = headers
                    .get(ACCEPT_LANGUAGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                format!("{lang}:{}", store.version.load(Ordering::SeqCst))
            }
        }
    };
    let write = {
        let store = store.clone();
        move |uri: Uri| {
            let store = store.clone();
            let w = Write::of(&uri);
            async move {
                let status = StatusCode::from_u16(w.status.unwrap_or(200)).unwrap();
                // An error is a write that did not happen.
                if status.is_success() || status.is_redirection() {
                    store.version.fetch_add(1, Ordering::SeqCst);
                }
                let mut headers = HeaderMap::new();
                if let Some(l) = w.location {
                    headers.insert(LOCATION, l.parse().unwrap());
                }
                if let Some(l) = w.content_location {
                    headers.insert(CONTENT_LOCATION, l.parse().unwrap());
                }
                (status, headers, "written").into_response()
            }
        }
    };
    let item = get(read.clone())
        .post(write.clone())
        .put(write.clone())
        .patch(write.clone())
        .delete(write);
    let guard = guard.ttl(Duration::from_secs(60));
    Router::new()
        .route("/item", item.layer(guard.clone()))
        .route("/other", get(read).layer(guard))
}

fn request(method: Method, uri: &str, host: &str, lang: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header(HOST, host);
    if let Some(lang) = lang {
        b = b.header(ACCEPT_LANGUAGE, lang);
    }
    b.body(Body::empty()).unwrap()
}

async fn read(app: &Router, uri: &str, host: &str, lang: Option<&str>) -> Answer {
    send(app, request(Method::GET, uri, host, lang)).await
}

async fn write(app: &Router, method: Method, uri: &str) -> Answer {
    send(app, request(method, uri, "a.example", None)).await
}

/// Asks until the answer is `want` (another instance hears of the write by
/// message), at most 50 times.
async fn read_until(app: &Router, uri: &str, lang: Option<&str>, want: &str) -> String {
    let mut text = read(app, uri, "a.example", lang).await.text();
    for _ in 0..50 {
        if text == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = read(app, uri, "a.example", lang).await.text();
    }
    text
}

/// Every unsafe method's success is seen at once by its own client, in
/// every variant, and by the other instance.
async fn a_write_is_read_back_everywhere(a: Backend, b: Backend) {
    let store = Store::default();
    let a = app(&store, StampedeGuard::new(a));
    let b = app(&store, StampedeGuard::new(b));
    let mut version = 0;
    for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        for lang in [None, Some("en")] {
            let want = format!("{}:{version}", lang.unwrap_or("none"));
            assert_eq!(read(&a, "/item", "a.example", lang).await.text(), want);
            assert_eq!(read(&b, "/item", "a.example", lang).await.text(), want);
            assert_eq!(read(&a, "/item", "a.example", lang).await.x_cache(), "HIT");
        }
        let written = write(&a, method.clone(), "/item").await;
        assert_eq!(written.status, StatusCode::OK);
        assert_eq!(written.x_cache(), "BYPASS");
        version += 1;
        for lang in [None, Some("en")] {
            let want = format!("{}:{version}", lang.unwrap_or("none"));
            // Read your own write: no wait.
            let mine = read(&a, "/item", "a.example", lang).await.text();
            assert_eq!(mine, want, "{method} was not invalidated here");
            let theirs = read_until(&b, "/item", lang, &want).await;
            assert_eq!(
                theirs, want,
                "{method} was not invalidated on the other instance"
            );
        }
    }
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    #[tokio::test]
    async fn a_successful_write_invalidates_on_every_instance() {
        let redis = RedisServer::start();
        a_write_is_read_back_everywhere(connect(&redis).await, connect(&redis).await).await;
    }

    /// Redis gone: the write still gets its answer (the purge is tried, and
    /// fails, within the backend's deadlines), and this instance has dropped
    /// its copy all the same.
    #[tokio::test]
    async fn a_failed_invalidation_never_fails_the_write() {
        let mut redis = RedisServer::start();
        let backend = Backend::redis_builder(&redis.url())
            .deadline(Duration::from_millis(50))
            .connect()
            .await
            .expect("redis backend");
        let store = Store::default();
        let app = app(&store, StampedeGuard::new(backend.clone()));
        assert_eq!(
            read(&app, "/item", "a.example", None).await.text(),
            "none:0"
        );
        redis.kill();
        let written = write(&app, Method::POST, "/item").await;
        assert_eq!(written.status, StatusCode::OK);
        assert_eq!(written.text(), "written");
        let after = read(&app, "/item", "a.example", None).await;
        assert_eq!(after.text(), "none:1", "the local copy was dropped");
        assert!(backend.stats().redis.unwrap().errors > 0);
    }
}

#[tokio::test]
async fn a_successful_write_invalidates_embedded() {
    let backend = Backend::local();
    a_write_is_read_back_everywhere(backend.clone(), backend).await;
}

#[tokio::test]
async fn an_error_answer_invalidates_nothing() {
    let store = Store::default();
    let app = app(&store, StampedeGuard::new(Backend::local()));
    assert_eq!(
        read(&app, "/item", "a.example", None).await.text(),
        "none:0"
    );
    for status in [400, 403, 404, 409, 500, 503] {
        let uri = format!("/item?status={status}&location=/other");
        let answer = write(&app, Method::POST, &uri).await;
        assert_eq!(answer.status.as_u16(), status);
        let after = read(&app, "/item", "a.example", None).await;
        assert_eq!(after.x_cache(), "HIT", "a {status} dropped the entry");
    }
    assert_eq!(store.reads(), 1);
}

#[tokio::test]
async fn locations_on_the_same_host_are_invalidated_and_other_hosts_are_not() {
    let store = Store::default();
    let app = app(&store, StampedeGuard::new(Backend::local()));
    // The same path cached for this host and for another one.
    read(&app, "/other", "a.example", None).await;
    read(&app, "/other", "evil.example", None).await;
    assert_eq!(store.reads(), 2);

    // Another host's URI, absolute or network-path: ignored.
    for location in ["http://evil.example/other", "//evil.example/other"] {
        let uri = format!("/item?location={location}&content_location={location}");
        write(&app, Method::POST, &uri).await;
        let other = read(&app, "/other", "evil.example", None).await;
        assert_eq!(other.x_cache(), "HIT", "{location} reached another host");
        let ours = read(&app, "/other", "a.example", None).await;
        assert_eq!(
            ours.x_cache(),
            "HIT",
            "{location} is not this host's /other"
        );
    }
    assert_eq!(store.reads(), 2);

    // This host's, relative, absolute or in Content-Location: dropped.
    for (header, value) in [
        ("location", "/other"),
        ("location", "other"),
        ("location", "http://A.EXAMPLE/other"),
        ("content_location", "/other"),
    ] {
        let before = store.reads();
        write(&app, Method::POST, &format!("/item?{header}={value}")).await;
        let ours = read(&app, "/other", "a.example", None).await;
        assert_eq!(ours.x_cache(), "MISS", "{header}: {value} was not dropped");
        assert_eq!(store.reads(), before + 1);
        let theirs = read(&app, "/other", "evil.example", None).await;
        assert_eq!(theirs.x_cache(), "HIT");
    }
}

#[tokio::test]
async fn the_opt_out_keeps_entries() {
    let store = Store::default();
    let guard = StampedeGuard::new(Backend::local()).invalidate_on_unsafe(false);
    let app = app(&store, guard);
    read(&app, "/item", "a.example", None).await;
    let written = write(&app, Method::POST, "/item").await;
    assert_eq!(written.status, StatusCode::OK);
    let after = read(&app, "/item", "a.example", None).await;
    assert_eq!((after.x_cache(), after.text().as_str()), ("HIT", "none:0"));
}

#[tokio::test]
async fn safe_methods_invalidate_nothing() {
    let store = Store::default();
    let app = app(&store, StampedeGuard::new(Backend::local()));
    read(&app, "/item", "a.example", None).await;
    for method in [Method::HEAD, Method::OPTIONS, Method::TRACE] {
        send(&app, request(method, "/item", "a.example", None)).await;
    }
    let after = read(&app, "/item", "a.example", None).await;
    assert_eq!(after.x_cache(), "HIT");
    assert_eq!(store.reads(), 1);
}

/// The write's target is keyed as a GET of it is: the query in any order,
/// with credentials on the write, and through the route's key function.
#[tokio::test]
async fn the_target_is_keyed_as_its_get() {
    let store = Store::default();
    let app = app(&store, StampedeGuard::new(Backend::local()));
    read(&app, "/item?a=1&b=2", "a.example", None).await;
    let mut post = request(Method::POST, "/item?b=2&a=1", "A.EXAMPLE", None);
    post.headers_mut()
        .insert(http::header::COOKIE, "session=1".parse().unwrap());
    assert_eq!(send(&app, post).await.status, StatusCode::OK);
    let after = read(&app, "/item?a=1&b=2", "a.example", None).await;
    assert_eq!(after.x_cache(), "MISS");
    assert_eq!(after.text(), "none:1");

    // A key function: one entry per tenant.
    let store = Store::default();
    let guard = StampedeGuard::new(Backend::local()).key_fn(|req| {
        let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
        Some(format!("{}:{}", tenant, req.uri.path()))
    });
    let app = app_with(&store, guard);
    let tenant = |method: Method, tenant: &str| {
        let mut r = request(method, "/item", "a.example", None);
        r.headers_mut().insert("x-tenant", tenant.parse().unwrap());
        r
    };
    send(&app, tenant(Method::GET, "t1")).await;
    send(&app, tenant(Method::GET, "t2")).await;
    assert_eq!(store.reads(), 2);
    send(&app, tenant(Method::PUT, "t1")).await;
    assert_eq!(
        send(&app, tenant(Method::GET, "t1")).await.x_cache(),
        "MISS"
    );
    assert_eq!(send(&app, tenant(Method::GET, "t2")).await.x_cache(), "HIT");
    assert_eq!(store.reads(), 3);
}
