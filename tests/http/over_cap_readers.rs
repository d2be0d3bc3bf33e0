//! Bodies over `max_body_bytes` shared by coalesced waiters, with readers
//! and origins that misbehave: a waiter that never reads, one that leaves
//! mid-body, an origin whose body fails half way, HEAD and Range requests,
//! and a body exactly at the cap. Counts only: answers completed within a
//! generous bound, origin calls, bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use stampede_guard::Backend;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::common::over_cap::{big_app, big_app_on, expected, CAP};
use crate::common::{send, Answer, Origin};

/// Far beyond any time these bodies need, the spool's ten seconds of
/// patience with a reader that holds the others back included: a count, not
/// a timing.
const GENEROUS: Duration = Duration::from_secs(60);

fn req(method: &str, range: Option<&str>) -> Request<Body> {
    let mut r = Request::builder().method(method).uri("/big");
    if let Some(range) = range {
        r = r.header("range", range);
    }
    r.body(Body::empty()).unwrap()
}

/// Sends `n` requests at once and returns their heads, once the origin
/// has been called and `gate` opened. Each request is polled on this task
/// before any is left to the scheduler, so that every one has joined the
/// rebuild (or made the call) before the origin answers, however busy the
/// machine.
async fn heads(
    app: &Router,
    origin: &Origin,
    gate: &Semaphore,
    n: usize,
    make: impl Fn() -> Request<Body>,
) -> Vec<http::Response<Body>> {
    let mut requests: Vec<_> = (0..n)
        .map(|_| Box::pin(app.clone().oneshot(make())))
        .collect();
    let mut answered: Vec<Option<http::Response<Body>>> = (0..n).map(|_| None).collect();
    for _ in 0..3 {
        std::future::poll_fn(|cx| {
            for (request, answer) in requests.iter_mut().zip(answered.iter_mut()) {
                if answer.is_none()
                    && let std::task::Poll::Ready(response) = request.as_mut().poll(cx)
                {
                    *answer = Some(response.unwrap());
                }
            }
            std::task::Poll::Ready(())
        })
        .await;
        tokio::task::yield_now().await;
    }
    let tasks: Vec<_> = requests
        .into_iter()
        .zip(answered)
        .map(|(request, answer)| {
            tokio::spawn(async move {
                match answer {
                    Some(response) => response,
                    None => request.await.unwrap(),
                }
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
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Reads each body on its own task; how many end whole within `GENEROUS`.
async fn whole_within(responses: Vec<http::Response<Body>>, len: usize) -> usize {
    let tasks: Vec<_> = responses
        .into_iter()
        .map(|r| {
            tokio::spawn(async move {
                tokio::time::timeout(GENEROUS, r.into_body().collect())
                    .await
                    .ok()
                    .and_then(|b| b.ok())
                    .map(|b| b.to_bytes())
            })
        })
        .collect();
    let whole = expected(len);
    let mut n = 0;
    for t in tasks {
        if t.await.unwrap().is_some_and(|b| b == whole) {
            n += 1;
        }
    }
    n
}

/// One coalesced waiter that never reads (a client whose window stays
/// shut): how many of the other 19 get their whole answer. The stalled one
/// is cut off once the others have waited for it the spool's lag limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_never_reads_does_not_stall_the_others() {
    let (chunk, chunks) = (4 * 1024, 64);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 20, || req("GET", None)).await;
    let stalled = responses.pop().unwrap();
    let done = whole_within(responses, chunk * chunks).await;
    // Requests that come while the waiters are stalled.
    let later: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(req("GET", None)).await.unwrap() })
        })
        .collect();
    let mut heads = Vec::new();
    for t in later {
        if let Ok(Ok(r)) = tokio::time::timeout(GENEROUS, t).await {
            heads.push(r);
        }
    }
    let got_head = heads.len();
    let later_done = whole_within(heads, chunk * chunks).await;
    eprintln!("requests during the stall: {got_head} of 5 got a head, {later_done} whole");
    eprintln!(
        "never-reading waiter: {done} of 19 others whole within {GENEROUS:?}; origin calls {}",
        origin.calls()
    );
    drop(stalled);
    assert_eq!(done, 19, "a waiter that never reads stalled the others");
}

