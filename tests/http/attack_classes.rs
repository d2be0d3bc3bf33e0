//! Attack classes, each on both backends: request headers frameworks honour
//! to rewrite the target or the method, response fields that belong to one
//! client, and two services sharing one backend.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stampede_guard::{Backend, StampedeGuard};

use crate::common::backends::Backends;
use crate::common::driver::counted_app;
use crate::common::server::serve;
use crate::common::{request_with, send, Answer, Origin};

/// Headers of the target-rewrite class, most of them in no list the crate
/// keeps: each is keyed, so an answer built with it is never served for a
/// request without it or with another value, nor the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_rewrites_never_share_an_answer_with_other_requests() {
    let backends = Backends::start();
    let headers = [
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("x-original-uri", "/admin"),
        ("x-forwarded-uri", "/admin"),
        ("x-forwarded-path", "/admin"),
        ("x-envoy-original-path", "/admin"),
        ("x-invoke-path", "/admin"),
        ("x-original-host", "evil.test"),
        ("x-host", "evil.test"),
        ("x-forwarded-server", "evil.test"),
        ("x-forwarded-scheme", "http"),
        ("front-end-https", "off"),
        ("x_original_url", "/admin"),
        ("forwarded", "host=evil.test"),
        ("x-http-host-override", "evil.test"),
        ("x-context-path", "/admin"),
    ];
    for (kind, backend) in backends.each().await {
        for (i, (name, value)) in headers.into_iter().enumerate() {
            let origin = Origin::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
            let at = |q: &str| format!("/report?h={i}&o={q}");
            let case = format!("{kind}: {name}");

            // Plain first: the header's request is not answered from it.
            let plain = send(&app, request_with("GET", &at("p"), &[])).await;
            assert_eq!(plain.text(), "v1", "{case}");
            let with = send(&app, request_with("GET", &at("p"), &[(name, value)])).await;
            assert_eq!(with.text(), "v2", "{case}: served the plain entry");
            let other = send(&app, request_with("GET", &at("p"), &[(name, "/other")])).await;
            assert_eq!(other.text(), "v3", "{case}: served another value's");
            assert_eq!(
                send(&app, request_with("GET", &at("p"), &[])).await.text(),
                "v1",
                "{case}"
            );
            let again = send(&app, request_with("GET", &at("p"), &[(name, value)])).await;
            assert_eq!(again.text(), "v2", "{case}: its own entry");

            // The header's request first: a plain one is not answered from it.
            let with = send(&app, request_with("GET", &at("w"), &[(name, value)])).await;
            assert_eq!(with.text(), "v4", "{case}");
            let plain = send(&app, request_with("GET", &at("w"), &[])).await;
            assert_eq!(plain.text(), "v5", "{case}: plain served the header's");
            assert_eq!(origin.calls(), 5, "{case}");
        }
    }
}

/// Headers that make a framework run another method are never answered
/// from the cache, nor is their answer stored; one naming an unsafe method
/// invalidates the URL as that method would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_overrides_pass_the_cache() {
    let backends = Backends::start();
    let headers = [
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-method",
        "x-forwarded-method",
        "x-rewrite-method",
        "x_http_method_override",
        "x-http-verb",
    ];
    for (kind, backend) in backends.each().await {
        for (i, name) in headers.into_iter().enumerate() {
            let origin = Origin::default();
            let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
            let app = counted_app(&origin, guard, |n| async move { format!("v{n}") });
            let uri = format!("/report?m={i}");
            let case = format!("{kind}: {name}");

            let first = send(&app, request_with("GET", &uri, &[(name, "DELETE")])).await;
            assert_eq!(first.text(), "v1", "{case}");
            assert_eq!(first.x_cache(), "BYPASS", "{case}");
            let plain = send(&app, request_with("GET", &uri, &[])).await;
            assert_eq!(
                plain.text(),
                "v2",
                "{case}: the override's answer was stored"
            );
            let again = send(&app, request_with("GET", &uri, &[(name, "DELETE")])).await;
            assert_eq!(again.text(), "v3", "{case}: answered from the cache");
            // The origin ran a DELETE: the plain entry is gone, as after a
            // real one.
            let after = send(&app, request_with("GET", &uri, &[])).await;
            assert_eq!(after.text(), "v4", "{case}: the entry outlived the DELETE");
            assert_eq!(
                send(&app, request_with("GET", &uri, &[])).await.text(),
                "v4"
            );
            assert_eq!(origin.calls(), 4, "{case}");
        }
    }
}

