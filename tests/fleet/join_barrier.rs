//! An instance started without Redis joins the fleet while it is under
//! load, and another instance purges around the join: once a purge returned
//! `Ok`, no request sent after it is answered with a value whose origin
//! call began before the purge did.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::fleet::{instance, Instance};
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin};
use stampede_guard::{Backend, Status};

const LIMIT: Duration = Duration::from_secs(30);

fn builder(url: &str) -> stampede_guard::RedisBackendBuilder {
    Backend::redis_builder(url)
        .probe_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_after_a_purge_predates_it_while_an_instance_joins() {
    let mut redis = RedisServer::start();
    redis.kill();
    let url = redis.url();
    let origin = Origin::default();
    let ttl = |g: stampede_guard::StampedeGuard| g.ttl(Duration::from_secs(60));
    let a = Arc::new(instance(
        builder(&url).connect().await.expect("starts without redis"),
        &origin,
        Duration::from_millis(30),
        ttl,
    ));
    // The highest origin call number a request sent now may not be
    // answered with (none: 0).
    let floor = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let stale = Arc::new(Mutex::new(Vec::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    let hammers: Vec<_> = (0..6)
        .map(|t| {
            let (a, floor, stop, stale, answered) = (
                a.clone(),
                floor.clone(),
                stop.clone(),
                stale.clone(),
                answered.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let key = (t + i) % 4;
                    i += 1;
                    let joined = a.backend.health().status == Status::Fleet;
                    let at = floor.load(Ordering::SeqCst);
                    let answer = send(&a.app, get(&format!("/report?k={key}"))).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let v: usize = answer.text().trim_start_matches('v').parse().unwrap_or(0);
                    if answer.status == 200 && v <= at {
                        stale.lock().unwrap().push((
                            joined,
                            key,
                            v,
                            at,
                            answer.x_cache().to_owned(),
                        ));
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart();
    let b: Instance = instance(
        builder(&url)
            .require_redis_at_start()
            .connect()
            .await
            .expect("connects"),
        &origin,
        Duration::from_millis(30),
        ttl,
    );
    // Purges from the moment B is in, through A's join and after it.
    let mut purges = 0;
    let mut joined_at = None;
    let until = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < until {
        let before = origin.calls();
        if b.guard.invalidate_all().await.is_ok() {
            floor.fetch_max(before, Ordering::SeqCst);
            purges += 1;
        }
        if joined_at.is_none() && a.backend.health().status == Status::Fleet {
            joined_at = Some(purges);
        }
        if joined_at.is_some_and(|j| purges >= j + 40) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for h in hammers {
        h.await.unwrap();
    }
    let all = stale.lock().unwrap().clone();
    let before_join = all.iter().filter(|s| !s.0).count();
    let stale: Vec<_> = all.into_iter().filter(|s| s.0).collect();
    eprintln!("answers older than a purge, sent before A joined: {before_join}");
    eprintln!(
        "purges {purges} (A joined after {joined_at:?}); answers {}; origin calls {}; stale {}: {:?}",
        answered.load(Ordering::Relaxed),
        origin.calls(),
        stale.len(),
        &stale[..stale.len().min(10)]
    );
    assert!(joined_at.is_some(), "A never joined");
    assert!(
        stale.is_empty(),
        "answers older than a purge that returned Ok"
    );
}

/// `a` reaches Redis through a link that freezes, under steady load on a
/// few keys; `b` purges again and again while the link is frozen and after
/// it thaws. With no outage grace (the default), a purge that returned `Ok`
/// is a barrier for `a` too: nothing `a` answers to a request sent after it
/// comes from an origin call that began before the purge did, whether `a`
/// held it before the freeze or rebuilt it locally during the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_nothing_rebuilt_during_a_frozen_link_outlives_a_later_purge() {
    let (stale, _) = frozen_link_under_purges(Duration::ZERO).await;
    assert!(
        stale.is_empty(),
        "answers older than a purge that returned Ok"
    );
}

/// With a grace, what `a` serves past a purge is bounded: measured, the
/// age of the oldest such answer (from the purge's start) is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_grace_answers_past_a_purge_are_bounded() {
    let grace = Duration::from_secs(2);
    let (stale, oldest) = frozen_link_under_purges(grace).await;
    eprintln!(
        "grace {grace:?}: {} answers past a purge, oldest {oldest:?} after it began",
        stale.len()
    );
}

/// Answers past a purge, and the greatest age (from the start of the
/// purge they predate) at which one was sent.
async fn frozen_link_under_purges(
    grace: Duration,
) -> (Vec<(usize, usize, usize, String)>, Duration) {
    use crate::common::proxy::Proxy;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let ttl = |g: stampede_guard::StampedeGuard| g.ttl(Duration::from_secs(60));
    let proxy = Proxy::start(redis.port()).await;
    let a = Arc::new(instance(
        builder(&proxy.url())
            .outage_grace(grace)
            .deadline(Duration::from_millis(500))
            .connect()
            .await
            .expect("a"),
        &origin,
        Duration::from_millis(20),
        ttl,
    ));
    let b = instance(
        builder(&redis.url())
            .outage_grace(grace)
            .deadline(Duration::from_millis(500))
            .connect()
            .await
            .expect("b"),
        &origin,
        Duration::from_millis(20),
        ttl,
    );
    let until = std::time::Instant::now() + LIMIT;
    while a.backend.health().status != Status::Fleet || b.backend.health().status != Status::Fleet {
        assert!(std::time::Instant::now() < until, "no fleet");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let floor = Arc::new(AtomicUsize::new(0));
    let purges: Arc<Mutex<Vec<(usize, std::time::Instant)>>> = Arc::default();
    let oldest = Arc::new(Mutex::new(Duration::ZERO));
    let stop = Arc::new(AtomicBool::new(false));
    let stale = Arc::new(Mutex::new(Vec::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    let hammers: Vec<_> = (0..4)
        .map(|t| {
            let (a, floor, stop, stale, answered) = (
                a.clone(),
                floor.clone(),
                stop.clone(),
                stale.clone(),
                answered.clone(),
            );
            let (purges, oldest) = (purges.clone(), oldest.clone());
            tokio::spawn(async move {
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let key = (t + i) % 3;
                    let sent = std::time::Instant::now();
                    i += 1;
                    let at = floor.load(Ordering::SeqCst);
                    let answer = send(&a.app, get(&format!("/report?k={key}"))).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    let v: usize = answer.text().trim_start_matches('v').parse().unwrap_or(0);
                    if answer.status == 200 && v <= at {
                        stale
                            .lock()
                            .unwrap()
                            .push((key, v, at, answer.x_cache().to_owned()));
                        let started = purges
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|p| p.0 >= v)
                            .map(|p| p.1);
                        if let Some(started) = started {
                            let mut o = oldest.lock().unwrap();
                            *o = (*o).max(sent.saturating_duration_since(started));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.freeze();
    let (mut ok, mut failed) = (0, 0);
    for round in 0..12 {
        if round == 9 {
            proxy.thaw();
        }
        let before = origin.calls();
        let started = std::time::Instant::now();
        match tokio::time::timeout(LIMIT, b.guard.invalidate_all())
            .await
            .expect("no hang")
        {
            Ok(()) => {
                purges.lock().unwrap().push((before, started));
                floor.fetch_max(before, Ordering::SeqCst);
                ok += 1;
            }
            Err(_) => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for h in hammers {
        h.await.unwrap();
    }
    let stale = stale.lock().unwrap().clone();
    eprintln!(
        "purges ok {ok}, failed {failed}; answers {}; origin calls {}; stale {}: {:?}",
        answered.load(Ordering::Relaxed),
        origin.calls(),
        stale.len(),
        &stale[..stale.len().min(12)]
    );
    let oldest = *oldest.lock().unwrap();
    (stale, oldest)
}
