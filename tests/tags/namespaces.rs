//! A namespace is a service's whole cache world: two services on one
//! backend (one process, or one Redis), each with its own namespace, tag
//! their pages alike, and every purge made through one of them (a tag,
//! everything, a URL, a request, a `Cache`'s key or everything, the admin
//! router's purges) reaches that namespace's entries on every instance and
//! none of the other's. Counted as origin calls.

use std::time::Duration;

use crate::common::{send, Answer, Origin};
use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use http::header::HOST;
use http::Request;
use stampede_guard::{Backend, Cache, StampedeGuard};

/// One service on one instance: `/products/{id}` tagged `product:<id>`
/// and `shared`, and a `Cache` in the same namespace.
struct Service {
    guard: StampedeGuard,
    app: Router,
    cache: Cache<String>,
    origin: Origin,
}

fn service(backend: &Backend, namespace: Option<&str>, origin: &Origin) -> Service {
    let mut guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(60));
    let mut cache = Cache::new(backend.clone()).ttl(Duration::from_secs(60));
    if let Some(namespace) = namespace {
        guard = guard.namespace(namespace);
        cache = cache.namespace(namespace);
    }
    let handler = {
        let origin = origin.clone();
        move |Path(id): Path<u32>| {
            let origin = origin.clone();
            async move {
                let (n, _running) = origin.enter();
                let tags = format!("product:{id} shared");
                ([("surrogate-key", tags)], format!("p{id}-v{n}"))
            }
        }
    };
    let app = Router::new().route("/products/{id}", get(handler).layer(guard.clone()));
    #[cfg(feature = "admin")]
    let app = app.nest("/admin", stampede_guard::Admin::new(guard.clone()).router());
    Service {
        guard,
        app,
        cache,
        origin: origin.clone(),
    }
}

fn page(path: &str) -> Request<Body> {
    Request::get(path)
        .header(HOST, "api.example.com")
        .body(Body::empty())
        .unwrap()
}

async fn product(service: &Service) -> Answer {
    send(&service.app, page("/products/1")).await
}

