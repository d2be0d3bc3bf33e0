//! Attacks on the lock's promises with Redis one network hop away (each
//! instance through its own proxy holding every chunk 20–40 ms each way)
//! and with Redis pausing its writers (`CLIENT PAUSE WRITE`) while holders
//! renew and contenders queue. Each test prints what it measured
//! (`MEASURED ...`); the assertions count overlaps, fences and failed
//! acquisitions, never time.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, FencingToken, Lock, LockError};

const INSTANCES: usize = 3;
const TASKS_PER_INSTANCE: usize = 4;
const ROUNDS: usize = 5;
/// Holds per contender when Redis's writers are paused.
const PAUSED_ROUNDS: usize = 1;

/// Who is inside the critical section: each holder's id and whether its
/// guard has reported the loss of the lock.
#[derive(Default)]
struct Inside {
    holders: Mutex<Vec<(usize, Arc<AtomicBool>)>>,
    /// Entries while another holder, not told of a loss, was inside.
    overlaps: AtomicUsize,
    /// Fencing tokens in the order the holders entered.
    fences: Mutex<Vec<FencingToken>>,
}

/// What a contention run saw.
#[derive(Debug, Default)]
#[allow(dead_code)]
struct Contention {
    acquired: usize,
    timeouts: usize,
    unavailable: usize,
    other_errors: usize,
    overlaps: usize,
    fences_not_rising: usize,
    holds_lost: usize,
    circuit_openings: u64,
}

/// `TASKS_PER_INSTANCE` tasks on each lock (one lock per instance), each
/// taking the lock `rounds` times (trying again 50 ms after a failed
/// acquisition) and holding it for `hold` (or until it is lost). `during` runs beside them (a fault), from when the first holds.
async fn contend(
    locks: &[Lock],
    backends: &[Backend],
    rounds: usize,
    hold: Duration,
    during: impl std::future::Future<Output = ()>,
) -> Contention {
    let inside = Arc::new(Inside::default());
    let acquired = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let lost = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, lock) in locks.iter().enumerate() {
        for t in 0..TASKS_PER_INSTANCE {
            let id = i * TASKS_PER_INSTANCE + t;
            let (lock, inside, acquired, errors, lost) = (
                lock.clone(),
                inside.clone(),
                acquired.clone(),
                errors.clone(),
                lost.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let (mut holds, mut attempts) = (0, 0);
                while holds < rounds && attempts < 1_000 {
                    attempts += 1;
                    let guard = match lock.acquire("hot").await {
                        Ok(g) => g,
                        Err(e) => {
                            // As a service would: try again a little later.
                            errors.lock().expect("errors").push(e);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    holds += 1;
                    acquired.fetch_add(1, Ordering::SeqCst);
                    let told = Arc::new(AtomicBool::new(guard.is_lost()));
                    {
                        let mut holders = inside.holders.lock().expect("holders");
                        if holders.iter().any(|(_, told)| !told.load(Ordering::SeqCst)) {
                            inside.overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        holders.push((id, told.clone()));
                        inside
                            .fences
                            .lock()
                            .expect("fences")
                            .push(guard.fencing_token());
                    }
                    tokio::select! {
                        () = guard.lost() => {
                            told.store(true, Ordering::SeqCst);
                            lost.fetch_add(1, Ordering::SeqCst);
                        }
                        () = tokio::time::sleep(hold) => {}
                    }
                    // Out of the section before the lock is handed back.
                    inside
                        .holders
                        .lock()
                        .expect("holders")
                        .retain(|(who, _)| *who != id);
                    let _ = guard.release().await;
                }
            }));
        }
    }
    let fault = async {
        // The fault starts once the lock is in use.
        while acquired.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        during.await;
    };
    let all = async {
        for t in tasks {
            t.await.expect("contender");
        }
    };
    tokio::join!(fault, all);
    let fences = inside.fences.lock().expect("fences").clone();
    let errors = std::mem::take(&mut *errors.lock().expect("errors"));
    let mut seen = Contention {
        acquired: acquired.load(Ordering::SeqCst),
        overlaps: inside.overlaps.load(Ordering::SeqCst),
        fences_not_rising: fences.windows(2).filter(|w| w[0] >= w[1]).count(),
        holds_lost: lost.load(Ordering::SeqCst),
        ..Contention::default()
    };
    for e in errors {
        match e {
            LockError::Timeout => seen.timeouts += 1,
            LockError::Unavailable(_) => seen.unavailable += 1,
            _ => seen.other_errors += 1,
        }
    }
    for b in backends {
        seen.circuit_openings += b.stats().redis.expect("redis stats").circuit_openings;
    }
    seen
}

