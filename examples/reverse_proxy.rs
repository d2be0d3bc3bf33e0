//! A caching reverse proxy: `stampede-guard` in front of any HTTP origin.
//!
//! Every request is forwarded to the upstream (method, path and query,
//! headers without the hop-by-hop ones, body) by a hyper client, and the
//! answer is streamed back. The guard sits between the two as a shared cache
//! would: it follows the origin's `Cache-Control`, `Expires` and `Vary`
//! (`respect_cache_control(true)`), and with `ttl(0)` a response the origin
//! gives no freshness to is not stored. No stale windows are configured;
//! every other setting is the crate's default.
//!
//! ```text
//! # the embedded backend (in-process cache)
//! cargo run --example reverse_proxy -- --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000
//! # the Redis backend: one cache, and one origin call per key, for every proxy
//! # that points at the same Redis (also read from REDIS_URL)
//! cargo run --example reverse_proxy -- --upstream http://127.0.0.1:8000 --redis redis://127.0.0.1:6379
//! ```
//!
//! Once it listens, it prints `listening on http://ADDR` on its own line
//! (with `--listen 127.0.0.1:0` the system picks a free port). An origin that
//! cannot be reached, or drops the connection, is answered with
//! `502 Bad Gateway`.
//!
//! This is the configuration `scripts/conformance` measures with the public
//! HTTP caching test suite (CONFORMANCE.md has the figures). In production
//! a route usually adds stale windows (`stale_while_revalidate`,
//! `stale_if_error`) so that expiry and origin failures are not felt by
//! clients; the README describes each setting. The client speaks plain
//! `http://` to the upstream; for `https://`, build it with a TLS connector
//! (for instance `hyper-rustls`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use stampede_guard::{Backend, BoxError, StampedeGuard};
use tower::{ServiceBuilder, ServiceExt};

#[derive(Parser, Debug)]
#[command(about = "A caching reverse proxy built on stampede-guard")]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The origin every request is forwarded to, e.g. `http://127.0.0.1:8000`
    /// (a path prefix, if any, is put before each request's path).
    #[arg(long)]
    upstream: Uri,
    /// Cache in Redis at this URL (shared by every proxy pointing at it)
    /// instead of in process. Read from `REDIS_URL` when not given.
    #[arg(long)]
    redis: Option<String>,
}

/// The upstream client: plain HTTP/1.1, connections pooled.
type UpstreamClient = Client<HttpConnector, Incoming>;

type ProxyBody = BoxBody<Bytes, BoxError>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let upstream = Upstream::new(&args.upstream)?;
    let backend = backend(args.redis.or_else(|| std::env::var("REDIS_URL").ok())).await?;

    let guard = StampedeGuard::new(backend)
        // Freshness comes from the origin (`Cache-Control`, `Expires`);
        // a response it says nothing about is not stored.
        .respect_cache_control(true)
        .ttl(Duration::ZERO);

    let client: UpstreamClient = Client::builder(TokioExecutor::new()).build_http();
    let cached = ServiceBuilder::new()
        .layer(guard)
        .service(tower::service_fn(move |request| {
            upstream.clone().forward(client.clone(), request)
        }));

    // hyper calls services through `&self`; the adapter clones the tower
    // service per request, which is cheap (the guard's state is shared).
    let service = TowerToHyperService::new(tower::service_fn(move |request| {
        let cached = cached.clone();
        async move {
            let response = match cached.oneshot(request).await {
                Ok(response) => response.map(|body| body.boxed()),
                Err(error) => bad_gateway(&error),
            };
            Ok::<_, Infallible>(response)
        }
    }));

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: the next accept may work.
                Err(_) => continue,
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let service = service.clone();
        tokio::spawn(async move {
            // A client hanging up mid-response is not worth reporting here.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The cache's backend: Redis at `redis_url`, or the embedded one.
async fn backend(redis_url: Option<String>) -> Result<Backend, BoxError> {
    match redis_url {
        None => Ok(Backend::local()),
        #[cfg(feature = "redis")]
        Some(url) => Ok(Backend::redis(&url).await?),
        #[cfg(not(feature = "redis"))]
        Some(_) => Err("the Redis backend needs the crate's `redis` feature".into()),
    }
}

/// Where requests go: the upstream's scheme and authority, and its path
/// prefix (empty for an upstream given without a path).
#[derive(Clone, Debug)]
struct Upstream {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    prefix: String,
}

impl Upstream {
    fn new(uri: &Uri) -> Result<Self, BoxError> {
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return Err(format!("the upstream `{uri}` needs a scheme and a host").into());
        };
        if scheme != &http::uri::Scheme::HTTP {
            return Err("this example's client speaks plain http:// only".into());
        }
        Ok(Upstream {
            scheme: scheme.clone(),
            authority: authority.clone(),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// Sends `request` upstream and returns its answer, the body streamed.
    async fn forward(
        self,
        client: UpstreamClient,
        request: Request<Incoming>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        let (mut parts, body) = request.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        parts.uri = Uri::builder()
            .scheme(self.scheme)
            .authority(self.authority)
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
            .expect("a valid authority and path make a valid URI");
        // The client speaks HTTP/1.1 to the upstream whatever the client of
        // the proxy spoke, and sets `Host` from the upstream's URI.
        parts.version = Version::HTTP_11;
        remove_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);

        let mut response = client.request(Request::from_parts(parts, body)).await?;
        // Hop-by-hop headers describe the upstream connection: they are
        // neither stored nor passed on.
        remove_hop_by_hop(response.headers_mut());
        Ok(response)
    }
}

/// Removes the headers that concern one connection only (RFC 9110 §7.6.1):
/// the fixed list, and every header that `Connection` names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// The answer when the upstream could not be reached or failed mid-way.
fn bad_gateway(error: &hyper_util::client::legacy::Error) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from(format!("upstream error: {error}\n")))
        .map_err(|never| match never {})
        .boxed();
    Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(body)
        .expect("static headers are valid")
}
