//! Sentinel under faults (see `cluster_promises.rs` for the cluster's):
//! what docs/TOPOLOGY.md promises behind Sentinel, attacked on real
//! processes.
//!
//! - A sentinel that takes the `+switch-master` subscription and then drops
//!   the connection, every time: the instance asks it again at the pace of
//!   its role checks, not in a loop as fast as the sentinel answers.
//! - A sentinel that announces failovers without end is followed at a
//!   bounded pace.
//! - Two instances contend for a synced lock while `SENTINEL FAILOVER`
//!   moves the primary (the old one answers throughout, and takes writes
//!   until it is converted): no two holds overlap, and the tokens of the
//!   holds rise in the order the holds were taken.
//! - What TOPOLOGY.md says of the plain lock is exact: increments the
//!   replica never got are lost with the primary, and the promoted replica
//!   hands out a number that was already issued.
#![cfg(feature = "redis")]

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::lock::held_locks;
use crate::common::redis::RedisServer;
use crate::common::sentinel::{read_command, SentinelSetup, SERVICE};
use stampede_guard::{Backend, FencingToken, Lock, LockError};

/// What a fake sentinel does once it has confirmed a `+switch-master`
/// subscription.
#[derive(Clone, Copy)]
enum AfterSubscribe {
    /// Hangs up on the subscriber.
    HangUp,
    /// Announces a failover every millisecond, for as long as the
    /// subscriber listens.
    Announce,
}

