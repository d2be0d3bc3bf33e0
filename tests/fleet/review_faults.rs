//! Faults at the worst moments for the start without Redis, the outage
//! grace and the shutdown: a real redis-server killed, frozen or restarted,
//! an instance's link frozen through a proxy. Each test counts what the
//! fleet's promises bound (stale answers after a purge that returned `Ok`,
//! origin calls, leases and locks left held, members left behind).
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::{
    answers_carrying, backend_at, backend_with_grace, instance, keys_like, members, purged,
    settled, wait_for_status, Instance,
};
use crate::common::logs::Logs;
use crate::common::monitor::until;
use crate::common::proxy::Proxy;
use crate::common::redis::RedisServer;
use crate::common::{get, send, Origin, ROOMY_DEADLINE};
use stampede_guard::{Backend, StampedeGuard, Status};

/// Far more than any wait below needs: only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(30);

fn ttl(guard: StampedeGuard) -> StampedeGuard {
    guard.ttl(Duration::from_secs(60))
}

/// A backend that starts even when its Redis does not answer (a 500 ms
/// connect timeout), tries again every 100 ms, and keeps serving its
/// in-process tier for `grace` once it cannot hear the fleet.
async fn starting(url: &str, grace: Duration) -> Backend {
    Backend::redis_builder(url)
        .deadline(ROOMY_DEADLINE)
        .connect_timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .outage_grace(grace)
        .connect()
        .await
        .expect("starts with or without redis")
}

/// [`starting`] under the strict barrier (no outage grace).
async fn strict(url: &str) -> Backend {
    starting(url, Duration::ZERO).await
}

/// B cannot reach Redis when it starts (its link frozen) while A can. B
/// builds an entry on its own; A purges it, and the purge returns `Ok`:
/// under the strict barrier no instance may then answer what was built
/// before it. B is no member of the fleet, so the purge does not wait for
/// it: with no outage grace, B answers nothing from its in-process tier
/// while it is outside the fleet (as in an outage past its lease); it
/// only coalesces its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_still_local_does_not_serve_an_entry_purged_elsewhere() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let proxy = Proxy::start(redis.port()).await;
    proxy.freeze();
    let b = instance(strict(&proxy.url()).await, &origin, Duration::ZERO, ttl);
    assert_eq!(b.backend.health().status, Status::Degraded, "B is local");
    wait_for_status(&[&a], Status::Fleet).await;

    let held = send(&b.app, get("/report")).await.text();
    for _ in 0..5 {
        let answer = send(&b.app, get("/report")).await;
        assert_ne!(
            answer.x_cache(),
            "HIT",
            "no answer from the in-process tier"
        );
    }
    purged(&a, "/report").await;
    let stale = answers_carrying(&b, "/report", &held, 10).await;
    assert_eq!(
        stale, 0,
        "answers of an entry built before a purge that returned Ok"
    );
}

/// The same with an outage grace: B, outside the fleet, serves what it
/// built from its in-process tier, for the grace at most. A's purge
/// returns `Ok` at once (B is no member); B stops answering the purged
/// entry once the grace ran out, while still local (the limit of the poll
/// is a hang detector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_still_local_serves_what_it_built_for_the_grace_at_most() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let proxy = Proxy::start(redis.port()).await;
    proxy.freeze();
    let b = starting(&proxy.url(), Duration::from_secs(1)).await;
    let b = instance(b, &origin, Duration::ZERO, ttl);
    assert_eq!(b.backend.health().status, Status::Degraded, "B is local");
    wait_for_status(&[&a], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    purged(&a, "/report").await;
    let until_limit = std::time::Instant::now() + LIMIT;
    while send(&b.app, get("/report")).await.text() == held {
        assert!(
            std::time::Instant::now() < until_limit,
            "B served the purged entry past the grace while local"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b.backend.health().status, Status::Degraded, "still local");
    proxy.thaw();
}

/// The same, checked once B joined: what it built while local (with a
/// grace, so that it serves it) goes when it joins, so the purge it missed
/// is not served past the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_joins_late_does_not_serve_what_it_built_before_a_purge() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let proxy = Proxy::start(redis.port()).await;
    proxy.freeze();
    let b = instance(graced(&proxy.url()).await, &origin, Duration::ZERO, ttl);
    assert_eq!(b.backend.health().status, Status::Degraded, "B is local");
    let held = settled(&b, "/report").await;
    purged(&a, "/report").await;
    proxy.thaw();
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let stale = answers_carrying(&b, "/report", &held, 10).await;
    assert_eq!(stale, 0, "nothing built before the purge after the join");
}

