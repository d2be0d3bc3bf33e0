//! The call shapes users write compile, and answer: `Cache::get_or_rebuild`
//! with closures, async closures, boxed futures and `fn` items, inside
//! `tokio::spawn`; the layer on axum handlers and routes, nested routers,
//! a `ServiceBuilder` and a hyper service. Each runs on the embedded
//! backend and counts its origin calls. And the first error a user of the
//! default features meets with a TLS URL names the feature it needs.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stampede_guard::{Backend, Cache, StampedeGuard};
use tower::{ServiceBuilder, ServiceExt};

type Boxed = Pin<Box<dyn Future<Output = Result<String, io::Error>> + Send>>;

/// Counts the rebuilds or origin calls of one test.
#[derive(Clone, Default)]
struct Calls(Arc<AtomicUsize>);

impl Calls {
    fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn cache() -> Cache<String> {
    Cache::new(Backend::local()).ttl(Duration::from_secs(60))
}

/// Runs `call` twice, each inside `tokio::spawn` (which asks the future to
/// be `Send` for every lifetime), and returns both answers.
async fn twice_spawned<Fut>(call: impl Fn() -> Fut) -> [String; 2]
where
    Fut: Future<Output = String> + Send + 'static,
{
    let first = tokio::spawn(call()).await.expect("first call");
    let second = tokio::spawn(call()).await.expect("second call");
    [first, second]
}

#[tokio::test]
async fn a_closure_returning_an_async_block() {
    let (cache, calls) = (cache(), Calls::default());
    let answers = twice_spawned(|| {
        let (cache, calls) = (cache.clone(), calls.clone());
        async move {
            cache
                .get_or_rebuild("k", move || async move {
                    Ok::<_, io::Error>(format!("v{}", calls.hit()))
                })
                .await
                .expect("rebuilt")
        }
    })
    .await;
    assert_eq!(answers, ["v1", "v1"]);
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn an_async_closure() {
    let (cache, calls) = (cache(), Calls::default());
    let answers = twice_spawned(|| {
        let (cache, calls) = (cache.clone(), calls.clone());
        async move {
            cache
                .get_or_rebuild("k", async move || {
                    Ok::<_, io::Error>(format!("v{}", calls.hit()))
                })
                .await
                .expect("rebuilt")
        }
    })
    .await;
    assert_eq!(answers, ["v1", "v1"]);
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn a_closure_returning_a_boxed_future() {
    let (cache, calls) = (cache(), Calls::default());
    let answers = twice_spawned(|| {
        let (cache, calls) = (cache.clone(), calls.clone());
        async move {
            cache
                .get_or_rebuild("k", move || -> Boxed {
                    Box::pin(async move { Ok(format!("v{}", calls.hit())) })
                })
                .await
                .expect("rebuilt")
        }
    })
    .await;
    assert_eq!(answers, ["v1", "v1"]);
    assert_eq!(calls.count(), 1);
}

static FN_CALLS: AtomicUsize = AtomicUsize::new(0);

async fn load_report() -> Result<String, io::Error> {
    Ok(format!("r{}", FN_CALLS.fetch_add(1, Ordering::SeqCst) + 1))
}

fn load_boxed() -> Boxed {
    Box::pin(async { Ok("boxed".to_owned()) })
}

#[tokio::test]
async fn fn_items() {
    let cache = cache();
    let answers = twice_spawned(|| {
        let cache = cache.clone();
        async move {
            cache
                .get_or_rebuild("report", load_report)
                .await
                .expect("rebuilt")
        }
    })
    .await;
    assert_eq!(answers, ["r1", "r1"]);
    assert_eq!(FN_CALLS.load(Ordering::SeqCst), 1);

    let boxed = tokio::spawn(async move { cache.get_or_rebuild("boxed", load_boxed).await })
        .await
        .expect("spawned")
        .expect("rebuilt");
    assert_eq!(boxed, "boxed");
}

/// The error a rebuild returns reaches the caller, in the shape it has.
#[tokio::test]
async fn a_failing_boxed_future_inside_spawn() {
    let cache = cache();
    let failed = tokio::spawn(async move {
        cache
            .get_or_rebuild("k", || -> Boxed {
                Box::pin(async { Err(io::Error::other("origin down")) })
            })
            .await
    })
    .await
    .expect("spawned")
    .expect_err("the rebuild failed");
    assert_eq!(
        failed.error().map(|e| e.to_string()).as_deref(),
        Some("origin down")
    );
}

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60))
}

