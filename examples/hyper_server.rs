//! `stampede-guard` around a plain hyper service, no framework.
//!
//! The guard is an ordinary tower layer, so it wraps any
//! `Service<http::Request<B>>` whose responses have an `http_body::Body`. Here
//! the inner service is a `tower::service_fn`, served by hyper-util's
//! HTTP/1 + HTTP/2 connection builder.
//!
//! ```text
//! cargo run --example hyper_server            # sends a few requests, then exits
//! cargo run --example hyper_server -- --serve # keeps serving until Ctrl-C
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use stampede_guard::{Backend, StampedeGuard};
use tower::ServiceBuilder;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let serve_forever = std::env::args().any(|arg| arg == "--serve");
    let origin_calls = Arc::new(AtomicUsize::new(0));

    let service = ServiceBuilder::new()
        .layer(StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(30)))
        .service_fn({
            let origin_calls = origin_calls.clone();
            // The guard hands the request over with hyper's own body type
            // (`Incoming`): it never replaces request bodies (a GET's
            // content is read to its end and discarded, so none is left).
            move |request: Request<Incoming>| {
                let origin_calls = origin_calls.clone();
                async move {
                    origin_calls.fetch_add(1, Ordering::SeqCst);
                    // Slow enough that concurrent requests overlap.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let body = format!("price list for {}\n", request.uri().path());
                    let response = Response::builder()
                        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                        .body(Full::new(Bytes::from(body)))
                        .expect("static headers are valid");
                    Ok::<_, Infallible>(response)
                }
            }
        });
    // hyper calls services through `&self`; the adapter clones the tower
    // service per request, which is cheap: the guard's state sits behind `Arc`s.
    let service = TowerToHyperService::new(service);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                // A client hanging up mid-response is not worth reporting here.
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    if serve_forever {
        println!("listening on http://{addr}; try: curl -i http://{addr}/prices");
        println!("press Ctrl-C to stop");
        tokio::signal::ctrl_c().await?;
        server.abort();
        return Ok(());
    }

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = |path: &str| {
        let client = client.clone();
        let uri = format!("http://{addr}{path}").parse::<hyper::Uri>();
        async move {
            let response = client.get(uri?).await?;
            let x_cache = match response.headers().get("x-cache") {
                Some(value) => value.to_str()?.to_owned(),
                None => "(none)".to_owned(),
            };
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Error>((x_cache, String::from_utf8_lossy(&body).trim().to_owned()))
        }
    };

    println!("serving on http://{addr}");
    println!("three concurrent requests for a cold key:");
    let (a, b, c) = tokio::join!(get("/prices"), get("/prices"), get("/prices"));
    for (x_cache, body) in [a?, b?, c?] {
        println!("  x-cache: {x_cache:<9}  body: {body:?}");
    }
    println!(
        "  origin calls so far: {}",
        origin_calls.load(Ordering::SeqCst)
    );

    println!("one more, now that the entry is cached:");
    let (x_cache, body) = get("/prices").await?;
    println!("  x-cache: {x_cache:<9}  body: {body:?}");
    println!(
        "  origin calls so far: {}",
        origin_calls.load(Ordering::SeqCst)
    );

    server.abort();
    Ok(())
}