/// A backend that shut down left the membership: purges no longer wait for
/// it. It keeps answering (as an embedded backend) from an in-process tier
/// filled while it was a member, and hears no purge any more: an entry
/// purged after it left is answered as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_backend_does_not_serve_an_entry_purged_after_it_left() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    until("both are members", || members(&redis).len() == 2).await;
    let held = settled(&a, "/report").await;
    assert_eq!(
        held,
        settled(&b, "/report").await,
        "one value for the fleet"
    );

    a.backend.shutdown(Duration::from_millis(100)).await;
    until("A left", || members(&redis).len() == 1).await;
    purged(&b, "/report").await;
    let stale = answers_carrying(&a, "/report", &held, 10).await;
    assert_eq!(
        stale, 0,
        "answers of an entry built before a purge that returned Ok"
    );
}

/// The same with a 1 s outage grace: once shut down, A serves what it
/// held for the grace at most, then drops it: it stops answering the entry
/// purged after it left (the limit of the poll is a hang detector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_backend_serves_what_it_held_for_the_grace_at_most() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let graced = backend_with_grace(&redis.url(), ROOMY_DEADLINE, Duration::from_secs(1)).await;
    let a = instance(graced, &origin, Duration::ZERO, ttl);
    let b = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    until("both are members", || members(&redis).len() == 2).await;
    let held = settled(&a, "/report").await;

    a.backend.shutdown(Duration::from_millis(100)).await;
    until("A left", || members(&redis).len() == 1).await;
    purged(&b, "/report").await;
    let until_limit = std::time::Instant::now() + LIMIT;
    while send(&a.app, get("/report")).await.text() == held {
        assert!(
            std::time::Instant::now() < until_limit,
            "A served the purged entry past the grace after its shutdown"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis frozen (SIGSTOP) while many rebuild leases and a few locks are
/// held: a shutdown with a 100 ms deadline cannot hand anything back, and
/// must still return within its deadline plus a bound that does not grow
/// with the number of holds (the connect timeout for the hand-back, again
/// for the supervisor): 40 leases, each of whose releases would wait out a
/// whole 1 s call deadline, and three locks. The limit below is a hang
/// detector, six times what a bounded hand-back needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_redis_frozen_returns_whatever_the_number_of_holds() {
    use stampede_guard::Lock;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(
        backend_at(&redis.url(), ROOMY_DEADLINE).await,
        &origin,
        Duration::from_secs(600),
        |g| {
            g.ttl(Duration::from_secs(60))
                .lease(Duration::from_secs(60))
        },
    );
    const KEYS: usize = 40;
    let requests: Vec<_> = (0..KEYS)
        .map(|k| {
            let app = a.app.clone();
            tokio::spawn(async move { send(&app, get(&format!("/report/{k}"))).await })
        })
        .collect();
    until("every rebuild runs", || origin.calls() == KEYS).await;
    until("every lease is taken", || {
        keys_like(&redis, "sg:*:l").len() == KEYS
    })
    .await;
    let lock = Lock::new(a.backend.clone()).lease(Duration::from_secs(60));
    let mut guards = Vec::new();
    for k in 0..3 {
        guards.push(lock.acquire(&format!("job{k}")).await.expect("a lock"));
    }

    redis.freeze();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        a.backend.shutdown(Duration::from_millis(100)),
    )
    .await;
    redis.thaw();
    for r in requests {
        r.abort();
    }
    let report = report.expect("the shutdown returned");
    assert_eq!(report.unfinished_rebuilds, KEYS as u64);
    assert_eq!(
        report.leases_handed_back + report.locks_handed_back + report.not_handed_back,
        (KEYS + 3) as u64,
        "every hold accounted for"
    );
    assert!(guards.iter().all(|g| g.is_lost()), "every lock told");
}

/// Started without Redis; Redis comes up and the backend joins in the
/// background; a shutdown lands at some moment of that join. Whatever the
/// moment, once the shutdown has returned the backend must end with no
/// membership and no connection to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_racing_the_join_leaves_no_member_and_no_connection() {
    let mut leaked = Vec::new();
    for round in 0..12u64 {
        let mut redis = RedisServer::start();
        redis.kill();
        let backend = strict(&redis.url()).await;
        assert_eq!(backend.health().status, Status::Degraded);
        redis.restart();
        // Somewhere between "not yet tried" and "joined".
        tokio::time::sleep(Duration::from_millis(20 * round)).await;
        let joined_before = backend.health().status == Status::Fleet;
        tokio::time::timeout(LIMIT, backend.shutdown(Duration::from_millis(100)))
            .await
            .expect("the shutdown returned");
        // Longer than the join's pause and a keepalive: a leaked tier would
        // have connected and registered by then.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let (m, c) = (members(&redis).len(), redis.client_ids().len());
        if m != 0 || c != 0 || backend.health().status != Status::Local {
            leaked.push((round, joined_before, m, c, backend.health().status));
        }
    }
    assert!(
        leaked.is_empty(),
        "(round, joined, members, clients, status): {leaked:?}"
    );
}

