//! Requests an attacker controls, over real HTTP/1.1 connections where the
//! wire matters: what each costs the origin on a key the cache could answer
//! (one miss per key per window at most), whether one client's answer can
//! reach another, and whether a waiter on a body over the size cap that
//! reads steadily gets it whole. Counts only: origin calls, answers, bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use stampede_guard::{Backend, StampedeGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::common::driver::counted_app;
#[cfg(feature = "redis")]
use crate::common::over_cap::big_app_on;
use crate::common::over_cap::{big_app, expected};
use crate::common::server::serve;
use crate::common::{send, Origin};

/// Far beyond any time these requests and bodies need (the spool's ten
/// seconds of patience included): a bound on a wait, never a measurement.
const GENEROUS: Duration = Duration::from_secs(60);

/// One hand-written request on its own connection: the status and the body
/// (everything after the head; a `Connection: close` request gets an
/// unchunked body or a chunked one, compared by containment).
pub(crate) async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(GENEROUS, stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// `n` copies of a hand-written request at once, each on its own connection.
async fn raw_burst(addr: SocketAddr, n: usize, request: &'static str) -> Vec<(u16, String)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(async move { raw(addr, request).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

const PLAIN: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
/// A GET with one byte of content: any client can send it.
const WITH_BODY: &str =
    "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";

/// A GET with a body on a key nobody has cached yet: the claim is that no
/// request property a client controls (credentials, upgrades and unsafe
/// methods aside) costs more than one miss per key. Thirty plain GETs at
/// once cost one call; thirty GETs with one byte of body each cost one
/// call each, every time, for as long as nobody else warms the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_a_body_on_a_cold_key_costs_at_most_one_miss() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        format!("v{n}")
    });
    let addr = serve(app).await;
    let answers = raw_burst(addr, 30, WITH_BODY).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    eprintln!(
        "30 GETs with a body on a cold key: {ok} answered 200, {} origin calls",
        origin.calls()
    );
    assert_eq!(ok, 30);
    assert!(
        origin.calls() <= 1,
        "30 GETs with a body on a cold key cost {} origin calls",
        origin.calls()
    );
}

/// The same on a key whose entry is stale but within the route's
/// stale-while-revalidate window: a plain GET is answered from it (one
/// background refresh), a GET with a body is passed through, every time.
#[tokio::test]
async fn a_get_with_a_body_on_a_stale_key_costs_at_most_one_miss() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(1))
        .stale_while_revalidate(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    let addr = serve(app).await;
    assert_eq!(raw(addr, PLAIN).await.0, 200);
    // Past the one-second ttl, well within the stale window.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..10 {
        assert_eq!(raw(addr, WITH_BODY).await.0, 200);
    }
    let calls = origin.calls() - 1;
    eprintln!("10 GETs with a body on a stale key: {calls} origin calls");
    assert!(
        calls <= 1,
        "10 GETs with a body on a stale key cost {calls} origin calls"
    );
}

/// A fleet of two on a real redis-server: the key is fresh in Redis (the
/// first instance built it), so a plain GET on the second is a hit. A GET
/// with a body on the second instance is answered only from that
/// instance's in-process tier, which never gets the entry from these
/// requests: each costs an origin call.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_a_body_on_a_key_fresh_in_redis_costs_no_origin_call() {
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
        addrs.push(
            serve(counted_app(
                &origin,
                guard,
                |n| async move { format!("v{n}") },
            ))
            .await,
        );
    }
    let (status, body) = raw(addrs[0], PLAIN).await;
    assert_eq!(status, 200);
    assert!(body.contains("v1"), "{body}");
    for _ in 0..10 {
        assert_eq!(raw(addrs[1], WITH_BODY).await.0, 200);
    }
    let calls = origin.calls() - 1;
    // A plain GET on the second instance is a hit from Redis.
    let (_, body) = raw(addrs[1], PLAIN).await;
    eprintln!(
        "10 GETs with a body on instance B, key fresh in Redis: {calls} origin calls; a plain GET then got {body:?}"
    );
    assert!(
        calls <= 1,
        "10 GETs with a body on a key fresh in Redis cost {calls} origin calls"
    );
}

