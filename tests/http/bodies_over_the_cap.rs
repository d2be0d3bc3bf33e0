//! Answers larger than the route's `max_body_bytes`: never stored, never an
//! error the origin did not send. Every request that waited on the rebuild
//! gets the origin's answer, read once and streamed to it within a memory
//! bound, or from the origin itself when that bound cannot hold it; and the
//! key then passes straight through for a while instead of queueing its
//! requests behind a body that will never be stored.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use tokio::sync::Semaphore;

use crate::common::over_cap::{big_app, expected};
use crate::common::{get as get_req, send, Answer, Origin};

/// `n` requests at once, each from its own task, answered once `gate`
/// opens: it opens when the origin has had its first call and every
/// request has been sent.
async fn waiting_burst(app: &Router, origin: &Origin, gate: &Semaphore, n: usize) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/big")).await })
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
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

fn assert_whole(answers: &[Answer], len: usize) {
    let whole = expected(len);
    for answer in answers {
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.headers);
        assert_eq!(answer.body.len(), len, "{}", answer.x_cache());
        assert!(
            answer.body == whole,
            "{}: a body not the origin's",
            answer.x_cache()
        );
    }
}

async fn coalesced_waiters_all_get_the_whole_answer(chunk: usize, chunks: usize) {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    let answers = waiting_burst(&app, &origin, &gate, 20).await;
    assert_whole(&answers, chunk * chunks);
    // At most one origin call per request, whatever the interleaving.
    assert!(origin.calls() <= 20, "{}", origin.calls());
}

/// On one thread every request of the burst joins the flight before its
/// task runs: exactly one origin call.
#[tokio::test(flavor = "current_thread")]
async fn twenty_waiters_on_one_rebuild_of_a_big_answer_cost_one_origin_call() {
    for (chunk, chunks) in [(64 * 1024, 1), (4 * 1024, 256)] {
        let origin = Origin::default();
        let gate = Arc::new(Semaphore::new(0));
        let app = big_app(&origin, &gate, chunk, chunks);
        let answers = waiting_burst(&app, &origin, &gate, 20).await;
        assert_whole(&answers, chunk * chunks);
        assert_eq!(origin.calls(), 1, "{chunk} x {chunks}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_on_a_64_kib_answer_over_a_1_kib_cap_all_get_it_whole() {
    coalesced_waiters_all_get_the_whole_answer(64 * 1024, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_on_many_chunks_over_the_cap_all_get_it_whole() {
    coalesced_waiters_all_get_the_whole_answer(4 * 1024, 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_far_over_four_times_the_cap_reaches_every_waiter_whole() {
    // 1 MiB in 256 chunks over a 1 KiB cap: a thousand times the cap.
    coalesced_waiters_all_get_the_whole_answer(4 * 1024, 256).await;
}

#[tokio::test]
async fn after_a_body_over_the_cap_later_requests_pass_straight_through() {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, 8 * 1024, 4);
    let first = waiting_burst(&app, &origin, &gate, 5).await;
    assert_whole(&first, 32 * 1024);
    let before = origin.calls();
    // A later burst, with the origin holding every answer back: if its
    // requests queued behind one of them, only one call would reach the
    // origin while it holds. Each reaches it on its own.
    gate.forget_permits(usize::MAX);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, get_req("/big")).await })
        })
        .collect();
    let mut reached = 0;
    for _ in 0..4000 {
        reached = origin.calls() - before;
        if reached >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(reached, 10, "requests queued behind one another");
    gate.add_permits(10_000);
    for task in tasks {
        let answer = task.await.expect("request task");
        assert_whole(std::slice::from_ref(&answer), 32 * 1024);
        assert_ne!(answer.x_cache(), "COALESCED");
    }
}

/// A waiter whose client reads nothing for a while does not fail, and
/// does not make the others fail: the origin is read on as the slowest
/// reader reads (the memory bound holds), and every body ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_reads_late_still_gets_the_whole_body() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (chunk, chunks) = (4 * 1024, 64);
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let app = big_app(&origin, &gate, chunk, chunks);
    // Only the heads: nobody reads a body yet.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(get_req("/big")).await.unwrap() })
        })
        .collect();
    for _ in 0..2000 {
        if origin.calls() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gate.add_permits(10_000);
    let mut responses = Vec::new();
    for task in tasks {
        responses.push(task.await.expect("request task"));
    }
    let late = responses.pop().expect("ten responses");
    // The others read as fast as they can; the late one has not begun.
    let readers: Vec<_> = responses
        .into_iter()
        .map(|response| tokio::spawn(async move { response.into_body().collect().await }))
        .collect();
    for _ in 0..500 {
        tokio::task::yield_now().await;
    }
    let late = late.into_body().collect().await.expect("the late body");
    assert!(late.to_bytes() == expected(chunk * chunks));
    for reader in readers {
        let body = reader.await.unwrap().expect("a body");
        assert!(body.to_bytes() == expected(chunk * chunks));
    }
}
