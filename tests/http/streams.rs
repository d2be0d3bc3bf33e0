//! Attacks on body handling: streamed and shared bodies, framing lies from
//! the origin, the memory a shared body holds, and a streamed entry in Redis.

use crate::common::counting::live;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{local_guard, send, Origin};
use axum::body::Body;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
#[cfg(feature = "redis")]
use stampede_guard::Backend;
use stampede_guard::StampedeGuard;
use tokio::sync::{mpsc, Notify};
use tower::ServiceExt;

const PATIENCE: Duration = Duration::from_secs(30);

fn req(method: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().method(method).uri("/file");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn cl(answer: &crate::common::Answer) -> Option<usize> {
    answer
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

/// Every answer's Content-Length, when present, is its body's length.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn assert_framing(answer: &crate::common::Answer) {
    if let Some(n) = cl(answer) {
        assert_eq!(n, answer.body.len(), "Content-Length lies: {answer:?}");
    }
}

// ------------------------------------------------ bodies and framing lies

/// A route whose body is `parts` (then its end) under a declared
/// `Content-Length` of `declared`, if any.
fn lying_app(
    origin: &Origin,
    gate: Option<Arc<Notify>>,
    declared: Option<usize>,
    parts: Vec<Bytes>,
    guard: StampedeGuard,
) -> Router {
    let o = origin.clone();
    Router::new().route(
        "/file",
        get(move || {
            let (origin, gate, parts) = (o.clone(), gate.clone(), parts.clone());
            async move {
                let (_n, running) = origin.enter();
                if let Some(gate) = gate {
                    gate.notified().await;
                }
                let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
                tokio::spawn(async move {
                    let _running = running;
                    for part in parts {
                        if tx.send(Ok(part)).await.is_err() {
                            return;
                        }
                    }
                });
                let mut response = Response::new(Body::from_stream(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ));
                if let Some(n) = declared {
                    response
                        .headers_mut()
                        .insert("content-length", n.to_string().parse().unwrap());
                }
                response
            }
        })
        .layer(guard),
    )
}

/// Body and Content-Length of one request, or the body's error.
async fn fetch(
    app: &Router,
    request: Request<Body>,
) -> (Option<usize>, Result<Bytes, String>, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let cl = response
        .headers()
        .get("content-length")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let x = response
        .headers()
        .get("x-cache")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    (cl, body, x)
}

#[tokio::test(flavor = "current_thread")]
async fn a_body_shorter_than_its_declared_length_is_not_stored_as_complete() {
    // RFC 9111 §3.3: a response is complete only when all the octets its
    // framing announces have arrived. The origin announces 100 and ends
    // after 10: storing those 10 under a rewritten Content-Length: 10 turns
    // a truncated body into a complete-looking one for every later client.
    let origin = Origin::default();
    let app = lying_app(
        &origin,
        None,
        Some(100),
        vec![Bytes::from(vec![b'a'; 10])],
        local_guard(),
    );
    let (_cl, first, _) = fetch(&app, req("GET", &[])).await;
    let _ = first;
    // Let the fill settle, then see what later clients get.
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    // The next request fetches again, and its body, cut short in turn,
    // ends with an error (RFC 9112 §6.3: an incomplete message), so it is
    // read with `fetch`, which reports that error instead of panicking.
    let (cl, next, x) = fetch(&app, req("GET", &[])).await;
    assert!(
        !(x == "HIT" && next.as_ref().is_ok_and(|b| b.len() == 10)),
        "a body cut short of its declared 100 bytes was stored and served as complete: {cl:?} {next:?}"
    );
    assert_eq!(origin.calls(), 2, "nothing was stored");
}

/// `n` GETs of `app` at once, on a current-thread runtime: each task gets
/// 200 turns to join the flight before `gate` lets the origin answer.
/// Returns what each read, as [`fetch`] reports it, within `PATIENCE`.
async fn waiters(
    app: &Router,
    gate: &Notify,
    n: usize,
) -> Vec<(Option<usize>, Result<Bytes, String>, String)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { fetch(&app, req("GET", &[])).await })
        })
        .collect();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap());
    }
    answers
}

