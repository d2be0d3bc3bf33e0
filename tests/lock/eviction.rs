//! A lock on a Redis that may evict its key. Redis cannot exempt a key from
//! eviction, so by default a lock is refused on a server with a `maxmemory`
//! and a policy other than `noeviction`, judged by the server that would
//! grant it, in the acquisition's own script; opted in, a holder whose key
//! was evicted learns it at its next renewal, and fencing tokens keep rising
//! across the eviction. Where the policy cannot be read (`INFO` refused), a
//! warning, once, and locks go on. The cache tier works on any policy. On a
//! cluster a lock is judged by its own primary.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

#[cfg(feature = "redis-cluster")]
use crate::common::lock::turn_evicting;
use crate::common::lock::{backend, held_locks, lock_on_a_server_turned_evicting, over_keys};
use crate::common::redis::RedisServer;
use crate::common::ROOMY_DEADLINE;
use stampede_guard::{Backend, Cache, FencingToken, Lock, LockError};

/// A server that evicts the least recently used key of any kind once its
/// data passes a few MiB.
fn evicting_server() -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"])
}

async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..1_000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

/// How many of a lock's keys matching `suffix` (`l` the hold, `n` the fence
/// counter) Redis holds. `EXISTS` does not touch a key's LRU clock.
fn lock_keys(redis: &RedisServer, suffix: &str) -> usize {
    let reply = over_keys(redis, &format!("sg:lock:*:{suffix}"), "n = n + 1");
    reply.trim_start_matches(':').parse().unwrap_or(0)
}

/// Writes keys of 1 KiB until Redis has evicted every lock hold and fencing
/// counter; returns how many batches of 100 that took.
fn fill_until_locks_evicted(redis: &RedisServer) -> usize {
    let fill = "for i = 1, 100 do \
                redis.call('SET', 'filler:' .. ARGV[1] .. ':' .. i, string.rep('x', 1024)) \
                end return 1";
    for batch in 0..20_000 {
        if lock_keys(redis, "l") == 0 && lock_keys(redis, "n") == 0 {
            return batch;
        }
        assert_eq!(redis.raw(&["EVAL", fill, "0", &batch.to_string()]), ":1");
    }
    panic!("redis kept the lock's keys through 2 GiB of writes");
}

/// A resource that serves only the newest lock holder it has seen (the
/// fencing recipe: the token is checked on every read and write).
#[derive(Default)]
struct Resource {
    last: Option<FencingToken>,
    writes: Vec<FencingToken>,
}

impl Resource {
    fn write(&mut self, fence: FencingToken) -> bool {
        if self.last.is_some_and(|last| fence < last) {
            return false;
        }
        self.last = Some(fence);
        self.writes.push(fence);
        true
    }
}

