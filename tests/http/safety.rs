//! Never cache what must not be shared, and never buffer what is too large.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{get as get_req, local_guard, send, Origin};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use stampede_guard::StampedeGuard;
use tower::ServiceExt;

/// A route answering with `headers` and a body naming the call.
fn app_with(
    origin: &Origin,
    headers: &'static [(&'static str, &'static str)],
    guard: StampedeGuard,
) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/r",
        get(move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let mut map = HeaderMap::new();
                for (k, v) in headers {
                    map.append(*k, v.parse().unwrap());
                }
                (map, format!("call {n}")).into_response()
            }
        })
        .layer(guard),
    )
}

async fn twice(
    app: &Router,
    make: impl Fn() -> Request<Body>,
) -> (crate::common::Answer, crate::common::Answer) {
    let a = send(app, make()).await;
    let b = send(app, make()).await;
    (a, b)
}

#[tokio::test]
async fn requests_with_credentials_pass_through() {
    for (name, value) in [
        ("authorization", "Bearer t"),
        ("cookie", "sid=1"),
        ("proxy-authorization", "Basic x"),
    ] {
        let origin = Origin::default();
        let app = app_with(&origin, &[], local_guard());
        let make = || {
            Request::get("/r")
                .header(name, value)
                .body(Body::empty())
                .unwrap()
        };
        let (a, b) = twice(&app, make).await;
        assert_eq!(origin.calls(), 2, "{name} must not be cached");
        assert_eq!((a.x_cache(), b.x_cache()), ("BYPASS", "BYPASS"));
        // And nothing was stored that an anonymous request could see.
        send(&app, get_req("/r")).await;
        assert_eq!(origin.calls(), 3, "{name}");
    }
}

#[tokio::test]
async fn credentials_are_cached_when_the_route_opts_in() {
    let origin = Origin::default();
    let app = app_with(&origin, &[], local_guard().allow_credentials(true));
    let make = || {
        Request::get("/r")
            .header("authorization", "Bearer t")
            .body(Body::empty())
            .unwrap()
    };
    let (_, b) = twice(&app, make).await;
    assert_eq!(origin.calls(), 1);
    assert_eq!(b.x_cache(), "HIT");
}

#[tokio::test]
async fn unshareable_responses_are_never_stored() {
    let cases: [&'static [(&'static str, &'static str)]; 7] = [
        &[("set-cookie", "sid=secret")],
        &[("cache-control", "private")],
        &[("cache-control", "no-store")],
        &[("cache-control", "no-cache")],
        &[
            ("cache-control", "public, max-age=60"),
            ("cache-control", "private=\"x-user\", private"),
        ],
        &[("vary", "*")],
        &[("vary", "accept-language, *")],
    ];
    for headers in cases {
        let origin = Origin::default();
        let app = app_with(&origin, headers, local_guard().hit_for_miss(Duration::ZERO));
        let (a, b) = twice(&app, || get_req("/r")).await;
        assert_eq!(origin.calls(), 2, "{headers:?} must not be stored");
        assert_eq!(
            (a.text().as_str(), b.text().as_str()),
            ("call 1", "call 2"),
            "{headers:?}"
        );
    }
}

#[tokio::test]
async fn set_cookie_can_be_stripped_from_the_stored_copy() {
    let origin = Origin::default();
    let app = app_with(
        &origin,
        &[
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("content-type", "text/plain"),
        ],
        local_guard().strip_set_cookie(true),
    );
    let (leader, hit) = twice(&app, || get_req("/r")).await;
    assert_eq!(origin.calls(), 1);
    let cookies: Vec<_> = leader.headers.get_all("set-cookie").iter().collect();
    assert_eq!(
        cookies,
        ["a=1", "b=2"],
        "the client that caused the rebuild keeps its cookies"
    );
    assert_eq!(hit.x_cache(), "HIT");
    assert!(
        hit.headers.get("set-cookie").is_none(),
        "nobody else gets them"
    );
    assert_eq!(hit.headers["content-type"], "text/plain");
}