/// Two readers that never read, the first answered (most likely the one
/// whose request started the fetch) and the last: both are cut off, the
/// other 18 end whole, and the origin is called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_readers_that_never_read_starter_included_do_not_stall_the_others() {
    let (chunk, chunks) = (4 * 1024, 64);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 20, || req("GET", None)).await;
    let first = responses.remove(0);
    let last = responses.pop().unwrap();
    let done = whole_within(responses, chunk * chunks).await;
    eprintln!(
        "two never-reading readers: {done} of 18 others whole; origin calls {}",
        origin.calls()
    );
    assert_eq!(done, 18);
    assert_eq!(origin.calls(), 1);
    // Cut off: each body ends with an error, never as a whole body.
    for stalled in [first, last] {
        let body = tokio::time::timeout(GENEROUS, stalled.into_body().collect()).await;
        assert!(
            matches!(body, Ok(Err(_))),
            "a cut-off body ended whole or hung"
        );
    }
}

/// A reader that reads, only slowly (a pause per chunk far within the
/// spool's patience), on a body within the disk cap (64 KiB at this cap):
/// it is never cut off, and every reader ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_that_keeps_reading_is_never_cut_off() {
    let (chunk, chunks) = (4 * 1024, 16);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 10, || req("GET", None)).await;
    let slow = responses.pop().unwrap();
    let slow = tokio::spawn(async move {
        let mut body = slow.into_body();
        let mut read = Vec::new();
        while let Some(frame) = tokio::time::timeout(GENEROUS, body.frame()).await.ok()? {
            if let Ok(data) = frame.ok()?.into_data() {
                read.extend_from_slice(&data);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Some(Bytes::from(read))
    });
    let done = whole_within(responses, chunk * chunks).await;
    let slow = slow.await.unwrap();
    eprintln!(
        "slow reader: whole {}; {done} of 9 others whole",
        slow.as_ref()
            .is_some_and(|b| *b == expected(chunk * chunks))
    );
    assert_eq!(slow, Some(expected(chunk * chunks)));
    assert_eq!(done, 9);
    assert_eq!(origin.calls(), 1);
}

/// The disk a body over the cap may spill to at this cap (64 x the cap).
const DISK_CAP: usize = 64 * CAP;

/// Spill files this process left in the temporary directory.
fn spill_files_left() -> usize {
    let prefix = format!(".stampede-guard-spill-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Reads one frame of `response`'s body, then waits for `go` before it
/// reads the rest: the bytes, and whether it ended whole.
fn read_one_then_wait(
    response: http::Response<Body>,
    go: Arc<Semaphore>,
) -> tokio::task::JoinHandle<(Vec<u8>, bool)> {
    tokio::spawn(async move {
        let mut body = response.into_body();
        let mut read = Vec::new();
        let mut paused = false;
        loop {
            match tokio::time::timeout(GENEROUS, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                    }
                }
                Ok(None) => return (read, true),
                Ok(Some(Err(_))) | Err(_) => return (read, false),
            }
            if !paused {
                paused = true;
                let _ = tokio::time::timeout(GENEROUS, go.acquire()).await;
            }
        }
    })
}

/// A reader that falls behind the memory window (it reads one chunk, and
/// the rest only once the others are done) on a body within the disk cap:
/// the others end whole without waiting for it, and it then ends whole,
/// read from the spill file. No spill file is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_the_window_ends_whole_and_the_others_do_not_wait_for_it() {
    let (chunk, chunks) = (1024, DISK_CAP / 1024);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 10, || req("GET", None)).await;
    let go = Arc::new(Semaphore::new(0));
    let slow = read_one_then_wait(responses.pop().unwrap(), go.clone());
    // The slow one reads nothing more until these are done.
    let done = whole_within(responses, chunk * chunks).await;
    go.add_permits(1);
    let (read, whole) = slow.await.unwrap();
    eprintln!(
        "behind the window: {done} of 9 others whole; the slow one whole {whole} ({} bytes); origin calls {}",
        read.len(),
        origin.calls()
    );
    assert_eq!(done, 9);
    assert!(whole && read == expected(chunk * chunks));
    assert_eq!(origin.calls(), 1);
    assert_eq!(spill_files_left(), 0);
}