/// An `Upgrade` naming a protocol no handler of the route speaks, with
/// `Connection: upgrade`, over HTTP/1.1: the handler answers it as the
/// plain GET it is (200, the same body, no switch), yet every such request
/// reaches it. Any client adds two headers and turns the protection off:
/// thirty at once on a warm key, thirty origin calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_the_handler_never_accepts_costs_no_origin_call_on_a_warm_key() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
    let addr = serve(app).await;
    assert_eq!(raw(addr, PLAIN).await.0, 200);
    const SWITCH: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: no-such-protocol/1\r\nConnection: upgrade, close\r\n\r\n";
    let answers = raw_burst(addr, 30, SWITCH).await;
    let plain = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b.contains('v'))
        .count();
    let calls = origin.calls() - 1;
    eprintln!("30 requests asking to switch to a protocol nobody speaks: {plain} plain 200s, {calls} origin calls");
    assert_eq!(plain, 30, "the handler answered them as plain GETs");
    assert!(
        calls <= 1,
        "30 requests with an Upgrade no handler accepts cost {calls} origin calls on a warm key"
    );
}

/// The request that starts a rebuild carries a header the others do not,
/// and the handler fails because of it, saying so with `Vary` on its `500`.
/// The waiters' own requests, which the handler answers `200`, must not get
/// the starter's failure.
#[tokio::test]
async fn a_failure_the_starters_own_header_caused_never_reaches_the_waiters() {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let (origin, gate) = (origin.clone(), gate.clone());
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let (origin, gate) = (origin.clone(), gate.clone());
                async move {
                    let (n, _running) = origin.enter();
                    gate.acquire().await.expect("gate").forget();
                    if headers.contains_key("x-mode") {
                        return (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [("vary", "x-mode")],
                            "x-mode not supported".to_owned(),
                        );
                    }
                    (StatusCode::OK, [("x-n", "0")], format!("v{n}"))
                }
            })
            .layer(guard),
        )
    };
    let starter = {
        let app = app.clone();
        tokio::spawn(async move {
            let r = Request::get("/report")
                .header("x-mode", "broken")
                .body(Body::empty())
                .unwrap();
            send(&app, r).await
        })
    };
    for _ in 0..2000 {
        if origin.calls() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, crate::common::get("/report")).await })
        })
        .collect();
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(10_000);
    let starter = starter.await.unwrap();
    assert_eq!(starter.status, StatusCode::INTERNAL_SERVER_ERROR);
    let mut ok = 0;
    let mut failed = 0;
    for w in waiters {
        let a = w.await.unwrap();
        match a.status {
            StatusCode::OK => ok += 1,
            s if s.is_server_error() => failed += 1,
            _ => {}
        }
    }
    eprintln!(
        "starter's own header made the handler fail: {ok} waiters 200, {failed} waiters 5xx, {} origin calls",
        origin.calls()
    );
    assert_eq!(
        failed, 0,
        "{failed} of 20 waiters got a failure their own request would not have"
    );
}

/// A waiter on a body over the cap that reads a chunk every half second,
/// never pausing anywhere near ten seconds, while the others read as fast
/// as they can. The README promises an error only to a client that reads
/// nothing for 10 s while others read ahead of it, or falls further behind
/// than the spill file holds; this one reads all the time, only slower
/// than the spool's memory window per ten seconds (4 KiB here; 16 MiB,
/// about 13 Mbit/s, at the default cap), on a body within the disk cap.
/// The body is long enough that the origin is still sending when that
/// reader falls ten seconds behind; read whole at this pace it takes 32 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_reads_every_half_second_is_never_cut_off() {
    let (chunk, chunks) = (128, 64);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                app.oneshot(crate::common::get("/big"))
                    .await
                    .expect("infallible")
            })
        })
        .collect();
    for _ in 0..2000 {
        if origin.calls() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(10_000);
    let mut responses = Vec::new();
    for t in tasks {
        responses.push(t.await.unwrap());
    }
    let steady = responses.pop().unwrap();
    let steady = tokio::spawn(async move {
        let mut body = steady.into_body();
        let mut read = Vec::new();
        let mut frames = 0usize;
        loop {
            match tokio::time::timeout(GENEROUS, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                        frames += 1;
                    }
                }
                Ok(Some(Err(_))) => return (false, read.len(), frames),
                Ok(None) => break,
                Err(_) => return (false, read.len(), frames),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        (read == expected(chunk * chunks), read.len(), frames)
    });
    let fast: Vec<_> = responses
        .into_iter()
        .map(|r| {
            tokio::spawn(async move {
                tokio::time::timeout(GENEROUS, r.into_body().collect())
                    .await
                    .ok()
                    .and_then(|b| b.ok())
                    .is_some_and(|b| b.to_bytes() == expected(chunk * chunks))
            })
        })
        .collect();
    let mut fast_whole = 0;
    for t in fast {
        fast_whole += usize::from(t.await.unwrap());
    }
    let (whole, bytes, frames) = steady.await.unwrap();
    eprintln!(
        "steady reader: whole {whole}, {bytes} of {} bytes in {frames} reads; {fast_whole} of 4 fast readers whole; origin calls {}",
        chunk * chunks,
        origin.calls()
    );
    assert_eq!(fast_whole, 4);
    assert!(
        whole,
        "a reader that read a chunk every half second was cut off after {bytes} bytes"
    );
}

