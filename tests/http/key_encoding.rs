//! Accept-Encoding in the key (compression behind the guard, learned per
//! route or declared), and why requests pass: the bypass counter's `reason`
//! label and the one warning per reason.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{send, Answer, Origin};
use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, SET_COOKIE};
use http::Request;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use stampede_guard::{Backend, StampedeGuard};
use tower_http::compression::CompressionLayer;

const TEXT: &str = "an expensive, very compressible answer; ";

/// A route behind tower-http's compression, with the guard outside it: the
/// guard sees (and stores) compressed bodies and `Vary: accept-encoding`.
fn compressed_app(origin: &Origin, guard: StampedeGuard) -> Router {
    let origin = origin.clone();
    Router::new()
        .route(
            "/c",
            get(move || {
                let origin = origin.clone();
                async move {
                    origin.enter();
                    TEXT.repeat(50)
                }
            }),
        )
        .layer(CompressionLayer::new())
        .layer(guard)
}

fn accepting(ae: Option<&str>) -> Request<Body> {
    let mut request = Request::get("/c");
    if let Some(ae) = ae {
        request = request.header(ACCEPT_ENCODING, ae);
    }
    request.body(Body::empty()).unwrap()
}

/// The coding the answer must be in for a client that accepts `ae` (the one
/// tower-http picks: br over gzip at equal q; the tests use no lower q),
/// checked on its headers and its bytes.
fn assert_coded_for(answer: &Answer, ae: Option<&str>) {
    let expected = match ae {
        Some(ae) if ae.contains("br") => Some("br"),
        Some(ae) if ae.contains("gzip") => Some("gzip"),
        _ => None,
    };
    let got = answer
        .headers
        .get(CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap());
    assert_eq!(
        got,
        expected,
        "accept-encoding {ae:?}, x-cache {}",
        answer.x_cache()
    );
    match expected {
        None => assert_eq!(answer.text(), TEXT.repeat(50)),
        Some("gzip") => assert_eq!(&answer.body[..2], [0x1f, 0x8b], "gzip magic"),
        Some(_) => assert_ne!(answer.text(), TEXT.repeat(50)),
    }
}

/// Sends one request per `ae` at once, each from its own task.
async fn mixed_burst(
    app: &Router,
    aes: &[Option<&'static str>],
) -> Vec<(Option<&'static str>, Answer)> {
    let tasks: Vec<_> = aes
        .iter()
        .map(|ae| {
            let (app, ae) = (app.clone(), *ae);
            tokio::spawn(async move { (ae, send(&app, accepting(ae)).await) })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("request task"));
    }
    out
}

async fn compression_is_protected_once_learned(backend: Backend) {
    let origin = Origin::default();
    let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
    let app = compressed_app(&origin, guard);

    // The first answer says Vary: accept-encoding; the route learns from it.
    let first = send(&app, accepting(Some("gzip"))).await;
    assert_coded_for(&first, Some("gzip"));
    assert_eq!(origin.calls(), 1);

    // 50 gzip clients at once: one origin call, all gzip.
    let answers = mixed_burst(&app, &[Some("gzip"); 50]).await;
    assert_eq!(origin.calls(), 2, "one call for the burst after learning");
    for (ae, answer) in &answers {
        assert_ne!(answer.x_cache(), "BYPASS");
        assert_coded_for(answer, *ae);
    }

    // Mixed clients: each normalised Accept-Encoding is one entry, and no
    // client gets a coding it did not ask for.
    let kinds = [
        Some("br, gzip"),
        Some("gzip;q=1,br"),
        Some("identity"),
        None,
        Some("gzip"),
    ];
    let aes: Vec<_> = kinds.iter().cycle().take(100).copied().collect();
    for (ae, answer) in &mixed_burst(&app, &aes).await {
        assert_ne!(answer.x_cache(), "BYPASS");
        assert_coded_for(answer, *ae);
    }
    // br+gzip (either spelling), identity, absent: three new entries.
    assert_eq!(origin.calls(), 5);
}

#[tokio::test]
async fn compression_behind_the_guard_is_learned_and_coalesced() {
    compression_is_protected_once_learned(Backend::local()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn compression_behind_the_guard_is_learned_and_coalesced_with_redis() {
    let redis = crate::common::redis::RedisServer::start();
    compression_is_protected_once_learned(crate::common::driver::connect(&redis).await).await;
}

#[tokio::test]
async fn a_route_that_declares_accept_encoding_is_protected_from_the_first_request() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(60))
        .vary([ACCEPT_ENCODING]);
    let app = compressed_app(&origin, guard);
    let answers = mixed_burst(&app, &[Some("gzip, br"); 50]).await;
    assert_eq!(origin.calls(), 1);
    for (ae, answer) in &answers {
        assert_coded_for(answer, *ae);
    }
    // Another spelling of the same preferences is the same entry.
    let hit = send(&app, accepting(Some("br;q=1, gzip"))).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_coded_for(&hit, Some("br;q=1, gzip"));
    // `gzip` alone is not: it must never get the br copy.
    let gzip = send(&app, accepting(Some("gzip"))).await;
    assert_eq!(gzip.x_cache(), "MISS");
    assert_coded_for(&gzip, Some("gzip"));
    assert_eq!(origin.calls(), 2);
}

#[tokio::test]
async fn inside_compression_one_uncompressed_copy_serves_every_coding() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let handler_origin = origin.clone();
    let app = Router::new()
        .route(
            "/c",
            get(move || {
                let origin = handler_origin.clone();
                async move {
                    origin.enter();
                    TEXT.repeat(50)
                }
            })
            .layer(guard),
        )
        .layer(CompressionLayer::new());
    let kinds = [Some("gzip"), Some("br, gzip"), Some("identity"), None];
    let aes: Vec<_> = kinds.iter().cycle().take(60).copied().collect();
    for (ae, answer) in &mixed_burst(&app, &aes).await {
        assert_coded_for(answer, *ae);
    }
    assert_eq!(origin.calls(), 1, "one entry, compressed per response");
}

