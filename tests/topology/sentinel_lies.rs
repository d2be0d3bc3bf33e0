//! Sentinels that lie or babble: a fake sentinel (a plain TCP listener
//! speaking just enough RESP) listed before the real one. It names a
//! replica, answers garbage, or hangs after the handshake. The crate must
//! connect past it to the real primary, never to the replica, and never
//! panic on what it hears.
#![cfg(feature = "redis")]

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::common::lock::held_locks;
use crate::common::sentinel::{read_command, SentinelSetup};
use stampede_guard::{Backend, Lock};

/// What the fake sentinel answers once the handshake (`HELLO`) is done.
#[derive(Clone, Copy)]
enum Fake {
    /// Names `127.0.0.1:port` as the primary (a stale or lying view).
    Names(u16),
    /// Answers every command, the handshake too, with bytes that are no RESP.
    Babble,
    /// Answers the handshake, then a reply of the wrong shape.
    WrongShape(&'static str),
    /// Answers the handshake, then nothing at all.
    Mute,
    /// Names itself as the primary, and answers `ROLE` with this reply.
    Role(&'static str),
}

fn serve(stream: TcpStream, fake: Fake) {
    let mut out = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    while let Some(args) = read_command(&mut reader) {
        let first = args.first().map(String::as_str).unwrap_or("");
        let reply: String = match (fake, first) {
            (Fake::Babble, _) => "\u{1}garbage\r\n%x\r\n".into(),
            (_, "HELLO") => "%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n".into(),
            (Fake::Mute, _) => continue,
            (_, "CLIENT") => "+OK\r\n".into(),
            (_, "PING") => "+PONG\r\n".into(),
            (_, "SUBSCRIBE") => ">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n".into(),
            (Fake::Names(port), "SENTINEL") => {
                let port = port.to_string();
                format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
            }
            (Fake::WrongShape(reply), "SENTINEL") => reply.into(),
            (Fake::Role(_), "SENTINEL") => {
                let port = reader.get_ref().local_addr().unwrap().port().to_string();
                format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
            }
            (Fake::Role(reply), "ROLE") => reply.into(),
            _ => "-ERR unknown command\r\n".into(),
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Starts a fake sentinel on a free loopback port; it lives as long as the
/// test process (its threads block on the listener).
fn fake_sentinel(fake: Fake) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream, fake));
        }
    });
    port
}

/// The setup's URL with `fakes` listed before its real sentinels.
fn url_with(setup: &SentinelSetup, fakes: &[u16]) -> String {
    let real = setup.url();
    let rest = real.strip_prefix("redis-sentinel://").unwrap();
    let fakes: Vec<String> = fakes.iter().map(|p| format!("127.0.0.1:{p},")).collect();
    format!("redis-sentinel://{}{rest}", fakes.concat())
}

/// Fail-fast: what these tests check is the start-up error (without the
/// opt-in, a backend whose sentinels cannot name a primary yet starts with
/// in-process protection and keeps asking).
async fn connect(url: &str) -> Result<Backend, stampede_guard::Error> {
    let connecting = Backend::redis_builder(url)
        .probe_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(2))
        .require_redis_at_start()
        .connect();
    tokio::time::timeout(Duration::from_secs(20), connecting)
        .await
        .expect("connecting does not hang")
}

