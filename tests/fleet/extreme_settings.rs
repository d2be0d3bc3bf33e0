//! The Redis backend builder's durations at their edges (zero, a
//! nanosecond, the most a `u64` of seconds holds, the largest `Duration`),
//! as a service reads them from its environment: no value panics once
//! requests and purges arrive, nor overflows arithmetic on `Instant`s.
#![cfg(feature = "redis")]

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, RedisBackendBuilder, StampedeGuard};

use crate::common::redis::RedisServer;
use crate::common::{get as get_req, send, Origin};

/// A knob of the builder.
#[derive(Clone, Copy, Debug)]
enum Knob {
    Deadline,
    ConnectTimeout,
    ProbeInterval,
    OutageGrace,
}

impl Knob {
    fn set(self, builder: RedisBackendBuilder, value: Duration) -> RedisBackendBuilder {
        match self {
            Knob::Deadline => builder.deadline(value),
            Knob::ConnectTimeout => builder.connect_timeout(value),
            Knob::ProbeInterval => builder.probe_interval(value),
            Knob::OutageGrace => builder.outage_grace(value),
        }
    }
}

const KNOBS: [Knob; 4] = [
    Knob::Deadline,
    Knob::ConnectTimeout,
    Knob::ProbeInterval,
    Knob::OutageGrace,
];

fn app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                ([("surrogate-key", "report")], format!("v{n}"))
            }
        })
        .layer(guard),
    )
}

/// Connects with `knob` at `value`, then a miss, a hit, and each purge.
/// Returns the steps that panicked (a step that errs or runs past a
/// generous limit is not a panic, and is not counted).
async fn exercise(url: String, knob: Knob, value: Duration) -> Vec<String> {
    let mut panicked = Vec::new();
    let step = |name: &'static str, task: tokio::task::JoinHandle<()>| async move {
        match tokio::time::timeout(Duration::from_secs(20), task).await {
            Ok(Err(e)) if e.is_panic() => Some(format!("{knob:?}={value:?}: {name} panicked")),
            _ => None,
        }
    };
    let connect = tokio::spawn(async move {
        knob.set(Backend::redis_builder(&url), value)
            .connect()
            .await
            .ok()
    });
    let backend = match tokio::time::timeout(Duration::from_secs(20), connect).await {
        Ok(Ok(Some(backend))) => backend,
        Ok(Err(e)) if e.is_panic() => {
            return vec![format!("{knob:?}={value:?}: connect panicked")];
        }
        _ => return panicked,
    };
    let origin = Origin::default();
    let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
    let router = app(&origin, guard.clone());
    for name in ["miss", "hit"] {
        let router = router.clone();
        let task = tokio::spawn(async move {
            send(&router, get_req("http://api.example.com/report")).await;
        });
        panicked.extend(step(name, task).await);
    }
    let g = guard.clone();
    let task = tokio::spawn(async move {
        let _ = g.invalidate_tag("report").await;
    });
    panicked.extend(step("invalidate_tag", task).await);
    let g = guard.clone();
    let task = tokio::spawn(async move {
        let _ = g.invalidate_url("http://api.example.com/report").await;
    });
    panicked.extend(step("invalidate_url", task).await);
    let g = guard.clone();
    let task = tokio::spawn(async move {
        let _ = g.invalidate_all().await;
    });
    panicked.extend(step("invalidate_all", task).await);
    let router = router.clone();
    let task = tokio::spawn(async move {
        send(&router, get_req("http://api.example.com/report")).await;
    });
    panicked.extend(step("miss after the purges", task).await);
    drop(backend);
    panicked
}

/// The largest values: a deadline, connect timeout, probe interval or
/// outage grace of `Duration::MAX` or `u64::MAX` seconds.
///
/// The backend brings its timers into range when it connects (a deadline,
/// connect timeout and probe interval of 1 ms to 2^31 s, a grace of 0 to
/// 2^31 s): `Instant` arithmetic on them cannot overflow.
#[tokio::test]
async fn the_largest_redis_durations_never_panic() {
    let redis = RedisServer::start();
    let mut panicked = Vec::new();
    for knob in KNOBS {
        for value in [Duration::MAX, Duration::from_secs(u64::MAX)] {
            panicked.extend(exercise(redis.url(), knob, value).await);
        }
    }
    assert!(panicked.is_empty(), "{panicked:#?}");
}

/// The smallest values: zero and a nanosecond. Calls may fail (a zero
/// deadline), never panic.
#[tokio::test]
async fn the_smallest_redis_durations_never_panic() {
    let redis = RedisServer::start();
    let mut panicked = Vec::new();
    for knob in KNOBS {
        for value in [Duration::ZERO, Duration::from_nanos(1)] {
            panicked.extend(exercise(redis.url(), knob, value).await);
        }
    }
    assert!(panicked.is_empty(), "{panicked:#?}");
}

/// Durations every builder clamps, at their edges.
const EDGES: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_secs((1 << 31) + 1),
    Duration::from_secs(u64::MAX),
    Duration::MAX,
];