/// A backend with an outage grace far longer than the test.
async fn graced(url: &str) -> Backend {
    backend_with_grace(url, Duration::from_millis(500), Duration::from_secs(600)).await
}

/// Redis flaps: killed and restarted empty, again and again, under load,
/// each time long enough for both instances to notice and to rejoin. The
/// issue's bound for an outage is at most one origin call per key per
/// instance per TTL (60 s here, far longer than the test): every warm key
/// is requested through all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_redis_costs_at_most_one_call_per_key_per_instance_per_ttl() {
    const KEYS: usize = 5;
    const FLAPS: usize = 6;
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(graced(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(graced(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let both = [&a, &b];
    wait_for_status(&both, Status::Fleet).await;
    let load = || async {
        for k in 0..KEYS {
            for i in &both {
                let answer = send(&i.app, get(&format!("/report?k={k}"))).await;
                assert_eq!(answer.status, 200);
            }
        }
    };
    for k in 0..KEYS {
        settled(&a, &format!("/report?k={k}")).await;
        settled(&b, &format!("/report?k={k}")).await;
    }
    let warm = origin.calls();
    assert!(warm <= KEYS * 2);
    for _ in 0..FLAPS {
        redis.kill();
        let until = std::time::Instant::now() + LIMIT;
        while !both
            .iter()
            .all(|i| i.backend.health().status == Status::Degraded)
        {
            assert!(std::time::Instant::now() < until, "the outage was noticed");
            load().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        redis.restart();
        let until = std::time::Instant::now() + LIMIT;
        while !both
            .iter()
            .all(|i| i.backend.health().status == Status::Fleet)
        {
            assert!(std::time::Instant::now() < until, "the rejoin");
            load().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        load().await;
    }
    let during = origin.calls() - warm;
    assert!(
        during <= KEYS * 2,
        "{during} origin calls for {KEYS} warm keys on 2 instances over {FLAPS} flaps"
    );
}

/// Redis restarted empty under two instances with a long grace: once
/// they rejoined, each keeps answering what it held (Redis lost its data,
/// and with it any purge made before the loss), with no origin call; a
/// purge made after the rejoin, of a key or of a tag, reaches the copy
/// kept on the other instance before it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_empty_restart_held_entries_are_kept_and_a_later_purge_reaches_them() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let tagged = |guard: StampedeGuard| {
        ttl(guard).tags(|req: &http::request::Parts| vec![req.uri.path().to_owned()])
    };
    let a = instance(graced(&redis.url()).await, &origin, Duration::ZERO, tagged);
    let b = instance(graced(&redis.url()).await, &origin, Duration::ZERO, tagged);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let by_key = settled(&b, "/report/1").await;
    let by_tag = settled(&b, "/report/2").await;
    assert_eq!(
        by_key,
        settled(&a, "/report/1").await,
        "one value for the fleet"
    );
    settled(&a, "/report/2").await;
    let warm = origin.calls();

    redis.kill();
    wait_for_status(&[&a, &b], Status::Degraded).await;
    redis.restart();
    wait_for_status(&[&a, &b], Status::Fleet).await;
    for (uri, held) in [("/report/1", &by_key), ("/report/2", &by_tag)] {
        let answer = send(&b.app, get(uri)).await;
        assert_eq!(
            (answer.x_cache(), &answer.text()),
            ("HIT", held),
            "{uri} kept"
        );
    }
    assert_eq!(origin.calls(), warm, "no origin call for what was held");

    purged(&a, "/report/1").await;
    assert_ne!(
        send(&b.app, get("/report/1")).await.text(),
        by_key,
        "a key purged after the rejoin"
    );
    tokio::time::timeout(LIMIT, a.guard.invalidate_tag("/report/2"))
        .await
        .expect("no hang")
        .expect("the purge returned Ok");
    assert_ne!(
        send(&b.app, get("/report/2")).await.text(),
        by_tag,
        "a tag purged after the rejoin"
    );
}

/// B is cut off (its link frozen) while A purges a key B holds, and Redis
/// then restarts empty: the purge is lost with Redis's data, and when B's
/// link is back nothing in Redis says what it missed. With a short grace B
/// still stops answering the purged copy once the grace ran out, and never
/// answers it again (the limit of the poll is a hang detector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_lost_with_redis_s_data_is_not_served_past_the_grace() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let proxy = Proxy::start(redis.port()).await;
    let short = |url: String| async move {
        backend_with_grace(&url, Duration::from_millis(200), Duration::from_secs(1)).await
    };
    let a = instance(short(redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(short(proxy.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    proxy.freeze();
    purged(&a, "/report").await;
    redis.kill();
    redis.restart();
    wait_for_status(&[&a], Status::Fleet).await;
    proxy.thaw();
    let until_limit = std::time::Instant::now() + LIMIT;
    while send(&b.app, get("/report")).await.text() == held {
        assert!(
            std::time::Instant::now() < until_limit,
            "B served the purged entry past any grace"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_status(&[&b], Status::Fleet).await;
    for _ in 0..20 {
        assert_ne!(
            send(&b.app, get("/report")).await.text(),
            held,
            "never again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rebuilds a key for 600 s; B and C each have requests waiting for it.
/// A and B shut down at once (100 ms deadline): A hands its lease back. C
/// takes it over: one origin call for the fleet, every waiter on C
/// answered. B's waiters are answered too; B's connections close at the
/// end of its shutdown, whatever its waiters wait for, so they are served
/// as on the embedded backend: at most one call on B, coalesced in-process
/// (the documented cost of requests still waiting when `shutdown` is
/// called).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_shutting_down_mid_rebuild_leave_the_third_one_rebuild() {
    use crate::common::monitor::Monitor;
    let redis = RedisServer::start();
    let monitor = Monitor::start(&redis);
    let (oa, ob, oc) = (Origin::default(), Origin::default(), Origin::default());
    let configure = |g: StampedeGuard| {
        g.ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(60))
            .wait_budget(Duration::from_secs(30))
    };
    let url = redis.url();
    let connect = || backend_at(&url, ROOMY_DEADLINE);
    let a = instance(connect().await, &oa, Duration::from_secs(600), configure);
    let b = instance(connect().await, &ob, Duration::from_millis(200), configure);
    let c = instance(connect().await, &oc, Duration::from_millis(200), configure);
    until("three members", || members(&redis).len() == 3).await;
    let app = a.app.clone();
    let a_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
    until("A's handler runs", || oa.calls() == 1).await;
    until("A holds the lease", || {
        keys_like(&redis, "sg:*:l").len() == 1
    })
    .await;
    let waiters = |i: &Instance| -> Vec<_> {
        (0..10)
            .map(|_| {
                let app = i.app.clone();
                tokio::spawn(async move { send(&app, get("/report/hot")).await })
            })
            .collect()
    };
    monitor.settle(&redis).await;
    let mark = monitor.len();
    let on_b = waiters(&b);
    let on_c = waiters(&c);
    // B and C each asked Redis once (their requests coalesce in-process)
    // and found the lease held.
    monitor.await_fetches(mark, 2).await;
    assert_eq!(ob.calls() + oc.calls(), 0, "everyone waits for A");

    let (ra, rb) = tokio::join!(
        tokio::time::timeout(LIMIT, a.backend.shutdown(Duration::from_millis(100))),
        tokio::time::timeout(LIMIT, b.backend.shutdown(Duration::from_millis(100))),
    );
    let (ra, _rb) = (ra.expect("A returned"), rb.expect("B returned"));
    assert_eq!(ra.leases_handed_back, 1);
    let mut ok = 0;
    for t in on_b.into_iter().chain(on_c) {
        let answer = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("answered")
            .expect("task");
        if answer.status == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 20, "every waiter answered");
    assert_eq!(
        oc.calls(),
        1,
        "one rebuild for the fleet after A's hand-back"
    );
    assert!(
        ob.calls() <= 1,
        "B's waiters coalesce in-process once B works embedded: {}",
        ob.calls()
    );
    a_request.abort();
}

/// C's purge waits for the acknowledgement of every member; A, whose
/// replies are held (it cannot hear the message), shuts down and leaves the
/// membership while C waits. C must not wait out the lease for a member
/// that left: the purge is confirmed, not counted unconfirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_does_not_wait_for_a_member_that_left_while_it_waited() {
    use crate::common::monitor::Monitor;
    let redis = RedisServer::start();
    let monitor = Monitor::start(&redis);
    let origin = Origin::default();
    let proxy = Proxy::start(redis.port()).await;
    let a = instance(strict(&proxy.url()).await, &origin, Duration::ZERO, ttl);
    let c = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &c], Status::Fleet).await;
    until("both are members", || members(&redis).len() == 2).await;
    settled(&c, "/report").await;

    monitor.settle(&redis).await;
    let mark = monitor.len();
    proxy.freeze_replies();
    let purger = {
        let guard = c.guard.clone();
        let request = http::Request::get("/report").body(()).expect("a request");
        tokio::spawn(async move { guard.invalidate(&request).await })
    };
    // C read the membership (A still in it) after its purge was published.
    until("C reads the membership", || {
        let cmds = monitor.commands(mark);
        let published = cmds.iter().position(|c| {
            c.first().is_some_and(|n| {
                n.eq_ignore_ascii_case("evalsha") || n.eq_ignore_ascii_case("eval")
            }) && c.iter().any(|a| a.ends_with(":g"))
        });
        published.is_some_and(|p| {
            cmds[p..].iter().any(|c| {
                c.iter().any(|a| a == "sg:members") && !c.iter().any(|a| a.contains("ack"))
            })
        })
    })
    .await;
    tokio::time::timeout(LIMIT, a.backend.shutdown(Duration::from_millis(100)))
        .await
        .expect("A's shutdown returned");
    until("A left", || members(&redis).len() == 1).await;
    tokio::time::timeout(LIMIT, purger)
        .await
        .expect("no hang")
        .expect("task")
        .expect("the purge returned Ok");
    proxy.thaw();
    let unconfirmed = c
        .backend
        .stats()
        .redis
        .expect("redis stats")
        .unconfirmed_invalidations;
    assert_eq!(
        unconfirmed, 0,
        "the purge waited for a member that had left"
    );
}

/// A's rebuild ends right around its shutdown's deadline, so its commit
/// and the hand-back of its lease race; B, waiting, takes over when the
/// lease comes back and rebuilds. Whatever the order, a value older than
/// the one B committed never ends up in Redis: a fresh instance reads the
/// newest value built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_racing_its_hand_back_never_overwrites_a_newer_value() {
    let mut older_won = Vec::new();
    for round in 0..6u64 {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let configure = |g: StampedeGuard| {
            g.ttl(Duration::from_secs(60))
                .lease(Duration::from_secs(60))
                .wait_budget(Duration::from_secs(30))
        };
        let url = redis.url();
        let a = instance(
            backend_at(&url, ROOMY_DEADLINE).await,
            &origin,
            Duration::from_millis(300),
            configure,
        );
        let b = instance(
            backend_at(&url, ROOMY_DEADLINE).await,
            &origin,
            Duration::from_millis(50),
            configure,
        );
        let app = a.app.clone();
        let a_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
        until("A's handler runs", || origin.calls() == 1).await;
        let app = b.app.clone();
        let b_request = tokio::spawn(async move { send(&app, get("/report/hot")).await });
        // Deadlines from well before to just past the end of A's handler.
        let deadline = Duration::from_millis(200 + 30 * round);
        let report = tokio::time::timeout(LIMIT, a.backend.shutdown(deadline))
            .await
            .expect("A's shutdown returned");
        let b_answer = tokio::time::timeout(LIMIT, b_request)
            .await
            .expect("B answered")
            .expect("task");
        let _ = tokio::time::timeout(LIMIT, a_request).await;
        let d = instance(
            backend_at(&url, ROOMY_DEADLINE).await,
            &origin,
            Duration::ZERO,
            configure,
        );
        let calls = origin.calls();
        let read = send(&d.app, get("/report/hot")).await;
        let newest = format!("v{}", calls);
        if origin.calls() == calls && read.text() != newest {
            older_won.push((round, report, b_answer.text(), read.text(), newest));
        }
    }
    assert!(older_won.is_empty(), "{older_won:?}");
}

/// A waits in the queue of a lock B holds, and shuts down meanwhile; B then
/// releases. C must get the lock, and A's wait must not end with a guard
/// that believes it holds the lock too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waited_for_during_shutdown_is_never_held_twice() {
    use stampede_guard::Lock;
    let redis = RedisServer::start();
    let url = redis.url();
    let (a, b, c) = (
        backend_at(&url, ROOMY_DEADLINE).await,
        backend_at(&url, ROOMY_DEADLINE).await,
        backend_at(&url, ROOMY_DEADLINE).await,
    );
    let lock = |backend: &Backend| Lock::new(backend.clone()).lease(Duration::from_secs(60));
    let held_by_b = lock(&b).acquire("job").await.expect("B takes the lock");
    let a_wait = {
        let lock = lock(&a);
        tokio::spawn(async move { lock.acquire("job").await })
    };
    until("A waits in the queue", || {
        !keys_like(&redis, "sg:lock:*:q").is_empty()
    })
    .await;
    let report = tokio::time::timeout(LIMIT, a.shutdown(Duration::from_millis(100)))
        .await
        .expect("A's shutdown returned");
    held_by_b.release().await.expect("B releases");
    let c_lock = lock(&c);
    let mut c_guard = None;
    let until_limit = std::time::Instant::now() + LIMIT;
    while c_guard.is_none() && std::time::Instant::now() < until_limit {
        c_guard = c_lock.try_acquire("job").await.expect("C asks");
        if c_guard.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let a_result = tokio::time::timeout(LIMIT, a_wait).await;
    let a_holds = matches!(&a_result, Ok(Ok(Ok(g))) if !g.is_lost());
    assert!(
        c_guard.is_some() && !a_holds,
        "C holds: {}, A holds: {a_holds}, report {report:?}",
        c_guard.is_some()
    );
}

/// Redis is killed, the backend shuts down during the outage, Redis comes
/// back: the shut-down backend must not reconnect or rejoin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_shut_down_during_an_outage_does_not_rejoin() {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a], Status::Fleet).await;
    settled(&a, "/report").await;
    redis.kill();
    wait_for_status(&[&a], Status::Degraded).await;
    tokio::time::timeout(LIMIT, a.backend.shutdown(Duration::from_millis(100)))
        .await
        .expect("the shutdown returned");
    redis.restart();
    // Longer than a probe interval and a keepalive: a reconnect would show.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(members(&redis).len(), 0);
    assert!(redis.client_ids().is_empty(), "no connection from A");
    assert_eq!(a.backend.health().status, Status::Local);
}

/// Started without Redis; Redis comes up and is killed again at moments
/// through the background join, several times, then stays up. The backend
/// joins in the end, and once joined it hears the fleet's purges: it does
/// not answer an entry another instance purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_dies_while_the_backend_joins_is_joined_once_it_stays_up() {
    let mut redis = RedisServer::start();
    redis.kill();
    let origin = Origin::default();
    let b = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    for round in 0..8u64 {
        redis.restart();
        tokio::time::sleep(Duration::from_millis(15 * round)).await;
        redis.kill();
    }
    redis.restart();
    wait_for_status(&[&b], Status::Fleet).await;
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    purged(&a, "/report").await;
    let answer = send(&b.app, get("/report")).await;
    assert_ne!(answer.text(), held, "the purge was heard");
}

/// Redis frozen (SIGSTOP, so it keeps its data) under two instances with an
/// outage grace; A purges a key during the outage (an error, kept pending);
/// B serves what it held, within the grace. Redis thaws: once A's pending
/// purge has reached Redis, neither instance answers the purged value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_pending_through_a_frozen_redis_is_honoured_after_the_thaw() {
    use crate::common::monitor::Monitor;
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(graced(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(graced(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    assert_eq!(held, settled(&a, "/report").await);
    let generations = keys_like(&redis, "sg:*:g");
    assert_eq!(generations.len(), 1, "{generations:?}");
    let monitor = Monitor::start(&redis);
    monitor.settle(&redis).await;

    redis.freeze();
    wait_for_status(&[&a, &b], Status::Degraded).await;
    let mark = monitor.len();
    let purge = tokio::time::timeout(LIMIT, a.guard.invalidate(&get("/report")))
        .await
        .expect("no hang");
    assert!(purge.is_err(), "no purge reaches a frozen redis");
    redis.thaw();
    // A's purge reaches Redis: some call after the thaw names the group's
    // generation key.
    until("the pending purge reaches redis", || {
        monitor
            .commands(mark)
            .iter()
            .any(|c| c.iter().any(|a| *a == generations[0]))
    })
    .await;
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let mut stale = Vec::new();
    for _ in 0..10 {
        for (name, i) in [("a", &a), ("b", &b)] {
            let answer = send(&i.app, get("/report")).await;
            if answer.text() == held {
                stale.push(name);
            }
        }
    }
    assert!(stale.is_empty(), "answers of the purged value: {stale:?}");
}

/// Strict barrier (no grace). B's link freezes; once its subscription
/// lease has run out B drops its in-process tier and rebuilds on its own,
/// keeping what it builds for up to a lease. A then purges: B's membership
/// returns `Ok` once B's membership has lapsed. The strict rule says no
/// instance then answers what it read before the purge returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_a_cut_off_instance_does_not_serve_what_it_rebuilt_before_a_purge() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let proxy = Proxy::start(redis.port()).await;
    let fast = |url: String| async move {
        backend_with_grace(&url, Duration::from_millis(200), Duration::ZERO).await
    };
    let a = instance(fast(redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(fast(proxy.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    until("both are members", || members(&redis).len() == 2).await;
    settled(&b, "/report").await;

    proxy.freeze();
    wait_for_status(&[&b], Status::Degraded).await;
    // B, cut off past its lease, drops what it held and rebuilds alone.
    let rebuilt = settled(&b, "/report").await;
    purged(&a, "/report").await;
    let stale = answers_carrying(&b, "/report", &rebuilt, 10).await;
    assert_eq!(
        stale, 0,
        "answers of an entry B read before a purge that returned Ok"
    );
}

/// Runs `body` with every event of the process captured, in a process of
/// its own: this test binary, started again on the test `name` alone. A
/// process-wide subscriber sees every thread's events, and no other test
/// logs there, so the counts are exact whichever runner runs the suite
/// and however many tests run beside it.
fn with_logs(name: &str, body: impl FnOnce(&Logs)) {
    if !crate::common::child::alone() {
        return crate::common::child::run_alone(module_path!(), name);
    }
    let logs = Logs::default();
    tracing::subscriber::set_global_default(logs.clone())
        .expect("the only subscriber of the process");
    body(&logs);
}

/// The WARN and INFO lines, for a failure's message.
fn loud(logs: &Logs) -> Vec<(tracing::Level, String)> {
    let mut lines = logs.all();
    lines.retain(|(level, _)| *level <= tracing::Level::INFO);
    lines
}

/// Redis flaps three times: killed until the backend's health says
/// `Degraded` (then, if `down_long`, kept down under load for longer than
/// two keepalives), restarted until the health says `Fleet`, then up for
/// longer than two keepalives. Returns the (WARN, INFO) outage lines
/// logged since the instance joined, after each recovery, with the
/// degraded episodes the backend counted meanwhile (`outages`). Served from the in-process tier (a
/// grace), the requests make no Redis call.
///
/// A machine too busy to answer a keepalive in time shows a real episode
/// of its own beside the three outages; it is logged and counted like
/// them, so the lines are checked against the backend's own count, which
/// timing cannot set apart from them. Each is read once the episodes
/// begun have ended (the health polled until the three agree, with a
/// limit that only a hang reaches): an outage logged twice never agrees.
async fn outage_lines(logs: &Logs, down_long: bool) -> Vec<(usize, usize, usize)> {
    let mut redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(graced(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a], Status::Fleet).await;
    // Counted from the moment the health first says `Fleet`: an episode
    // the health reported while the instance joined is not one of these.
    let (w0, i0) = (
        logs.lines(tracing::Level::WARN, "redis unreachable").len(),
        logs.lines(tracing::Level::INFO, "redis answers again")
            .len(),
    );
    let outages = || {
        let stats = a.backend.stats().redis.expect("connected");
        usize::try_from(stats.outages).expect("a count")
    };
    let o0 = outages();
    let warns = || logs.lines(tracing::Level::WARN, "redis unreachable").len() - w0;
    let infos = || {
        logs.lines(tracing::Level::INFO, "redis answers again")
            .len()
            - i0
    };
    let mut seen = Vec::new();
    for round in 1..=3 {
        redis.kill();
        let until = std::time::Instant::now() + LIMIT;
        while a.backend.health().status != Status::Degraded {
            assert!(std::time::Instant::now() < until, "the outage was noticed");
            send(&a.app, get("/report")).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if down_long {
            for _ in 0..25 {
                send(&a.app, get("/report")).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        redis.restart();
        wait_for_status(&[&a], Status::Fleet).await;
        // Up for longer than two keepalives: a late line would be counted.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let until = std::time::Instant::now() + LIMIT;
        let lines = loop {
            let health = a.backend.health().status;
            let lines = (warns(), infos(), outages() - o0);
            if health == Status::Fleet && lines.0 == lines.2 && lines.1 == lines.2 {
                break lines;
            }
            assert!(
                std::time::Instant::now() < until,
                "(WARN, INFO, outages) {lines:?}: {:#?}",
                loud(logs)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(lines.2 >= round, "each outage is one episode at least");
        seen.push(lines);
    }
    seen
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Per the README each outage the health reports logs one WARN when the
/// backend degrades and one INFO once Redis answers and the subscription
/// is confirmed: with Redis restarted as soon as the health says
/// `Degraded`, however short the outage.
#[test]
fn a_short_outage_the_health_reports_is_logged_too() {
    with_logs("a_short_outage_the_health_reports_is_logged_too", |logs| {
        let seen = runtime().block_on(outage_lines(logs, false));
        assert!(
            seen.iter().all(|&(w, i, o)| w == o && i == o),
            "{seen:?}: {:#?}",
            loud(logs)
        );
    });
}

/// Kept down for a few seconds under load instead, each outage logs its
/// WARN and its INFO, and the summaries and signs in between add none.
#[test]
fn a_long_outage_logs_one_warn_and_one_info() {
    with_logs("a_long_outage_logs_one_warn_and_one_info", |logs| {
        let seen = runtime().block_on(outage_lines(logs, true));
        assert!(
            seen.iter().all(|&(w, i, o)| w == o && i == o),
            "{seen:?}: {:#?}",
            loud(logs)
        );
    });
}

/// B started without Redis (its link frozen) and is not in the fleet yet;
/// A is, and holds an entry. B's application purges that key after a write
/// and is told `Ok`. A purge that returned `Ok` must reach the fleet (or
/// fail, and be kept until Redis has it, as during an outage): A must not
/// answer the purged entry, then or once B has joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_an_instance_still_local_reaches_the_fleet_or_fails() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let proxy = Proxy::start(redis.port()).await;
    proxy.freeze();
    let b = instance(strict(&proxy.url()).await, &origin, Duration::ZERO, ttl);
    assert_eq!(b.backend.health().status, Status::Degraded, "B is local");
    wait_for_status(&[&a], Status::Fleet).await;
    let held = settled(&a, "/report").await;

    let purge = tokio::time::timeout(LIMIT, b.guard.invalidate(&get("/report")))
        .await
        .expect("no hang");
    proxy.thaw();
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let stale = answers_carrying(&a, "/report", &held, 10).await;
    assert!(
        purge.is_err() || stale == 0,
        "the purge returned Ok and A answered the purged entry {stale} times of 10"
    );
    assert!(purge.is_err(), "a purge outside the fleet fails");
    // Kept, and made once B joined: A stops answering the purged entry
    // (the limit of the poll is a hang detector).
    let until_limit = std::time::Instant::now() + LIMIT;
    while send(&a.app, get("/report")).await.text() == held {
        assert!(
            std::time::Instant::now() < until_limit,
            "the purge kept before the join never reached the fleet"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The same for a purge of everything (a move of the table's generation):
/// it fails while B is local, and is made once B joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_everything_on_an_instance_still_local_is_made_once_it_joins() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let proxy = Proxy::start(redis.port()).await;
    proxy.freeze();
    let b = instance(strict(&proxy.url()).await, &origin, Duration::ZERO, ttl);
    assert_eq!(b.backend.health().status, Status::Degraded, "B is local");
    wait_for_status(&[&a], Status::Fleet).await;
    let held = settled(&a, "/report").await;

    let purge = tokio::time::timeout(LIMIT, b.guard.invalidate_all())
        .await
        .expect("no hang");
    assert!(purge.is_err(), "a purge outside the fleet fails");
    assert_eq!(
        send(&a.app, get("/report")).await.text(),
        held,
        "not made yet"
    );
    proxy.thaw();
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let until_limit = std::time::Instant::now() + LIMIT;
    while send(&a.app, get("/report")).await.text() == held {
        assert!(
            std::time::Instant::now() < until_limit,
            "the purge kept before the join never reached the fleet"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A shut down; its application purges a key afterwards and is told `Ok`,
/// while B, still in the fleet, holds the entry: a purge that returned
/// `Ok` must have reached the fleet, or fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_a_shut_down_backend_reaches_the_fleet_or_fails() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let a = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(strict(&redis.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    a.backend.shutdown(Duration::from_millis(100)).await;
    let purge = tokio::time::timeout(LIMIT, a.guard.invalidate(&get("/report")))
        .await
        .expect("no hang");
    let stale = answers_carrying(&b, "/report", &held, 10).await;
    assert!(
        purge.is_err() || stale == 0,
        "the purge returned Ok and B answered the purged entry {stale} times of 10"
    );
    assert!(purge.is_err(), "a purge after the shutdown fails");
}

/// The same race as above over a link with a 40 ms one-way delay, so the
/// background join's connect (several round trips) is long and the
/// shutdown lands inside it: the backend must still end with no member
/// and no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_inside_a_slow_join_leaves_no_member_and_no_connection() {
    let mut leaked = Vec::new();
    for round in 0..8u64 {
        let mut redis = RedisServer::start();
        redis.kill();
        let proxy = Proxy::delayed(redis.port(), 40..=40).await;
        let backend = strict(&proxy.url()).await;
        redis.restart();
        tokio::time::sleep(Duration::from_millis(100 + 120 * round)).await;
        let joined_before = backend.health().status == Status::Fleet;
        tokio::time::timeout(LIMIT, backend.shutdown(Duration::from_millis(100)))
            .await
            .expect("the shutdown returned");
        until("no member and no connection", || {
            members(&redis).is_empty() && redis.client_ids().is_empty()
        })
        .await;
        // Longer than the join's pause and a keepalive: a leaked tier would
        // have connected or registered again by then.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let (m, c) = (members(&redis).len(), redis.client_ids().len());
        if m != 0 || c != 0 || backend.health().status != Status::Local {
            leaked.push((round, joined_before, m, c, backend.health().status));
        }
    }
    assert!(
        leaked.is_empty(),
        "(round, joined, members, clients, status): {leaked:?}"
    );
}

/// With a short grace, a cut-off instance serves what it held before a
/// purge only until the lease and the grace have run out, while it is
/// still cut off: it ends up answering a value built after the purge
/// without its link coming back (the limit of the poll is a hang detector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_instance_stops_serving_a_purged_entry_once_the_grace_ran_out() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let proxy = Proxy::start(redis.port()).await;
    let short = |url: String| async move {
        backend_with_grace(&url, Duration::from_millis(200), Duration::from_secs(1)).await
    };
    let a = instance(short(redis.url()).await, &origin, Duration::ZERO, ttl);
    let b = instance(short(proxy.url()).await, &origin, Duration::ZERO, ttl);
    wait_for_status(&[&a, &b], Status::Fleet).await;
    let held = settled(&b, "/report").await;
    proxy.freeze();
    purged(&a, "/report").await;
    let until_limit = std::time::Instant::now() + LIMIT;
    loop {
        let answer = send(&b.app, get("/report")).await;
        if answer.text() != held {
            break;
        }
        assert!(
            std::time::Instant::now() < until_limit,
            "B served the purged entry past any grace while cut off"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b.backend.health().status, Status::Degraded, "still cut off");
    proxy.thaw();
}
