//! The RFC 9211 `Cache-Status` member, in each way a request is answered.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::status::{cache_status, split_ttl};
use crate::common::{burst, get as get_req, send, Answer, Origin};
use axum::body::Body;
use axum::response::AppendHeaders;
use axum::routing::get;
use axum::Router;
use http::{header, Request, StatusCode};
use stampede_guard::{Backend, StampedeGuard};
use tokio::sync::Semaphore;

/// The one member of this layer, with its `ttl` parameter taken out and
/// returned apart (it depends on the clock).
fn ours(answer: &Answer) -> (String, Option<i64>) {
    let all = cache_status(answer);
    assert_eq!(all.len(), 1, "exactly one member: {all:?}");
    split_ttl(&all[0])
}

/// An origin that answers "v<n>" with the status `status` holds, and counts.
fn app(origin: &Origin, status: Arc<AtomicU16>, guard: StampedeGuard) -> Router {
    let o = origin.clone();
    Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            let status = status.clone();
            async move {
                let (n, _) = origin.enter();
                let code = StatusCode::from_u16(status.load(Ordering::SeqCst)).unwrap();
                (code, [(header::ETAG, "\"e\"")], format!("v{n}"))
            }
        })
        .post(|| async { "posted" })
        .layer(guard),
    )
}

fn ok() -> Arc<AtomicU16> {
    Arc::new(AtomicU16::new(200))
}

#[tokio::test]
async fn a_miss_is_stored_and_a_hit_tells_its_freshness() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(30));
    let app = app(&origin, ok(), guard);
    let miss = send(&app, get_req("/r")).await;
    assert_eq!(
        ours(&miss),
        ("stampede-guard; fwd=uri-miss; stored".to_owned(), None)
    );
    assert_eq!(miss.x_cache(), "MISS", "x-cache is still on by default");
    let hit = send(&app, get_req("/r")).await;
    let (member, ttl) = ours(&hit);
    assert_eq!(member, "stampede-guard; hit");
    let ttl = ttl.expect("a hit tells its ttl");
    assert!((0..=30).contains(&ttl), "ttl {ttl} within the route's 30 s");
    // A 304 the layer makes from the entry is still a hit (RFC 9211 §2.1).
    let conditional = Request::get("/r")
        .header(header::IF_NONE_MATCH, "\"e\"")
        .body(Body::empty())
        .unwrap();
    let not_modified = send(&app, conditional).await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    assert_eq!(ours(&not_modified).0, "stampede-guard; hit");
    // HEAD on a miss, answered from the entry it stored.
    let head_app = app_with_fresh_origin(StampedeGuard::new(Backend::local()));
    let head = Request::head("/r").body(Body::empty()).unwrap();
    let head = send(&head_app, head).await;
    assert_eq!(ours(&head).0, "stampede-guard; fwd=uri-miss; stored");
    assert_eq!(origin.calls(), 1);
}

fn app_with_fresh_origin(guard: StampedeGuard) -> Router {
    app(&Origin::default(), ok(), guard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_rebuild_are_collapsed() {
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let (o, g) = (origin.clone(), gate.clone());
    let app = Router::new().route(
        "/r",
        get(move || {
            let (origin, gate) = (o.clone(), g.clone());
            async move {
                origin.enter();
                gate.acquire().await.expect("open").forget();
                "v"
            }
        })
        .layer(StampedeGuard::new(Backend::local())),
    );
    let releaser = {
        let gate = gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            gate.add_permits(1);
        })
    };
    let answers = burst(&app, 8, || get_req("/r")).await;
    releaser.await.unwrap();
    assert_eq!(origin.calls(), 1);
    let mut members: Vec<String> = answers.iter().map(|a| ours(a).0).collect();
    members.sort();
    let starters = members
        .iter()
        .filter(|m| *m == "stampede-guard; fwd=uri-miss; stored")
        .count();
    let collapsed = members
        .iter()
        .filter(|m| *m == "stampede-guard; fwd=uri-miss; collapsed")
        .count();
    let hits = members
        .iter()
        .filter(|m| *m == "stampede-guard; hit")
        .count();
    assert_eq!(starters, 1, "{members:?}");
    assert_eq!(starters + collapsed + hits, 8, "{members:?}");
    assert_eq!(collapsed, crate::common::tally(&answers, "COALESCED"));
}

