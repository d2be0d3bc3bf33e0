//! Fleet-wide protection: K instances, each with its own L1 and its own Redis
//! connections, in front of one origin, against a real redis-server.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::fleet::{fleet_burst, wakeups, Instance};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, tally, Origin, ROOMY_DEADLINE};
use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Notify;

/// The Redis a test's fleet talks to: a plain server, or one that requires
/// TLS (a private CA) and an ACL user confined to the crate's keys, channel
/// and commands, as a managed service is set up. Every scenario below runs on
/// both. Admin commands of the tests themselves go to the plain port.
enum Deployment {
    Plain(RedisServer),
    #[cfg(all(feature = "redis-tls", feature = "serde"))]
    Tls(crate::common::tls::Certs, crate::common::tls::TlsRedis),
}

impl Deployment {
    fn plain() -> Self {
        Deployment::Plain(RedisServer::start())
    }

    #[cfg(all(feature = "redis-tls", feature = "serde"))]
    fn tls() -> Self {
        let certs = crate::common::tls::Certs::generate();
        let server = crate::common::tls::TlsRedis::start(&certs, false);
        Deployment::Tls(certs, server)
    }

    /// A backend whose deadline a loaded machine meets: no scenario here is
    /// about the deadline, and they count origin calls or Redis round trips
    /// exactly.
    async fn connect(&self) -> Backend {
        self.connect_with(ROOMY_DEADLINE).await
    }

    async fn connect_with(&self, deadline: Duration) -> Backend {
        match self {
            Deployment::Plain(server) => Backend::redis_builder(&server.url())
                .deadline(deadline)
                .connect()
                .await
                .expect("redis backend"),
            #[cfg(all(feature = "redis-tls", feature = "serde"))]
            Deployment::Tls(certs, server) => {
                let mut config = stampede_guard::RedisConfig::new(server.url("app-secret"));
                let mut tls = stampede_guard::TlsFiles::default();
                tls.ca_file = Some(certs.path("ca.crt"));
                config.tls = Some(tls);
                config.deadline = deadline;
                Backend::from_config(config).await.expect("TLS backend")
            }
        }
    }
}

impl std::ops::Deref for Deployment {
    type Target = RedisServer;

    fn deref(&self) -> &RedisServer {
        match self {
            Deployment::Plain(server) => server,
            #[cfg(all(feature = "redis-tls", feature = "serde"))]
            Deployment::Tls(_, tls) => &tls.server,
        }
    }
}

/// Runs a scenario on a plain Redis and on a TLS + ACL one.
macro_rules! on_every_deployment {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain() {
                super::$scenario(super::Deployment::plain()).await;
            }

            #[cfg(all(feature = "redis-tls", feature = "serde"))]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls() {
                super::$scenario(super::Deployment::tls()).await;
            }
        }
    )*};
}

async fn connect(redis: &Deployment) -> Backend {
    redis.connect().await
}

/// One instance of the service: its own backend (L1 + Redis connections).
async fn instance(
    redis: &Deployment,
    origin: &Origin,
    delay: Duration,
    configure: impl Fn(StampedeGuard) -> StampedeGuard,
) -> Instance {
    crate::common::fleet::instance(connect(redis).await, origin, delay, configure)
}

async fn fleet(
    redis: &Deployment,
    origin: &Origin,
    k: usize,
    delay: Duration,
    configure: impl Fn(StampedeGuard) -> StampedeGuard + Copy,
) -> Vec<Instance> {
    crate::common::fleet::fleet(k, origin, delay, || connect(redis), configure).await
}

async fn three_instances_call_the_origin_once_for_a_cold_key(redis: Deployment) {
    let origin = Origin::default();
    let instances = fleet(&redis, &origin, 3, Duration::from_millis(100), |g| g).await;
    let answers = fleet_burst(&instances, 1000, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1, "one origin call for the whole fleet");
    assert!(answers.iter().all(|a| a.status == 200 && a.text() == "v1"));
    assert_eq!(tally(&answers, "MISS"), 1);
}

async fn an_expired_key_is_rebuilt_once_for_the_fleet(redis: Deployment) {
    let origin = Origin::default();
    // A ttl well above what a burst takes on a loaded machine: the second
    // value must not expire (and be rebuilt, rightly) before it is counted.
    let instances = fleet(&redis, &origin, 3, Duration::from_millis(50), |g| {
        g.ttl(Duration::from_millis(1500))
    })
    .await;
    fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let answers = fleet_burst(&instances, 600, || get_req("/report")).await;
    assert_eq!(origin.calls(), 2, "one rebuild per expiry, fleet-wide");
    assert!(answers.iter().all(|a| a.text() == "v2"));
}

