//! The supervisor against a real Redis: it stops with its tier, and closes
//! an open circuit once Redis answers.

use std::sync::Weak;

use super::*;
use crate::key::Key;
use crate::store::redis::testing::{connect, RedisServer};
use crate::store::redis::RedisTier;

fn shared(tier: &Arc<RedisTier>) -> Weak<Connections> {
    Arc::downgrade(&tier.conns)
}

async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..300 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Fails calls until the circuit opens.
async fn open_circuit(tier: &Arc<RedisTier>) {
    let key = Key::for_value("t", b"k");
    for _ in 0..20 {
        if !tier.is_available() {
            return;
        }
        assert!(tier
            .fetch_or_lease(&key, Duration::from_secs(1), None)
            .await
            .is_err());
    }
    panic!("the circuit did not open");
}

#[tokio::test]
async fn the_supervisor_stops_when_an_idle_tier_is_dropped() {
    let redis = RedisServer::start();
    let tier = connect(&redis).await;
    let state = shared(&tier);
    // The tier itself, its entries, barrier (and the barrier's batched
    // reads) and locks, and its supervisor.
    assert_eq!(state.strong_count(), 6, "the tier and its supervisor");
    drop(tier);
    assert!(
        eventually(|| state.strong_count() == 0).await,
        "no task keeps the tier's state"
    );
}

#[tokio::test]
async fn the_supervisor_stops_when_the_tier_is_dropped_mid_probe() {
    let mut redis = RedisServer::start();
    let tier = connect(&redis).await;
    let state = shared(&tier);
    redis.kill();
    open_circuit(&tier).await;
    // Let the probe fail a few times, so it is in its retry loop.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!tier.is_available());
    drop(tier);
    assert!(
        eventually(|| state.strong_count() == 0).await,
        "the probe ended with the tier"
    );
}

#[tokio::test]
async fn an_open_circuit_closes_once_redis_answers_again() {
    let mut redis = RedisServer::start();
    let tier = connect(&redis).await;
    redis.kill();
    open_circuit(&tier).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!tier.is_available(), "stays open while Redis is gone");
    redis.restart();
    assert!(
        eventually(|| tier.is_available()).await,
        "the probe closed the circuit"
    );
    let key = Key::for_value("t", b"k");
    assert!(tier.invalidate(&key, &"k".into()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tier_ends_its_tasks_while_a_background_release_waits_on_redis() {
    let redis = RedisServer::start();
    let tier = connect(&redis).await;
    let state = shared(&tier);
    let whole = Arc::downgrade(&tier);
    redis.freeze();
    // A release that retries for as long as its lease would run: it needs
    // the connections, not the tier, its supervisor or its membership.
    tier.entries.release_orphan(
        Key::for_value("t", b"k"),
        "token".to_owned(),
        Duration::from_secs(30),
    );
    drop(tier);
    let ended = eventually(|| whole.strong_count() == 0).await;
    let conns_held = state.strong_count() > 0;
    redis.thaw();
    assert!(ended, "the tier and its supervisor end at the drop");
    assert!(
        conns_held,
        "the release still holds the connections it needs"
    );
    assert!(
        eventually(|| state.strong_count() == 0).await,
        "and lets them go once Redis has answered it"
    );
}

/// Counts the events logged at INFO and above, and the debug lines that
/// say a keepalive went unanswered.
#[derive(Default)]
struct Logged {
    loud: std::sync::Mutex<Vec<(tracing::Level, String)>>,
    silent_keepalives: std::sync::atomic::AtomicUsize,
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

struct Counter(Arc<Logged>);

impl tracing::Subscriber for Counter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        if level <= tracing::Level::INFO {
            self.0.loud.lock().unwrap().push((level, message.0));
        } else if message.0.starts_with("redis subscriber does not answer") {
            self.0
                .silent_keepalives
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the condition did not come true");
}

/// Set in the process [`with_logs`] starts: the test it names runs there.
const LOGGED_TEST: &str = "STAMPEDE_GUARD_LOGGED_TEST";

/// Runs `body` with every event of the process counted, in a process of
/// its own: this test binary, started again on the test `name` alone. A
/// process-wide subscriber sees every thread's events, and no other test
/// logs there, so the counts are exact however many tests run beside it.
fn with_logs(name: &str, body: impl FnOnce(Arc<Logged>)) {
    if std::env::var(LOGGED_TEST).as_deref() == Ok(name) {
        let logged = Arc::new(Logged::default());
        tracing::subscriber::set_global_default(Counter(logged.clone()))
            .expect("the only subscriber of the process");
        body(logged);
        return;
    }
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::{name}");
    let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args([test.as_str(), "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(LOGGED_TEST, name)
        .output()
        .expect("the test runs in a process of its own");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in its own process: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An outage logs one WARN when it begins and one INFO when it ends,
/// however many keepalives go unanswered and probes fail meanwhile.
#[test]
fn an_outage_logs_one_warn_and_one_info() {
    with_logs("an_outage_logs_one_warn_and_one_info", |logged| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(an_outage_logged(&logged));
    });
}

async fn an_outage_logged(logged: &Logged) {
    let mut redis = RedisServer::start();
    let tier = connect(&redis).await;
    redis.kill();
    open_circuit(&tier).await;
    until(|| {
        logged
            .silent_keepalives
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 3
    })
    .await;
    redis.restart();
    until(|| !tier.conns.outage.is_on()).await;
    let loud = logged.loud.lock().unwrap().clone();
    let warns: Vec<_> = loud
        .iter()
        .filter(|(level, _)| *level == tracing::Level::WARN)
        .collect();
    let infos: Vec<_> = loud
        .iter()
        .filter(|(level, _)| *level == tracing::Level::INFO)
        .collect();
    assert_eq!(warns.len(), 1, "one WARN: {loud:?}");
    assert!(warns[0].1.starts_with("redis unreachable"), "{loud:?}");
    assert_eq!(infos.len(), 1, "one INFO: {loud:?}");
    assert!(
        infos[0].1.contains("fleet-wide protection restored"),
        "{loud:?}"
    );
}
