//! The operators' router (`Admin`), mounted behind an authentication layer
//! as an application would: purges by URL, tag and all (POST and DELETE)
//! drop what they name, here and on another instance; a bad URL is a 400;
//! stats and readiness answer JSON, 503 once Redis is gone. Real requests
//! through the router, on Redis and embedded.
#![cfg(feature = "admin")]

use std::time::Duration;

use crate::common::{send, Answer, Origin};
use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use stampede_guard::{Admin, Backend, StampedeGuard};

const TOKEN: &str = "Bearer operator";

async fn operators_only(request: AxumRequest, next: Next) -> Result<Response, StatusCode> {
    match request.headers().get(AUTHORIZATION) {
        Some(token) if token == TOKEN => Ok(next.run(request).await),
        _ => Err(StatusCode::UNAUTHORIZED),
    }
}

/// `/report` and `/tagged` (tagged `reports`), each answering its call
/// number, and the admin router under `/admin/cache` behind the token.
fn app(origin: &Origin, backend: Backend) -> Router {
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let answer = |origin: &Origin| {
        let origin = origin.clone();
        move || {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                ([("surrogate-key", "reports")], format!("v{n}"))
            }
        }
    };
    Router::new()
        .route("/report", get(answer(origin)).layer(guard.clone()))
        .route("/tagged", get(answer(origin)).layer(guard.clone()))
        .nest(
            "/admin/cache",
            Admin::new(guard)
                .router()
                .layer(middleware::from_fn(operators_only)),
        )
}

fn page(path: &str) -> Request<Body> {
    Request::get(path)
        .header(HOST, "api.example.com")
        .body(Body::empty())
        .unwrap()
}

fn admin(method: Method, path: &str, body: Option<&str>) -> Request<Body> {
    let b = Request::builder()
        .method(method)
        .uri(format!("/admin/cache{path}"))
        .header(AUTHORIZATION, TOKEN);
    match body {
        Some(body) => b
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

fn json(answer: &Answer) -> serde_json::Value {
    serde_json::from_slice(&answer.body).expect("a JSON body")
}

async fn texts(app: &Router) -> [String; 2] {
    [
        send(app, page("/report")).await.text(),
        send(app, page("/tagged")).await.text(),
    ]
}

/// Asks `app` until `path`'s answer differs from `old`, at most 50 times
/// (another instance hears a purge by message).
async fn changed(app: &Router, path: &str, old: &str) -> String {
    let mut now = send(app, page(path)).await.text();
    for _ in 0..50 {
        if now != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = send(app, page(path)).await.text();
    }
    now
}

/// Every purge through the admin router of `a`, seen on `b` too.
async fn purges(a: Backend, b: Backend) {
    let origin = Origin::default();
    let (app_a, app_b) = (app(&origin, a), app(&origin, b));
    let old = texts(&app_a).await;
    let old_b = texts(&app_b).await;
    assert_eq!(texts(&app_a).await, old, "cached");

    let refused = send(&app_a, {
        let mut r = admin(Method::POST, "/purge/all", None);
        r.headers_mut().remove(AUTHORIZATION);
        r
    })
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(texts(&app_a).await, old, "nothing purged without the token");

    // By URL: only /report goes.
    let answer = send(
        &app_a,
        admin(
            Method::POST,
            "/purge/url",
            Some(r#"{"url": "https://api.example.com/report"}"#),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(json(&answer), serde_json::json!({"purged": "url"}));
    let now = texts(&app_a).await;
    assert_ne!(now[0], old[0], "the URL was purged");
    assert_eq!(now[1], old[1], "another URL was not");
    assert_ne!(changed(&app_b, "/report", &old_b[0]).await, old_b[0]);

    // By tag, with DELETE: both carry `reports`.
    let before = texts(&app_a).await;
    let answer = send(
        &app_a,
        admin(Method::DELETE, "/purge/tag", Some(r#"{"tag": "reports"}"#)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(json(&answer), serde_json::json!({"purged": "tag"}));
    let now = texts(&app_a).await;
    assert!(now.iter().zip(&before).all(|(n, b)| n != b), "{now:?}");
    let tagged_b = send(&app_b, page("/tagged")).await.text();

    // All.
    let before = texts(&app_a).await;
    let answer = send(&app_a, admin(Method::POST, "/purge/all", None)).await;
    assert_eq!(json(&answer), serde_json::json!({"purged": "all"}));
    let now = texts(&app_a).await;
    assert!(now.iter().zip(&before).all(|(n, b)| n != b), "{now:?}");
    assert_ne!(changed(&app_b, "/tagged", &tagged_b).await, tagged_b);

    // A URL that is not one: 400, and nothing purged.
    let before = texts(&app_a).await;
    for body in [r#"{"url": "/report"}"#, r#"{"url": "not a url"}"#] {
        let answer = send(&app_a, admin(Method::POST, "/purge/url", Some(body))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(json(&answer)["error"]["kind"], "InvalidInput", "{body}");
    }
    let answer = send(&app_a, admin(Method::POST, "/purge/url", Some("{}"))).await;
    assert!(answer.status.is_client_error(), "a body without its field");
    assert_eq!(texts(&app_a).await, before);

    let stats = send(&app_a, admin(Method::GET, "/stats", None)).await;
    assert_eq!(stats.status, StatusCode::OK);
    assert!(
        json(&stats)["l1_bytes"].as_u64().unwrap() > 0,
        "{}",
        stats.text()
    );
}

async fn health(app: &Router) -> (StatusCode, serde_json::Value) {
    let answer = send(app, admin(Method::GET, "/health", None)).await;
    (answer.status, json(&answer))
}

#[tokio::test]
async fn embedded_admin_purges_and_answers() {
    let backend = Backend::local();
    purges(backend.clone(), backend.clone()).await;
    let (status, body) = health(&app(&Origin::default(), backend)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["ready"], true);
    assert_eq!(body["status"], "local");
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    #[tokio::test]
    async fn admin_purges_reach_every_instance() {
        let redis = RedisServer::start();
        purges(connect(&redis).await, connect(&redis).await).await;
    }

    #[tokio::test]
    async fn readiness_is_503_with_the_reason_once_redis_is_gone() {
        let mut redis = RedisServer::start();
        let backend = Backend::redis_builder(&redis.url())
            .probe_interval(Duration::from_secs(60))
            .connect()
            .await
            .expect("backend");
        let app = app(&Origin::default(), backend);
        let mut answer = health(&app).await;
        for _ in 0..250 {
            if answer.0 == StatusCode::OK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            answer = health(&app).await;
        }
        assert_eq!(answer.0, StatusCode::OK, "{}", answer.1);
        assert_eq!(answer.1["status"], "fleet");
        assert_eq!(answer.1["redis"]["breaker"], "closed");

        redis.kill();
        for n in 0..500 {
            send(&app, page(&format!("/report?n={n}"))).await;
            answer = health(&app).await;
            if answer.0 != StatusCode::OK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (status, body) = answer;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["ready"], false);
        assert_eq!(body["status"], "degraded");
        let why = body["why"].as_array().expect("reasons");
        assert!(!why.is_empty(), "{body}");
    }
}
