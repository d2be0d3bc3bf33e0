//! More attacks: credentials and one-client answers, hit-for-miss, the
//! references an unsafe method's answer names (dot segments, a bare query),
//! and invalidation as a barrier across variants and instances.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::driver::counted_app;
use crate::common::{get as get_req, local_guard, request_with, send, Origin};
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::header::SET_COOKIE;
use http::{HeaderMap, HeaderName, Method, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};

/// A request with credentials, in any spelling, is neither answered from
/// the cache nor stored.
#[tokio::test]
async fn credentials_in_any_spelling_bypass() {
    for (name, value) in [
        ("authorization", "Bearer x"),
        ("Authorization", ""),
        ("cookie", "s=1"),
        ("cookie", ""),
        ("proxy-authorization", "Basic eA=="),
    ] {
        let origin = Origin::default();
        let app = counted_app(&origin, local_guard(), |n| async move { format!("v{n}") });
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
        let with = send(&app, request_with(Method::GET, "/report", &[(name, value)])).await;
        assert_eq!(with.x_cache(), "BYPASS", "{name}: {value}");
        assert_eq!(with.text(), "v2", "{name}: answered from the cache");
        assert_eq!(send(&app, get_req("/report")).await.text(), "v1");
    }
}

/// Two answers with cookies in a row open a hit-for-miss window; the first
/// cacheable answer in it is stored all the same.
#[tokio::test]
async fn hit_for_miss_never_blocks_the_next_cacheable_answer() {
    let origin = Origin::default();
    let app = counted_app(&origin, local_guard(), |n| async move {
        if n <= 2 {
            ([(SET_COOKIE, format!("s={n}"))], format!("v{n}")).into_response()
        } else {
            format!("v{n}").into_response()
        }
    });
    for n in 1..=2 {
        let a = send(&app, get_req("/report")).await;
        assert_eq!(a.text(), format!("v{n}"));
    }
    assert_eq!(send(&app, get_req("/report")).await.text(), "v3");
    let hit = send(&app, get_req("/report")).await;
    assert_eq!(hit.text(), "v3", "the cacheable answer was not stored");
    assert!(hit.headers.get(SET_COOKIE).is_none());
    assert_eq!(origin.calls(), 3);
}

/// Refusals for one client (and statuses the route does not store) never
/// reach another, sequentially or while waiting on the same rebuild.
#[tokio::test]
async fn one_clients_refusal_never_reaches_another() {
    for status in [401u16, 403, 407, 429, 302, 206, 201] {
        let origin = Origin::default();
        let app = counted_app(&origin, local_guard(), move |n| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if n == 1 {
                (StatusCode::from_u16(status).unwrap(), "refused").into_response()
            } else {
                format!("v{n}").into_response()
            }
        });
        let answers = crate::common::burst(&app, 10, || get_req("/report")).await;
        let refused = answers.iter().filter(|a| a.text() == "refused").count();
        assert_eq!(refused, 1, "{status} reached {refused} clients");
        assert!(answers
            .iter()
            .all(|a| a.text() == "refused" || a.status == StatusCode::OK));
    }
}