/// What client `a` and then client `b` are answered, on a route whose
/// origin gives each answer `fields` (`<n>` in a value becomes the call's
/// number).
async fn two_clients(
    guard: StampedeGuard,
    fields: &'static [(&'static str, &'static str)],
    uri: &str,
) -> (Answer, Answer, usize) {
    let origin = Origin::default();
    let app = counted_app(&origin, guard, move |n| async move {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            let value = value.replace("<n>", &n.to_string());
            headers.append(http::HeaderName::from_static(name), value.parse().unwrap());
        }
        (headers, format!("v{n}")).into_response()
    });
    let a = send(&app, request_with("GET", uri, &[("x-client", "a")])).await;
    let b = send(&app, request_with("GET", uri, &[("x-client", "b")])).await;
    (a, b, origin.calls())
}

/// Response fields that belong to the client that asked are never sent to
/// another: each either keeps the answer out of the cache, or is stripped
/// from the stored copy while the first client still gets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_fields_never_reach_another_client() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let guard = || StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
        let mut n = 0;
        let mut uri = || {
            n += 1;
            format!("/report?c={n}")
        };

        // Stripped from the stored copy; the answer is still shared.
        for (route, fields, private) in [
            (
                guard(),
                &[("authentication-info", "nextnonce=\"a<n>\"")][..],
                "authentication-info",
            ),
            (
                guard(),
                &[("proxy-authentication-info", "nextnonce=\"p<n>\"")][..],
                "proxy-authentication-info",
            ),
            (
                guard().cache_private(true),
                &[
                    ("cache-control", "private=\"x-user\", max-age=60"),
                    ("x-user", "user-<n>"),
                ][..],
                "x-user",
            ),
            (
                guard().cache_private(true),
                &[
                    ("cache-control", "no-cache=\"x-user, x-token\""),
                    ("x-user", "user-<n>"),
                    ("x-token", "t<n>"),
                ][..],
                "x-token",
            ),
            // A targeted field lets the answer be stored whatever
            // `Cache-Control` says; the fields it names for one client are
            // still not.
            (
                guard().respect_cache_control(true),
                &[
                    ("cache-control", "no-cache=\"x-user\""),
                    ("cdn-cache-control", "max-age=60"),
                    ("x-user", "user-<n>"),
                ][..],
                "x-user",
            ),
            (
                guard().respect_cache_control(true).cache_private(true),
                &[
                    ("cdn-cache-control", "max-age=60, private=\"x-user\""),
                    ("x-user", "user-<n>"),
                ][..],
                "x-user",
            ),
            (
                guard().strip_set_cookie(true),
                &[("set-cookie2", "s=<n>; Version=1")][..],
                "set-cookie2",
            ),
        ] {
            let (a, b, calls) = two_clients(route, fields, &uri()).await;
            let case = format!("{kind}: {private}");
            assert!(a.headers.get(private).is_some(), "{case}: a lost its own");
            assert_eq!(b.text(), "v1", "{case}: the answer is shared");
            assert_eq!(b.x_cache(), "HIT", "{case}");
            assert!(b.headers.get(private).is_none(), "{case}: {:?}", b.headers);
            assert_eq!(calls, 1, "{case}");
        }

        // Not shared at all by default: a cookie in either spelling.
        for name in ["set-cookie", "set-cookie2"] {
            static FIELDS: [&[(&str, &str)]; 2] = [
                &[("set-cookie", "s=<n>")],
                &[("set-cookie2", "s=<n>; Version=1")],
            ];
            let fields = FIELDS[usize::from(name == "set-cookie2")];
            let (a, b, calls) = two_clients(guard(), fields, &uri()).await;
            let case = format!("{kind}: {name}");
            let own = a.headers.get(name).unwrap().to_str().unwrap();
            assert!(own.starts_with("s=1"), "{case}");
            assert_eq!(b.text(), "v2", "{case}: b was served a's answer");
            assert!(
                b.headers
                    .get(name)
                    .is_none_or(|v| v.to_str().unwrap().starts_with("s=2")),
                "{case}"
            );
            assert_eq!(calls, 2, "{case}");
        }

        // Hop-by-hop: what `Connection` names describes a's connection,
        // and is never stored nor sent on.
        let (a, b, calls) = two_clients(
            guard(),
            &[("connection", "x-hop"), ("x-hop", "a-secret-<n>")],
            &uri(),
        )
        .await;
        assert!(a.headers.get("x-hop").is_none(), "{kind}");
        assert_eq!(b.x_cache(), "HIT", "{kind}");
        assert!(b.headers.get("x-hop").is_none(), "{kind}");
        assert_eq!(calls, 1, "{kind}");
    }
}

