//! Attacks at the HTTP edge on tags and `Cache-Status`: what a client sends
//! must not tag an entry, odd tag lists tag exactly their tags, variants
//! keep their own tags, and every `Cache-Status` member tells what happened
//! (a `ttl` that counts the answer's age, a conditional request that missed
//! told as a miss, `collapsed` and `hit` across instances on Redis). The
//! `stored` claim: `stored_status.rs`.

#[cfg(feature = "redis")]
use std::time::Duration;

use crate::common::status::{no_tag_headers, ours, with};
use crate::common::{local_guard, send, Origin};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use stampede_guard::StampedeGuard;

/// `/p` answers `v<call>` with the response headers `headers` gives.
fn app(origin: &Origin, guard: StampedeGuard, headers: fn(&HeaderMap) -> HeaderMap) -> Router {
    let origin = origin.clone();
    let handler = move |request: HeaderMap| {
        let origin = origin.clone();
        async move {
            let (n, _running) = origin.enter();
            (headers(&request), format!("v{n}"))
        }
    };
    Router::new().route("/p", get(handler).layer(guard))
}

fn product_tag(_: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("surrogate-key", HeaderValue::from_static("product:1"));
    headers
}

/// A client sends the tag headers itself, in any spelling and as many
/// lines: they tag nothing (a purge of their tags leaves the entry), they
/// never come back, and the origin's own tag still purges it.
#[tokio::test]
async fn tag_headers_a_client_sends_tag_nothing() {
    let origin = Origin::default();
    let guard = local_guard();
    let app = app(&origin, guard.clone(), product_tag);
    let forged: &[(&str, &[u8])] = &[
        ("Surrogate-Key", b"evil"),
        ("SURROGATE-KEY", b"evil2 product:2"),
        ("cache-tag", b"evil3,evil4"),
        ("Cache-Tag", b"\xffevil5"),
    ];
    let first = send(&app, with("/p", forged)).await;
    assert_eq!(first.text(), "v1");
    no_tag_headers(&first, "the rebuild's answer");
    for tag in [
        "evil",
        "evil2",
        "product:2",
        "evil3",
        "evil4",
        "evil5",
        "\u{fffd}evil5",
    ] {
        guard.invalidate_tag(tag).await.unwrap();
    }
    let again = send(&app, with("/p", forged)).await;
    assert_eq!(
        (again.text().as_str(), origin.calls()),
        ("v1", 1),
        "a tag the client sent purged the entry"
    );
    no_tag_headers(&again, "the hit");
    guard.invalidate_tag("product:1").await.unwrap();
    assert_eq!(send(&app, with("/p", &[])).await.text(), "v2");
}

fn odd_lists(_: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("surrogate-key", "  a \t b\t"),
        ("surrogate-key", ""),
        ("cache-tag", ",,c,, ,d,"),
        ("cache-tag", "e"),
    ] {
        headers.append(name, HeaderValue::from_static(value));
    }
    headers
}

/// Tag lists with empty members, tabs, repeated lines and an empty line:
/// each of the tags they name purges the entry, and what is no tag of
/// theirs (an empty tag, a separator, two tags taken as one) does not.
#[tokio::test]
async fn odd_tag_lists_tag_exactly_their_tags() {
    for tag in ["a", "b", "c", "d", "e", " e "] {
        let origin = Origin::default();
        let guard = local_guard();
        let app = app(&origin, guard.clone(), odd_lists);
        assert_eq!(send(&app, with("/p", &[])).await.text(), "v1");
        for not_a_tag in ["", " ", ",", "a b", "c,d", "A", "ab"] {
            guard.invalidate_tag(not_a_tag).await.unwrap();
        }
        let hit = send(&app, with("/p", &[])).await;
        assert_eq!(
            hit.text(),
            "v1",
            "a purge of no tag of the entry dropped it"
        );
        guard.invalidate_tag(tag).await.unwrap();
        let after = send(&app, with("/p", &[])).await;
        assert_eq!(after.text(), "v2", "the purge of {tag:?} left the entry");
        no_tag_headers(&after, "the rebuild's answer");
    }
}

fn by_language(request: &HeaderMap) -> HeaderMap {
    let language = request
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let mut headers = HeaderMap::new();
    headers.insert(
        "cache-tag",
        HeaderValue::from_str(&format!("lang:{language}")).unwrap(),
    );
    headers.insert(header::VARY, HeaderValue::from_static("accept-language"));
    headers
}