/// An origin whose reads take a while and answer the version they read at
/// their start, varying on `x-lang`.
fn slow_reader(version: &Arc<AtomicUsize>, guard: StampedeGuard) -> Router {
    let v = version.clone();
    let read = move |headers: HeaderMap| {
        let v = v.clone();
        async move {
            let seen = v.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let lang = headers
                .get("x-lang")
                .and_then(|l| l.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            ([("vary", "x-lang")], format!("{lang}:{seen}"))
        }
    };
    Router::new().route("/doc", get(read).layer(guard))
}

/// A request that names its host: guards on one backend (the embedded
/// stand-in for two instances) share its entries.
fn lang(l: &str) -> Request<Body> {
    request_with(Method::GET, "/doc", &[("host", "docs.test"), ("x-lang", l)])
}

/// `invalidate` drops every variant on every instance, and is a barrier: a
/// request after it never gets a value read before it, even from a rebuild
/// that was running when it was called.
async fn invalidate_is_a_barrier(a: Backend, b: Backend) {
    let vary = [HeaderName::from_static("x-lang")];
    let ttl = Duration::from_secs(60);
    let ga = StampedeGuard::new(a).ttl(ttl).vary(vary.clone());
    let gb = StampedeGuard::new(b).ttl(ttl).vary(vary);
    let version = Arc::new(AtomicUsize::new(0));
    let app_a = slow_reader(&version, ga.clone());
    let app_b = slow_reader(&version, gb.clone());
    assert_eq!(send(&app_a, lang("en")).await.text(), "en:0");
    assert_eq!(send(&app_b, lang("fr")).await.text(), "fr:0");
    assert_eq!(send(&app_b, lang("en")).await.text(), "en:0");

    // A rebuild of a new variant is running on A when B writes.
    let running = {
        let app_a = app_a.clone();
        tokio::spawn(async move { send(&app_a, lang("de")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    version.fetch_add(1, Ordering::SeqCst);
    gb.invalidate(&lang("xx")).await.expect("invalidate");

    for (app, l) in [
        (&app_a, "en"),
        (&app_a, "fr"),
        (&app_b, "en"),
        (&app_b, "fr"),
        (&app_a, "de"),
    ] {
        let got = send(app, lang(l)).await.text();
        assert_eq!(
            got,
            format!("{l}:1"),
            "a value from before the invalidation"
        );
    }
    let _ = running.await;
    let again = send(&app_a, lang("de")).await.text();
    assert_eq!(
        again, "de:1",
        "the rebuild running at the invalidation was stored"
    );
}

#[tokio::test]
async fn invalidate_is_a_barrier_embedded() {
    let backend = Backend::local();
    invalidate_is_a_barrier(backend.clone(), backend).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn invalidate_is_a_barrier_for_the_fleet() {
    let redis = crate::common::redis::RedisServer::start();
    let a = crate::common::driver::connect(&redis).await;
    let b = crate::common::driver::connect(&redis).await;
    invalidate_is_a_barrier(a, b).await;
}

/// The other instance drops every variant too (once the invalidation
/// message reaches it), and its rebuild that was running then stores
/// nothing.
#[cfg(feature = "redis")]
#[tokio::test]
async fn invalidate_reaches_every_variant_on_every_instance() {
    let redis = crate::common::redis::RedisServer::start();
    let a = crate::common::driver::connect(&redis).await;
    let b = crate::common::driver::connect(&redis).await;
    let vary = [HeaderName::from_static("x-lang")];
    let ttl = Duration::from_secs(60);
    let ga = StampedeGuard::new(a).ttl(ttl).vary(vary.clone());
    let gb = StampedeGuard::new(b).ttl(ttl).vary(vary);
    let version = Arc::new(AtomicUsize::new(0));
    let app_a = slow_reader(&version, ga);
    let _app_b = slow_reader(&version, gb.clone());
    for l in ["en", "fr"] {
        assert_eq!(send(&app_a, lang(l)).await.text(), format!("{l}:0"));
    }
    let running = {
        let app_a = app_a.clone();
        tokio::spawn(async move { send(&app_a, lang("de")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    version.fetch_add(1, Ordering::SeqCst);
    gb.invalidate(&lang("xx")).await.expect("invalidate");
    for l in ["en", "fr"] {
        let mut got = String::new();
        for _ in 0..50 {
            got = send(&app_a, lang(l)).await.text();
            if got == format!("{l}:1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(got, format!("{l}:1"), "the other instance kept {l}");
    }
    let _ = running.await;
    assert_eq!(send(&app_a, lang("de")).await.text(), "de:1");
}

/// The guard around a whole router, served by hyper directly: the request
/// body is hyper's `Incoming`, not axum's. An HTTP/2 GET whose DATA frames
/// come without `Content-Length` has its content discarded: the handler
/// sees none, so no answer a body shaped can be stored, and the request
/// costs what any GET costs (the next one is a hit).
#[tokio::test]
async fn an_http2_get_body_never_reaches_a_handler_behind_a_guard_around_the_router() {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use tokio::net::{TcpListener, TcpStream};
    use tower::Layer;

    let origin = Origin::default();
    let o = origin.clone();
    let router = Router::new().route(
        "/r",
        get(move |body: String| {
            let o = o.clone();
            async move {
                o.enter();
                format!("body={body}")
            }
        }),
    );
    let service = local_guard().layer(router);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let mut bodies = Vec::new();
    for body in [Some("evil"), None] {
        let frames: Vec<Result<Frame<bytes::Bytes>, std::convert::Infallible>> = body
            .map(|b| Ok(Frame::data(bytes::Bytes::from_static(b.as_bytes()))))
            .into_iter()
            .collect();
        let request = Request::get("http://a.test/r")
            .body(StreamBody::new(tokio_stream::iter(frames)))
            .unwrap();
        let response = sender.send_request(request).await.expect("h2 response");
        let status = response.headers()["x-cache"].to_str().unwrap().to_owned();
        let text = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        bodies.push((status, String::from_utf8_lossy(&text).into_owned()));
    }
    assert_eq!(
        bodies[0],
        ("MISS".to_owned(), "body=".to_owned()),
        "the handler saw the GET's body: {bodies:?}"
    );
    assert_eq!(
        bodies[1],
        ("HIT".to_owned(), "body=".to_owned()),
        "{bodies:?}"
    );
    assert_eq!(origin.calls(), 1);
}