/// A response whose only `private` and `no-cache` are qualified (RFC 9111
/// §5.2.2.4, §5.2.2.7) is stored by default without the fields they name:
/// the second client is answered from the entry, without them, after one
/// origin call, while the first keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qualified_private_or_no_cache_stores_the_rest() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let guard = || StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
        let mut n = 0;
        let mut uri = || {
            n += 1;
            format!("/report?q={n}")
        };
        for (route, fields, named) in [
            (
                guard(),
                &[
                    ("cache-control", "no-cache=\"x-user\""),
                    ("x-user", "user-<n>"),
                    ("x-keep", "k"),
                ][..],
                &["x-user"][..],
            ),
            (
                guard().respect_cache_control(true),
                &[
                    ("cache-control", "no-cache=\"x-user, x-token\""),
                    ("x-user", "user-<n>"),
                    ("x-token", "t<n>"),
                    ("x-keep", "k"),
                    ("cache-control", "max-age=3600"),
                ],
                &["x-user", "x-token"],
            ),
            (
                guard(),
                &[
                    ("cache-control", "private=\"x-user\", max-age=60"),
                    ("x-user", "user-<n>"),
                    ("x-keep", "k"),
                ],
                &["x-user"],
            ),
            (
                guard().respect_cache_control(true),
                &[
                    ("cache-control", "PRIVATE=\"X-User\", max-age=60"),
                    ("x-user", "user-<n>"),
                    ("x-keep", "k"),
                ],
                &["x-user"],
            ),
            (
                guard().respect_cache_control(true),
                &[
                    ("cdn-cache-control", "max-age=60, no-cache=\"x-user\""),
                    ("x-user", "user-<n>"),
                    ("x-keep", "k"),
                ],
                &["x-user"],
            ),
        ] {
            let (a, b, calls) = two_clients(route, fields, &uri()).await;
            let case = format!("{kind}: {fields:?}");
            for name in named {
                assert!(a.headers.get(*name).is_some(), "{case}: a lost {name}");
                assert!(b.headers.get(*name).is_none(), "{case}: {:?}", b.headers);
            }
            assert_eq!(b.text(), "v1", "{case}: not stored");
            assert_eq!(b.x_cache(), "HIT", "{case}");
            assert_eq!(b.headers["x-keep"], "k", "{case}");
            assert_eq!(calls, 1, "{case}");
        }

        // Beside the plain form, or a list this cache cannot honour: not
        // stored at all.
        for fields in [
            &[
                ("cache-control", "private=\"x-user\", private"),
                ("x-user", "user-<n>"),
            ][..],
            &[
                ("cache-control", "no-cache=\"x-user\""),
                ("cache-control", "no-cache"),
                ("x-user", "user-<n>"),
            ],
            &[("cache-control", "private=x-user"), ("x-user", "user-<n>")],
            &[("cache-control", "private=\"\""), ("x-user", "user-<n>")],
            &[
                ("cache-control", "no-cache=\"x user\""),
                ("x-user", "user-<n>"),
            ],
            &[
                ("cache-control", "no-cache=\"vary\""),
                ("x-user", "user-<n>"),
            ],
            &[
                ("cache-control", "no-cache=\"content-encoding\""),
                ("x-user", "user-<n>"),
            ],
        ] {
            let (a, b, calls) = two_clients(guard(), fields, &uri()).await;
            let case = format!("{kind}: {fields:?}");
            assert_eq!(a.headers["x-user"], "user-1", "{case}");
            assert_eq!(b.text(), "v2", "{case}: stored");
            assert_eq!(b.headers["x-user"], "user-2", "{case}");
            assert_eq!(calls, 2, "{case}");
        }
    }
}

