//! The builders' numbers at the edges of their ranges: a value out of range
//! is brought into it (a status code out of range panics at construction,
//! as `RouteConfig` refuses it), and no edge value of any knob panics or
//! overflows once requests arrive. Also the builder's names: the `x-cache`
//! header has a method of its own, and the old name still sets it.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderName, StatusCode};
use stampede_guard::{Backend, Cache, Lock, StampedeGuard, WaitTimeout};

use crate::common::{burst, get as get_req, send, Origin};

/// Durations at and past every edge: zero, below a millisecond, past
/// 2^31 s, the most a `u64` of seconds holds, the largest `Duration`.
const DURATIONS: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_secs((1 << 31) + 1),
    Duration::from_secs(u64::MAX),
    Duration::MAX,
    Duration::from_secs(30),
];

/// Ratios a number read from the environment may be.
const RATIOS: [f64; 8] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -1.0,
    0.0,
    f64::MIN_POSITIVE,
    f64::MAX,
    1.0,
];

fn guard() -> StampedeGuard {
    StampedeGuard::new(Backend::local())
}

fn app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new().route(
        "/report",
        get(move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                format!("v{n}")
            }
        })
        .layer(guard),
    )
}

/// Every guard built from an edge value answers a miss, a hit, a burst
/// and a HEAD: with the origin's answer, or (a rebuild timeout taken as
/// 1 ms, a wait budget of 0 failing closed) with the status that says so.
#[tokio::test]
async fn no_edge_value_of_any_knob_panics_on_the_request_path() {
    type Knob = fn(StampedeGuard, Duration) -> StampedeGuard;
    let durations: [(&str, Knob); 8] = [
        ("ttl", StampedeGuard::ttl),
        ("stale_while_revalidate", |g, d| {
            g.ttl(Duration::from_millis(1)).stale_while_revalidate(d)
        }),
        ("stale_if_error", |g, d| {
            g.ttl(Duration::from_millis(1)).stale_if_error(d)
        }),
        ("wait_budget", |g, d| {
            g.wait_budget(d)
                .on_wait_timeout(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE))
        }),
        ("lease", StampedeGuard::lease),
        ("rebuild_timeout", StampedeGuard::rebuild_timeout),
        ("hit_for_miss", |g, d| {
            g.hit_for_miss(d).cacheable_statuses([StatusCode::CREATED])
        }),
        ("refresh_ahead.floor", |g, d| g.refresh_ahead(1.0, d)),
    ];
    let mut guards = Vec::new();
    for (knob, set) in durations {
        for d in DURATIONS {
            guards.push((format!("{knob}({d:?})"), set(guard(), d)));
        }
    }
    for x in RATIOS {
        guards.push((format!("early_refresh({x})"), guard().early_refresh(x)));
        guards.push((
            format!("refresh_ahead({x}, 0s)"),
            guard().refresh_ahead(x, Duration::ZERO),
        ));
        guards.push((
            format!("refresh_ahead({x}, MAX)"),
            guard().refresh_ahead(x, Duration::MAX),
        ));
    }
    for bytes in [0, 1, usize::MAX] {
        guards.push((
            format!("max_body_bytes({bytes})"),
            guard().max_body_bytes(bytes),
        ));
    }

    let allowed = [
        StatusCode::OK,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::GATEWAY_TIMEOUT,
    ];
    for (name, guard) in guards {
        let origin = Origin::default();
        let app = app(&origin, guard);
        let mut answers = vec![
            send(&app, get_req("/report")).await,
            send(&app, get_req("/report")).await,
        ];
        answers.extend(burst(&app, 4, || get_req("/report")).await);
        let head = http::Request::head("/report")
            .body(axum::body::Body::empty())
            .unwrap();
        answers.push(send(&app, head).await);
        for a in &answers {
            assert!(allowed.contains(&a.status), "{name}: {}", a.status);
        }
        assert!(
            (1..=answers.len()).contains(&origin.calls()),
            "{name}: {} origin calls for {} requests",
            origin.calls(),
            answers.len()
        );
    }
}