/// Request heads any client can write on the wire, each sent ten times in
/// a row on a warm key of its own app: the origin calls each costs (at most
/// the one miss of a new key). Directives in every spelling and repeated,
/// obs-fold, HTTP/1.0, host casing, absolute form, hop-by-hop lists naming
/// keyed or framing fields, expectations, trailers, a content type, framing
/// that announces no content, a chunked body that has none, conditions,
/// ranges, HEAD, OPTIONS, a lowercase method, an encoded path, an empty
/// query, and forwarding fields the key does not use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_shapes_any_client_can_send_cost_at_most_one_miss_on_a_warm_key() {
    let shapes: &[&str] = &[
        "GET /report HTTP/1.1\r\nHost: a.test\r\nCache-Control: no-store\r\nCache-Control: no-cache, max-age=0\r\nPragma: no-cache\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nCache-Control: no-cache\r\n no-store\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nCache-Control:no-store\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\ncache-control: \"no-store\"\r\n",
        "GET /report HTTP/1.0\r\nHost: a.test\r\n",
        "GET /report HTTP/1.1\r\nHost: A.TEST\r\n",
        "GET http://a.test/report HTTP/1.1\r\nHost: b.test\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nConnection: x-forwarded-host, host, content-length\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nExpect: 100-continue\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nTE: trailers\r\nConnection: TE\r\nTrailer: x-t\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Type: application/json\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: 00\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nRange: bytes=0-0\r\nIf-Range: \"x\"\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nIf-None-Match: *\r\nIf-Modified-Since: Thu, 01 Jan 1970 00:00:00 GMT\r\n",
        "HEAD /report HTTP/1.1\r\nHost: a.test\r\n",
        "OPTIONS /report HTTP/1.1\r\nHost: a.test\r\n",
        "get /report HTTP/1.1\r\nHost: a.test\r\n",
        "GET /%72eport HTTP/1.1\r\nHost: a.test\r\n",
        "GET /report? HTTP/1.1\r\nHost: a.test\r\n",
        "GET /report?& HTTP/1.1\r\nHost: a.test\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nMax-Forwards: 0\r\nVia: 1.1 x\r\nX-Forwarded-For: 1.2.3.4\r\n",
        "GET /report HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n",
    ];
    let mut costly = Vec::new();
    for shape in shapes {
        let origin = Origin::default();
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
        let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
        let addr = serve(app).await;
        assert_eq!(raw(addr, PLAIN).await.0, 200);
        let request = match shape.contains("\r\n\r\n") {
            // The chunked shape carries its (empty) body.
            true => format!("{shape}\r\n"),
            false => format!("{shape}Connection: close\r\n\r\n"),
        };
        let request = if shape.contains("Transfer-Encoding") {
            shape.replace("\r\n\r\n0\r\n", "\r\nConnection: close\r\n\r\n0\r\n\r\n")
        } else {
            request
        };
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(raw(addr, &request).await.0);
        }
        let calls = origin.calls() - 1;
        eprintln!("{shape:?}: statuses {statuses:?}, {calls} origin calls");
        if calls > 1 {
            costly.push(format!("{shape:?}: {calls} calls for 10"));
        }
    }
    assert!(costly.is_empty(), "{costly:#?}");
}