/// A `304` that renews an entry stored under a qualified `no-cache` does
/// not bring the named field back into it: the entry served after the
/// renewal lacks it, and the body crossed the wire once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_does_not_bring_a_named_field_back() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let origin = Origin::default();
        let renewals = Arc::new(AtomicUsize::new(0));
        let (o, r) = (origin.clone(), renewals.clone());
        let app = Router::new().route(
            "/renewed",
            axum::routing::get(move |headers: HeaderMap| {
                let (origin, renewals) = (o.clone(), r.clone());
                async move {
                    let (n, _running) = origin.enter();
                    let user = format!("user-{n}");
                    let conditional = headers.get("if-none-match").is_some_and(|v| v == "\"c1\"");
                    if conditional {
                        renewals.fetch_add(1, Ordering::SeqCst);
                        // Fresh for an hour from now on: one renewal.
                        let cc = "no-cache=\"x-user\", max-age=3600";
                        let fields = [("cache-control", cc), ("etag", "\"c1\"")];
                        (http::StatusCode::NOT_MODIFIED, fields, [("x-user", user)]).into_response()
                    } else {
                        let cc = "no-cache=\"x-user\", max-age=1";
                        let fields = [("cache-control", cc), ("etag", "\"c1\"")];
                        (fields, [("x-user", user)], "the body").into_response()
                    }
                }
            })
            .layer(
                StampedeGuard::new(backend.clone())
                    .ttl(Duration::from_secs(60))
                    .respect_cache_control(true),
            ),
        );
        let first = send(&app, request_with("GET", "/renewed", &[])).await;
        assert_eq!(first.headers["x-user"], "user-1", "{kind}");
        // Asks until the entry, stale after a second, has been renewed.
        for _ in 0..500 {
            if renewals.load(Ordering::SeqCst) > 0 {
                break;
            }
            let answer = send(&app, request_with("GET", "/renewed", &[])).await;
            assert_eq!(answer.text(), "the body", "{kind}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(renewals.load(Ordering::SeqCst), 1, "{kind}");
        let after = send(&app, request_with("GET", "/renewed", &[])).await;
        assert_eq!(after.text(), "the body", "{kind}");
        assert_eq!(after.x_cache(), "HIT", "{kind}");
        assert!(
            after.headers.get("x-user").is_none(),
            "{kind}: {:?}",
            after.headers
        );
        assert_eq!(origin.calls(), 2, "{kind}: one 200, one 304");
    }
}