#[tokio::test]
async fn a_lock_is_refused_on_a_server_that_may_evict_it() {
    let redis = evicting_server();
    let backend = backend(&redis.url(), ROOMY_DEADLINE).await;
    let lock = Lock::new(backend.clone()).wait_budget(Duration::from_secs(1));

    for attempt in [
        lock.acquire("stock").await,
        lock.try_acquire("stock")
            .await
            .map(|g| g.expect("refused, not busy")),
    ] {
        match attempt {
            Err(LockError::EvictingServer { policy, maxmemory }) => {
                assert_eq!(policy, "allkeys-lru");
                assert_eq!(maxmemory, 4 * 1024 * 1024);
            }
            other => panic!("expected EvictingServer, got {other:?}"),
        }
    }
    let refused = lock.acquire("stock").await.unwrap_err().to_string();
    assert!(refused.contains("allkeys-lru"), "{refused}");
    assert!(refused.contains("allow_evicting_server"), "{refused}");
    assert_eq!(held_locks(&redis), ":0", "nothing was taken");
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy.as_deref(), Some("allkeys-lru"));

    // The cache tier works on the same server: one rebuild for two
    // instances, the second served from Redis.
    let rebuilds = Arc::new(AtomicUsize::new(0));
    let backend_again = crate::common::lock::backend(&redis.url(), ROOMY_DEADLINE).await;
    for instance in [backend, backend_again] {
        let cache = Cache::<String>::new(instance);
        let counted = rebuilds.clone();
        let value = cache
            .get_or_rebuild("report", move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("fresh".to_owned())
            })
            .await
            .expect("served");
        assert_eq!(value, "fresh");
    }
    assert_eq!(rebuilds.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn opted_in_an_evicted_hold_is_lost_and_tokens_keep_rising() {
    let redis = evicting_server();
    let first_instance = backend(&redis.url(), ROOMY_DEADLINE).await;
    let second_instance = backend(&redis.url(), ROOMY_DEADLINE).await;
    // A lease long enough that the watchdog's renewals (every 2 s) leave
    // the hold the least recently used key between them.
    let lease = Duration::from_secs(6);
    let allowed = |b: &Backend| {
        Lock::new(b.clone())
            .lease(lease)
            .allow_evicting_server(true)
    };
    let mut resource = Resource::default();

    let first = allowed(&first_instance)
        .acquire("stock")
        .await
        .expect("opted in");
    assert!(resource.write(first.fencing_token()));
    fill_until_locks_evicted(&redis);

    // The default stays safe: a second owner does not get the lock.
    let refused = Lock::new(second_instance.clone())
        .try_acquire("stock")
        .await;
    assert!(
        matches!(refused, Err(LockError::EvictingServer { .. })),
        "{refused:?}"
    );
    // Opted in, the lock is free now: a second owner takes it, under a
    // greater token, though the counter was evicted with the hold.
    let second = allowed(&second_instance)
        .try_acquire("stock")
        .await
        .expect("redis answers")
        .expect("the evicted hold is free");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{:?} after {:?}",
        second.fencing_token(),
        first.fencing_token()
    );
    assert!(resource.write(second.fencing_token()));

    // The first holder's watchdog finds the key gone at its next renewal.
    eventually("the first holder learns it lost the lock", async || {
        first.is_lost()
    })
    .await;
    // It checks before its next fenced write, and would be refused anyway.
    assert!(first.is_lost());
    assert!(!resource.write(first.fencing_token()));
    assert!(!second.is_lost());
    assert!(
        !first.release().await.expect("redis answers"),
        "not its hold"
    );
    assert!(second.release().await.expect("redis answers"));

    // Tokens never repeat: every later acquisition is above both.
    let third = allowed(&first_instance)
        .acquire("stock")
        .await
        .expect("free");
    assert!(resource.write(third.fencing_token()));
    let tokens = &resource.writes;
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test]
async fn a_policy_changed_at_runtime_is_judged_by_the_next_acquisition() {
    let (redis, backend, lock) = lock_on_a_server_turned_evicting().await;
    // The link stays up: the server judges each acquisition itself.
    let refused = lock.try_acquire("stock").await;
    assert!(
        matches!(&refused, Err(LockError::EvictingServer { policy, .. }) if policy == "allkeys-lru"),
        "{refused:?}"
    );
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy.as_deref(), Some("allkeys-lru"));
    // Cut and back: still refused, by the server reached since.
    redis.raw(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    redis.raw(&["CLIENT", "KILL", "TYPE", "normal"]);
    for _ in 0..5 {
        let refused = lock.try_acquire("stock").await;
        assert!(
            !matches!(refused, Ok(Some(_))),
            "granted on an evicting server: {refused:?}"
        );
    }
    assert_eq!(held_locks(&redis), ":0");
    // Back to noeviction: granted again, at once.
    assert_eq!(
        redis.raw(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        "+OK"
    );
    let guard = lock.acquire("stock").await.expect("noeviction again");
    assert!(guard.release().await.expect("released"));
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy, None);
}

#[tokio::test]
async fn a_server_that_keeps_every_key_takes_locks_as_before() {
    for settings in [
        &["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"][..],
        &["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"][..],
    ] {
        let redis = RedisServer::start_with(settings);
        let backend = backend(&redis.url(), ROOMY_DEADLINE).await;
        let lock = Lock::new(backend.clone());
        let guard = lock.acquire("stock").await.expect("{settings:?}");
        assert_eq!(held_locks(&redis), ":1");
        assert!(guard.release().await.expect("released"));
        let stats = backend.stats().redis.expect("a redis backend");
        assert_eq!(stats.eviction_policy, None);
    }
}

