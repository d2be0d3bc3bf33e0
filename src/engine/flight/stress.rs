//! Stress tests of the in-process flight map on the real code: many tasks on
//! a multi-threaded runtime join one key while leaders finish, panic or are
//! cancelled at random points. Loom cannot run tokio's `watch`; the map's
//! state machine is model-checked exhaustively in tests/model/flight.rs, and
//! these tests run the real `Flights` under real scheduling.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Flights, Joined, Outcome};
use crate::engine::entry::{Entry, Lifetime};
use crate::key::Key;

/// Counts the leaders of attached flights; the count goes down before the
/// leader's flight is closed (locals drop in reverse order).
struct Leading(Arc<AtomicUsize>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Counters {
    leading: Arc<AtomicUsize>,
    double_leader: AtomicUsize,
    answered: AtomicUsize,
    led: AtomicUsize,
    stores: AtomicUsize,
    finished: AtomicUsize,
}

fn value() -> Outcome {
    Outcome::Value {
        entry: Arc::new(Entry::new(
            Bytes::from_static(b"v"),
            Lifetime::default(),
            Duration::ZERO,
            Duration::ZERO,
            Instant::now(),
        )),
        stale: false,
    }
}

/// One request: lead or follow until it has a value. A leader fails (panics,
/// abandons, answers for itself alone) on the first `fails` leads of the
/// round, chosen by `seed`.
async fn request(flights: Arc<Flights>, key: Key, c: Arc<Counters>, seed: u64) {
    let mut round = 0u64;
    loop {
        round += 1;
        match flights.join(key) {
            Joined::Lead(leader) => {
                if c.leading.fetch_add(1, Ordering::SeqCst) != 0 {
                    c.double_leader.fetch_add(1, Ordering::SeqCst);
                }
                let leading = Leading(c.leading.clone());
                c.led.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                let choice = (seed.wrapping_mul(31).wrapping_add(round * 7)) % 5;
                match choice {
                    // A panic while leading: the leader drops in the unwind.
                    0 if round < 4 => {
                        let handle = tokio::spawn(async move {
                            let _leader = leader;
                            let _leading = leading;
                            tokio::task::yield_now().await;
                            panic!("origin handler panicked (expected in this test)");
                        });
                        assert!(handle.await.is_err());
                        continue;
                    }
                    // Abandoned: dropped without an outcome.
                    1 if round < 4 => {
                        drop(leading);
                        drop(leader);
                        continue;
                    }
                    _ => {
                        drop(leading);
                        let stores = &c.stores;
                        if leader.finish(value(), || {
                            stores.fetch_add(1, Ordering::SeqCst);
                        }) {
                            c.answered.fetch_add(1, Ordering::SeqCst);
                            c.finished.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            }
            Joined::Follow(follower) => match follower.wait(Duration::from_secs(3600)).await {
                Some(Outcome::Value { .. }) => {
                    c.answered.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Some(_) => continue,
                None => panic!("a follower's generous budget ran out: stranded"),
            },
        }
    }
}

#[test]
fn leaders_hand_over_on_panic_cancel_and_abandon_and_nobody_is_stranded() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let counters = Arc::new(Counters {
            leading: Arc::new(AtomicUsize::new(0)),
            double_leader: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            led: AtomicUsize::new(0),
            stores: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        });
        let (mut cancelled, mut spawned) = (0, 0);
        for iteration in 0..300u64 {
            let flights = Arc::new(Flights::new());
            let key = Key::for_value("stress", &iteration.to_be_bytes());
            let mut tasks = Vec::new();
            for t in 0..8u64 {
                let job = request(flights.clone(), key, counters.clone(), iteration * 8 + t);
                tasks.push(tokio::spawn(job));
                spawned += 1;
            }
            // Cancel a few tasks at random points, leaders and followers.
            for _ in 0..(iteration % 3) {
                tokio::task::yield_now().await;
                let victim = (iteration as usize * 5 + cancelled) % tasks.len();
                tasks[victim].abort();
            }
            for task in tasks {
                // Hangs here if a waiter were stranded; the test's harness
                // timeout would then fail it.
                match task.await {
                    Ok(()) => {}
                    Err(e) if e.is_cancelled() => cancelled += 1,
                    Err(e) => panic!("a request failed: {e}"),
                }
            }
            assert_eq!(flights.len(), 0, "no flight left behind");
        }
        let answered = counters.answered.load(Ordering::SeqCst);
        assert_eq!(
            counters.double_leader.load(Ordering::SeqCst),
            0,
            "never two leaders"
        );
        assert_eq!(
            answered + cancelled,
            spawned,
            "every request not cancelled has a value"
        );
        assert!(cancelled > 0, "some tasks were cancelled");
        assert!(
            counters.led.load(Ordering::SeqCst) > 300,
            "leaders handed over"
        );
        assert_eq!(
            counters.stores.load(Ordering::SeqCst),
            counters.finished.load(Ordering::SeqCst),
            "each finished flight stored once"
        );
    });
}

#[test]
fn a_detached_flight_never_stores_and_later_requests_lead_anew() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut refused = 0;
        for iteration in 0..300u64 {
            let flights = Arc::new(Flights::new());
            let key = Key::for_value("detach", &iteration.to_be_bytes());
            let Joined::Lead(leader) = flights.join(key) else {
                panic!("the first joiner leads")
            };
            // Every other iteration detaches before the finish for sure (a
            // loaded machine may never run the racing detacher first); the
            // others race it.
            if iteration % 2 == 1 {
                flights.detach_group(&key);
            }
            let detacher = {
                let flights = flights.clone();
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    flights.detach_group(&key);
                })
            };
            tokio::task::yield_now().await;
            let stored = Arc::new(AtomicUsize::new(0));
            let s = stored.clone();
            let attached = leader.finish(value(), move || {
                s.fetch_add(1, Ordering::SeqCst);
            });
            detacher.await.unwrap();
            // Stored exactly when the flight was still attached at its end.
            assert_eq!(stored.load(Ordering::SeqCst), usize::from(attached));
            refused += usize::from(!attached);
            assert!(
                matches!(flights.join(key), Joined::Lead(_)),
                "a new flight after either"
            );
        }
        assert!(refused > 0, "some detaches came before the finish");
    });
}