#[tokio::test]
async fn stale_while_revalidating_is_a_hit_with_a_negative_ttl() {
    let origin = Origin::default();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(100))
        .stale_while_revalidate(Duration::from_secs(60));
    let app = app(&origin, ok(), guard);
    send(&app, get_req("/r")).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let stale = send(&app, get_req("/r")).await;
    assert_eq!(stale.x_cache(), "STALE");
    let (member, ttl) = ours(&stale);
    assert_eq!(member, "stampede-guard; hit");
    assert!(ttl.expect("a ttl") < 0, "stale: a negative ttl");
}

#[tokio::test]
async fn stale_if_error_tells_the_origins_status() {
    let origin = Origin::default();
    let status = ok();
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(100))
        .stale_if_error(Duration::from_secs(60));
    let app = app(&origin, status.clone(), guard);
    send(&app, get_req("/r")).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    status.store(503, Ordering::SeqCst);
    let rescued = send(&app, get_req("/r")).await;
    assert_eq!(rescued.status, StatusCode::OK);
    assert_eq!(rescued.text(), "v1");
    let (member, ttl) = ours(&rescued);
    assert_eq!(
        member,
        "stampede-guard; fwd=stale; fwd-status=503; detail=stale-if-error"
    );
    assert!(ttl.expect("a ttl") < 0);
}

#[tokio::test]
async fn a_304_from_the_origin_renews_the_entry_and_says_so() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move |request: Request<Body>| {
            let origin = o.clone();
            async move {
                origin.enter();
                // The origin sits behind another cache, which says so on the
                // 200 and on the 304 alike.
                let tag = [
                    (header::ETAG, "\"e\""),
                    (
                        header::HeaderName::from_static("cache-status"),
                        "up; fwd=stale",
                    ),
                ];
                match request.headers().get(header::IF_NONE_MATCH) {
                    Some(_) => (StatusCode::NOT_MODIFIED, tag, String::new()),
                    None => (StatusCode::OK, tag, "body".to_owned()),
                }
            }
        })
        .layer(
            StampedeGuard::new(Backend::local())
                .ttl(Duration::from_millis(100))
                .stale_if_error(Duration::from_secs(60)),
        ),
    );
    send(&app, get_req("/r")).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let renewed = send(&app, get_req("/r")).await;
    assert_eq!(renewed.text(), "body");
    assert_eq!(
        ours(&renewed).0,
        "stampede-guard; fwd=stale; fwd-status=304; stored"
    );
    // Neither the 200's nor the 304's upstream member was stored.
    let hit = send(&app, get_req("/r")).await;
    assert_eq!(ours(&hit).0, "stampede-guard; hit");
    assert_eq!(origin.calls(), 2);
}

#[tokio::test]
async fn bypasses_say_why_they_went_forward() {
    let app = app_with_fresh_origin(StampedeGuard::new(Backend::local()));
    let post = Request::post("/r").body(Body::empty()).unwrap();
    assert_eq!(
        ours(&send(&app, post).await).0,
        "stampede-guard; fwd=method"
    );
    let authed = Request::get("/r")
        .header(header::AUTHORIZATION, "Bearer x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        ours(&send(&app, authed).await).0,
        "stampede-guard; fwd=request; detail=credentials"
    );
    let with_body = Request::get("/r")
        .header(header::CONTENT_LENGTH, "3")
        .body(Body::from("abc"))
        .unwrap();
    // A GET's content is discarded: the request goes the way of any GET.
    assert_eq!(
        ours(&send(&app, with_body).await).0,
        "stampede-guard; fwd=uri-miss; stored"
    );
}

#[tokio::test]
async fn an_unshareable_answer_is_a_miss_not_stored() {
    let app = Router::new().route(
        "/r",
        get(|| async { ([(header::CACHE_CONTROL, "private")], "mine") })
            .layer(StampedeGuard::new(Backend::local())),
    );
    let answer = send(&app, get_req("/r")).await;
    let (member, _) = ours(&answer);
    assert!(
        member.starts_with("stampede-guard; fwd=uri-miss; detail="),
        "{member}"
    );
    assert!(!member.contains("stored"));
}