async fn cached(service: &Service) -> String {
    let origin = service.origin.clone();
    service
        .cache
        .get_or_rebuild("rate", move || async move {
            let (n, _running) = origin.enter();
            Ok::<_, std::io::Error>(format!("rate-v{n}"))
        })
        .await
        .expect("a value")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purge {
    Tag,
    All,
    Url,
    Request,
    CacheKey,
    CacheAll,
    #[cfg(feature = "admin")]
    AdminTag,
    #[cfg(feature = "admin")]
    AdminAll,
    #[cfg(feature = "admin")]
    AdminUrl,
}

impl Purge {
    /// Whether it drops the service's page (`/products/1`), and its cached
    /// value.
    fn drops(self) -> (bool, bool) {
        match self {
            Purge::CacheKey => (false, true),
            Purge::All | Purge::CacheAll => (true, true),
            #[cfg(feature = "admin")]
            Purge::AdminAll => (true, true),
            _ => (true, false),
        }
    }

    async fn run(self, service: &Service) {
        let guard = &service.guard;
        match self {
            Purge::Tag => guard.invalidate_tag("shared").await.unwrap(),
            Purge::All => guard.invalidate_all().await.unwrap(),
            Purge::Url => guard
                .invalidate_url("https://api.example.com/products/1")
                .await
                .unwrap(),
            Purge::Request => guard.invalidate(&page("/products/1")).await.unwrap(),
            Purge::CacheKey => service.cache.invalidate("rate").await.unwrap(),
            Purge::CacheAll => service.cache.invalidate_all().await.unwrap(),
            #[cfg(feature = "admin")]
            Purge::AdminTag => admin(service, "/tag", Some(r#"{"tag": "shared"}"#)).await,
            #[cfg(feature = "admin")]
            Purge::AdminAll => admin(service, "/all", None).await,
            #[cfg(feature = "admin")]
            Purge::AdminUrl => {
                let url = r#"{"url": "https://api.example.com/products/1"}"#;
                admin(service, "/url", Some(url)).await;
            }
        }
    }

    fn every() -> Vec<Purge> {
        let plain = [
            Purge::Tag,
            Purge::All,
            Purge::Url,
            Purge::Request,
            Purge::CacheKey,
            Purge::CacheAll,
        ];
        #[cfg(feature = "admin")]
        let admin = [Purge::AdminTag, Purge::AdminAll, Purge::AdminUrl];
        #[cfg(not(feature = "admin"))]
        let admin: [Purge; 0] = [];
        plain.into_iter().chain(admin).collect()
    }
}

#[cfg(feature = "admin")]
async fn admin(service: &Service, what: &str, body: Option<&str>) {
    let request = Request::post(format!("/admin/purge{what}"));
    let request = match body {
        Some(body) => request
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned())),
        None => request.body(Body::empty()),
    };
    let answer = send(&service.app, request.unwrap()).await;
    assert_eq!(answer.status, http::StatusCode::OK, "{}", answer.text());
}

/// The services of one instance, by namespace: `shop`, `blog`, and one
/// with none.
struct Instance {
    shop: Service,
    blog: Service,
    plain: Service,
}

/// Origins shared by every instance, one per namespace.
#[derive(Default)]
struct Origins {
    shop: Origin,
    blog: Origin,
    plain: Origin,
}

fn instance(backend: &Backend, origins: &Origins) -> Instance {
    Instance {
        shop: service(backend, Some("shop"), &origins.shop),
        blog: service(backend, Some("blog"), &origins.blog),
        plain: service(backend, None, &origins.plain),
    }
}

/// Fills every service's page and value on every instance.
async fn warm(instances: &[Instance]) {
    for instance in instances {
        for service in [&instance.shop, &instance.blog, &instance.plain] {
            product(service).await;
            cached(service).await;
        }
    }
}

/// How many calls a purge through `through` (of the first instance) cost
/// each bystander service, and its own namespace, once every instance asked
/// again: `(own, bystanders)`.
async fn purge_through(
    purge: Purge,
    instances: &[Instance],
    through: fn(&Instance) -> &Service,
    bystanders: fn(&Instance) -> [&Service; 2],
) -> (usize, usize) {
    warm(instances).await;
    let own_origin = &through(&instances[0]).origin;
    let others: Vec<&Origin> = bystanders(&instances[0])
        .iter()
        .map(|s| &s.origin)
        .collect();
    let own_before = own_origin.calls();
    let others_before: usize = others.iter().map(|o| o.calls()).sum();
    purge.run(through(&instances[0])).await;
    for instance in instances {
        let own = through(instance);
        let answer = product(own).await;
        if !purge.drops().0 {
            assert_eq!(answer.x_cache(), "HIT", "{purge:?}: the page is kept");
        }
        cached(own).await;
        for bystander in bystanders(instance) {
            product(bystander).await;
            cached(bystander).await;
        }
    }
    let own = own_origin.calls() - own_before;
    let crossed = others.iter().map(|o| o.calls()).sum::<usize>() - others_before;
    (own, crossed)
}

fn shop(i: &Instance) -> &Service {
    &i.shop
}

fn plain(i: &Instance) -> &Service {
    &i.plain
}

fn not_shop(i: &Instance) -> [&Service; 2] {
    [&i.blog, &i.plain]
}

fn not_plain(i: &Instance) -> [&Service; 2] {
    [&i.shop, &i.blog]
}

/// Every purge kind through `shop`, then through the service with no
/// namespace: each costs its own namespace one call per dropped item for
/// the whole fleet, and the bystanders none.
async fn scoped(instances: &[Instance]) {
    let mut crossed = Vec::new();
    for purge in Purge::every() {
        let (page, value) = purge.drops();
        let expected = usize::from(page) + usize::from(value);
        for (name, through, bystanders) in [
            ("shop", shop as fn(&Instance) -> &Service, not_shop as _),
            ("none", plain as _, not_plain as _),
        ] {
            let (own, others) = purge_through(purge, instances, through, bystanders).await;
            assert_eq!(own, expected, "{purge:?} through {name}: its own namespace");
            if others != 0 {
                crossed.push(format!(
                    "{purge:?} through {name}: {others} calls elsewhere"
                ));
            }
        }
    }
    assert!(
        crossed.is_empty(),
        "purges crossed namespaces: {crossed:#?}"
    );
}

#[tokio::test]
async fn embedded_purges_stay_in_their_namespace() {
    let backend = Backend::local();
    let origins = Origins::default();
    let instances = [instance(&backend, &origins)];
    scoped(&instances).await;
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;
    use crate::common::fleet::backend_at;
    use crate::common::redis::RedisServer;
    use crate::common::tagged::bucket_field;

    /// FNV-1a, as the crate names a namespace in the table.
    fn fnv(namespace: &str) -> u64 {
        namespace.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    #[tokio::test]
    async fn fleet_purges_stay_in_their_namespace_on_every_instance() {
        let redis = RedisServer::start();
        let origins = Origins::default();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let backend = backend_at(&redis.url(), Duration::from_secs(1)).await;
            instances.push(instance(&backend, &origins));
        }
        scoped(&instances).await;
    }

    /// An instance that builds a namespace's first guard after it joined
    /// the fleet has not read that namespace's generations yet: an entry
    /// Redis still holds from before a purge of its tag is not served.
    #[tokio::test]
    async fn a_namespace_built_after_the_join_hears_earlier_purges() {
        let redis = RedisServer::start();
        let origin = Origin::default();
        let first = backend_at(&redis.url(), Duration::from_secs(1)).await;
        let shop = service(&first, Some("shop"), &origin);
        assert_eq!(product(&shop).await.text(), "p1-v1");
        // Stored in Redis as v1; the purge moves the tag's generation and
        // leaves the entry there, void.
        shop.guard.invalidate_tag("shared").await.unwrap();
        // In the namespace's own field of the table; the empty namespace's
        // (the one versions without namespaces read) did not move.
        let bucket = bucket_field("shared");
        let ours = format!("s{:016x}.{bucket}", fnv("shop"));
        assert!(redis
            .raw(&["HGET", "sg:tags", &ours])
            .parse::<u64>()
            .is_ok());
        assert!(redis
            .raw(&["HGET", "sg:tags", &bucket])
            .parse::<u64>()
            .is_err());

        let late = backend_at(&redis.url(), Duration::from_secs(1)).await;
        let plain = service(&late, None, &Origin::default());
        assert_eq!(
            product(&plain).await.x_cache(),
            "MISS",
            "joined and serving"
        );
        let shop_late = service(&late, Some("shop"), &origin);
        let answer = product(&shop_late).await;
        assert_eq!(answer.text(), "p1-v2", "the purged entry is not served");
        assert_eq!(origin.calls(), 2);
        assert_ne!(product(&shop).await.text(), "p1-v1");
    }
}