/// An answer that varies on a request header keeps its `Vary` in the stored
/// copy whatever `Connection` or a qualified `no-cache` names: stored
/// without it, one client's variant would be served to every other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_keeps_its_vary_whatever_names_it() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        for (i, (name, value)) in [
            ("connection", "vary"),
            ("cache-control", "no-cache=\"vary\""),
            ("cache-control", "private=\"Vary\""),
        ]
        .into_iter()
        .enumerate()
        {
            let origin = Origin::default();
            let o = origin.clone();
            let guard = StampedeGuard::new(backend.clone())
                .ttl(Duration::from_secs(60))
                .cache_private(true);
            let app = Router::new().route(
                "/report",
                axum::routing::get(move |headers: HeaderMap| {
                    let origin = o.clone();
                    async move {
                        origin.enter();
                        let user = headers
                            .get("x-user")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_owned();
                        ([("vary", "x-user"), (name, value)], format!("for {user}"))
                    }
                })
                .layer(guard),
            );
            let uri = format!("/report?v={i}");
            let case = format!("{kind}: {name}: {value}");
            let a = send(&app, request_with("GET", &uri, &[("x-user", "a")])).await;
            assert_eq!(a.text(), "for a", "{case}");
            let b = send(&app, request_with("GET", &uri, &[("x-user", "b")])).await;
            assert_eq!(b.text(), "for b", "{case}: served a's variant");
            let again = send(&app, request_with("GET", &uri, &[("x-user", "a")])).await;
            assert_eq!(again.text(), "for a", "{case}");
            assert!(origin.calls() >= 2, "{case}");
        }
    }
}

/// GETs `path` at `addr` over HTTP/1.1, with `host` as `Host` if given
/// (else the client's own: the address and port).
async fn fetch(addr: SocketAddr, path: &str, host: Option<&str>) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut r = Request::get(format!("http://{addr}{path}"));
    if let Some(host) = host {
        r = r.header(http::header::HOST, host);
    }
    let response = client
        .request(r.body(Body::empty()).unwrap())
        .await
        .expect("answer");
    let body = response.into_body().collect().await.expect("body");
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

/// Two services in one process, each on its own port with its own guard on
/// one shared backend and default settings, both with a `/report`: each
/// only ever answers with its own; and two instances of one service, which
/// clients reach under one host (a load balancer's), still make one origin
/// call per key between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_sharing_a_backend_answer_only_their_own() {
    let backends = Backends::start();
    for (kind, backend) in backends.each().await {
        let (reports, billing) = (Origin::default(), Origin::default());
        let app = |origin: &Origin, name: &'static str, backend: &Backend| {
            counted_app(
                origin,
                StampedeGuard::new(backend.clone()),
                move |n| async move { format!("{name}-{n}") },
            )
        };
        let a = serve(app(&reports, "reports", &backend)).await;
        let b = serve(app(&billing, "billing", &backend)).await;
        for _ in 0..3 {
            assert_eq!(fetch(a, "/report", None).await, "reports-1", "{kind}");
            assert_eq!(fetch(b, "/report", None).await, "billing-1", "{kind}");
        }
        assert_eq!((reports.calls(), billing.calls()), (1, 1), "{kind}");

        // Two instances of one service: each its own backend on the same
        // Redis (one backend in process for the embedded kind).
        #[cfg(feature = "redis")]
        let other = match kind {
            "redis" => backends.instance().await,
            _ => backend.clone(),
        };
        #[cfg(not(feature = "redis"))]
        let other = backend.clone();
        let origin = Origin::default();
        let one = serve(app(&origin, "shop", &backend)).await;
        let two = serve(app(&origin, "shop", &other)).await;
        let host = Some("shop.example");
        assert_eq!(fetch(one, "/report", host).await, "shop-1", "{kind}");
        assert_eq!(fetch(two, "/report", host).await, "shop-1", "{kind}");
        assert_eq!(fetch(one, "/report", host).await, "shop-1", "{kind}");
        assert_eq!(origin.calls(), 1, "{kind}: the instances share the entry");
    }
}