/// Two instances on one real redis-server, ten requests at once on each for
/// a body over the cap: every request gets it whole; the origin calls the
/// fleet makes.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_cap_requested_on_two_instances_at_once() {
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
        apps.push(big_app_on(backend, &origin, &gate, 4096, 16, None));
    }
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let app = apps[i % 2].clone();
            tokio::spawn(async move {
                let r = app
                    .oneshot(crate::common::get("/big"))
                    .await
                    .expect("infallible");
                tokio::time::timeout(GENEROUS, r.into_body().collect())
                    .await
                    .ok()
                    .and_then(|b| b.ok())
                    .is_some_and(|b| b.to_bytes() == expected(4096 * 16))
            })
        })
        .collect();
    for _ in 0..2000 {
        if origin.calls() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before_gate = origin.calls();
    gate.add_permits(10_000);
    let mut whole = 0;
    for t in tasks {
        whole += usize::from(t.await.unwrap());
    }
    eprintln!(
        "20 requests on 2 instances for a body over the cap: {whole} whole, {} origin calls ({before_gate} before the origin answered)",
        origin.calls()
    );
    assert_eq!(whole, 20);
    assert!(origin.calls() <= 2, "{} origin calls", origin.calls());
}

/// A handler that sets a cookie for some requests only, by a header they
/// carry (a locale, consent or experiment cookie set on a first visit; here
/// `X-Probe`). One such request that starts the key's rebuild marks the key
/// hit-for-miss for everyone: the next thirty plain requests, which would
/// have coalesced on one call, go to the origin one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_whose_answer_sets_a_cookie_does_not_turn_coalescing_off_for_everyone() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let mut response = http::Response::new(Body::from(format!("v{n}")));
                    if headers.contains_key("x-probe") {
                        response
                            .headers_mut()
                            .insert("set-cookie", http::HeaderValue::from_static("seen=1"));
                    }
                    response
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    let probe = "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Probe: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(addr, probe).await.0, 200);
    let answers = raw_burst(addr, 30, PLAIN).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let calls = origin.calls() - 1;
    eprintln!("one request answered with a cookie, then 30 plain at once: {ok} answered, {calls} origin calls");
    assert_eq!(ok, 30);
    assert!(
        calls <= 1,
        "30 plain requests after one whose answer set a cookie cost {calls} origin calls"
    );
}

/// The same through a stale entry: a request answered stale starts the
/// background refresh with its own headers; its answer sets a cookie (for
/// that request alone), and the stale entry gives way to a hit-for-miss
/// mark. The next thirty plain requests, which the stale entry (and one
/// refresh) would have answered, reach the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_answered_with_a_cookie_does_not_turn_coalescing_off_for_everyone() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(1))
        .stale_while_revalidate(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let mut response = http::Response::new(Body::from(format!("v{n}")));
                    if headers.contains_key("x-probe") {
                        response
                            .headers_mut()
                            .insert("set-cookie", http::HeaderValue::from_static("seen=1"));
                    }
                    response
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    assert_eq!(raw(addr, PLAIN).await.0, 200);
    // Past the one-second ttl, well within the stale window.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let probe = "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Probe: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(addr, probe).await.0, 200);
    // The refresh it started has run.
    for _ in 0..2000 {
        if origin.calls() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_probe = origin.calls();
    let answers = raw_burst(addr, 30, PLAIN).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let calls = origin.calls() - after_probe;
    eprintln!("stale hit whose refresh set a cookie, then 30 plain at once: {ok} answered, {calls} origin calls ({after_probe} before)");
    assert_eq!(ok, 30);
    assert!(
        calls <= 1,
        "30 plain requests after a refresh answered with a cookie cost {calls} origin calls"
    );
}

/// A client the handler refuses (a `429` for a caller over its rate limit,
/// told apart by a header the key does not use) sends two requests at once
/// on a cold key: the second waits on the first's rebuild, is refused as
/// the re-leader, and the key is marked hit-for-miss for everyone. The next
/// thirty plain requests, which would coalesce on one call, reach the
/// origin one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_does_not_turn_coalescing_off_for_everyone() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    if headers.get("x-client").is_some_and(|c| c == "over-limit") {
                        // Long enough for the other refused request to join.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        return (StatusCode::TOO_MANY_REQUESTS, "slow down".to_owned());
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    (StatusCode::OK, format!("v{n}"))
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    const REFUSED: &str =
        "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Client: over-limit\r\nConnection: close\r\n\r\n";
    let refused = raw_burst(addr, 2, REFUSED).await;
    assert!(refused.iter().all(|(s, _)| *s == 429), "{refused:?}");
    let after_refusals = origin.calls();
    let answers = raw_burst(addr, 30, PLAIN).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let calls = origin.calls() - after_refusals;
    eprintln!("two refused at once, then 30 plain at once: {ok} answered, {calls} origin calls ({after_refusals} for the refused)");
    assert_eq!(ok, 30);
    assert!(
        calls <= 1,
        "30 plain requests after two refused ones cost {calls} origin calls"
    );
}