async fn body_of(response: Response<Body>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

/// Sends `uri` twice through `app`; returns both bodies.
async fn twice(app: &Router, uri: &str) -> [String; 2] {
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let request = Request::get(uri).body(Body::empty()).expect("request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        bodies.push(body_of(response).await);
    }
    bodies.try_into().expect("two bodies")
}

fn counting_handler(
    calls: &Calls,
) -> impl Fn() -> std::future::Ready<String> + Clone + Send + use<> {
    let calls = calls.clone();
    move || std::future::ready(format!("page {}", calls.hit()))
}

#[tokio::test]
async fn the_layer_on_an_axum_router() {
    let calls = Calls::default();
    let app = Router::new()
        .route("/page", get(counting_handler(&calls)))
        .layer(guard());
    assert_eq!(twice(&app, "/page").await, ["page 1", "page 1"]);
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn the_layer_on_one_route() {
    let calls = Calls::default();
    let app = Router::new()
        .route("/cached", get(counting_handler(&calls)).layer(guard()))
        .route("/live", get(|| async { "live" }));
    assert_eq!(twice(&app, "/cached").await, ["page 1", "page 1"]);
    assert_eq!(twice(&app, "/live").await, ["live", "live"]);
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn the_layer_on_nested_routers() {
    let (a, b) = (Calls::default(), Calls::default());
    let inner_a = Router::new().route("/item", get(counting_handler(&a)));
    let inner_b = Router::new().route("/item", get(counting_handler(&b)));
    // The layer inside the nest sees the stripped path; it keys on the URI
    // the client sent, so the two `/item`s never share an entry.
    let app = Router::new()
        .nest("/a", inner_a.layer(guard()))
        .nest("/b", inner_b.layer(guard()));
    assert_eq!(twice(&app, "/a/item").await, ["page 1", "page 1"]);
    assert_eq!(twice(&app, "/b/item").await, ["page 1", "page 1"]);
    assert_eq!((a.count(), b.count()), (1, 1));

    let shared = guard();
    let (c, d) = (Calls::default(), Calls::default());
    let app = Router::new()
        .nest(
            "/c",
            Router::new().route("/item", get(counting_handler(&c))),
        )
        .nest(
            "/d",
            Router::new().route("/item", get(counting_handler(&d))),
        )
        .layer(shared);
    assert_eq!(twice(&app, "/c/item").await, ["page 1", "page 1"]);
    assert_eq!(twice(&app, "/d/item").await, ["page 1", "page 1"]);
    assert_eq!((c.count(), d.count()), (1, 1));
}

#[tokio::test]
async fn a_service_builder_around_a_service_fn() {
    let calls = Calls::default();
    let service =
        ServiceBuilder::new().layer(guard()).service_fn({
            let calls = calls.clone();
            move |_: Request<Full<Bytes>>| {
                let n = calls.hit();
                async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("fn {n}")))))
                }
            }
        });
    for _ in 0..2 {
        let request = Request::get("/fn")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = service.clone().oneshot(request).await.expect("infallible");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(&body[..], b"fn 1");
    }
    assert_eq!(calls.count(), 1);
}

#[tokio::test]
async fn a_hyper_service() {
    use hyper::service::Service as _;
    use hyper_util::service::TowerToHyperService;

    let calls = Calls::default();
    let service = ServiceBuilder::new().layer(guard()).service_fn({
        let calls = calls.clone();
        move |_: Request<Full<Bytes>>| {
            let n = calls.hit();
            async move {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("hyper {n}")))))
            }
        }
    });
    let service = TowerToHyperService::new(service);
    for _ in 0..2 {
        let request = Request::get("/h")
            .body(Full::new(Bytes::new()))
            .expect("request");
        // As hyper's connection task calls it: on a spawned task.
        let call = service.call(request);
        let response = tokio::spawn(call)
            .await
            .expect("spawned")
            .expect("infallible");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(&body[..], b"hyper 1");
    }
    assert_eq!(calls.count(), 1);
}

/// A `rediss://` URL in a build without TLS fails at once, as a settings
/// error that names the feature to turn on (the default features; run by
/// scripts/test in that build).
#[cfg(all(feature = "redis", not(feature = "redis-tls")))]
#[tokio::test]
async fn a_rediss_url_without_the_tls_feature_names_it() {
    for url in [
        "rediss://127.0.0.1:1/",
        "rediss-sentinel://127.0.0.1:1/primary",
    ] {
        let error = Backend::redis(url).await.expect_err("no TLS in this build");
        assert_eq!(
            error.kind(),
            stampede_guard::ErrorKind::InvalidConfig,
            "{url}"
        );
        assert!(
            error.to_string().contains("`redis-tls` feature"),
            "{url}: {error}"
        );
    }
}