/// The same on a body twice the disk cap: the reader that fell further
/// behind than the disk cap is cut off (its body ends with an error, never
/// short but whole) once the others have waited the lag limit for it, and
/// the others end whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_further_behind_than_the_disk_cap_is_cut_off() {
    let (chunk, chunks) = (1024, 2 * DISK_CAP / 1024);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 10, || req("GET", None)).await;
    let go = Arc::new(Semaphore::new(0));
    let slow = read_one_then_wait(responses.pop().unwrap(), go.clone());
    let done = whole_within(responses, chunk * chunks).await;
    go.add_permits(1);
    let (read, whole) = slow.await.unwrap();
    eprintln!(
        "past the disk cap: {done} of 9 others whole; the slow one whole {whole} ({} bytes)",
        read.len()
    );
    assert_eq!(done, 9);
    assert!(!whole);
    assert!(read.len() < chunk * chunks);
}

/// A reader that reads nothing at all while the others read a body within
/// the disk cap: the others end whole; once it has read nothing for the
/// spool's lag limit (10 s) after the others read ahead, its body ends with
/// an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_reads_nothing_for_ten_seconds_is_cut_off() {
    let (chunk, chunks) = (1024, DISK_CAP / 1024);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 10, || req("GET", None)).await;
    let stalled = responses.pop().unwrap();
    let done = whole_within(responses, chunk * chunks).await;
    assert_eq!(done, 9);
    // At least the lag limit, however fast the clock runs.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let body = tokio::time::timeout(GENEROUS, stalled.into_body().collect()).await;
    eprintln!(
        "stalled for 11 s: ended with an error {}",
        matches!(body, Ok(Err(_)))
    );
    assert!(
        matches!(body, Ok(Err(_))),
        "a stalled body ended whole or hung"
    );
}

/// One waiter reads a chunk and leaves: the others still end whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_mid_body_does_not_break_the_others() {
    let (chunk, chunks) = (4 * 1024, 64);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let mut responses = heads(&app, &origin, &gate, 20, || req("GET", None)).await;
    let mut leaver = responses.pop().unwrap().into_body();
    let _ = leaver.frame().await;
    drop(leaver);
    let done = whole_within(responses, chunk * chunks).await;
    eprintln!(
        "leaver: {done} of 19 whole; origin calls {}",
        origin.calls()
    );
    assert_eq!(done, 19);
}

/// The origin's body fails half way: every waiter sees a failed body (the
/// origin's), none waits forever, none gets a whole body that was never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_body_failing_half_way_ends_every_waiter() {
    let (chunk, chunks) = (4 * 1024, 16);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app_on(Backend::local(), &origin, &gate, chunk, chunks, Some(8));
    let responses = heads(&app, &origin, &gate, 20, || req("GET", None)).await;
    let statuses: Vec<_> = responses.iter().map(|r| r.status()).collect();
    let tasks: Vec<_> = responses
        .into_iter()
        .map(|r| {
            tokio::spawn(
                async move { tokio::time::timeout(GENEROUS, r.into_body().collect()).await },
            )
        })
        .collect();
    let (mut failed, mut hung, mut ok) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Err(_) => hung += 1,
            Ok(Err(_)) => failed += 1,
            Ok(Ok(_)) => ok += 1,
        }
    }
    eprintln!(
        "origin failing mid-body: statuses {statuses:?}; failed {failed}, hung {hung}, ok {ok}; calls {}",
        origin.calls()
    );
    assert_eq!((hung, ok), (0, 0));
    // Later: the key is not stuck.
    let after = app.clone().oneshot(req("GET", None)).await.unwrap();
    let status = after.status();
    let body = tokio::time::timeout(GENEROUS, after.into_body().collect()).await;
    eprintln!("after: {status} ended {}", body.is_ok());
    assert!(body.is_ok(), "a later request hung");
}