/// The lock works, and its hold sits on the real primary.
async fn holds_on_primary(setup: &SentinelSetup, backend: Backend) {
    let lock = Lock::new(backend);
    let guard = lock.acquire("stock").await.expect("lock");
    assert_eq!(
        held_locks(&setup.primary),
        ":1",
        "the hold is on the primary"
    );
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_the_replica_is_passed_over_for_the_next() {
    let setup = SentinelSetup::start();
    // The first sentinel has a stale view: it names the replica.
    let liar = fake_sentinel(Fake::Names(setup.replica.port()));
    let backend = connect(&url_with(&setup, &[liar]))
        .await
        .expect("the next sentinel names the real primary");
    holds_on_primary(&setup, backend.clone()).await;
    // A second while the role checks run: the instance stays on the
    // primary (the liar does not pull it to the replica) and fails nothing.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    holds_on_primary(&setup, backend.clone()).await;
    assert_eq!(backend.stats().redis.unwrap().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_sentinels_is_an_error_never_a_panic() {
    let setup = SentinelSetup::start();
    let fakes = [
        fake_sentinel(Fake::Babble),
        fake_sentinel(Fake::Mute),
        fake_sentinel(Fake::WrongShape(":42\r\n")),
        fake_sentinel(Fake::WrongShape("*2\r\n$3\r\nfoo\r\n$3\r\nbar\r\n")),
        fake_sentinel(Fake::WrongShape(
            "*2\r\n$9\r\n127.0.0.1\r\n$6\r\n999999\r\n",
        )),
        fake_sentinel(Fake::WrongShape("*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n")),
        fake_sentinel(Fake::WrongShape("*2\r\n_\r\n_\r\n")),
        fake_sentinel(Fake::WrongShape("$-1\r\n")),
        fake_sentinel(Fake::Names(1)),
    ];
    // Each alone: an error at start-up, no panic, no hang.
    for (n, fake) in fakes.iter().enumerate() {
        let url = format!("redis-sentinel://127.0.0.1:{fake}/cache");
        assert!(
            connect(&url).await.is_err(),
            "fake {n} alone connects nothing"
        );
    }
    // All of them before the real sentinel: the real one is reached.
    let backend = connect(&url_with(&setup, &fakes))
        .await
        .expect("the real sentinel, past the fakes");
    holds_on_primary(&setup, backend.clone()).await;
    // The supervisor keeps asking (every second): nothing breaks meanwhile.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    holds_on_primary(&setup, backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stale_sentinel_does_not_keep_instances_on_the_old_primary() {
    // Three honest sentinels and, listed first, one whose view never moves
    // past the old primary (a sentinel cut off through the failover).
    let setup = SentinelSetup::start_with(3, &[]);
    let stale = fake_sentinel(Fake::Names(setup.primary.port()));
    let url = url_with(&setup, &[stale]);
    let a = Lock::new(connect(&url).await.expect("connects"));
    let b = Lock::new(connect(&url).await.expect("connects"));
    let mut newest = stampede_guard::FencingToken(0);
    for lock in [&a, &b] {
        let guard = lock.acquire("stock").await.expect("lock");
        newest = newest.max(guard.fencing_token());
        assert!(guard.release().await.unwrap());
    }
    crate::common::cluster::wait_replicated(&setup.primary, Duration::from_secs(10));

    // The honest sentinels move the primary; the old one keeps answering
    // and says it is a primary for seconds more.
    let service = crate::common::sentinel::SERVICE;
    assert_eq!(
        setup.sentinels[0].raw(&["SENTINEL", "FAILOVER", service]),
        "+OK\r\n"
    );
    setup.wait_for_promotion(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        setup
            .primary
            .raw(&["INFO", "replication"])
            .contains("role:master"),
        "the old primary still says it is one"
    );
    let before = setup.primary.evalsha_calls();
    for round in 0..6 {
        let (mine, other) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let guard = mine.acquire("stock").await.expect("lock after the switch");
        assert!(
            other.try_acquire("stock").await.unwrap().is_none(),
            "round {round}: both instances held the lock"
        );
        assert!(guard.fencing_token() > newest, "round {round}: tokens rise");
        newest = guard.fencing_token();
        assert!(guard.release().await.unwrap());
    }
    assert_eq!(
        setup.primary.evalsha_calls() - before,
        0,
        "scripts ran on the old primary after the switch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_answering_role_oddly_is_refused_without_a_panic() {
    let setup = SentinelSetup::start();
    let odd = [
        "*0\r\n",
        ":1\r\n",
        "+master\r\n",
        "$6\r\nmaster\r\n",
        "*1\r\n:7\r\n",
        "*1\r\n*1\r\n$6\r\nmaster\r\n",
        "_\r\n",
        "*3\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:1\r\n",
    ];
    let fakes: Vec<u16> = odd.iter().map(|r| fake_sentinel(Fake::Role(r))).collect();
    let refusing = fake_sentinel(Fake::Role("-ERR no\r\n"));
    for (n, fake) in fakes.iter().chain([&refusing]).enumerate() {
        let url = format!("redis-sentinel://127.0.0.1:{fake}/cache");
        assert!(connect(&url).await.is_err(), "odd ROLE {n} is no primary");
    }
    // Listed before the real sentinel (as many fakes as real ones would
    // tie; one fake each time): the real primary is found.
    for fake in fakes {
        let backend = connect(&url_with(&setup, &[fake]))
            .await
            .expect("the real sentinel, past a node with an odd ROLE");
        holds_on_primary(&setup, backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_sentinel_hung_an_instance_keeps_its_primary() {
    let setup = SentinelSetup::start();
    let backend = connect(&setup.url()).await.expect("connects");
    holds_on_primary(&setup, backend.clone()).await;

    // Every sentinel hangs: a new instance cannot start (and says so, in
    // bounded time); the running one keeps its primary through the role
    // checks, failing nothing.
    setup.sentinel().freeze();
    assert!(
        connect(&setup.url()).await.is_err(),
        "nobody names a primary"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    holds_on_primary(&setup, backend.clone()).await;
    assert_eq!(backend.stats().redis.unwrap().errors, 0);

    // The sentinel answers again: nothing to follow, nothing failed.
    setup.sentinel().thaw();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    holds_on_primary(&setup, backend.clone()).await;
    assert_eq!(backend.stats().redis.unwrap().errors, 0);
}