/// Two variants of one URL, each tagged by the origin with its language:
/// a purge of one language's tag drops that variant only; the other stays
/// a hit and says so, the purged one is rebuilt and says `stored`.
#[tokio::test]
async fn variants_keep_their_own_tags_and_status() {
    let origin = Origin::default();
    let guard = local_guard().vary([header::ACCEPT_LANGUAGE]);
    let app = app(&origin, guard.clone(), by_language);
    let en: &[(&str, &[u8])] = &[("accept-language", b"en")];
    let fr: &[(&str, &[u8])] = &[("accept-language", b"fr")];
    assert_eq!(send(&app, with("/p", en)).await.text(), "v1");
    assert_eq!(send(&app, with("/p", fr)).await.text(), "v2");
    guard.invalidate_tag("lang:fr").await.unwrap();
    let en_hit = send(&app, with("/p", en)).await;
    assert_eq!(en_hit.text(), "v1");
    assert_eq!(ours(&en_hit).0, "stampede-guard; hit");
    let fr_miss = send(&app, with("/p", fr)).await;
    assert_eq!(fr_miss.text(), "v3");
    assert_eq!(ours(&fr_miss).0, "stampede-guard; fwd=uri-miss; stored");
    no_tag_headers(&fr_miss, "the rebuilt variant");
    let fr_hit = send(&app, with("/p", fr)).await;
    assert_eq!((fr_hit.text().as_str(), origin.calls()), ("v3", 3));
}

fn aged(_: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=600"),
    );
    headers.insert(header::AGE, HeaderValue::from_static("500"));
    headers.insert(header::ETAG, HeaderValue::from_static("\"e\""));
    headers
}

/// The origin's answer is already 500 s old of its 600 (`Age`): a hit's
/// `ttl` is what is left of its freshness, never the whole lifetime (RFC
/// 9211 §2.4, RFC 9111 §4.2).
#[tokio::test]
async fn a_hit_ttl_counts_the_age_the_answer_arrived_with() {
    let origin = Origin::default();
    let guard = local_guard().respect_cache_control(true);
    let app = app(&origin, guard, aged);
    let miss = send(&app, with("/p", &[])).await;
    assert_eq!(ours(&miss).0, "stampede-guard; fwd=uri-miss; stored");
    let hit = send(&app, with("/p", &[])).await;
    assert_eq!(hit.text(), "v1");
    let (member, ttl) = ours(&hit);
    assert_eq!(member, "stampede-guard; hit");
    let ttl = ttl.expect("a ttl");
    assert!(
        (0..=100).contains(&ttl),
        "ttl {ttl} for 100 s of freshness left"
    );
}

/// A conditional request that finds nothing stored goes forward: its `304`
/// is made from the entry its own rebuild stored, and it says so (a miss,
/// `stored`), never `hit`. The next conditional request is the hit.
#[tokio::test]
async fn a_conditional_request_that_missed_is_told_as_a_miss() {
    let origin = Origin::default();
    let app = app(&origin, local_guard().respect_cache_control(true), aged);
    let conditional: &[(&str, &[u8])] = &[("if-none-match", b"\"e\"")];
    let first = send(&app, with("/p", conditional)).await;
    assert_eq!(first.status, StatusCode::NOT_MODIFIED);
    assert_eq!(ours(&first).0, "stampede-guard; fwd=uri-miss; stored");
    let second = send(&app, with("/p", conditional)).await;
    assert_eq!(second.status, StatusCode::NOT_MODIFIED);
    assert_eq!(ours(&second).0, "stampede-guard; hit");
    assert_eq!(origin.calls(), 1);
}

fn learns_encoding(_: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    headers.insert("surrogate-key", HeaderValue::from_static("product:1"));
    headers
}

/// The first answer that teaches the route `Vary: accept-encoding` is not
/// stored (README): it must not say `stored`, must not carry its tags, and
/// whatever it says, the next request agrees with it (a hit only after
/// `stored`).
#[tokio::test]
async fn the_answer_that_teaches_vary_tells_the_truth_about_storing() {
    let origin = Origin::default();
    let app = app(&origin, local_guard(), learns_encoding);
    let gzip: &[(&str, &[u8])] = &[("accept-encoding", b"gzip")];
    let first = send(&app, with("/p", gzip)).await;
    no_tag_headers(&first, "the teaching answer");
    let said_stored = ours(&first).0.ends_with("; stored");
    let second = send(&app, with("/p", gzip)).await;
    let hit = ours(&second).0 == "stampede-guard; hit";
    assert_eq!(
        said_stored,
        hit,
        "the first answer said {:?}, the next was {:?}",
        ours(&first).0,
        ours(&second).0
    );
    no_tag_headers(&second, "the next answer");
}