/// `/report` on `backend`: `500` (with `Vary: x-mode`, and `no-store` when
/// `no_store`: an answer the cache keeps only its status and `Vary` of) for
/// a request that carries `x-mode`, `v<call>` for any other.
fn fails_for_x_mode(backend: Backend, origin: &Origin, no_store: bool) -> Router {
    let origin = origin.clone();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
    Router::new().route(
        "/report",
        get(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                if headers.contains_key("x-mode") {
                    let cc = if no_store { "no-store" } else { "public" };
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [("vary", "x-mode"), ("cache-control", cc)],
                        "x-mode not supported".to_owned(),
                    );
                }
                (
                    StatusCode::OK,
                    [("x-n", "0"), ("x-mode-seen", "no")],
                    format!("v{n}"),
                )
            }
        })
        .layer(guard),
    )
}

/// One client's requests carry a header the handler fails on (its `500`
/// says `Vary: x-mode`). On a fleet each of its failures leaves the key's
/// failure marker, whose backoff doubles, and during it every instance
/// answers the key's requests with the failure without asking the origin:
/// but only requests of the failure's own variant. After a few such
/// requests (one per backoff, until the origin has failed five times),
/// plain requests on the other instance, which the origin answers `200`,
/// get `200`, from one origin call for all ten.
async fn one_clients_failure_never_answers_other_clients(addrs: [SocketAddr; 2], origin: &Origin) {
    const BROKEN: &str =
        "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Mode: broken\r\nConnection: close\r\n\r\n";
    let mut attacker_requests = 0;
    for _ in 0..2000 {
        if origin.calls() >= 5 {
            break;
        }
        let (status, _) = raw(addrs[0], BROKEN).await;
        assert!(status >= 500, "{status}");
        attacker_requests += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after_attack = origin.calls();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(raw(addrs[1], PLAIN).await.0);
    }
    let failed = statuses.iter().filter(|s| **s >= 500).count();
    let calls = origin.calls() - after_attack;
    eprintln!(
        "{attacker_requests} requests with x-mode ({after_attack} reached the origin); then 10 plain on the other instance: {statuses:?}, {calls} origin calls"
    );
    assert_eq!(
        failed, 0,
        "{failed} of 10 plain requests on another instance got the failure another client's header caused"
    );
    assert_eq!(calls, 1, "the plain variant is stored once");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_failure_never_answers_other_clients_on_the_fleet() {
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;
    for no_store in [false, true] {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
            addrs.push(serve(fails_for_x_mode(backend, &origin, no_store)).await);
        }
        one_clients_failure_never_answers_other_clients([addrs[0], addrs[1]], &origin).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_failure_never_answers_other_clients_embedded() {
    for no_store in [false, true] {
        let origin = Origin::default();
        let addr = serve(fails_for_x_mode(Backend::local(), &origin, no_store)).await;
        one_clients_failure_never_answers_other_clients([addr, addr], &origin).await;
    }
}

/// The same failure (`500`, `Vary: x-mode`, `no-store`) on the request that
/// started a rebuild, with twenty plain requests waiting on it: none of
/// them gets it; their own variant is asked once for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstored_failure_the_starters_header_caused_never_reaches_the_waiters() {
    const BROKEN: &str =
        "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Mode: broken\r\nConnection: close\r\n\r\n";
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = {
        let (origin, gate) = (origin.clone(), gate.clone());
        let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let (origin, gate) = (origin.clone(), gate.clone());
                async move {
                    let (n, _running) = origin.enter();
                    gate.acquire().await.expect("gate").forget();
                    if headers.contains_key("x-mode") {
                        return (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [("vary", "x-mode"), ("cache-control", "no-store")],
                            "x-mode not supported".to_owned(),
                        );
                    }
                    (
                        StatusCode::OK,
                        [("x-n", "0"), ("x-mode-seen", "no")],
                        format!("v{n}"),
                    )
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    let starter = tokio::spawn(async move { raw(addr, BROKEN).await });
    for _ in 0..2000 {
        if origin.calls() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiters: Vec<_> = (0..20)
        .map(|_| tokio::spawn(async move { raw(addr, PLAIN).await }))
        .collect();
    // Let them all join the flight before it answers.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.add_permits(10_000);
    assert_eq!(starter.await.unwrap().0, 500);
    let mut statuses = Vec::new();
    for w in waiters {
        statuses.push(w.await.unwrap().0);
    }
    let failed = statuses.iter().filter(|s| **s >= 500).count();
    eprintln!(
        "an unstored failure of the starter's variant: waiters {statuses:?}, {} origin calls",
        origin.calls()
    );
    assert_eq!(
        failed, 0,
        "{failed} of 20 waiters got the starter's failure"
    );
    assert!(origin.calls() <= 2, "{} origin calls", origin.calls());
}

/// `/report` counted by `origin` (answers `v<call>`), and `/secret`
/// counted by `secret`: a request only a smuggled one would make.
fn with_a_secret(origin: &Origin, secret: &Origin) -> Router {
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let (origin, secret) = (origin.clone(), secret.clone());
    Router::new()
        .route(
            "/report",
            get(move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    format!("v{n}")
                }
            }),
        )
        .route(
            "/secret",
            get(move || {
                let secret = secret.clone();
                async move {
                    secret.enter();
                    "secret".to_owned()
                }
            }),
        )
        .layer(guard)
}

/// A GET whose content is a whole second request, on a kept-alive
/// connection, then a plain GET on it: the content is read and thrown away
/// (the connection's framing stays whole), so the hidden request is never
/// answered nor made, and the plain GET after it is answered as the second
/// answer on the connection. Content-Length and chunked shapes alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_hidden_in_a_get_body_is_never_answered() {
    const HIDDEN: &str = "GET /secret HTTP/1.1\r\nHost: a.test\r\n\r\n";
    const NEXT: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
    let sized = format!(
        "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: {}\r\n\r\n{HIDDEN}{NEXT}",
        HIDDEN.len()
    );
    let chunked = format!(
        "GET /report HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{HIDDEN}\r\n0\r\n\r\n{NEXT}",
        HIDDEN.len()
    );
    for wire in [sized, chunked] {
        let (origin, secret) = (Origin::default(), Origin::default());
        let addr = serve(with_a_secret(&origin, &secret)).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(wire.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(GENEROUS, stream.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        let answers = text.matches("HTTP/1.1 ").count();
        eprintln!(
            "a request hidden in a GET's body: {answers} answers, {} calls to /secret, {} to /report",
            secret.calls(),
            origin.calls()
        );
        assert_eq!(answers, 2, "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert_eq!(secret.calls(), 0, "the hidden request was made");
        assert_eq!(origin.calls(), 1, "the plain GET after it is a hit");
    }
}

/// The handler reads the body of a GET: behind the layer it never sees
/// one (its answer could otherwise be stored for everyone), and a GET with
/// content costs what a plain one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_reads_a_get_body_never_sees_one() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap, body: String| {
                let origin = origin.clone();
                async move {
                    origin.enter();
                    let framing = headers.contains_key("content-length")
                        || headers.contains_key("transfer-encoding");
                    format!("body={body} framing={framing}")
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    let evil = "GET /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nConnection: close\r\n\r\nevil";
    let (status, body) = raw(addr, evil).await;
    assert_eq!(status, 200);
    assert!(body.contains("body= framing=false"), "{body}");
    let (_, body) = raw(addr, PLAIN).await;
    assert!(body.contains("body= framing=false"), "{body}");
    assert_eq!(origin.calls(), 1);
}

/// Other shapes of content on a cold key, thirty at once each: chunked
/// GETs, then HEADs with a `Content-Length`. One origin call in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_gets_and_heads_with_content_cost_at_most_one_miss() {
    const CHUNKED: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    const HEAD: &str =
        "HEAD /report HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab";
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        format!("v{n}")
    });
    let addr = serve(app).await;
    let answers = raw_burst(addr, 30, CHUNKED).await;
    let whole = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b.contains("v1"))
        .count();
    let heads = raw_burst(addr, 30, HEAD).await;
    let heads_ok = heads.iter().filter(|(s, _)| *s == 200).count();
    eprintln!(
        "30 chunked GETs then 30 HEADs with content, on a cold key: {whole} + {heads_ok} answered, {} origin calls",
        origin.calls()
    );
    assert_eq!((whole, heads_ok), (30, 30));
    assert_eq!(origin.calls(), 1);
}