/// A ttl of 0 means the same in code and in a file: nothing is stored on
/// the route's own lifetime, each request in turn calls the origin. The
/// longest ttl (past 2^31 s, taken as 2^31 s) stores once.
#[tokio::test]
async fn a_zero_ttl_stores_nothing_and_the_longest_stores_once() {
    let zero = Origin::default();
    let app0 = app(&zero, guard().ttl(Duration::ZERO));
    for _ in 0..3 {
        assert_eq!(send(&app0, get_req("/report")).await.x_cache(), "MISS");
    }
    assert_eq!(zero.calls(), 3);

    let longest = Origin::default();
    let app_max = app(&longest, guard().ttl(Duration::MAX));
    assert_eq!(send(&app_max, get_req("/report")).await.text(), "v1");
    for _ in 0..3 {
        let a = send(&app_max, get_req("/report")).await;
        assert_eq!((a.x_cache(), a.text().as_str()), ("HIT", "v1"));
    }
    assert_eq!(longest.calls(), 1);
}

/// What `RouteConfig` refuses the builder refuses too: a status outside
/// 100..=599 to store, or outside 200..=599 to answer a waiter with,
/// panics when the guard is built (never while answering), and what the
/// config accepts the builder takes.
#[cfg(feature = "serde")]
#[test]
fn the_builder_refuses_the_statuses_the_config_refuses() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    for code in [100_u16, 101, 199, 200, 204, 503, 599, 600, 999] {
        let status = StatusCode::from_u16(code).unwrap();
        type Build = fn(StatusCode) -> StampedeGuard;
        let cases: [(String, Build); 2] = [
            (format!(r#"{{ "cacheable_statuses": [{code}] }}"#), |s| {
                guard().cacheable_statuses([s])
            }),
            (
                format!(r#"{{ "on_wait_timeout": {{ "respond": {code} }} }}"#),
                |s| guard().on_wait_timeout(WaitTimeout::Respond(s)),
            ),
        ];
        for (json, build) in cases {
            let read = serde_json::from_str::<stampede_guard::RouteConfig>(&json);
            let built = catch_unwind(AssertUnwindSafe(|| build(status)));
            assert_eq!(read.is_ok(), built.is_ok(), "{json}");
        }
    }
}

/// `Cache<V>` takes the same ranges: at every edge a value is rebuilt and
/// returned (or the rebuild, given 1 ms, times out), a ttl of 0 stores
/// nothing, and the longest ttl stores once.
#[tokio::test]
async fn cache_knobs_at_their_edges_never_panic() {
    type Knob = fn(Cache<Bytes>, Duration) -> Cache<Bytes>;
    let knobs: [(&str, Knob); 6] = [
        ("ttl", Cache::ttl),
        ("stale_while_revalidate", Cache::stale_while_revalidate),
        ("stale_if_error", Cache::stale_if_error),
        ("wait_budget", Cache::wait_budget),
        ("lease", Cache::lease),
        ("rebuild_timeout", Cache::rebuild_timeout),
    ];
    let fresh = || Cache::<Bytes>::new(Backend::local());
    let mut caches = Vec::new();
    for (knob, set) in knobs {
        for d in DURATIONS {
            caches.push((format!("{knob}({d:?})"), set(fresh(), d)));
        }
    }
    for x in RATIOS {
        caches.push((format!("early_refresh({x})"), fresh().early_refresh(x)));
    }
    for (name, cache) in caches {
        let origin = Origin::default();
        for _ in 0..2 {
            let origin = origin.clone();
            let answer = cache
                .get_or_rebuild("k", move || async move {
                    let (n, _running) = origin.enter();
                    Ok::<_, std::io::Error>(Bytes::from(format!("v{n}")))
                })
                .await;
            if let Err(e) = answer {
                assert!(name.starts_with("rebuild_timeout"), "{name}: {e}");
            }
        }
        assert!((1..=2).contains(&origin.calls()), "{name}");
    }

    for (ttl, calls) in [(Duration::ZERO, 2), (Duration::MAX, 1)] {
        let cache = fresh().ttl(ttl);
        let origin = Origin::default();
        for _ in 0..2 {
            let origin = origin.clone();
            cache
                .get_or_rebuild("k", move || async move {
                    origin.enter();
                    Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                })
                .await
                .unwrap();
        }
        assert_eq!(origin.calls(), calls, "ttl {ttl:?}");
    }
}