/// HEAD and Range requests coalesced on a body over the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_and_range_requests_on_a_body_over_the_cap() {
    let (chunk, chunks) = (4 * 1024, 16);
    let len = chunk * chunks;
    for (method, range) in [
        ("HEAD", None),
        ("GET", Some("bytes=0-9")),
        ("GET", Some("bytes=-10")),
    ] {
        let origin = Origin::default();
        let gate = Arc::new(Semaphore::new(0));
        let app = big_app(&origin, &gate, chunk, chunks);
        let responses = heads(&app, &origin, &gate, 20, || req(method, range)).await;
        let tasks: Vec<_> = responses
            .into_iter()
            .map(|r| {
                tokio::spawn(async move {
                    let (parts, body) = r.into_parts();
                    let body = tokio::time::timeout(GENEROUS, body.collect()).await;
                    (parts, body)
                })
            })
            .collect();
        let mut answers: Vec<Answer> = Vec::new();
        let (mut hung, mut failed) = (0, 0);
        for t in tasks {
            let (parts, body) = t.await.unwrap();
            match body {
                Err(_) => hung += 1,
                Ok(Err(_)) => failed += 1,
                Ok(Ok(b)) => answers.push(Answer {
                    status: parts.status,
                    headers: parts.headers,
                    body: b.to_bytes(),
                }),
            }
        }
        eprintln!("{method} {range:?}: hung {hung}, failed {failed}");
        let mut kinds = std::collections::BTreeMap::new();
        for a in &answers {
            *kinds
                .entry((
                    a.status.as_u16(),
                    a.body.len(),
                    a.headers
                        .get("content-length")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    a.headers
                        .get("content-range")
                        .map(|v| v.to_str().unwrap().to_owned()),
                ))
                .or_insert(0) += 1;
        }
        eprintln!(
            "{method} {range:?}: {kinds:?}; origin calls {}",
            origin.calls()
        );
        assert_eq!((hung, failed), (0, 0), "{method} {range:?}");
        for a in &answers {
            match (method, range) {
                ("HEAD", _) => {
                    assert_eq!(a.status, StatusCode::OK);
                    assert!(a.body.is_empty());
                }
                (_, Some("bytes=0-9")) => {
                    assert!(
                        (a.status == StatusCode::PARTIAL_CONTENT
                            && a.body == expected(len).slice(0..10))
                            || (a.status == StatusCode::OK && a.body == expected(len)),
                        "{:?} {}",
                        a.status,
                        a.body.len()
                    );
                }
                _ => {
                    assert!(
                        (a.status == StatusCode::PARTIAL_CONTENT
                            && a.body == expected(len).slice(len - 10..))
                            || (a.status == StatusCode::OK && a.body == expected(len)),
                        "{:?} {}",
                        a.status,
                        a.body.len()
                    );
                }
            }
        }
    }
}

/// A body exactly at the cap is stored; one byte over is not.
#[tokio::test]
async fn a_body_exactly_at_the_cap_is_stored_one_byte_over_is_not() {
    for (len, stored) in [(CAP, true), (CAP + 1, false)] {
        let origin = Origin::default();
        let gate = Arc::new(Semaphore::new(10_000));
        let app = big_app(&origin, &gate, len, 1);
        for _ in 0..5 {
            let a = send(&app, req("GET", None)).await;
            assert!(a.body == expected(len));
        }
        eprintln!("len {len}: origin calls {} for 5", origin.calls());
        assert_eq!(
            origin.calls() == 1,
            stored,
            "len {len}: {} calls",
            origin.calls()
        );
    }
}