/// `/report`: a protocol switch with a `Sec-WebSocket-Key` gets a `101`;
/// one without it a `400` (a handshake the endpoint refuses); a plain GET
/// `v<call>`.
fn switching_app(origin: &Origin) -> Router {
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                if headers.contains_key("upgrade") {
                    if !headers.contains_key("sec-websocket-key") {
                        return http::Response::builder()
                            .status(StatusCode::BAD_REQUEST)
                            .body(Body::from("bad handshake"))
                            .unwrap();
                    }
                    return http::Response::builder()
                        .status(StatusCode::SWITCHING_PROTOCOLS)
                        .header("upgrade", "websocket")
                        .header("connection", "upgrade")
                        .body(Body::empty())
                        .unwrap();
                }
                http::Response::new(Body::from(format!("v{n}")))
            }
        })
        .layer(guard),
    )
}

const HANDSHAKE: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// An endpoint that does switch (a `101`) on a key whose plain GET is
/// cached: every switch, ten in a row and ten at once, reaches it and is
/// switched; the plain GET stays a hit. A handshake it refuses (a `400`)
/// teaches the layer nothing: the switches after it still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_protocol_switch_reaches_the_handler_every_time() {
    const REFUSED: &str =
        "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: upgrade, close\r\n\r\n";
    let origin = Origin::default();
    let addr = serve(switching_app(&origin)).await;
    assert_eq!(raw(addr, PLAIN).await.0, 200);
    assert_eq!(raw(addr, REFUSED).await.0, 400);
    let mut switched = 0;
    for _ in 0..10 {
        switched += usize::from(raw(addr, HANDSHAKE).await.0 == 101);
    }
    let at_once = raw_burst(addr, 10, HANDSHAKE).await;
    switched += at_once.iter().filter(|(s, _)| *s == 101).count();
    let (status, body) = raw(addr, PLAIN).await;
    eprintln!(
        "a real switch: {switched} of 20 switched, {} origin calls (1 plain, 1 refused, 20 switches)",
        origin.calls()
    );
    assert_eq!(switched, 20);
    assert_eq!(origin.calls(), 22);
    assert_eq!(status, 200);
    assert!(body.contains("v1"), "the plain GET is still a hit: {body}");
}

