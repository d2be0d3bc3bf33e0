//! Bodies: the request that caused a rebuild streams the origin's bytes as
//! they come, a body over the cap is fetched once for every waiter, and a
//! body that fails part way never looks complete to anyone.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{get as get_req, local_guard, send, tally, Origin};
use axum::body::Body;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use stampede_guard::{SharedBodyError, StampedeGuard};
use tokio::sync::{mpsc, Notify};
use tower::ServiceExt;

/// Generous bound so that a broken build fails instead of hanging; never a
/// measure of speed.
const PATIENCE: Duration = Duration::from_secs(30);

/// Body parts a handler sends, in order; `None` waits for the gate.
type Script = Vec<Option<Result<Bytes, std::io::Error>>>;

/// A route whose body follows `script` (built per call), waiting on `gate`
/// wherever the script says so.
fn scripted_app(
    origin: &Origin,
    gate: &Arc<Notify>,
    guard: StampedeGuard,
    script: impl Fn() -> Script + Clone + Send + Sync + 'static,
) -> Router {
    let (origin, gate) = (origin.clone(), gate.clone());
    Router::new().route(
        "/r",
        get(move || {
            let (origin, gate, script) = (origin.clone(), gate.clone(), script.clone());
            async move {
                let (_n, running) = origin.enter();
                let (tx, rx) = mpsc::channel(1);
                tokio::spawn(async move {
                    let _running = running;
                    for part in script() {
                        match part {
                            None => gate.notified().await,
                            Some(part) => {
                                if tx.send(part).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
                Response::new(Body::from_stream(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ))
            }
        })
        .layer(guard),
    )
}

fn chunk(byte: u8, len: usize) -> Option<Result<Bytes, std::io::Error>> {
    Some(Ok(Bytes::from(vec![byte; len])))
}

/// Lets spawned requests reach the flight before the origin moves on.
async fn let_requests_join() {
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_starter_gets_the_first_chunk_while_the_origin_still_sends() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let app = scripted_app(&origin, &gate, local_guard(), || {
        vec![chunk(b'a', 100), None, chunk(b'b', 100), chunk(b'c', 100)]
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client: Client<_, http_body_util::Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = format!("http://{addr}/r").parse().unwrap();

    let response = tokio::time::timeout(PATIENCE, client.get(uri.clone()))
        .await
        .expect("the head arrives while the origin waits")
        .unwrap();
    assert_eq!(response.headers()["x-cache"], "MISS");
    let mut body = response.into_body();
    let first = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("the first chunk arrives while the origin waits on the gate")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    // The origin has not sent more: it is still waiting for the gate.
    assert_eq!(first, Bytes::from(vec![b'a'; 100]));
    gate.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest.len(), 200);

    // The entry was filled whole behind the stream.
    let hit = client.get(uri).await.unwrap();
    assert_eq!(hit.headers()["x-cache"], "HIT");
    assert_eq!(hit.headers()["content-length"], "300");
    let whole = hit.into_body().collect().await.unwrap().to_bytes();
    let mut expected = vec![b'a'; 100];
    expected.extend([b'b'; 100]);
    expected.extend([b'c'; 100]);
    assert_eq!(whole, Bytes::from(expected));
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fill_goes_on_when_the_starters_client_goes_away() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let app = scripted_app(&origin, &gate, local_guard(), || {
        vec![chunk(b'a', 10), None, chunk(b'b', 10)]
    });
    let response = app.clone().oneshot(get_req("/r")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first.len(), 10);
    // The client hangs up mid-body.
    drop(body);
    gate.notify_one();
    // The rebuild finished on its own task: the entry lands, and a later
    // request is answered from it.
    let mut answer = send(&app, get_req("/r")).await;
    for _ in 0..1000 {
        if answer.x_cache() == "HIT" {
            break;
        }
        tokio::task::yield_now().await;
        answer = send(&app, get_req("/r")).await;
    }
    assert_eq!(answer.x_cache(), "HIT");
    assert_eq!(answer.text(), "aaaaaaaaaabbbbbbbbbb");
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn twenty_waiters_share_one_fetch_of_a_body_over_the_cap() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    // 2 KiB of distinct bytes over a 1 KiB cap, after the gate.
    let script = || {
        let mut parts = vec![None];
        parts.extend((0..8u8).map(|i| chunk(b'a' + i, 256)));
        parts
    };
    let app = scripted_app(&origin, &gate, local_guard().max_body_bytes(1024), script);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/r")).await })
        })
        .collect();
    let_requests_join().await;
    gate.notify_one();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap());
    }
    let expected: Vec<u8> = (0..8u8).flat_map(|i| [b'a' + i; 256]).collect();
    assert_eq!(origin.calls(), 1);
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.body, Bytes::from(expected.clone()));
    }
    assert_eq!(tally(&answers, "MISS"), 1);
    assert_eq!(tally(&answers, "COALESCED"), 19);

    // Never stored: the next request fetches again.
    let gate_open = tokio::spawn({
        let gate = gate.clone();
        async move { gate.notify_one() }
    });
    gate_open.await.unwrap();
    let again = send(&app, get_req("/r")).await;
    assert_eq!(again.body.len(), 2048);
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_shared_body_that_fails_part_way_fails_for_every_reader() {
    // An attacker's dream: a body cut short that some reader takes for
    // whole. Every reader must see an error, the starter the origin's own.
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let script = || {
        vec![
            None,
            chunk(b'x', 1024),
            chunk(b'y', 512),
            Some(Err(std::io::Error::other("origin broke"))),
        ]
    };
    let app = scripted_app(&origin, &gate, local_guard().max_body_bytes(1024), script);
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let response = app.oneshot(get_req("/r")).await.unwrap();
                let status = response.headers()["x-cache"].to_str().unwrap().to_owned();
                (
                    status,
                    response.into_body().collect().await.map(|b| b.to_bytes()),
                )
            })
        })
        .collect();
    let_requests_join().await;
    gate.notify_one();
    let mut shared_errors = 0;
    for task in tasks {
        let (status, body) = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        let error = body.expect_err("a body cut short is never complete");
        if status == "COALESCED" {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
            let mut shared = false;
            while let Some(e) = source {
                shared |= e.is::<SharedBodyError>();
                source = e.source();
            }
            shared_errors += usize::from(shared);
        }
    }
    assert_eq!(shared_errors, 4);
    assert_eq!(origin.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_error_midway_reaches_the_starter_and_nothing_is_stored() {
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    // The first call breaks part way; later ones answer whole.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let script = move || {
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            vec![
                chunk(b'a', 10),
                Some(Err(std::io::Error::other("origin broke"))),
            ]
        } else {
            vec![chunk(b'a', 10), chunk(b'b', 10)]
        }
    };
    let app = scripted_app(&origin, &gate, local_guard(), script);
    let response = app.clone().oneshot(get_req("/r")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first.len(), 10);
    let error = body.frame().await.unwrap().expect_err("the origin's error");
    assert!(error.to_string().contains("origin broke"), "{error}");
    // Until the broken flight has ended a request may share its failure;
    // after, it fetches again. It is never answered with the broken body.
    let mut again = send(&app, get_req("/r")).await;
    for _ in 0..1000 {
        assert_ne!(again.x_cache(), "HIT", "a broken body was stored");
        if again.x_cache() == "MISS" {
            break;
        }
        assert_eq!(again.status, StatusCode::BAD_GATEWAY);
        tokio::task::yield_now().await;
        again = send(&app, get_req("/r")).await;
    }
    assert_eq!(again.x_cache(), "MISS");
    assert_eq!(again.text(), "aaaaaaaaaabbbbbbbbbb");
    assert_eq!(origin.calls(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_error_over_the_cap_is_not_shared() {
    // A 5xx is a failed rebuild: the waiters get the failure, never the
    // error page, and the origin is called once.
    let origin = Origin::default();
    let o = origin.clone();
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let app = Router::new().route(
        "/r",
        get(move || {
            let (origin, gate) = (o.clone(), g.clone());
            async move {
                let (_n, _running) = origin.enter();
                gate.notified().await;
                (StatusCode::INTERNAL_SERVER_ERROR, vec![b'e'; 4096])
            }
        })
        .layer(local_guard().max_body_bytes(1024)),
    );
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/r")).await })
        })
        .collect();
    let_requests_join().await;
    gate.notify_one();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap());
    }
    assert_eq!(origin.calls(), 1);
    let starter = answers.iter().find(|a| a.x_cache() == "MISS").unwrap();
    assert_eq!(starter.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(starter.body.len(), 4096);
    for waiter in answers.iter().filter(|a| a.x_cache() == "COALESCED") {
        assert_eq!(waiter.status, StatusCode::BAD_GATEWAY);
        assert!(waiter.body.is_empty());
    }
    assert_eq!(tally(&answers, "COALESCED"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_over_the_cap_stops_being_read_when_its_readers_leave() {
    // A client asks for an endless body and hangs up: the shared fetch must
    // not keep reading (and holding) it for nobody.
    let stopped = Arc::new(Notify::new());
    let s = stopped.clone();
    let app = Router::new().route(
        "/endless",
        get(move || {
            let stopped = s.clone();
            async move {
                let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
                tokio::spawn(async move {
                    while tx.send(Ok(Bytes::from(vec![b'z'; 1024]))).await.is_ok() {}
                    stopped.notify_one();
                });
                Response::new(Body::from_stream(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ))
            }
        })
        .layer(local_guard().max_body_bytes(4096)),
    );
    let response = app.oneshot(get_req("/endless")).await.unwrap();
    let mut body = response.into_body();
    let mut seen = 0;
    while seen <= 8192 {
        seen += body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap()
            .len();
    }
    drop(body);
    tokio::time::timeout(PATIENCE, stopped.notified())
        .await
        .expect("the origin's body is dropped once nobody reads it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_the_rebuild_timeout_ends_with_an_error_not_a_hang() {
    // The origin sends a chunk, then never finishes: the rebuild is
    // abandoned at its timeout, and the starter's stream must fail rather
    // than wait forever or end as if complete.
    let origin = Origin::default();
    let gate = Arc::new(Notify::new());
    let app = scripted_app(
        &origin,
        &gate,
        local_guard().rebuild_timeout(Duration::from_millis(200)),
        || vec![chunk(b'a', 10), None, chunk(b'b', 10)],
    );
    let response = app.clone().oneshot(get_req("/r")).await.unwrap();
    let body = tokio::time::timeout(PATIENCE, response.into_body().collect())
        .await
        .expect("the stream ends");
    assert!(body.is_err(), "a cut body never looks complete");
    // Until the abandoned flight has ended a request may share its 504;
    // after, it fetches again. Never a stored cut body.
    for _ in 0..1000 {
        let next = app.clone().oneshot(get_req("/r")).await.unwrap();
        let status = next.headers()["x-cache"].to_str().unwrap().to_owned();
        assert_ne!(status, "HIT", "a cut body was stored");
        if status == "MISS" {
            assert_eq!(origin.calls(), 2);
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the abandoned flight never ended");
}