async fn stale_while_revalidate_refreshes_once_for_the_fleet(redis: Deployment) {
    let origin = Origin::default();
    let instances = fleet(&redis, &origin, 3, Duration::from_millis(200), |g| {
        g.ttl(Duration::from_millis(1500))
            .stale_while_revalidate(Duration::from_secs(30))
    })
    .await;
    fleet_burst(&instances, 30, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    // The refreshed value must stay fresh while the check below looks for
    // it, even on a loaded machine: a second expiry would rightly refresh
    // again.
    tokio::time::sleep(Duration::from_millis(1600)).await;

    let answers = fleet_burst(&instances, 600, || get_req("/report")).await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.text() == "v1" && a.x_cache() == "STALE"),
        "everyone is served the stale entry at once"
    );
    // Wait for the single refresh to land everywhere.
    for _ in 0..100 {
        let after = fleet_burst(&instances, 3, || get_req("/report")).await;
        if after.iter().all(|a| a.text() == "v2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.calls(), 2, "exactly one refresh for the fleet");
}

async fn waiters_in_other_instances_are_woken_by_the_publish(redis: Deployment) {
    let origin = Origin::default();
    // A lease far longer than the rebuild: only the publish can wake waiters
    // in time; a wake by lease expiry would show as a timeout.
    let instances = fleet(&redis, &origin, 3, Duration::from_millis(300), |g| {
        g.lease(Duration::from_secs(30))
    })
    .await;
    let answers = fleet_burst(&instances, 90, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    assert!(answers.iter().all(|a| a.text() == "v1"));
    // Everyone arrived before the value landed: one rebuilt it, the rest
    // (in every instance) waited for it, and say so.
    assert_eq!(tally(&answers, "MISS"), 1);
    assert_eq!(
        tally(&answers, "COALESCED"),
        89,
        "{:?}",
        answers.iter().map(|a| a.x_cache()).collect::<Vec<_>>()
    );
    let (by_message, by_timeout) = wakeups(&instances);
    assert_eq!(by_timeout, 0, "no waiter slept out a timer");
    assert!(
        by_message >= 1,
        "the other instances were woken by the commit's publish"
    );
}

async fn a_rebuild_longer_than_its_lease_keeps_the_lease(redis: Deployment) {
    let origin = Origin::default();
    // The rebuild outlives five lease periods; the watchdog must renew it.
    // A lease's validity is counted from a deadline before it was granted,
    // so the deadline stays well under the 200 ms lease (the default 50 ms).
    let connect = || redis.connect_with(Duration::from_millis(50));
    let instances =
        crate::common::fleet::fleet(3, &origin, Duration::from_millis(1000), connect, |g| {
            g.lease(Duration::from_millis(200))
        })
        .await;
    let answers = fleet_burst(&instances, 300, || get_req("/report")).await;
    assert_eq!(
        origin.calls(),
        1,
        "nobody else rebuilt while the lease was renewed"
    );
    assert!(answers.iter().all(|a| a.text() == "v1"));
}

async fn a_stalled_holders_late_commit_is_fenced_off(redis: Deployment) {
    let origin = Origin::default();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let make = |origin: &Origin| {
        let origin = origin.clone();
        let entered = entered.clone();
        let release = release.clone();
        move || {
            let origin = origin.clone();
            let entered = entered.clone();
            let release = release.clone();
            async move {
                let (n, _running) = origin.enter();
                if n == 1 {
                    entered.notify_one();
                    release.notified().await;
                }
                format!("v{n}")
            }
        }
    };
    let a_backend = redis.connect().await;
    let b_backend = redis.connect().await;
    let guard_a = StampedeGuard::new(a_backend.clone()).ttl(Duration::from_secs(60));
    let guard_b = StampedeGuard::new(b_backend.clone()).ttl(Duration::from_secs(60));
    let app_a = Router::new().route("/report", get(make(&origin)).layer(guard_a.clone()));
    let app_b = Router::new().route("/report", get(make(&origin)).layer(guard_b));

    let slow = {
        let app_a = app_a.clone();
        tokio::spawn(async move { send(&app_a, get_req("/report")).await })
    };
    entered.notified().await;
    // A stalls; its lease is lost (as after a long pause or a partition).
    let key = guard_a.key_for(&get_req("/report")).unwrap();
    assert_eq!(redis.raw(&["DEL", &format!("sg:{{{key}}}:l")]), ":1");

    let b = send(&app_b, get_req("/report")).await;
    assert_eq!(b.text(), "v2", "B took the free lease and rebuilt");
    release.notify_one();
    let a = slow.await.unwrap();
    assert_eq!(a.text(), "v1", "A's own client still gets A's answer");

    let stats = a_backend.stats().redis.unwrap();
    assert_eq!(stats.fenced_writes, 1, "A's late commit was refused");
    // A fresh instance sees B's value.
    let c = instance(&redis, &origin, Duration::ZERO, |g| {
        g.ttl(Duration::from_secs(60))
    })
    .await;
    let answer = send(&c.app, get_req("/report")).await;
    assert_eq!((answer.text().as_str(), answer.x_cache()), ("v2", "HIT"));
    assert_eq!(origin.calls(), 2);
}

async fn redis_round_trips_per_request_by_path(redis: Deployment) {
    let origin = Origin::default();
    let a = instance(&redis, &origin, Duration::from_millis(200), |g| g).await;
    let b = instance(&redis, &origin, Duration::from_millis(200), |g| g).await;
    let scripts = |redis: &RedisServer| redis.command_calls().get("evalsha").copied().unwrap_or(0);

    // Miss that wins the lease: fetch-or-lease, then commit.
    redis.reset_stats();
    send(&a.app, get_req("/report?miss")).await;
    assert_eq!(scripts(&redis), 2, "miss with lease = 2 round trips");

    // L1 miss, L2 hit (another instance built it): one round trip.
    redis.reset_stats();
    let hit = send(&b.app, get_req("/report?miss")).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_eq!(scripts(&redis), 1, "hit = 1 round trip");

    // L1 hit: none.
    redis.reset_stats();
    send(&b.app, get_req("/report?miss")).await;
    assert_eq!(scripts(&redis), 0, "an L1 hit costs no I/O");

    // Waiter: fetch (lease held), woken by the publish, which carries the
    // (small) entry: no second fetch. (Larger entries: tests/fleet/carried.rs.)
    let leader = {
        let app = a.app.clone();
        tokio::spawn(async move { send(&app, get_req("/report?wait")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.reset_stats();
    let waited = send(&b.app, get_req("/report?wait")).await;
    leader.await.unwrap();
    assert_eq!(waited.text(), "v2");
    let total = scripts(&redis);
    // The leader's commit is one of them.
    assert_eq!(total - 1, 1, "waiter = 1 round trip");
    assert_eq!(b.backend.stats().redis.unwrap().wakeups_with_entry, 1);
    assert_eq!(origin.calls(), 2);
}

async fn invalidation_reaches_redis_and_every_instance(redis: Deployment) {
    let origin = Origin::default();
    let instances = fleet(&redis, &origin, 3, Duration::ZERO, |g| {
        g.ttl(Duration::from_secs(60))
    })
    .await;
    fleet_burst(&instances, 30, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1);
    instances[0]
        .guard
        .invalidate(&get_req("/report"))
        .await
        .expect("the invalidation reached Redis");
    // Let the message reach the other instances' subscribers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in &instances[1..] {
        let answer = send(&i.app, get_req("/report")).await;
        assert_eq!(answer.text(), "v2", "the old entry is gone from every L1");
    }
    assert_eq!(origin.calls(), 2);
}

async fn corrupt_entries_are_misses_not_panics(redis: Deployment) {
    let origin = Origin::default();
    let a = instance(&redis, &origin, Duration::ZERO, |g| {
        g.ttl(Duration::from_secs(60))
    })
    .await;
    let key = a.guard.key_for(&get_req("/report")).unwrap();
    // Foreign bytes at our keys, marked fresh.
    redis.raw(&["SET", &format!("sg:{{{key}}}:v"), "not an entry"]);
    redis.raw(&["SET", &format!("sg:{{{key}}}:f"), "1", "PX", "60000"]);
    let answer = send(&a.app, get_req("/report")).await;
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (http::StatusCode::OK, "v1")
    );
    assert_eq!(a.backend.stats().redis.unwrap().corrupt_entries, 1);
    // The rebuild replaced the garbage.
    let b = instance(&redis, &origin, Duration::ZERO, |g| g).await;
    assert_eq!(send(&b.app, get_req("/report")).await.text(), "v1");
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn wrong_credentials_fail_at_start_up_with_a_clear_error() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let url = format!("redis://:wrong@127.0.0.1:{}/", redis.port());
    let error = Backend::redis(&url).await.expect_err("must not connect");
    let message = error.to_string();
    assert!(message.contains("could not set up Redis"), "{message}");
    assert!(
        !message.contains("wrong"),
        "the password is not echoed: {message}"
    );
    let ok = Backend::redis(&format!("redis://:right@127.0.0.1:{}/", redis.port())).await;
    assert!(ok.is_ok());
}

async fn early_refresh_rebuilds_a_hot_key_before_it_expires(redis: Deployment) {
    let origin = Origin::default();
    // beta = 1 with a 50 ms rebuild: a request in the last ~100 ms of the
    // entry's life refreshes it with a good chance, and hundreds come by.
    let instances = fleet(&redis, &origin, 3, Duration::from_millis(50), |g| {
        g.ttl(Duration::from_millis(400)).early_refresh(1.0)
    })
    .await;
    fleet_burst(&instances, 30, || get_req("/report")).await;
    let started = std::time::Instant::now();
    let mut answers = Vec::new();
    // Steady traffic: a hot key is one that is asked for all the time.
    for _ in 0..100 {
        answers.extend(fleet_burst(&instances, 30, || get_req("/report")).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(origin.calls() >= 2, "the key was refreshed");
    assert_eq!(origin.peak(), 1, "never two refreshes at once in the fleet");
    // No request ran the origin in the foreground: every rebuild after the
    // first fill was a background refresh, started before the key expired.
    // (A request may still coalesce on its instance's one-round-trip read of
    // the new entry from Redis; it never waits for the origin.)
    assert_eq!(tally(&answers, "MISS"), 0);
    assert!(answers.iter().all(|a| a.status == 200));
    // About one refresh per ttl window for the fleet, not one per instance
    // (K = 3) or per request.
    let windows = started.elapsed().as_secs_f64() / 0.4;
    assert!(
        (origin.calls() as f64) <= 2.0 + 2.0 * windows,
        "calls {} in {windows:.1} windows",
        origin.calls()
    );
}

async fn the_generic_cache_shares_values_across_the_fleet(redis: Deployment) {
    use stampede_guard::Cache;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut caches = Vec::new();
    for _ in 0..3 {
        let backend = redis.connect().await;
        caches.push(Cache::<String>::new(backend).ttl(Duration::from_secs(60)));
    }
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let cache = caches[i % 3].clone();
            let calls = calls.clone();
            tokio::spawn(async move {
                cache
                    .get_or_rebuild("user:42", move || async move {
                        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>("Ada".to_string())
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "Ada");
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    caches[0]
        .invalidate("user:42")
        .await
        .expect("the invalidation reached Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        caches[2].get("user:42"),
        None,
        "invalidation reached every instance"
    );
}

async fn a_cold_instance_serves_the_fleets_stale_entry_at_once_during_a_refresh(redis: Deployment) {
    let origin = Origin::default();
    let configure = |g: StampedeGuard| {
        g.ttl(Duration::from_millis(300))
            .stale_while_revalidate(Duration::from_secs(30))
    };
    let a = instance(&redis, &origin, Duration::from_millis(300), configure).await;
    send(&a.app, get_req("/report")).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A serves stale and starts the fleet's one refresh (300 ms).
    assert_eq!(send(&a.app, get_req("/report")).await.x_cache(), "STALE");

    // B has never seen the key: it finds the stale entry in Redis, with the
    // lease held, and serves it at once to all its requests.
    let b = instance(&redis, &origin, Duration::from_millis(300), configure).await;
    let answers = fleet_burst(std::slice::from_ref(&b), 100, || get_req("/report")).await;
    assert!(
        answers
            .iter()
            .all(|x| x.text() == "v1" && x.x_cache() == "STALE"),
        "{:?}",
        answers.iter().map(|x| x.x_cache()).collect::<Vec<_>>()
    );
    for _ in 0..100 {
        if send(&b.app, get_req("/report")).await.text() == "v2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(send(&b.app, get_req("/report")).await.text(), "v2");
    assert_eq!(origin.calls(), 2, "one refresh for both instances");
}

on_every_deployment!(
    three_instances_call_the_origin_once_for_a_cold_key,
    an_expired_key_is_rebuilt_once_for_the_fleet,
    stale_while_revalidate_refreshes_once_for_the_fleet,
    waiters_in_other_instances_are_woken_by_the_publish,
    a_rebuild_longer_than_its_lease_keeps_the_lease,
    a_stalled_holders_late_commit_is_fenced_off,
    redis_round_trips_per_request_by_path,
    invalidation_reaches_redis_and_every_instance,
    corrupt_entries_are_misses_not_panics,
    early_refresh_rebuilds_a_hot_key_before_it_expires,
    a_cold_instance_serves_the_fleets_stale_entry_at_once_during_a_refresh,
    the_generic_cache_shares_values_across_the_fleet,
);