/// A switch the handler answers as a plain GET, on a cold key, with
/// content: the first is passed through and teaches the layer; the rest,
/// thirty at once, are taken as plain GETs (their content discarded) and
/// coalesce on at most one more call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unaccepted_upgrade_with_content_on_a_cold_key_costs_at_most_two_calls() {
    const SWITCH_WITH_BODY: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: no-such-protocol/1\r\nConnection: upgrade, close\r\nContent-Length: 1\r\n\r\nx";
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = counted_app(&origin, guard, |n| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        format!("v{n}")
    });
    let addr = serve(app).await;
    let answers = raw_burst(addr, 30, SWITCH_WITH_BODY).await;
    let ok = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b.contains('v'))
        .count();
    eprintln!(
        "30 unaccepted switches with content on a cold key: {ok} answered, {} origin calls",
        origin.calls()
    );
    assert_eq!(ok, 30);
    assert!(origin.calls() <= 2, "{} origin calls", origin.calls());
}

/// A route whose every answer is per client (a cookie each time): nothing
/// is shared or stored, and every request, twenty at once twice, gets its
/// own answer from its own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_every_answer_sets_a_cookie_gives_each_request_its_own() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move || {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let mut response = http::Response::new(Body::from(format!("v{n}.")));
                    let cookie = http::HeaderValue::from_str(&format!("id={n}")).unwrap();
                    response.headers_mut().insert("set-cookie", cookie);
                    response
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    let mut bodies = std::collections::BTreeSet::new();
    for _ in 0..2 {
        for (status, body) in raw_burst(addr, 20, PLAIN).await {
            assert_eq!(status, 200);
            let v = body
                .split(|c: char| !c.is_ascii_alphanumeric())
                .find(|w| w.starts_with('v'))
                .unwrap_or_default()
                .to_owned();
            bodies.insert(v);
        }
    }
    eprintln!(
        "40 requests on a route whose every answer sets a cookie: {} distinct answers, {} origin calls",
        bodies.len(),
        origin.calls()
    );
    assert_eq!(bodies.len(), 40, "an answer for one client reached another");
    assert_eq!(origin.calls(), 40);
}