/// Events at WARN and below, with their `reason` field.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Captured {
    fn count(&self, level: tracing::Level, reason: &str) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, r)| *l == level && r == reason)
            .count()
    }
}

struct Reason(String);

impl tracing::field::Visit for Reason {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "reason" {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut reason = Reason(String::new());
        event.record(&mut reason);
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, reason.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Bypass counts by `reason` label; every series is the one counter name.
fn bypasses(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        if key.key().name() != "stampede_guard_bypass_total" {
            continue;
        }
        let reason = key.key().labels().find(|l| l.key() == "reason");
        out.push((reason.map_or(String::new(), |l| l.value().to_owned()), n));
    }
    out.sort();
    out
}

// One thread: the recorder and the subscriber are this thread's.
#[tokio::test(flavor = "current_thread")]
async fn each_pass_is_counted_by_reason_and_warned_once_per_guard() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _tracing = tracing::subscriber::set_default(captured.clone());

    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(60));
    let app = Router::new()
        .route(
            "/cookie",
            get(|| async { ([(SET_COOKIE, "s=1")], "yours") }),
        )
        .route("/form", post(|| async { "posted" }))
        .layer(guard);
    for n in 0..3 {
        let a = send(&app, crate::common::get(&format!("/cookie?n={n}"))).await;
        assert_eq!(a.text(), "yours");
    }
    for _ in 0..2 {
        let request = Request::post("/form").body(Body::from("x")).unwrap();
        assert_eq!(send(&app, request).await.x_cache(), "BYPASS");
    }
    let with_credentials = Request::get("/cookie")
        .header("authorization", "Bearer x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, with_credentials).await.x_cache(), "BYPASS");

    assert_eq!(
        bypasses(&snapshotter),
        vec![
            ("credentials".to_owned(), 1),
            ("method".to_owned(), 2),
            ("set-cookie".to_owned(), 3),
        ]
    );
    // The origin's answers that keep the route unprotected: said once,
    // loudly; requests the client chose to send uncached: quietly.
    assert_eq!(captured.count(tracing::Level::WARN, "set-cookie"), 1);
    assert_eq!(captured.count(tracing::Level::DEBUG, "set-cookie"), 2);
    assert_eq!(captured.count(tracing::Level::WARN, "method"), 0);
    assert_eq!(captured.count(tracing::Level::DEBUG, "method"), 2);
}