/// What a fake sentinel was asked.
#[derive(Default)]
struct Asked {
    subscriptions: AtomicUsize,
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`: where the primary is.
    questions: AtomicUsize,
}

/// A sentinel that names `primary`, confirms a subscription, and then does
/// `after`.
fn fake_sentinel(primary: u16, after: AfterSubscribe, asked: Arc<Asked>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let asked = asked.clone();
            std::thread::spawn(move || {
                let mut out = stream.try_clone().expect("clone");
                let mut reader = BufReader::new(stream);
                while let Some(args) = read_command(&mut reader) {
                    let reply = match args.first().map(String::as_str).unwrap_or("") {
                        "HELLO" => "%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n".to_owned(),
                        "CLIENT" => "+OK\r\n".to_owned(),
                        "PING" => "+PONG\r\n".to_owned(),
                        "SENTINEL" => {
                            asked.questions.fetch_add(1, Ordering::SeqCst);
                            let port = primary.to_string();
                            format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                        }
                        "SUBSCRIBE" => {
                            asked.subscriptions.fetch_add(1, Ordering::SeqCst);
                            let confirm =
                                ">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n";
                            let _ = out.write_all(confirm.as_bytes());
                            match after {
                                AfterSubscribe::HangUp => {
                                    let _ = out.shutdown(std::net::Shutdown::Both);
                                }
                                AfterSubscribe::Announce => {
                                    let body =
                                        format!("cache 127.0.0.1 {primary} 127.0.0.1 {primary}");
                                    let push = format!(
                                        ">3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n${}\r\n{body}\r\n",
                                        body.len()
                                    );
                                    while out.write_all(push.as_bytes()).is_ok() {
                                        std::thread::sleep(Duration::from_millis(1));
                                    }
                                }
                            }
                            return;
                        }
                        _ => "-ERR unknown command\r\n".to_owned(),
                    };
                    if out.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

async fn through(sentinel: u16) -> Backend {
    Backend::redis_builder(&format!("redis-sentinel://127.0.0.1:{sentinel}/cache"))
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("connects through the sentinel")
}

/// A sentinel that drops every `+switch-master` subscription right after
/// confirming it is asked again once per role check (about one a second),
/// not as fast as it answers: over three seconds, a handful of
/// subscriptions, and the instance keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_dropping_every_subscription_is_not_asked_in_a_loop() {
    let primary = RedisServer::start();
    let asked = Arc::new(Asked::default());
    let sentinel = fake_sentinel(primary.port(), AfterSubscribe::HangUp, asked.clone());
    let backend = through(sentinel).await;

    let before = asked.subscriptions.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = asked.subscriptions.load(Ordering::SeqCst) - before;
    assert!(
        asked <= 8,
        "{asked} subscriptions in 3 s: the instance asks the sentinel again in a loop"
    );

    let lock = Lock::new(backend);
    let guard = lock.acquire("stock").await.expect("lock");
    assert_eq!(held_locks(&primary), ":1");
    assert!(guard.release().await.unwrap());
}

/// A sentinel that announces a failover every millisecond (faulty, or a
/// primary flapping) is followed at a bounded pace: each announcement makes
/// the instance ask every sentinel where the primary is, and asking a
/// thousand times a second would be a storm of connections of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_announcing_without_end_is_followed_at_a_bounded_pace() {
    let primary = RedisServer::start();
    let asked = Arc::new(Asked::default());
    let sentinel = fake_sentinel(primary.port(), AfterSubscribe::Announce, asked.clone());
    let backend = through(sentinel).await;

    let before = asked.questions.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let questions = asked.questions.load(Ordering::SeqCst) - before;
    assert!(
        questions <= 60,
        "{questions} questions in 2 s: every announcement is followed at once"
    );

    let lock = Lock::new(backend);
    let guard = lock.acquire("stock").await.expect("lock");
    assert_eq!(held_locks(&primary), ":1");
    assert!(guard.release().await.unwrap());
}

/// What the contending instances saw.
#[derive(Default)]
struct Record {
    /// Tokens of the holds, in the order they were taken (each pushed while
    /// its hold is the only one).
    tokens: Mutex<Vec<(usize, FencingToken)>>,
    /// Holds now (must never exceed one).
    holding: AtomicUsize,
    overlaps: AtomicUsize,
    /// Acquisitions that failed as the docs allow (not acknowledged, or
    /// the lock busy for the whole wait budget).
    refused: AtomicUsize,
    stop: AtomicBool,
}

async fn contend(me: usize, lock: Lock, record: Arc<Record>) {
    while !record.stop.load(Ordering::SeqCst) {
        match lock.acquire("stock").await {
            Ok(guard) => {
                if record.holding.fetch_add(1, Ordering::SeqCst) != 0 {
                    record.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                record
                    .tokens
                    .lock()
                    .unwrap()
                    .push((me, guard.fencing_token()));
                tokio::time::sleep(Duration::from_millis(5)).await;
                record.holding.fetch_sub(1, Ordering::SeqCst);
                // A release that meets the switch may fail; the hold then
                // lapses with its lease.
                let _ = guard.release().await;
            }
            Err(LockError::Unavailable(_) | LockError::Timeout) => {
                record.refused.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("instance {me}: {e}"),
        }
    }
}

fn holds_by(record: &Record, me: usize) -> usize {
    record
        .tokens
        .lock()
        .unwrap()
        .iter()
        .filter(|(who, _)| *who == me)
        .count()
}

/// Waits (bounded) until each instance has taken `more` holds past `from`.
async fn until_each_holds(record: &Record, from: [usize; 2], more: usize) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while (0..2).any(|i| holds_by(record, i) < from[i] + more) {
        assert!(
            Instant::now() < give_up,
            "the instances stopped getting the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_holds_stay_exclusive_and_ordered_through_a_forced_failover() {
    let setup = SentinelSetup::start();
    let record = Arc::new(Record::default());
    let mut workers = Vec::new();
    for me in 0..2 {
        let backend = Backend::redis_builder(&setup.url())
            .probe_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("backend through the sentinel");
        // A short lease: a hold whose release met the switch lapses soon.
        let lock = Lock::new(backend)
            .lease(Duration::from_secs(1))
            .wait_budget(Duration::from_secs(5))
            .synced(1, Duration::from_millis(300));
        workers.push(tokio::spawn(contend(me, lock, record.clone())));
    }
    until_each_holds(&record, [0, 0], 3).await;

    assert_eq!(
        setup.sentinel().raw(&["SENTINEL", "FAILOVER", SERVICE]),
        "+OK\r\n"
    );
    setup.wait_for_promotion(Duration::from_secs(20));
    let at_switch = [holds_by(&record, 0), holds_by(&record, 1)];
    // Both instances hold the lock again on the new primary, acknowledged
    // by the old one turned replica.
    until_each_holds(&record, at_switch, 3).await;
    record.stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }

    assert_eq!(
        record.overlaps.load(Ordering::SeqCst),
        0,
        "two holds at once"
    );
    let tokens = record.tokens.lock().unwrap();
    for pair in tokens.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "a synced hold's token did not rise: {:?} then {:?} (all: {tokens:?})",
            pair[0],
            pair[1]
        );
    }
}

/// The plain (unsynced) lock across a failover that loses the last
/// increments: the replica had the fence counter, then stopped
/// acknowledging; the primary issued more numbers and died. The promoted
/// replica issues one of those numbers again, as docs/TOPOLOGY.md says
/// ("Without `synced`, a fencing token can repeat across a failover").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_repeats_a_token_when_the_failover_loses_increments() {
    let mut setup = SentinelSetup::start();
    let backend = Backend::redis_builder(&setup.url())
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("backend through the sentinel");
    let lock = Lock::new(backend);
    let first = lock.acquire("sku").await.expect("lock");
    let base = first.fencing_token();
    assert!(first.release().await.unwrap());
    crate::common::cluster::wait_replicated(&setup.primary, Duration::from_secs(10));

    // The replica is cut off (frozen, and its link closed by the primary,
    // so nothing waits for it in a socket buffer); the primary issues
    // three more.
    setup.replica.freeze();
    let cut = setup.primary.raw(&["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(cut, ":1", "the replica's link closed");
    let mut issued = vec![base];
    for _ in 0..3 {
        let guard = lock.acquire("sku").await.expect("lock");
        issued.push(guard.fencing_token());
        assert!(guard.release().await.unwrap());
    }
    setup.primary.kill();
    setup.replica.thaw();
    setup.wait_for_promotion(Duration::from_secs(20));

    let give_up = Instant::now() + Duration::from_secs(20);
    let again = loop {
        if let Ok(Some(guard)) = lock.try_acquire("sku").await {
            let token = guard.fencing_token();
            assert!(guard.release().await.unwrap());
            break token;
        }
        assert!(Instant::now() < give_up, "no lock on the new primary");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        issued[1..].contains(&again),
        "the promoted replica continued from the replicated counter ({base:?}): \
         {again:?} repeats one of {issued:?}"
    );
}