/// A page and a WebSocket on one path: a complete handshake gets a `101`,
/// anything else (a made-up or malformed switch too) the page. Thirty
/// made-up switches at once on a warm key cost at most the one probe, and
/// the page they taught the layer never answers a real handshake: each of
/// those still reaches the handler and is switched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_up_switch_never_turns_a_real_handshake_into_a_page_hit() {
    const MADE_UP: &str = "GET /report HTTP/1.1\r\nHost: a.test\r\nUpgrade: no-such-protocol/1\r\nConnection: upgrade, close\r\n\r\n";
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(600));
    let app = {
        let origin = origin.clone();
        Router::new().route(
            "/report",
            get(move |headers: HeaderMap| {
                let origin = origin.clone();
                async move {
                    let (n, _running) = origin.enter();
                    let handshake = headers
                        .get("upgrade")
                        .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"))
                        && headers.contains_key("sec-websocket-key");
                    if handshake {
                        return http::Response::builder()
                            .status(StatusCode::SWITCHING_PROTOCOLS)
                            .header("upgrade", "websocket")
                            .header("connection", "upgrade")
                            .body(Body::empty())
                            .unwrap();
                    }
                    http::Response::new(Body::from(format!("v{n}")))
                }
            })
            .layer(guard),
        )
    };
    let addr = serve(app).await;
    assert_eq!(raw(addr, PLAIN).await.0, 200);
    let pages = raw_burst(addr, 30, MADE_UP).await;
    let pages = pages
        .iter()
        .filter(|(s, b)| *s == 200 && b.contains('v'))
        .count();
    let after_made_up = origin.calls();
    let mut switched = 0;
    for _ in 0..5 {
        switched += usize::from(raw(addr, HANDSHAKE).await.0 == 101);
    }
    eprintln!(
        "30 made-up switches: {pages} pages, {} origin calls; then 5 real handshakes: {switched} switched",
        after_made_up - 1
    );
    assert_eq!(pages, 30);
    assert!(after_made_up - 1 <= 1, "{} origin calls", after_made_up - 1);
    assert_eq!(switched, 5);
    assert_eq!(origin.calls(), after_made_up + 5);
}

/// `/report` on `backend`: `v<call>` after 200 ms, with a cookie for a
/// request that carries `X-Probe`, and `Cache-Control: private` for one
/// that carries `X-Private`.
fn per_client_app(backend: Backend, origin: &Origin) -> Router {
    let origin = origin.clone();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(600));
    Router::new().route(
        "/report",
        get(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut response = http::Response::new(Body::from(format!("v{n}")));
                if headers.contains_key("x-probe") {
                    response
                        .headers_mut()
                        .insert("set-cookie", http::HeaderValue::from_static("seen=1"));
                }
                if headers.contains_key("x-private") {
                    response
                        .headers_mut()
                        .insert("cache-control", http::HeaderValue::from_static("private"));
                }
                response
            }
        })
        .layer(guard),
    )
}

/// The same class through `Cache-Control: private`: one request whose
/// answer is private to it, then thirty plain requests at once, coalesce
/// on one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_whose_answer_is_private_does_not_turn_coalescing_off() {
    let origin = Origin::default();
    let addr = serve(per_client_app(Backend::local(), &origin)).await;
    let private =
        "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Private: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(addr, private).await.0, 200);
    let answers = raw_burst(addr, 30, PLAIN).await;
    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let calls = origin.calls() - 1;
    eprintln!("one private answer, then 30 plain at once: {ok} answered, {calls} origin calls");
    assert_eq!(ok, 30);
    assert!(calls <= 1, "{calls} origin calls");
}

/// A fleet of two on a real redis-server: one request answered with a
/// cookie on instance A marks the key there; thirty plain requests at once,
/// half on each instance, cost at most one call per instance (a marked
/// key's flight does not queue behind the fleet's lease), and a plain
/// request after them is a hit on both.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_answer_on_one_instance_costs_the_fleet_at_most_one_call_per_instance() {
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let backend = backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
        addrs.push(serve(per_client_app(backend, &origin)).await);
    }
    let probe = "GET /report HTTP/1.1\r\nHost: a.test\r\nX-Probe: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(addrs[0], probe).await.0, 200);
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let addr = addrs[i % 2];
            tokio::spawn(async move { raw(addr, PLAIN).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.expect("request task").0 == 200);
    }
    let calls = origin.calls() - 1;
    let mut hits = 0;
    for addr in &addrs {
        hits += usize::from(raw(*addr, PLAIN).await.0 == 200);
    }
    eprintln!(
        "a cookie answer on A, then 30 plain at once over A and B: {ok} answered, {calls} origin calls; {} after",
        origin.calls() - 1 - calls
    );
    assert_eq!((ok, hits), (30, 2));
    assert!(calls <= 2, "{calls} origin calls");
    assert_eq!(
        origin.calls() - 1,
        calls,
        "a plain request after them missed"
    );
}