/// Counts WARN events whose message names the eviction policy.
#[derive(Clone, Default)]
struct Warnings(Arc<AtomicUsize>);

struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Warnings {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() == Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains("eviction policy") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[tokio::test]
async fn where_config_is_refused_the_unknown_policy_is_warned_once_and_locks_go_on() {
    let redis = evicting_server();
    assert_eq!(
        redis.raw(&[
            "ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all", "-config", "-info",
        ]),
        "+OK"
    );
    let url = format!("redis://locker:secret@127.0.0.1:{}/", redis.port());
    let warnings = Warnings::default();
    let _scope = tracing::subscriber::set_default(warnings.clone());

    let backend = backend(&url, ROOMY_DEADLINE).await;
    assert_eq!(warnings.0.load(Ordering::SeqCst), 1, "warned at connect");
    let lock = Lock::new(backend.clone());
    for _ in 0..3 {
        let guard = lock
            .acquire("stock")
            .await
            .expect("the policy is unknown: go on");
        assert!(guard.release().await.expect("released"));
    }
    assert_eq!(warnings.0.load(Ordering::SeqCst), 1, "warned once");
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy, None);
}

/// The policy is read by the acquisition script through `INFO` (a script
/// cannot run `CONFIG`): a user without `+config` is refused on an evicting
/// server; one without `+info` cannot tell, and takes locks after one
/// warning.
#[tokio::test]
async fn the_policy_is_read_through_info_alone() {
    let redis = evicting_server();
    for (user, denied) in [("no-config", "-config"), ("no-info", "-info")] {
        assert_eq!(
            redis.raw(&["ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all", denied]),
            "+OK"
        );
    }
    let url = |user: &str| format!("redis://{user}:secret@127.0.0.1:{}/", redis.port());
    let refused = Lock::new(backend(&url("no-config"), ROOMY_DEADLINE).await)
        .try_acquire("stock")
        .await;
    assert!(
        matches!(&refused, Err(LockError::EvictingServer { policy, .. }) if policy == "allkeys-lru"),
        "no-config: {refused:?}"
    );
    assert_eq!(held_locks(&redis), ":0", "no-config");

    let warnings = Warnings::default();
    let _scope = tracing::subscriber::set_default(warnings.clone());
    let backend = backend(&url("no-info"), ROOMY_DEADLINE).await;
    let guard = Lock::new(backend.clone())
        .try_acquire("stock")
        .await
        .expect("the policy is unknown: go on")
        .expect("free");
    assert!(guard.release().await.expect("released"));
    assert_eq!(warnings.0.load(Ordering::SeqCst), 1, "warned once");
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy, None);
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_lock_is_judged_by_its_own_primary() {
    use crate::common::cluster::Cluster;

    let cluster = Cluster::start(3, 0);
    // The last primary, not the seed the client asks first, may evict.
    let evicting = &cluster.nodes[2];
    turn_evicting(evicting, "64mb", "volatile-lru");
    let backend = crate::common::shards::connect(&cluster, ROOMY_DEADLINE).await;
    let stats = backend.stats().redis.expect("a redis backend");
    assert_eq!(stats.eviction_policy.as_deref(), Some("volatile-lru"));
    let lock = Lock::new(backend.clone());
    let (mut refused, mut taken) = (Vec::new(), 0);
    for n in 0..30 {
        let name = format!("job-{n}");
        match lock.try_acquire(&name).await {
            Err(LockError::EvictingServer { policy, .. }) => {
                assert_eq!(policy, "volatile-lru");
                refused.push(name);
            }
            Ok(Some(guard)) => {
                // Taken on a primary that keeps every key.
                assert_eq!(held_locks(evicting), ":0", "{name}");
                assert!(guard.release().await.expect("released"));
                taken += 1;
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(
        !refused.is_empty() && taken > 0,
        "refused {refused:?}, taken {taken}"
    );
    // Opted in, a refused one is taken, on the evicting primary.
    let allowed = lock.allow_evicting_server(true);
    let guard = allowed
        .try_acquire(&refused[0])
        .await
        .expect("redis answers");
    assert_eq!(held_locks(evicting), ":1");
    assert!(guard.expect("free").release().await.expect("released"));
}
