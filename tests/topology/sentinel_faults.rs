//! Sentinel under faults, on real processes: a hung first sentinel, an old
//! primary frozen through a failover and then resumed, fencing tokens
//! across a failover with synced acquisition, and the documented
//! least-privilege user.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::cluster::wait_replicated;
use crate::common::lock::{first_hold, held_locks};
use crate::common::sentinel::SentinelSetup;
use stampede_guard::{Backend, ErrorKind, FencingToken, Lock, LockError};

/// Waits until a live sentinel names the replica and the replica says it is
/// the primary (sentinels that do not answer are skipped).
fn wait_promoted(setup: &SentinelSetup, sentinel: usize, limit: Duration) {
    let give_up = Instant::now() + limit;
    while Instant::now() < give_up {
        if setup.sentinels[sentinel].primary_port() == Some(setup.replica.port())
            && setup
                .replica
                .raw(&["INFO", "replication"])
                .contains("role:master")
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the replica was not promoted within {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_first_sentinel_does_not_hold_back_the_failover() {
    let mut setup = SentinelSetup::start_with(3, &[]);
    let backend = setup.probing_backend().await;
    let lock = Lock::new(backend.clone());
    let before = first_hold(&lock, "job", Duration::from_secs(5)).await;
    wait_replicated(&setup.primary, Duration::from_secs(10));

    // The sentinel listed first hangs (its port still accepts connections),
    // then the primary dies; the other two sentinels promote the replica.
    setup.sentinels[0].freeze();
    setup.primary.kill();
    wait_promoted(&setup, 1, Duration::from_secs(20));

    // The instance asks past the hung sentinel and follows: its lock works
    // on the new primary.
    let after = first_hold(&lock, "job", Duration::from_secs(10)).await;
    assert!(after > before, "{after:?} > {before:?}");
    let guard = lock.acquire("job").await.expect("lock on the new primary");
    assert_eq!(
        held_locks(&setup.replica),
        ":1",
        "the hold is on the new primary"
    );
    assert!(guard.release().await.unwrap());

    // A new instance connects with the hung sentinel still listed first.
    let fresh = tokio::time::timeout(Duration::from_secs(10), Backend::redis(&setup.url()))
        .await
        .expect("connecting does not hang on the first sentinel")
        .expect("a later sentinel answers");
    let other = Lock::new(fresh);
    let token = first_hold(&other, "job", Duration::from_secs(5)).await;
    assert!(token > after);
    setup.sentinels[0].thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_resumed_after_the_failover_takes_no_writes() {
    let setup = SentinelSetup::start();
    let a = Lock::new(setup.probing_backend().await);
    let b = Lock::new(setup.probing_backend().await);
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(first_hold(&a, "stock", Duration::from_secs(5)).await);
        before.push(first_hold(&b, "stock", Duration::from_secs(5)).await);
    }
    wait_replicated(&setup.primary, Duration::from_secs(10));

    // The primary freezes; the sentinel promotes the replica; the old
    // primary resumes and, for a while, still says it is a primary.
    setup.primary.freeze();
    setup.wait_for_promotion(Duration::from_secs(20));
    setup.primary.thaw();
    // Within one role check (1 s) of the switch every instance has left
    // the old primary: past that, nothing of theirs runs there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let role = setup.primary.raw(&["INFO", "replication"]);
    assert!(
        role.contains("role:master"),
        "the old primary still says it is one: the split-brain window is open"
    );
    let scripts_before = setup.primary.evalsha_calls();

    // The instances use the lock (with one that connected after the
    // switch): they exclude each other, and every token is greater than
    // all those handed out before the failover.
    let c = Lock::new(setup.probing_backend().await);
    take_turns(&[&a, &b, &c], 12, *before.iter().max().unwrap()).await;
    assert_eq!(
        setup.primary.evalsha_calls(),
        scripts_before,
        "no script ran on the old primary after the switch"
    );
}

/// The locks take turns: each holder excludes the others, and every token
/// is greater than `last`.
async fn take_turns(locks: &[&Lock], rounds: usize, mut last: FencingToken) {
    for round in 0..rounds {
        let turn = round % locks.len();
        let guard = locks[turn]
            .acquire("stock")
            .await
            .expect("lock after the switch");
        for (i, other) in locks.iter().enumerate() {
            if i != turn {
                assert!(
                    other.try_acquire("stock").await.unwrap().is_none(),
                    "round {round}: instance {i} held the lock too"
                );
            }
        }
        assert!(guard.fencing_token() > last, "round {round}: tokens rise");
        last = guard.fencing_token();
        assert!(guard.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_whose_old_primary_still_answers_moves_every_instance() {
    // The instances' calls never fail: the sentinel moves the primary while
    // the old one keeps answering, and keeps saying it is a primary for
    // seconds (until the sentinel converts it).
    let setup = SentinelSetup::start();
    let a = Lock::new(setup.probing_backend().await);
    let b = Lock::new(setup.probing_backend().await);
    let newest = first_hold(&a, "stock", Duration::from_secs(5))
        .await
        .max(first_hold(&b, "stock", Duration::from_secs(5)).await);
    wait_replicated(&setup.primary, Duration::from_secs(10));
    let service = crate::common::sentinel::SERVICE;
    assert_eq!(
        setup.sentinel().raw(&["SENTINEL", "FAILOVER", service]),
        "+OK\r\n"
    );
    setup.wait_for_promotion(Duration::from_secs(20));
    // Within one role check (1 s) of the switch every instance has left
    // the old primary.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        setup
            .primary
            .raw(&["INFO", "replication"])
            .contains("role:master"),
        "the old primary still says it is one: the split-brain window is open"
    );
    let scripts_before = setup.primary.evalsha_calls();
    // C connects after the switch, to the new primary.
    let c = Lock::new(setup.probing_backend().await);
    take_turns(&[&a, &b, &c], 12, newest).await;
    assert_eq!(
        setup.primary.evalsha_calls(),
        scripts_before,
        "no script ran on the old primary after the switch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_acquisition_keeps_fencing_tokens_rising_across_a_failover() {
    let mut setup = SentinelSetup::start();
    let backend = setup.probing_backend().await;
    let synced = Lock::new(backend.clone())
        .lease(Duration::from_secs(30))
        .synced(1, Duration::from_millis(300));

    // With the replica frozen nothing acknowledges: the acquisition fails,
    // hands out no guard, and gives its hold back (a plain waiter gets the
    // lock long before the 30 s lease would have run out).
    setup.replica.freeze();
    match synced.acquire("sku").await {
        // Too few acknowledgements, or none before the call's own limit.
        Err(LockError::Unavailable(e)) => assert!(
            matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{e}"
        ),
        other => panic!("an unacknowledged acquisition must fail: {other:?}"),
    }
    setup.replica.thaw();
    let plain = Lock::new(backend.clone()).wait_budget(Duration::from_secs(5));
    let guard = plain.acquire("sku").await.expect("the hold was given back");
    assert!(guard.release().await.unwrap());

    // Synced holds, then the primary dies at once: no waiting for the
    // replica here, the acquisition did.
    let mut newest = FencingToken(0);
    for _ in 0..5 {
        let guard = synced.acquire("sku").await.expect("synced acquisition");
        newest = newest.max(guard.fencing_token());
        assert!(guard.release().await.unwrap());
    }
    let guard = synced.acquire("sku").await.expect("synced acquisition");
    newest = newest.max(guard.fencing_token());
    setup.primary.kill();
    drop(guard);
    setup.wait_for_promotion(Duration::from_secs(20));

    // On the new primary (no replica left to acknowledge, so a plain
    // lock), every token is greater than every token handed out before.
    let after = Lock::new(backend.clone());
    let first = first_hold(&after, "sku", Duration::from_secs(40)).await;
    assert!(first > newest, "{first:?} > {newest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_works_through_sentinel() {
    let mut args = vec!["--user", "app", "on", ">app-secret"];
    args.extend_from_slice(crate::common::tls::ACL_RULES);
    let setup = SentinelSetup::start_with(1, &args);
    let url = setup.url_as("app:app-secret@");

    // Without ROLE the user is refused, with a permission hint.
    assert_eq!(
        setup.primary.raw(&["ACL", "SETUSER", "app", "-role"]),
        "+OK"
    );
    let error = Backend::redis(&url).await.expect_err("ROLE is needed");
    assert_eq!(error.kind(), ErrorKind::Permission, "{error}");
    assert_eq!(
        setup.primary.raw(&["ACL", "SETUSER", "app", "+role"]),
        "+OK"
    );

    // With the documented permissions: the cache, a synced lock, no errors.
    let backend = Backend::redis(&url).await.expect("the documented user");
    let origin = crate::common::Origin::default();
    let app = crate::common::fleet::instance(backend.clone(), &origin, Duration::ZERO, |g| g);
    let first = crate::common::send(&app.app, crate::common::get("/report")).await;
    let second = crate::common::send(&app.app, crate::common::get("/report")).await;
    assert_eq!((first.text(), second.text()), ("v1".into(), "v1".into()));
    let lock = Lock::new(backend.clone()).synced(1, Duration::from_millis(500));
    let guard = lock
        .acquire("stock")
        .await
        .expect("synced lock as the user");
    assert!(guard.release().await.unwrap());
    assert_eq!(backend.stats().redis.unwrap().errors, 0);

    // A sentinel that wants a password, asked without one, is named as
    // the one that refused, not the data nodes' credentials.
    let sentinel = setup.sentinel();
    assert_eq!(
        sentinel.raw(&["ACL", "SETUSER", "default", "resetpass", ">s-secret"]),
        "+OK\r\n"
    );
    let error = Backend::redis(&url)
        .await
        .expect_err("the sentinel refuses");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(
        message.contains("authentication at the sentinel failed"),
        "{message}"
    );
    assert!(!message.contains("at the data node"), "{message}");
}
