//! Purge by the URL a user types: `invalidate_url` drops every variant of
//! the entries that requests for that URL were answered from (listed and
//! learned Vary), on every instance, and leaves other URLs alone; a URL
//! that does not parse is an error, never a panic. On Redis (two
//! instances) and embedded.

use std::time::Duration;

use crate::common::{send, until_all_differ, Origin};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::header::{ACCEPT_ENCODING, ACCEPT_LANGUAGE, HOST, VARY};
use http::{HeaderMap, Request};
use stampede_guard::{Backend, ErrorKind, StampedeGuard};

/// `/report` varies on Accept-Language (listed) and Accept-Encoding (the
/// origin's `Vary`, learned) and answers `<lang>:<call>`.
fn app(origin: &Origin, backend: Backend) -> (StampedeGuard, Router) {
    let guard = StampedeGuard::new(backend)
        .ttl(Duration::from_secs(60))
        .vary([ACCEPT_LANGUAGE]);
    let origin = origin.clone();
    let handler = move |headers: HeaderMap| {
        let origin = origin.clone();
        async move {
            let lang = headers
                .get(ACCEPT_LANGUAGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            let (n, _running) = origin.enter();
            ([(VARY, "accept-encoding")], format!("{lang}:{n}"))
        }
    };
    let router = Router::new().route("/report", get(handler).layer(guard.clone()));
    (guard, router)
}

/// A request as a client behind `Host: api.example.com` sends it.
fn req(query: &str, lang: Option<&str>, coding: Option<&str>) -> Request<Body> {
    let mut b = Request::get(format!("/report?{query}")).header(HOST, "api.example.com");
    if let Some(lang) = lang {
        b = b.header(ACCEPT_LANGUAGE, lang);
    }
    if let Some(coding) = coding {
        b = b.header(ACCEPT_ENCODING, coding);
    }
    b.body(Body::empty()).unwrap()
}

/// The variants of `?x=1&y=2` asked for.
const VARIANTS: [(Option<&str>, Option<&str>); 4] = [
    (Some("en"), Some("gzip")),
    (Some("en"), Some("br")),
    (Some("fr"), None),
    (None, None),
];

async fn texts(app: &Router) -> Vec<String> {
    let mut out = Vec::new();
    for (lang, coding) in VARIANTS {
        out.push(send(app, req("x=1&y=2", lang, coding)).await.text());
    }
    out
}

/// A purge of the typed URL (host in another case, query in another
/// order) on one instance drops every variant here and on the other one,
/// and nothing of another URL.
async fn purge_by_url(a: Backend, b: Backend) {
    let origin = Origin::default();
    let (guard_a, app_a) = app(&origin, a);
    let (_, app_b) = app(&origin, b);
    // Twice: the first answer teaches the route its Vary.
    texts(&app_a).await;
    let old = texts(&app_a).await;
    let old_b = texts(&app_b).await;
    let other = send(&app_a, req("x=2", None, None)).await.text();
    assert_eq!(
        texts(&app_a).await,
        old,
        "every variant was cached before the purge"
    );

    guard_a
        .invalidate_url("https://API.example.com/report?y=2&x=1")
        .await
        .expect("purged");
    let new_a = texts(&app_a).await;
    for (new, old) in new_a.iter().zip(&old) {
        assert_ne!(new, old, "every variant of the URL was dropped here");
    }
    let new_b = until_all_differ(&old_b, || texts(&app_b)).await;
    for (new, old) in new_b.iter().zip(&old_b) {
        assert_ne!(new, old, "every variant was dropped on the other instance");
    }
    assert_eq!(
        send(&app_a, req("x=2", None, None)).await.text(),
        other,
        "another URL keeps its entry"
    );
}

async fn bad_urls_are_errors(guard: &StampedeGuard) {
    for url in [
        "",
        "not a url",
        "/report?x=1",
        "api.example.com/report",
        "ftp://api.example.com/report",
        "https:///report",
        "https://exa mple.com/",
    ] {
        let e = guard.invalidate_url(url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{url:?}: {e}");
    }
}

#[tokio::test]
async fn embedded_purge_by_url_drops_every_variant() {
    let backend = Backend::local();
    purge_by_url(backend.clone(), backend.clone()).await;
    bad_urls_are_errors(&StampedeGuard::new(backend)).await;
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::driver::connect;
    use crate::common::redis::RedisServer;

    #[tokio::test]
    async fn purge_by_url_reaches_every_instance() {
        let redis = RedisServer::start();
        purge_by_url(connect(&redis).await, connect(&redis).await).await;
        bad_urls_are_errors(&StampedeGuard::new(connect(&redis).await)).await;
    }
}