/// `INSTANCES` backends with default settings, each through a delayed
/// proxy of its own.
async fn slow_backends(redis: &RedisServer) -> (Vec<Proxy>, Vec<Backend>) {
    let mut proxies = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..INSTANCES {
        let proxy = Proxy::delayed(redis.port(), 20..=40).await;
        backends.push(
            Backend::redis(&proxy.url())
                .await
                .expect("a backend with default settings over a slow link"),
        );
        proxies.push(proxy);
    }
    (proxies, backends)
}

/// 12 contenders on 3 instances, each over a slow link, each taking one
/// lock 5 times (default lease, 30 s wait budget): never two holders at
/// once, fences rise in the order of the holds, and no acquisition fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_links_lock_contention_keeps_exclusion_and_rising_fences() {
    let redis = RedisServer::start();
    let (_proxies, backends) = slow_backends(&redis).await;
    let locks: Vec<Lock> = backends
        .iter()
        .map(|b| Lock::new(b.clone()).wait_budget(Duration::from_secs(30)))
        .collect();
    let seen = contend(
        &locks,
        &backends,
        ROUNDS,
        Duration::from_millis(20),
        async {},
    )
    .await;
    eprintln!("MEASURED lock contention over slow links: {seen:?}");
    assert_eq!(seen.overlaps, 0, "{seen:?}");
    assert_eq!(seen.fences_not_rising, 0, "{seen:?}");
    assert_eq!(
        seen.acquired,
        INSTANCES * TASKS_PER_INSTANCE * ROUNDS,
        "no acquisition fails on a slow link: {seen:?}"
    );
    assert_eq!(
        seen.circuit_openings, 0,
        "a slow link is no failure: {seen:?}"
    );
}

/// The same contention (lease 300 ms, so holds of 600 ms need renewals;
/// one hold per contender) with Redis's writers paused for 3 s (`CLIENT PAUSE
/// 3000 WRITE`, from the first hold on) while a holder renews and the others queue: never two
/// holders at once that were not told of a loss, fences rise, every
/// contender gets its holds in the end; acquisitions during the pause may
/// fail (reported).
async fn contention_with_writes_paused(slow: bool) -> Contention {
    let redis = RedisServer::start();
    let (_proxies, backends) = if slow {
        slow_backends(&redis).await
    } else {
        let mut backends = Vec::new();
        for _ in 0..INSTANCES {
            backends.push(Backend::redis(&redis.url()).await.expect("backend"));
        }
        (Vec::new(), backends)
    };
    let locks: Vec<Lock> = backends
        .iter()
        .map(|b| {
            Lock::new(b.clone())
                .lease(Duration::from_millis(300))
                .wait_budget(Duration::from_secs(30))
        })
        .collect();
    contend(
        &locks,
        &backends,
        PAUSED_ROUNDS,
        Duration::from_millis(600),
        async {
            assert_eq!(redis.raw(&["CLIENT", "PAUSE", "3000", "WRITE"]), "+OK");
        },
    )
    .await
}

fn assert_exclusion(seen: &Contention) {
    assert_eq!(seen.overlaps, 0, "{seen:?}");
    assert_eq!(
        seen.acquired,
        INSTANCES * TASKS_PER_INSTANCE * PAUSED_ROUNDS,
        "{seen:?}"
    );
    assert_eq!(seen.fences_not_rising, 0, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_links_lock_contention_with_writes_paused() {
    let seen = contention_with_writes_paused(false).await;
    eprintln!("MEASURED lock contention, writes paused 3 s: {seen:?}");
    assert_exclusion(&seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_links_lock_contention_with_writes_paused_over_slow_links() {
    let seen = contention_with_writes_paused(true).await;
    eprintln!("MEASURED lock contention over slow links, writes paused 3 s: {seen:?}");
    assert_exclusion(&seen);
}
