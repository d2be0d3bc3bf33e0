//! An entry of one namespace put in Redis where another namespace's entry
//! of the same URL lives (every key of it: value, freshness marker, fence,
//! generation): an instance of the other namespace never serves it. An
//! attacker with write access to Redis could do this; so could a bug that
//! confuses two namespaces' keys.
#![cfg(feature = "redis")]

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::header::HOST;
use http::Request;
use stampede_guard::{Backend, StampedeGuard};

use crate::common::fleet::{backend_at, keys_like};
use crate::common::redis::RedisServer;
use crate::common::{send, Origin};

fn app(backend: &Backend, namespace: &str, origin: &Origin) -> Router {
    let guard = StampedeGuard::new(backend.clone())
        .ttl(Duration::from_secs(600))
        .namespace(namespace);
    let (o, name) = (origin.clone(), namespace.to_owned());
    Router::new().route(
        "/products/1",
        get(move || {
            let (o, name) = (o.clone(), name.clone());
            async move {
                let (n, _running) = o.enter();
                ([("surrogate-key", "shared")], format!("{name}-v{n}"))
            }
        })
        .layer(guard),
    )
}

fn page() -> Request<Body> {
    Request::get("/products/1")
        .header(HOST, "api.example.com")
        .body(Body::empty())
        .unwrap()
}

/// The hash tag (`{…}`) of a key.
fn group(key: &str) -> String {
    let start = key.find('{').expect("a hash tag");
    let end = key.find('}').expect("a hash tag");
    key[start..=end].to_owned()
}

/// Copies every key of group `from` onto group `to` (DUMP and RESTORE,
/// types and bytes as they are).
fn transplant(redis: &RedisServer, from: &str, to: &str) -> usize {
    let script = "local n = 0 \
        for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do \
          local dst = ARGV[3] .. string.sub(k, string.len(ARGV[1]) + 1) \
          local d = redis.call('DUMP', k) \
          redis.call('DEL', dst) \
          redis.call('RESTORE', dst, 0, d) \
          n = n + 1 \
        end \
        return n";
    let reply = redis.raw(&[
        "EVAL",
        script,
        "0",
        &format!("sg:{from}"),
        "",
        &format!("sg:{to}"),
    ]);
    reply
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("{reply}"))
}

/// Measured as the answers of a fresh instance of `blog` after `shop`'s
/// entry took the place of `blog`'s: every answer is `blog`'s own.
#[tokio::test]
async fn another_namespaces_entry_in_its_place_is_never_served() {
    let redis = RedisServer::start();
    let first = backend_at(&redis.url(), Duration::from_secs(1)).await;
    let (shop_origin, blog_origin) = (Origin::default(), Origin::default());
    let shop = app(&first, "shop", &shop_origin);
    assert_eq!(send(&shop, page()).await.text(), "shop-v1");
    let shop_keys = keys_like(&redis, "sg:{*");
    let blog = app(&first, "blog", &blog_origin);
    assert_eq!(send(&blog, page()).await.text(), "blog-v1");
    let blog_keys: Vec<String> = keys_like(&redis, "sg:{*")
        .into_iter()
        .filter(|k| !shop_keys.contains(k))
        .collect();
    // Control: a fresh instance serves blog's own entry from Redis.
    let control = backend_at(&redis.url(), Duration::from_secs(1)).await;
    let control_blog = app(&control, "blog", &blog_origin);
    let answer = send(&control_blog, page()).await;
    assert_eq!(
        (answer.x_cache(), answer.text().as_str()),
        ("HIT", "blog-v1")
    );
    drop(control);
    let (from, to) = (group(&shop_keys[0]), group(&blog_keys[0]));
    assert!(shop_keys.iter().all(|k| group(k) == from), "{shop_keys:?}");
    assert!(blog_keys.iter().all(|k| group(k) == to), "{blog_keys:?}");
    let moved = transplant(&redis, &from, &to);
    assert!(moved >= 2, "{moved} keys moved");

    let mut served = Vec::new();
    for _ in 0..3 {
        let fresh = backend_at(&redis.url(), Duration::from_secs(1)).await;
        let blog = app(&fresh, "blog", &blog_origin);
        let _shop_here = app(&fresh, "shop", &Origin::default());
        let answer = send(&blog, page()).await;
        served.push(answer.text());
    }
    assert!(
        served.iter().all(|text| text.starts_with("blog-")),
        "{served:?}"
    );
}
