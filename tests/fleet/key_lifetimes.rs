//! Per-key Redis state that lives only as long as its entry and lease, on
//! real Redis, against a lease holder that stalls for real: an instance in
//! its own OS process, stopped with SIGSTOP in the middle of its rebuild
//! until its lease, its fence hash and its group's generation have all
//! expired in Redis, then resumed with SIGCONT (its rebuild finishes and
//! commits at once, before it notices anything).
//!
//! Fencing numbers and generations reseeded from Redis's clock must never
//! go back: the stalled holder's late commit is refused whatever happened
//! meanwhile (nothing; another instance rebuilt the key; the key was
//! invalidated, before or after its state expired). Each test counts the
//! values in Redis and the answers that carry the stalled holder's build.
#![cfg(feature = "redis")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::common::driver::Boom;
use crate::common::fleet::keys_like;
use crate::common::redis::RedisServer;
use stampede_guard::{Backend, Cache};

/// What the stalled holder builds.
const STALLED: &str = "built-by-the-stalled-holder";

/// The lease every instance takes.
const LEASE: Duration = Duration::from_millis(600);

fn cache(backend: &Backend) -> Cache<String> {
    Cache::<String>::new(backend.clone())
        .namespace("lifetimes")
        .ttl(Duration::from_secs(600))
        .lease(LEASE)
}

