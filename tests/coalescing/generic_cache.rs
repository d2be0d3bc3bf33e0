//! The generic, HTTP-free API: the same protection for any async value.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stampede_guard::{Backend, Cache};

#[derive(Debug)]
struct Boom;

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_rebuild() {
    let cache: Cache<Bytes> = Cache::new(Backend::local()).ttl(Duration::from_secs(60));
    let calls = counter();
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let cache = cache.clone();
            let calls = calls.clone();
            tokio::spawn(async move {
                cache
                    .get_or_rebuild("k", move || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, Boom>(Bytes::from_static(b"value"))
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(&task.await.unwrap().unwrap()[..], b"value");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(cache.get("k").as_deref(), Some(&b"value"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rebuild_shares_its_error_and_is_not_cached() {
    let cache: Cache<String> = Cache::new(Backend::local());
    let calls = counter();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let cache = cache.clone();
            let calls = calls.clone();
            tokio::spawn(async move {
                cache
                    .get_or_rebuild("k", move || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err::<String, _>(Boom)
                    })
                    .await
            })
        })
        .collect();
    let mut errors = Vec::new();
    for task in tasks {
        let error = task.await.unwrap().unwrap_err();
        errors.push(error.error().expect("the rebuild's own error").clone());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        errors.iter().all(|e| Arc::ptr_eq(e, &errors[0])),
        "one error, shared"
    );
    let value = cache
        .get_or_rebuild("k", || async { Ok::<_, Boom>("ok".to_string()) })
        .await
        .unwrap();
    assert_eq!(value, "ok");
}

#[tokio::test]
async fn stale_values_cover_for_failures_and_slow_refreshes() {
    let cache: Cache<String> = Cache::new(Backend::local())
        .ttl(Duration::from_millis(50))
        .stale_if_error(Duration::from_secs(30));
    cache
        .get_or_rebuild("k", || async { Ok::<_, Boom>("old".to_string()) })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let v = cache
        .get_or_rebuild("k", || async { Err::<String, _>(Boom) })
        .await
        .unwrap();
    assert_eq!(v, "old");

    let swr: Cache<String> = Cache::new(Backend::local())
        .ttl(Duration::from_millis(50))
        .stale_while_revalidate(Duration::from_secs(30));
    swr.get_or_rebuild("k", || async { Ok::<_, Boom>("old".to_string()) })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let calls = counter();
    for _ in 0..20 {
        let calls = calls.clone();
        let v = swr
            .get_or_rebuild("k", move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, Boom>("new".to_string())
            })
            .await
            .unwrap();
        assert_eq!(v, "old", "stale value returned at once");
    }
    for _ in 0..50 {
        if swr.get("k").as_deref() == Some("new") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(swr.get("k").as_deref(), Some("new"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one background refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_caller_does_not_cancel_its_rebuild() {
    let cache: Cache<String> = Cache::new(Backend::local()).ttl(Duration::from_secs(60));
    let calls = counter();
    let release = Arc::new(tokio::sync::Notify::new());
    let first = {
        let cache = cache.clone();
        let calls = calls.clone();
        let release = release.clone();
        tokio::spawn(async move {
            cache
                .get_or_rebuild("k", move || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    Ok::<_, Boom>("built once".to_string())
                })
                .await
        })
    };
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let cache = cache.clone();
            let calls = calls.clone();
            tokio::spawn(async move {
                cache
                    .get_or_rebuild("k", move || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Boom>("second rebuild".to_string())
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    release.notify_one();
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap(), "built once");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the rebuild ran once");
    assert_eq!(cache.get("k").as_deref(), Some("built once"));
}

#[tokio::test]
async fn invalidate_forces_a_rebuild_and_namespaces_separate_values() {
    let backend = Backend::local();
    let a: Cache<String> = Cache::new(backend.clone()).namespace("a");
    let b: Cache<String> = Cache::new(backend).namespace("b");
    a.get_or_rebuild("k", || async { Ok::<_, Boom>("from a".to_string()) })
        .await
        .unwrap();
    assert_eq!(b.get("k"), None);
    assert_eq!(a.get("k").as_deref(), Some("from a"));
    a.invalidate("k")
        .await
        .expect("embedded invalidation cannot fail");
    assert_eq!(a.get("k"), None);
}