/// An origin behind another cache: its member comes first, then ours; it is
/// not stored, so a hit carries ours alone.
#[tokio::test]
async fn an_upstream_member_is_kept_before_ours_and_never_replayed() {
    let origin = Origin::default();
    let o = origin.clone();
    let app = Router::new().route(
        "/r",
        get(move || {
            let origin = o.clone();
            async move {
                origin.enter();
                (
                    AppendHeaders([
                        ("cache-status", "upstream; fwd=miss; stored"),
                        ("cache-status", "cdn; hit; ttl=99999"),
                    ]),
                    "v",
                )
            }
        })
        .layer(StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(30))),
    );
    let miss = send(&app, get_req("/r")).await;
    let members = cache_status(&miss);
    assert_eq!(
        members.last().map(String::as_str),
        Some("stampede-guard; fwd=uri-miss; stored")
    );
    assert_eq!(
        members[..2],
        ["upstream; fwd=miss; stored", "cdn; hit; ttl=99999"],
        "the upstream members first, as they came"
    );
    for _ in 0..3 {
        let hit = send(&app, get_req("/r")).await;
        let all = cache_status(&hit);
        assert_eq!(all.len(), 1, "no upstream member on a hit: {all:?}");
        assert!(all[0].starts_with("stampede-guard; hit; ttl="));
    }
    assert_eq!(origin.calls(), 1);
}

#[tokio::test]
async fn the_headers_and_the_name_are_configurable() {
    // Cache-Status alone, under another name.
    let only = app_with_fresh_origin(
        StampedeGuard::new(Backend::local())
            .x_cache_header(None)
            .cache_status_name("edge 1\r\n\"x\""),
    );
    let miss = send(&only, get_req("/r")).await;
    assert!(miss.headers.get("x-cache").is_none());
    assert_eq!(
        ours(&miss).0,
        r#""edge 1\"x\""; fwd=uri-miss; stored"#,
        "a name that is not a token is a quoted string, without control characters"
    );
    let token =
        app_with_fresh_origin(StampedeGuard::new(Backend::local()).cache_status_name("edge-1"));
    send(&token, get_req("/r")).await;
    assert_eq!(ours(&send(&token, get_req("/r")).await).0, "edge-1; hit");
    // x-cache alone.
    let x_only = app_with_fresh_origin(StampedeGuard::new(Backend::local()).cache_status(false));
    let miss = send(&x_only, get_req("/r")).await;
    assert_eq!(miss.x_cache(), "MISS");
    assert!(cache_status(&miss).is_empty());
    let hit = send(&x_only, get_req("/r")).await;
    assert!(
        cache_status(&hit).is_empty(),
        "no slot left behind in the entry"
    );
}

/// The waiters of a rebuild that failed get the stale copy too, told as
/// collapsed; the origin's status is the starter's to know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_failed_rebuild_are_told_stale_if_error_and_collapsed() {
    let origin = Origin::default();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = Arc::new(Semaphore::new(0));
    let (o, f, g) = (origin.clone(), failing.clone(), gate.clone());
    let app = Router::new().route(
        "/r",
        get(move || {
            let (origin, failing, gate) = (o.clone(), f.clone(), g.clone());
            async move {
                origin.enter();
                if failing.load(Ordering::SeqCst) {
                    gate.acquire().await.expect("open").forget();
                    return (StatusCode::SERVICE_UNAVAILABLE, "down");
                }
                (StatusCode::OK, "v")
            }
        })
        .layer(
            StampedeGuard::new(Backend::local())
                .ttl(Duration::from_millis(100))
                .stale_if_error(Duration::from_secs(60)),
        ),
    );
    send(&app, get_req("/r")).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    failing.store(true, Ordering::SeqCst);
    let releaser = {
        let gate = gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            gate.add_permits(1);
        })
    };
    let answers = burst(&app, 6, || get_req("/r")).await;
    releaser.await.unwrap();
    assert_eq!(origin.calls(), 2, "one failed rebuild for the burst");
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::OK && a.text() == "v"));
    let members: Vec<String> = answers.iter().map(|a| ours(a).0).collect();
    let starter = "stampede-guard; fwd=stale; fwd-status=503; detail=stale-if-error";
    let waiter = "stampede-guard; fwd=stale; fwd-status=502; collapsed; detail=stale-if-error";
    assert_eq!(
        members.iter().filter(|m| *m == starter).count(),
        1,
        "{members:?}"
    );
    assert_eq!(
        members.iter().filter(|m| *m == waiter).count(),
        5,
        "{members:?}"
    );
}