/// The lease holder in its own process: it prints `BUILDING` from inside
/// its rebuild of `item`, then `DONE <answer>` once its call returned (its
/// commit was tried by then).
struct Holder {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Holder {
    fn start(redis: &RedisServer, keys: usize) -> Holder {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                crate::common::child::test_name(module_path!(), "child_holder").as_str(),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SG_REDIS_URL", redis.url())
            .env("SG_KEYS", keys.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child process");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Holder { child, lines }
    }

    /// Waits (at most 60 s) for a line containing `word`; the rest of it.
    fn expect(&self, word: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the holder never printed {word}"));
            if let Some((_, rest)) = line.split_once(word) {
                return rest.trim().to_owned();
            }
        }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The entry's keys in Redis (value, lease, fence hash, generation), by
/// their suffix.
fn entry_keys(redis: &RedisServer) -> Vec<String> {
    keys_like(redis, "sg:{*")
        .into_iter()
        .filter(|k| [":v", ":l", ":n", ":g"].iter().any(|s| k.ends_with(s)))
        .collect()
}

/// How many keys in Redis hold the stalled holder's build.
fn stalled_values(redis: &RedisServer) -> usize {
    keys_like(redis, "sg:{*")
        .into_iter()
        .filter(|k| k.ends_with(":v"))
        .filter(|k| redis.raw(&["GET", k]).contains(STALLED))
        .count()
}

/// Waits (bounded, polling) until the entry's lease, fence hash and
/// generation have all expired in Redis.
async fn state_expired(redis: &RedisServer) {
    for _ in 0..2_000 {
        if entry_keys(redis)
            .iter()
            .all(|k| !(k.ends_with(":l") || k.ends_with(":n") || k.ends_with(":g")))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = entry_keys(redis);
    panic!(
        "the entry's state never expired: {} keys, such as {:?}",
        left.len(),
        left.first()
    );
}

/// What happens while the holder is stopped.
#[derive(Clone, Copy, Debug)]
enum Meanwhile {
    /// Nothing: its state expires, nobody takes the key.
    Nothing,
    /// Its state expires, then another instance rebuilds the key.
    Rebuilt,
    /// Its state expires, then the key is invalidated.
    InvalidatedAfter,
    /// The key is invalidated while its state is there, then the state
    /// expires, then another instance rebuilds the key.
    InvalidatedBeforeThenRebuilt,
}

/// One round: the holder stopped mid-rebuild, `meanwhile` done by an
/// instance in this process, the holder resumed. Returns (values in Redis
/// holding the stalled build, answers of this process carrying it after
/// the holder's commit was tried).
async fn round(meanwhile: Meanwhile) -> (usize, usize) {
    let redis = RedisServer::start();
    let backend = Backend::redis(&redis.url()).await.expect("redis backend");
    let here = cache(&backend);
    let calls = Arc::new(AtomicUsize::new(0));
    let rebuild = |here: Cache<String>, calls: Arc<AtomicUsize>| async move {
        here.get_or_rebuild("item", move || async move {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Boom>(format!("built-here-{n}"))
        })
        .await
        .expect("the rebuild here succeeds")
    };

    let holder = Holder::start(&redis, 1);
    holder.expect("BUILDING");
    holder.signal("-STOP");
    if let Meanwhile::InvalidatedBeforeThenRebuilt = meanwhile {
        here.invalidate("item")
            .await
            .expect("the purge reaches redis");
    }
    state_expired(&redis).await;
    match meanwhile {
        Meanwhile::Nothing => {}
        Meanwhile::Rebuilt | Meanwhile::InvalidatedBeforeThenRebuilt => {
            let got = rebuild(here.clone(), calls.clone()).await;
            assert!(got.starts_with("built-here-"), "{got}");
        }
        Meanwhile::InvalidatedAfter => {
            here.invalidate("item")
                .await
                .expect("the purge reaches redis");
        }
    }
    holder.signal("-CONT");
    let answer = holder.expect("DONE");
    assert_eq!(answer, STALLED, "the holder's own caller gets its build");
    let stored = stalled_values(&redis);
    // A new instance reads Redis afresh; this one reads its L1 or Redis.
    let fresh = cache(&Backend::redis(&redis.url()).await.expect("redis backend"));
    let mut served = 0;
    for cache in [&here, &fresh] {
        if rebuild(cache.clone(), calls.clone()).await == STALLED {
            served += 1;
        }
    }
    eprintln!(
        "{meanwhile:?}: stored {stored} served {served} keys {:?}",
        entry_keys(&redis)
    );
    (stored, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_whose_state_expired_cannot_commit() {
    assert_eq!(round(Meanwhile::Nothing).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_cannot_overwrite_a_rebuild_seeded_from_the_clock() {
    assert_eq!(round(Meanwhile::Rebuilt).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_cannot_commit_after_an_invalidation_of_expired_state() {
    assert_eq!(round(Meanwhile::InvalidatedAfter).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_cannot_commit_after_its_invalidated_generation_expired() {
    assert_eq!(round(Meanwhile::InvalidatedBeforeThenRebuilt).await, (0, 0));
}

/// The holder stopped in the middle of rebuilding 1,000 keys at once;
/// once their state expired, every other key is invalidated and the rest
/// rebuilt here; then the holder resumes and commits all 1,000 in a burst.
/// None of its builds is stored or served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_of_a_thousand_keys_commits_none() {
    const KEYS: usize = 1_000;
    let name = |i: usize| {
        if i == 0 {
            "item".to_owned()
        } else {
            format!("item-{i}")
        }
    };
    let redis = RedisServer::start();
    let backend = Backend::redis(&redis.url()).await.expect("redis backend");
    let here = cache(&backend);
    let holder = Holder::start(&redis, KEYS);
    holder.expect("BUILDING");
    holder.signal("-STOP");
    state_expired(&redis).await;
    let tasks: Vec<_> = (0..KEYS)
        .map(|i| {
            let here = here.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    here.invalidate(name(i))
                        .await
                        .expect("the purge reaches redis");
                } else {
                    let got = here
                        .get_or_rebuild(name(i), || async {
                            Ok::<_, Boom>("rebuilt-here".to_owned())
                        })
                        .await
                        .expect("the rebuild here succeeds");
                    assert_eq!(got, "rebuilt-here");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    holder.signal("-CONT");
    assert_eq!(holder.expect("DONE"), STALLED);
    let stored = stalled_values(&redis);
    let fresh = cache(&Backend::redis(&redis.url()).await.expect("redis backend"));
    let mut served = 0;
    for i in 0..KEYS {
        for cache in [&here, &fresh] {
            let got = cache
                .get_or_rebuild(name(i), || async {
                    Ok::<_, Boom>("rebuilt-after".to_owned())
                })
                .await
                .expect("the rebuild succeeds");
            served += usize::from(got == STALLED);
        }
    }
    eprintln!("stored {stored} served {served}");
    assert_eq!(
        (stored, served),
        (0, 0),
        "the stalled holder's builds came back"
    );
}

/// Entry point of the holder process (does nothing when run directly).
#[test]
#[ignore = "started by the stalled-holder tests"]
fn child_holder() {
    let Ok(url) = std::env::var("SG_REDIS_URL") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let backend = Backend::redis(&url).await.expect("redis");
        let cache = cache(&backend);
        let keys: usize = std::env::var("SG_KEYS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let entered = Arc::new(AtomicUsize::new(0));
        let calls: Vec<_> = (0..keys)
            .map(|i| {
                let (cache, entered) = (cache.clone(), entered.clone());
                tokio::spawn(async move {
                    let name = if i == 0 {
                        "item".to_owned()
                    } else {
                        format!("item-{i}")
                    };
                    cache
                        .get_or_rebuild(name, move || async move {
                            // Every build waits for the last to enter, so
                            // that none commits before the parent stops us.
                            if entered.fetch_add(1, Ordering::SeqCst) + 1 == keys {
                                println!("BUILDING");
                            }
                            while entered.load(Ordering::SeqCst) < keys {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            // Stopped here by the parent; resumed long after.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Ok::<_, Boom>(STALLED.to_owned())
                        })
                        .await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.expect("call"));
        }
        match answers.iter().find(|a| a.is_err()) {
            Some(Err(e)) => println!("DONE error {e:?}"),
            _ => println!("DONE {STALLED}"),
        }
        // Kept alive until the parent is done with it.
        tokio::time::sleep(Duration::from_secs(120)).await;
    });
}