/// `Cache-Status` across a fleet on Redis: the instance that rebuilt says
/// `stored`; another whose request waited for that rebuild says
/// `collapsed`; a third that finds the entry in Redis says `hit` with the
/// entry's freshness; after a tag purge, the next request is a miss again.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_across_instances_tells_each_way_of_answering() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    let redis = crate::common::redis::RedisServer::start();
    let origin = Origin::default();
    let gate = Arc::new(Semaphore::new(0));
    let mut apps = Vec::new();
    let mut guards = Vec::new();
    for _ in 0..3 {
        let backend =
            crate::common::fleet::backend_at(&redis.url(), crate::common::ROOMY_DEADLINE).await;
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let handler = {
            let (origin, gate) = (origin.clone(), gate.clone());
            move || {
                let (origin, gate) = (origin.clone(), gate.clone());
                async move {
                    let (n, _running) = origin.enter();
                    gate.acquire().await.unwrap().forget();
                    ([("surrogate-key", "product:1")], format!("v{n}"))
                }
            }
        };
        apps.push(Router::new().route("/p", get(handler).layer(guard.clone())));
        guards.push(guard);
    }
    let starter = tokio::spawn({
        let app = apps[0].clone();
        async move { send(&app, with("/p", &[])).await }
    });
    for _ in 0..500 {
        if origin.calls() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(origin.calls(), 1, "the rebuild started");
    let waiter = tokio::spawn({
        let app = apps[1].clone();
        async move { send(&app, with("/p", &[])).await }
    });
    // The waiter is parked on the lease (nothing more reaches the origin).
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.add_permits(100);
    let (starter, waiter) = (starter.await.unwrap(), waiter.await.unwrap());
    assert_eq!((starter.text(), waiter.text()), ("v1".into(), "v1".into()));
    assert_eq!(ours(&starter).0, "stampede-guard; fwd=uri-miss; stored");
    assert_eq!(ours(&waiter).0, "stampede-guard; fwd=uri-miss; collapsed");
    no_tag_headers(&waiter, "the waiter");
    let l2 = send(&apps[2], with("/p", &[])).await;
    let (member, ttl) = ours(&l2);
    assert_eq!(
        (member.as_str(), l2.text().as_str()),
        ("stampede-guard; hit", "v1")
    );
    assert!((0..=60).contains(&ttl.expect("a ttl")));
    no_tag_headers(&l2, "the Redis hit");
    assert_eq!(origin.calls(), 1);
    guards[0].invalidate_tag("product:1").await.unwrap();
    for app in &apps[1..] {
        let after = send(app, with("/p", &[])).await;
        assert_ne!(after.text(), "v1", "{:?}", ours(&after));
    }
}

/// The origin sends its tags as trailer fields of a chunked body: they tag
/// nothing (only header fields do, and a body with trailers is not
/// stored), and no client sees them: not the request that rebuilt, not one
/// passed through (credentials), not an answer that may not be shared
/// (`private`), not the readers of a body over the size cap.
#[tokio::test]
async fn tag_trailers_reach_no_client() {
    use http_body_util::{BodyExt as _, StreamBody};
    let origin = Origin::default();
    let handler = {
        let origin = origin.clone();
        move |request: HeaderMap| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let mut trailers = HeaderMap::new();
                trailers.insert("surrogate-key", HeaderValue::from_static("secret-tag"));
                trailers.insert("cache-tag", HeaderValue::from_static("secret-tag-2"));
                trailers.insert("x-checksum", HeaderValue::from_static("kept"));
                let frames = [
                    Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from(
                        format!("v{n}"),
                    ))),
                    Ok(http_body::Frame::trailers(trailers)),
                ];
                let private = request.contains_key("x-private");
                (
                    [(
                        header::CACHE_CONTROL,
                        if private { "private" } else { "public" },
                    )],
                    axum::body::Body::new(StreamBody::new(tokio_stream::iter(frames))),
                )
            }
        }
    };
    let app = Router::new()
        .route("/t", get(handler.clone()).layer(local_guard()))
        .route("/big", get(handler).layer(local_guard().max_body_bytes(1)));
    type Headers<'a> = &'a [(&'a str, &'a [u8])];
    let cases: &[(&str, Headers)] = &[
        ("/t", &[]),
        ("/t", &[]),
        ("/t", &[("authorization", b"Bearer x")]),
        ("/t", &[("x-private", b"1")]),
        ("/big", &[]),
    ];
    for (uri, headers) in cases {
        let response = tower::ServiceExt::oneshot(app.clone(), with(uri, headers))
            .await
            .unwrap();
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        for name in ["surrogate-key", "cache-tag"] {
            assert!(
                trailers.get(name).is_none(),
                "{uri} {headers:?}: a {name} trailer reached the client"
            );
        }
        assert_eq!(
            trailers.get("x-checksum").map(|v| v.as_bytes()),
            Some(&b"kept"[..]),
            "{uri} {headers:?}: the other trailers are kept"
        );
    }
}
