//! Numbers from the network never panic: header values an origin may send
//! (huge `Age`, `max-age`, `s-maxage`, stale windows, garbage) go through
//! the whole service, and every later request for the key is answered.

use std::time::Duration;

use crate::common::{get as get_req, send};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use proptest::prelude::*;
use stampede_guard::{Backend, StampedeGuard};

/// A route whose origin answers with the given header values.
fn app(headers: Vec<(&'static str, String)>, respect: bool) -> Router {
    Router::new().route(
        "/r",
        get(move || {
            let headers = headers.clone();
            async move {
                let mut response = "body".into_response();
                for (name, value) in headers {
                    if let Ok(value) = http::HeaderValue::from_str(&value) {
                        response.headers_mut().append(name, value);
                    }
                }
                response
            }
        })
        .layer(
            StampedeGuard::new(Backend::local())
                .ttl(Duration::from_secs(60))
                .stale_while_revalidate(Duration::from_secs(60))
                .stale_if_error(Duration::from_secs(60))
                .respect_cache_control(respect),
        ),
    )
}

#[tokio::test]
async fn the_largest_age_does_not_panic_the_hit_path() {
    let app = app(vec![("age", u64::MAX.to_string())], false);
    for _ in 0..3 {
        let answer = send(&app, get_req("/r")).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.text(), "body");
    }
}

#[tokio::test]
async fn the_largest_lifetimes_do_not_panic() {
    let huge = "18446744073709551615999".to_string();
    let app = app(
        vec![(
            "cache-control",
            format!("max-age={huge}, s-maxage={huge}, stale-while-revalidate={huge}, stale-if-error={huge}"),
        )],
        true,
    );
    for _ in 0..3 {
        assert_eq!(send(&app, get_req("/r")).await.status, StatusCode::OK);
    }
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        "[0-9]{1,40}",
        "-?[0-9]{0,5}(\\.[0-9]{0,3})?",
        "\\PC{0,24}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_age_and_cache_control_never_panic(
        age in header_value(),
        max_age in header_value(),
        s_maxage in header_value(),
        swr in header_value(),
        sie in header_value(),
        respect in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let app = app(
                vec![
                    ("age", age),
                    ("cache-control", format!("max-age={max_age}, s-maxage={s_maxage}")),
                    ("cache-control", format!("stale-while-revalidate={swr}, stale-if-error={sie}")),
                ],
                respect,
            );
            for _ in 0..2 {
                let answer = send(&app, get_req("/r")).await;
                prop_assert_eq!(answer.status, StatusCode::OK);
            }
            Ok(())
        })?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_durations_in_the_configuration_do_not_panic() {
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::MAX)
        .stale_while_revalidate(Duration::MAX)
        .stale_if_error(Duration::MAX)
        .wait_budget(Duration::MAX)
        .rebuild_timeout(Duration::MAX)
        .lease(Duration::MAX)
        .hit_for_miss(Duration::MAX);
    let app = Router::new().route("/r", get(|| async { "body" }).layer(guard));
    let answers = crate::common::burst(&app, 20, || get_req("/r")).await;
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "body"));
    let cache: stampede_guard::Cache<String> = stampede_guard::Cache::new(Backend::local())
        .ttl(Duration::MAX)
        .wait_budget(Duration::MAX)
        .rebuild_timeout(Duration::MAX)
        .lease(Duration::MAX);
    let value = cache
        .get_or_rebuild("k", || async { Ok::<_, std::io::Error>("v".to_string()) })
        .await
        .expect("rebuilt");
    assert_eq!(value, "v");
    let lock = stampede_guard::Lock::new(Backend::local())
        .lease(Duration::MAX)
        .wait_budget(Duration::MAX);
    let guard = lock.acquire("job").await.expect("free lock");
    assert!(lock.try_acquire("job").await.expect("embedded").is_none());
    drop(guard);
}