#[tokio::test(flavor = "current_thread")]
async fn a_shared_body_over_the_cap_never_ends_short_of_its_content_length() {
    // Declared 5000 (over the 1 KiB cap), the origin ends after 1500. Each
    // waiter reads the shared fetch: it must either end with an error or
    // carry a length that matches; a clean end short of Content-Length is a
    // silently truncated body.
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let parts = vec![Bytes::from(vec![b'x'; 1000]), Bytes::from(vec![b'y'; 500])];
    let app = lying_app(
        &origin,
        Some(gate.clone()),
        Some(5000),
        parts,
        local_guard().max_body_bytes(1024),
    );
    for (cl, body, x) in waiters(&app, &gate, 4).await {
        if let (Some(cl), Ok(body)) = (cl, &body) {
            assert_eq!(cl, body.len(), "{x}: a clean end short of Content-Length");
        }
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_shared_body_over_the_cap_never_runs_past_its_content_length() {
    // Declared 10, sent 2000 over a 1 KiB cap: the layer decides "over the
    // cap" from the bytes, and shares the origin's head with every waiter.
    // A waiter told 10 and sent 2000 is a framing lie the layer spread (on
    // a keep-alive connection the extra bytes are the next response).
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let parts = vec![Bytes::from(vec![b'x'; 1000]), Bytes::from(vec![b'y'; 1000])];
    let app = lying_app(
        &origin,
        Some(gate.clone()),
        Some(10),
        parts,
        local_guard().max_body_bytes(1024),
    );
    for (cl, body, x) in waiters(&app, &gate, 4).await {
        if x == "COALESCED"
            && let (Some(cl), Ok(body)) = (cl, &body)
        {
            assert_eq!(
                cl,
                body.len(),
                "a waiter's Content-Length disagrees with its body"
            );
        }
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_range_waiting_on_a_body_over_the_cap_gets_the_whole_200_framed_right() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let parts: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![b'a' + i; 256])).collect();
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
    let app = lying_app(
        &origin,
        Some(gate.clone()),
        Some(2048),
        parts,
        local_guard().max_body_bytes(1024),
    );
    let plain = {
        let app = app.clone();
        tokio::spawn(async move { fetch(&app, req("GET", &[])).await })
    };
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let ranged: Vec<_> = ["bytes=0-9", "bytes=-5", "bytes=9999-"]
        .into_iter()
        .map(|r| {
            let app = app.clone();
            tokio::spawn(async move { fetch(&app, req("GET", &[("range", r)])).await })
        })
        .collect();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let (cl, body, _) = plain.await.unwrap();
    assert_eq!(body.unwrap(), Bytes::from(expected.clone()));
    assert_eq!(cl, Some(2048));
    for t in ranged {
        let (cl, body, x) = tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
        assert_eq!(x, "COALESCED");
        assert_eq!(body.unwrap(), Bytes::from(expected.clone()));
        assert_eq!(cl, Some(2048));
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_body_with_trailers_keeps_them_and_is_not_stored() {
    use http_body::Frame;
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/file",
        get(move || {
            let origin = o.clone();
            async move {
                let _ = origin.enter();
                let mut trailers = HeaderMap::new();
                trailers.insert("x-sum", "42".parse().unwrap());
                let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
                    Ok(Frame::data(Bytes::from_static(b"abc"))),
                    Ok(Frame::trailers(trailers)),
                ];
                Response::new(Body::new(http_body_util::StreamBody::new(
                    tokio_stream::iter(frames),
                )))
            }
        })
        .layer(local_guard()),
    );
    let first = app.clone().oneshot(req("GET", &[])).await.unwrap();
    let collected = first.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-sum"], "42");
    let second = app.clone().oneshot(req("GET", &[])).await.unwrap();
    let collected = second.into_body().collect().await.unwrap();
    assert_eq!(
        collected.trailers().map(|t| t["x-sum"].clone()),
        Some("42".parse().unwrap())
    );
    assert_eq!(origin.calls(), 2, "a body with trailers is not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reader_of_a_huge_body_over_the_cap_does_not_hold_all_of_it() {
    // The heap is the process's: measured where no other test runs.
    if !crate::common::child::alone() {
        return crate::common::child::run_alone(
            module_path!(),
            "one_reader_of_a_huge_body_over_the_cap_does_not_hold_all_of_it",
        );
    }
    // One client downloads a 96 MiB body through the layer (over the cap,
    // so never stored). Nobody else reads it, yet the spool keeps every
    // chunk until the download ends: memory grows with the body, not the
    // cap. An attacker pulls a few large files at once and the process's
    // heap holds them all.
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 96 * 16;
    let app = Router::new().route(
        "/big",
        get(|| async {
            let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
            tokio::spawn(async move {
                for _ in 0..CHUNKS {
                    if tx.send(Ok(Bytes::from(vec![b'z'; CHUNK]))).await.is_err() {
                        return;
                    }
                }
            });
            Response::new(Body::from_stream(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ))
        })
        .layer(local_guard().max_body_bytes(1024 * 1024)),
    );
    let response = app
        .oneshot(Request::get("/big").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut body = response.into_body();
    let base = live();
    let mut seen = 0usize;
    let mut peak = 0isize;
    while let Some(frame) = body.frame().await {
        seen += frame.unwrap().into_data().unwrap().len();
        peak = peak.max(live() - base);
    }
    assert_eq!(seen, CHUNK * CHUNKS);
    assert!(
        peak < 32 * 1024 * 1024,
        "one reader streaming a 96 MiB body held {} MiB",
        peak / (1024 * 1024)
    );
}

// ------------------------------------------------------------------ Redis

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_entry_reaches_another_instance_whole_and_framed() {
    let server = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let make = |backend: Backend, origin: &Origin| {
        lying_app(
            origin,
            None,
            None,
            vec![Bytes::from(vec![b'a'; 700]), Bytes::from(vec![b'b'; 300])],
            StampedeGuard::new(backend).ttl(Duration::from_secs(60)),
        )
    };
    let a = make(Backend::redis(&server.url()).await.unwrap(), &origin);
    let other = Origin::default();
    let b = make(Backend::redis(&server.url()).await.unwrap(), &other);
    let (_, body, x) = fetch(&a, req("GET", &[])).await;
    assert_eq!(x, "MISS");
    assert_eq!(body.unwrap().len(), 1000);
    // The starter's last byte comes once the entry is stored everywhere.
    let seen = send(&b, req("GET", &[("range", "bytes=695-704")])).await;
    assert_eq!(other.calls(), 0, "the other instance found the entry");
    assert_eq!(seen.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&seen.body[..], b"aaaaabbbbb");
    assert_eq!(seen.headers["content-range"], "bytes 695-704/1000");
    assert_framing(&seen);
    let whole = send(&b, req("GET", &[])).await;
    assert_eq!(whole.body.len(), 1000);
    assert_eq!(cl(&whole), Some(1000));
}

#[tokio::test(flavor = "current_thread")]
async fn head_of_a_chunked_body_over_the_cap_does_not_claim_a_zero_length() {
    // HEAD on a cold key whose GET answer is chunked (no Content-Length) and
    // over the cap: the answer has an empty body, which a router fills in
    // as `Content-Length: 0`, a lie about the 2 KiB representation (RFC 9110
    // §9.3.2: HEAD's fields are the GET's; §8.6).
    let origin = Origin::default();
    let parts: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![b'a' + i; 256])).collect();
    let app = lying_app(
        &origin,
        None,
        None,
        parts,
        local_guard().max_body_bytes(1024),
    );
    let head = send(&app, req("HEAD", &[])).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    let claimed = head
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(
        claimed.is_none() || claimed.as_deref() == Some("2048"),
        "HEAD claims Content-Length {claimed:?} for a 2048-byte GET answer"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_304_for_a_chunked_body_over_the_cap_does_not_claim_a_zero_length() {
    // Same lie as HEAD, through If-None-Match on a cold key.
    let app = Router::new().route(
        "/file",
        get(|| async {
            let parts: Vec<Result<Bytes, std::io::Error>> = (0..8u8)
                .map(|i| Ok(Bytes::from(vec![b'a' + i; 256])))
                .collect();
            let mut response = Response::new(Body::from_stream(tokio_stream::iter(parts)));
            response
                .headers_mut()
                .insert("etag", "\"v1\"".parse().unwrap());
            response
        })
        .layer(local_guard().max_body_bytes(1024)),
    );
    let answer = send(&app, req("GET", &[("if-none-match", "\"v1\"")])).await;
    assert_eq!(answer.status, StatusCode::NOT_MODIFIED);
    let claimed = answer
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(
        claimed.is_none() || claimed.as_deref() == Some("2048"),
        "304 claims Content-Length {claimed:?} for a 2048-byte representation"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn waiters_over_the_cap_read_on_when_the_starter_hangs_up() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let parts: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![b'a' + i; 256])).collect();
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
    let app = lying_app(
        &origin,
        Some(gate.clone()),
        None,
        parts,
        local_guard().max_body_bytes(1024),
    );
    // The starter: takes its head and first bytes, then hangs up.
    let starter = {
        let app = app.clone();
        tokio::spawn(async move {
            let response = app.oneshot(req("GET", &[])).await.unwrap();
            let mut body = response.into_body();
            let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
            first.len()
        })
    };
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let answers = waiters(&app, &gate, 3).await;
    assert!(
        tokio::time::timeout(PATIENCE, starter)
            .await
            .unwrap()
            .unwrap()
            > 0
    );
    for (_cl, body, x) in answers {
        assert_eq!(x, "COALESCED");
        assert_eq!(body.unwrap(), Bytes::from(expected.clone()));
    }
    assert_eq!(origin.calls(), 1);
}
