//! The route both hit-path measures serve (`benches/hit_path.rs` and
//! `examples/hit_cost.rs`): the same handler, body and request, bare or
//! behind the layer on the embedded backend.

use std::convert::Infallible;
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use stampede_guard::{Backend, StampedeGuard};
use tower::{ServiceBuilder, ServiceExt};

/// A 1 KiB payload, about the size of a small JSON document.
pub static PAYLOAD: [u8; 1024] = [b'x'; 1024];
pub const CONTENT_TYPE: &str = "application/json";
pub const URI: &str = "/report?region=eu";
pub const TTL: Duration = Duration::from_secs(3600);

pub async fn handler() -> ([(header::HeaderName, &'static str); 1], Bytes) {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        Bytes::from_static(&PAYLOAD),
    )
}

pub fn request() -> Request<axum::body::Body> {
    Request::get(URI)
        .header(header::HOST, "bench.local")
        .body(axum::body::Body::empty())
        .expect("valid request")
}

/// The same request with a plain empty body, for the layer's service alone
/// and for an HTTP client.
pub fn plain_request() -> Request<Empty<Bytes>> {
    Request::get(URI)
        .header(header::HOST, "bench.local")
        .body(Empty::<Bytes>::new())
        .expect("valid request")
}

/// The route without the layer. Both routers are given their state here, as
/// `axum::serve` does for each connection: otherwise axum builds the
/// handler's service (and the layer around it) again on every request.
pub fn bare_router() -> Router {
    Router::new().route("/report", get(handler)).with_state(())
}

/// The same route with the layer.
pub fn guarded_router() -> Router {
    Router::new()
        .route(
            "/report",
            get(handler).layer(StampedeGuard::new(Backend::local()).ttl(TTL)),
        )
        .with_state(())
}

/// One request through a router, the way axum's server drives it: a fresh
/// clone of the router per request, then the whole body read.
pub async fn call_router(router: &Router) -> Bytes {
    let response = router.clone().oneshot(request()).await.expect("infallible");
    response
        .into_body()
        .collect()
        .await
        .expect("in-memory body")
        .to_bytes()
}

/// The layer around a service answering the same body, without a router.
pub fn guard_service() -> impl tower::Service<
    Request<Empty<Bytes>>,
    Response = Response<stampede_guard::GuardBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    ServiceBuilder::new()
        .layer(StampedeGuard::new(Backend::local()).ttl(TTL))
        .service_fn(|_: Request<Empty<Bytes>>| async {
            let response = Response::builder()
                .header(header::CONTENT_TYPE, CONTENT_TYPE)
                .body(Full::new(Bytes::from_static(&PAYLOAD)))
                .expect("valid response");
            Ok::<_, Infallible>(response)
        })
}

/// Fills the guarded route's entry, and checks that the next call is an L1
/// hit.
pub async fn warm(guarded: &Router) {
    call_router(guarded).await;
    let response = guarded
        .clone()
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(response.headers()["x-cache"], "HIT");
}