#[tokio::test]
async fn private_responses_are_cached_when_the_route_opts_in() {
    let origin = Origin::default();
    let app = app_with(
        &origin,
        &[("cache-control", "private")],
        local_guard().cache_private(true),
    );
    twice(&app, || get_req("/r")).await;
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn other_methods_pass_through_and_ranges_are_cut_from_one_fetch() {
    let origin = Origin::default();
    let o = origin.clone();
    let handler = move || {
        let origin = o.clone();
        async move {
            let (n, _running) = origin.enter();
            format!("call {n}")
        }
    };
    let app = Router::new().route(
        "/r",
        get(handler.clone()).post(handler).layer(local_guard()),
    );
    let post = || Request::post("/r").body(Body::empty()).unwrap();
    twice(&app, post).await;
    assert_eq!(origin.calls(), 2);
    let range = || {
        Request::get("/r")
            .header("range", "bytes=0-1")
            .body(Body::empty())
            .unwrap()
    };
    // A range is cut from the whole entry, fetched once.
    let (first, second) = twice(&app, range).await;
    assert_eq!(origin.calls(), 3);
    for answer in [first, second] {
        assert_eq!(answer.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(answer.text(), "ca");
    }
}

#[tokio::test]
async fn conditional_headers_do_not_reach_the_origin_of_a_shared_rebuild() {
    // An origin that would answer 304 to a conditional request: that answer
    // fits only the asker, so the layer asks for the whole entry.
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move |headers: HeaderMap| {
            let origin = o.clone();
            async move {
                let (_n, _running) = origin.enter();
                if headers.contains_key("if-none-match") {
                    return StatusCode::NOT_MODIFIED.into_response();
                }
                ([("etag", "\"v1\"")], "whole").into_response()
            }
        })
        .layer(local_guard()),
    );
    let conditional = Request::get("/r")
        .header("if-none-match", "\"v1\"")
        .body(Body::empty())
        .unwrap();
    let a = send(&app, conditional).await;
    // The cache asked for the whole entry, then answered the condition itself.
    assert_eq!((a.status, a.x_cache()), (StatusCode::NOT_MODIFIED, "MISS"));
    let b = send(&app, get_req("/r")).await;
    assert_eq!((b.x_cache(), b.text().as_str()), ("HIT", "whole"));
}

#[tokio::test]
async fn bodies_over_the_cap_are_delivered_whole_and_not_stored() {
    let origin = Origin::default();
    let o = origin.clone();
    let big = Bytes::from(vec![7u8; 64 * 1024]);
    let b2 = big.clone();
    let app = Router::new().route(
        "/big",
        get(move || {
            let origin = o.clone();
            let body = b2.clone();
            async move {
                let (_n, _running) = origin.enter();
                body
            }
        })
        .layer(local_guard().max_body_bytes(16 * 1024)),
    );
    let (a, b) = twice(&app, || get_req("/big")).await;
    assert_eq!(origin.calls(), 2);
    assert_eq!(a.body, big);
    assert_eq!(b.body, big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_bodies_over_the_cap_are_streamed_not_buffered() {
    // The origin sends more than the cap, then holds the rest back until the
    // client has seen the first bytes. A layer that buffered the body whole
    // would never hand the response over.
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let app = Router::new().route(
        "/stream",
        get(move || {
            let release = r.clone();
            async move {
                let stream = async_stream(release);
                Response::new(Body::from_stream(stream))
            }
        })
        .layer(local_guard().max_body_bytes(1024)),
    );
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        app.clone().oneshot(get_req("/stream")),
    )
    .await
    .expect("the response head arrives while the origin still streams")
    .unwrap();
    let mut body = response.into_body();
    let mut seen = 0usize;
    let mut released = false;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("frames keep coming")
    {
        seen += frame.unwrap().into_data().map_or(0, |d| d.len());
        if seen > 1024 && !released {
            release.notify_one();
            released = true;
        }
    }
    assert!(released);
    assert_eq!(seen, 4 * 1024 + 100);
}

/// Four 1 KiB chunks, a pause until released, then 100 more bytes.
fn async_stream(
    release: Arc<tokio::sync::Notify>,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::spawn(async move {
        for _ in 0..4 {
            let _ = tx.send(Ok(Bytes::from(vec![1u8; 1024]))).await;
        }
        release.notified().await;
        let _ = tx.send(Ok(Bytes::from(vec![2u8; 100]))).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
