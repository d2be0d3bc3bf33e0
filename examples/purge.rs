//! Purge by tag after a write: an axum service whose product pages are
//! cached and tagged, with an opt-in purge endpoint.
//!
//! `GET /products/{id}` is cached for an hour and tagged `product:<id>` (by
//! the route, from the request) and `catalog` (by the handler, in its
//! `Surrogate-Key` header, which the layer removes before the client sees
//! it). `POST /products/{id}` is the write: it changes the product, then
//! purges its tag. `POST /purge/tag/{tag}` and `POST /purge/all` are the
//! purge endpoints an operator or a CMS calls.
//!
//! The purge routes are the app's own: the layer does not expose them, and
//! it does no authorisation. Put them behind whatever guards your admin
//! routes (here, a shared token in `Authorization: Bearer …`, read from
//! `PURGE_TOKEN`), or on an internal listener. The write route is left
//! open here to keep the example short; a real one checks its caller
//! before it writes, and so before it purges: each write that succeeds
//! costs the next readers of that product a miss.
//!
//! With a Redis backend (`--redis redis://…`), a purge is a fleet barrier:
//! when the endpoint answers, no instance serves what was purged.
//!
//! ```sh
//! cargo run --example purge                       # runs a short self-check and exits
//! PURGE_TOKEN=secret cargo run --example purge -- --serve   # serves on 127.0.0.1:3000
//! curl localhost:3000/products/7
//! curl -X POST -H 'authorization: Bearer secret' localhost:3000/purge/tag/product:7
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use stampede_guard::{Backend, StampedeGuard};
use tower::ServiceExt;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct App {
    guard: StampedeGuard,
    /// The "database": product prices.
    prices: Arc<Mutex<HashMap<u32, u32>>>,
    /// The token the purge endpoints require.
    token: Arc<str>,
}

async fn show(State(app): State<App>, Path(id): Path<u32>) -> (HeaderMap, String) {
    let price = app.prices.lock().unwrap().get(&id).copied().unwrap_or(100);
    let mut headers = HeaderMap::new();
    headers.insert("surrogate-key", "catalog".parse().unwrap());
    (headers, format!("product {id}: {price} EUR\n"))
}

/// The write: change the price, then purge the product's tag. The client
/// gets its answer once no instance serves the old price.
async fn update(State(app): State<App>, Path(id): Path<u32>, price: String) -> StatusCode {
    let Ok(price) = price.trim().parse() else {
        return StatusCode::BAD_REQUEST;
    };
    app.prices.lock().unwrap().insert(id, price);
    match app.guard.invalidate_tag(&format!("product:{id}")).await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The app's own authorisation: the layer has none. (A real service
/// compares secrets in constant time, or uses its admin auth.)
fn authorised(app: &App, headers: &HeaderMap) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|given| given.as_bytes() == app.token.as_bytes())
}

async fn purge_tag(
    State(app): State<App>,
    headers: HeaderMap,
    Path(tag): Path<String>,
) -> StatusCode {
    if !authorised(&app, &headers) {
        return StatusCode::UNAUTHORIZED;
    }
    match app.guard.invalidate_tag(&tag).await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn purge_all(State(app): State<App>, headers: HeaderMap) -> StatusCode {
    if !authorised(&app, &headers) {
        return StatusCode::UNAUTHORIZED;
    }
    match app.guard.invalidate_all().await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A path segment percent-decoded, as axum's `Path` decodes it (`None` if
/// it is not UTF-8 then: `Path` refuses it too).
fn percent_decoded(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The app: its product routes, cached and tagged, and the purge routes.
pub(crate) fn router(backend: Backend, token: &str) -> Router {
    let guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(3600))
        .tags(|req| {
            // The id as the handler reads it (`Path<u32>`, percent-decoded):
            // `/products/007`, `/products/+7` and `/products/%37` are other
            // entries of product 7, and its purge must reach them. Tagging
            // the raw path segment would not.
            let id = req.uri.path().rsplit('/').next().unwrap_or_default();
            match percent_decoded(id).and_then(|id| id.parse::<u32>().ok()) {
                Some(id) => vec![format!("product:{id}")],
                None => Vec::new(),
            }
        });
    let app = App {
        guard: guard.clone(),
        prices: Arc::default(),
        token: Arc::from(token),
    };
    Router::new()
        .route("/products/{id}", get(show).layer(guard).post(update))
        .route("/purge/tag/{tag}", post(purge_tag))
        .route("/purge/all", post(purge_all))
        .with_state(app)
}

async fn call(app: &Router, request: Request<Body>) -> Result<(StatusCode, String), Error> {
    let response = app.clone().oneshot(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Shows the purge at work in-process, and fails if it does not.
async fn self_check(app: Router) -> Result<(), Error> {
    let get = || Request::get("/products/7").body(Body::empty());
    let before = call(&app, get()?).await?;
    println!("GET  /products/7          -> {}", before.1.trim());
    // The same product under another spelling of its id: another entry,
    // which the product's purge must reach too.
    let padded = || Request::get("/products/007").body(Body::empty());
    call(&app, padded()?).await?;
    let write = Request::post("/products/7").body(Body::from("80"))?;
    println!(
        "POST /products/7 (80)     -> {}",
        call(&app, write).await?.0
    );
    let after = call(&app, get()?).await?;
    println!("GET  /products/7          -> {}", after.1.trim());
    assert_eq!(
        after.1, "product 7: 80 EUR\n",
        "the write's purge reached the cache"
    );
    let after = call(&app, padded()?).await?;
    println!("GET  /products/007        -> {}", after.1.trim());
    assert_eq!(
        after.1, "product 7: 80 EUR\n",
        "the write's purge reached every spelling of the product"
    );

    let refused = Request::post("/purge/all").body(Body::empty())?;
    let refused = call(&app, refused).await?.0;
    println!("POST /purge/all (no auth) -> {refused}");
    assert_eq!(refused, StatusCode::UNAUTHORIZED);
    let purge = Request::post("/purge/tag/catalog")
        .header("authorization", "Bearer secret")
        .body(Body::empty())?;
    println!(
        "POST /purge/tag/catalog   -> {}",
        call(&app, purge).await?.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = args.iter().any(|a| a == "--serve");
    let redis = args
        .iter()
        .position(|a| a == "--redis")
        .and_then(|i| args.get(i + 1));
    let backend = match redis {
        #[cfg(feature = "redis")]
        Some(url) => Backend::redis(url).await?,
        #[cfg(not(feature = "redis"))]
        Some(_) => return Err("built without the `redis` feature".into()),
        None => Backend::local(),
    };
    // Serving, the purge token must be the operator's own: a default one
    // would leave the purge endpoints open to anyone who read this file.
    let token = match (std::env::var("PURGE_TOKEN"), serve) {
        (Ok(token), _) if !token.is_empty() => token,
        (_, true) => return Err("set PURGE_TOKEN to the purge endpoints' token".into()),
        (_, false) => "secret".to_owned(),
    };
    let app = router(backend, &token);
    if !serve {
        return self_check(app).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    axum::serve(listener, app).await?;
    Ok(())
}