/// `Lock`'s durations at their edges: a zero lease (taken as 3 ms), the
/// largest wait budget and hold; a second owner with a zero wait budget
/// is refused once, not left waiting.
#[tokio::test]
async fn lock_knobs_at_their_edges_never_panic() {
    for d in DURATIONS {
        let backend = Backend::local();
        let lock = Lock::new(backend.clone())
            .lease(d)
            .wait_budget(d)
            .max_hold(d)
            .synced(u32::MAX, d);
        let held = lock.acquire("report").await.expect("free");
        let other = Lock::new(backend).wait_budget(Duration::ZERO);
        assert!(
            other.try_acquire("report").await.unwrap().is_none(),
            "{d:?}"
        );
        assert!(held.release().await.unwrap(), "{d:?}");
    }
}

/// The Redis backend's timers at their edges (set in code, or read from a
/// config file): each is brought into its range when the backend connects,
/// so a request, a purge of a tag or of everything, and a lock all answer
/// without a panic or an overflowed `Instant`.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_backend_timers_at_their_edges_never_panic() {
    use crate::common::redis::RedisServer;

    let redis = RedisServer::start();
    for d in DURATIONS {
        let backend = Backend::redis_builder(&redis.url())
            .deadline(d)
            .connect_timeout(d)
            .probe_interval(d)
            .outage_grace(d)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        let origin = Origin::default();
        let app = app(
            &origin,
            StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60)),
        );
        for _ in 0..2 {
            let answer = send(&app, get_req("/report")).await;
            assert_eq!(answer.status, StatusCode::OK, "{d:?}");
        }
        // A deadline of 1 ms may be missed on a loaded machine: the answer
        // is then an error, never a panic.
        let guard = StampedeGuard::new(backend.clone());
        let _ = guard.invalidate_tag("report").await;
        let _ = guard.invalidate_all().await;
        if let Ok(held) = Lock::new(backend.clone())
            .wait_budget(Duration::ZERO)
            .acquire("r")
            .await
        {
            let _ = held.release().await;
        }
        backend.shutdown(Duration::from_secs(5)).await;
    }
}

/// The `x-cache` header has a method of its own, which leaves
/// `Cache-Status` alone; the old name still sets `x-cache`.
#[tokio::test]
#[allow(deprecated)]
async fn the_x_cache_header_has_its_own_name_and_the_old_one_still_works() {
    let quiet = [
        guard().x_cache_header(None),
        guard().cache_status_header(None),
    ];
    for guard in quiet {
        let a = send(&app(&Origin::default(), guard), get_req("/report")).await;
        assert!(a.headers.get("x-cache").is_none());
        assert!(a.headers.get("cache-status").is_some());
    }
    let renamed = [
        guard().x_cache_header(Some(HeaderName::from_static("x-edge"))),
        guard().cache_status_header(Some(HeaderName::from_static("x-edge"))),
    ];
    for guard in renamed {
        let a = send(&app(&Origin::default(), guard), get_req("/report")).await;
        assert_eq!(a.headers.get("x-edge").unwrap(), "MISS");
        assert!(a.headers.get("x-cache").is_none());
    }
    // Turning Cache-Status off leaves x-cache.
    let a = send(
        &app(&Origin::default(), guard().cache_status(false)),
        get_req("/report"),
    )
    .await;
    assert_eq!(a.x_cache(), "MISS");
    assert!(a.headers.get("cache-status").is_none());
}