/// `Lock` on Redis with every duration at an edge: acquired, refused to a
/// second owner with no wait, released (a long lease: kept until then); a
/// `synced` wait for more replicas
/// than exist fails or times out, never panics.
#[tokio::test]
async fn lock_knobs_at_their_edges_never_panic_on_redis() {
    let redis = RedisServer::start();
    let backend = crate::common::fleet::backend_at(&redis.url(), Duration::from_secs(1)).await;
    for d in EDGES {
        let lock = stampede_guard::Lock::new(backend.clone())
            .lease(d)
            .wait_budget(d.min(Duration::from_secs(1)))
            .max_hold(d);
        let name = format!("report-{}", d.as_nanos());
        let held = lock.acquire(&name).await.expect("free");
        let other = stampede_guard::Lock::new(backend.clone()).wait_budget(Duration::ZERO);
        assert!(other.try_acquire(&name).await.unwrap().is_none(), "{d:?}");
        // A lease of a few milliseconds may lapse before the release on a
        // loaded machine (the release then says so): no count on it.
        let released = held.release().await.unwrap();
        if d >= Duration::from_secs(1) {
            assert!(released, "{d:?}");
        }
        let synced = stampede_guard::Lock::new(backend.clone())
            .lease(d)
            .wait_budget(Duration::ZERO)
            .synced(u32::MAX, d.min(Duration::from_millis(200)));
        if let Ok(Some(held)) = synced.try_acquire(&format!("{name}-synced")).await {
            let _ = held.release().await;
        }
    }
}

/// `Cache<V>` on Redis with every duration at an edge, and the L1 limit
/// at 0, 1 and `u64::MAX` bytes: a value is rebuilt (or times out), read
/// again, purged by key and wholly.
#[tokio::test]
async fn cache_knobs_at_their_edges_never_panic_on_redis() {
    use stampede_guard::Cache;
    let redis = RedisServer::start();
    for l1 in [0, 1, u64::MAX] {
        let backend = Backend::redis_builder(&redis.url())
            .deadline(Duration::from_secs(1))
            .l1_max_bytes(l1)
            .connect()
            .await
            .expect("redis backend");
        for d in EDGES {
            let cache: Cache<String> = Cache::new(backend.clone())
                .ttl(d)
                .stale_while_revalidate(d)
                .stale_if_error(d)
                .wait_budget(d)
                .lease(d)
                .rebuild_timeout(d.max(Duration::from_secs(1)))
                .early_refresh(f64::MAX)
                .namespace(format!("n{}", d.as_nanos()));
            for _ in 0..2 {
                let value = cache
                    .get_or_rebuild("k", || async { Ok::<_, std::io::Error>("v".to_owned()) })
                    .await;
                assert!(value.is_ok(), "l1 {l1} {d:?}");
            }
            cache.invalidate("k").await.unwrap();
            cache.invalidate_all().await.unwrap();
        }
    }
}

/// A `RedisConfig` read from a file takes the same durations: a deadline of
/// `u64::MAX` seconds, as a config section can say it.
///
/// The section deserialises, and connecting brings the deadline into its
/// range, as the builder's value is.
#[cfg(feature = "serde")]
#[tokio::test]
async fn a_config_file_deadline_out_of_range_is_refused_or_clamped() {
    let redis = RedisServer::start();
    let json = format!(
        r#"{{"url": "{}", "deadline": "18446744073709551615s"}}"#,
        redis.url()
    );
    let config: stampede_guard::RedisConfig = match serde_json::from_str(&json) {
        Ok(config) => config,
        Err(_) => return,
    };
    let connect = tokio::spawn(async move {
        stampede_guard::RedisBackendBuilder::from_config(config)
            .connect()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let joined = connect.await;
    assert!(
        !joined.as_ref().is_err_and(tokio::task::JoinError::is_panic),
        "connect panicked"
    );
}

/// The largest outage grace and probe interval while Redis is gone: the
/// instance keeps answering from its in-process tier or the origin, and
/// its purges fail, without a panic; once Redis is back it answers again.
#[tokio::test]
async fn the_largest_grace_and_probe_interval_through_an_outage_never_panic() {
    let mut redis = RedisServer::start();
    for value in [Duration::MAX, Duration::from_secs(u64::MAX)] {
        let url = redis.url();
        let backend = Backend::redis_builder(&url)
            .deadline(Duration::from_millis(100))
            .outage_grace(value)
            .probe_interval(value)
            .connect()
            .await
            .expect("redis backend");
        let origin = Origin::default();
        let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
        let router = app(&origin, guard.clone());
        send(&router, get_req("http://api.example.com/report")).await;
        redis.kill();
        let steps = {
            let (router, guard) = (router.clone(), guard.clone());
            tokio::spawn(async move {
                for _ in 0..2 {
                    send(&router, get_req("http://api.example.com/report")).await;
                    let _ = guard.invalidate_tag("report").await;
                }
            })
        };
        let outcome = tokio::time::timeout(Duration::from_secs(60), steps).await;
        assert!(
            !matches!(outcome, Ok(Err(ref e)) if e.is_panic()),
            "{value:?}: panicked through the outage"
        );
        redis.restart();
    }
}
