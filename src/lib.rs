//! # stampede-guard
//!
//! A [tower](https://docs.rs/tower) layer that stops cache stampedes.
//!
//! When a hot cached response expires, every request that arrives before it is
//! rebuilt misses at once, and each runs the same expensive handler: a herd of
//! identical database aggregates or upstream calls, exactly when the origin can
//! least afford it. `stampede-guard` answers hot keys from memory and, on a
//! miss, lets **one** request per key run the handler while the others wait for
//! its answer or are served the stale copy.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use stampede_guard::{Backend, StampedeGuard};
//!
//! async fn report() -> String { "an expensive aggregate".into() }
//! async fn feed() -> String { "something fast-moving".into() }
//!
//! let guard = StampedeGuard::new(Backend::local())   // the embedded backend
//!     .ttl(Duration::from_secs(30))
//!     .stale_while_revalidate(Duration::from_secs(60));
//! let app: Router = Router::new()
//!     .route("/report", get(report).layer(guard.clone()))
//!     .route("/feed", get(feed).layer(guard.clone().ttl(Duration::from_secs(2))));
//! ```
//!
//! ## A request's path
//! 1. **Policy** ([`StampedeGuard`]'s builder): only `GET`/`HEAD` without
//!    credentials are cached unless the route opts in; anything else passes
//!    straight through.
//! 2. **Key**: namespace, method class (HEAD shares GET's entry), host, path,
//!    query sorted by name (the URL, which an invalidation drops whole), then
//!    the target's scheme, the forwarding headers and the route's Vary
//!    headers (the variant), hashed to 128 bits.
//! 3. **L1**: a byte-bounded `moka` cache. Fresh: `HIT`. Past its ttl but inside
//!    stale-while-revalidate: `STALE`, and one background refresh.
//! 4. **Flight**: on a miss the first request starts the rebuild (`MISS`); the
//!    others wait for it (`COALESCED`). The rebuild runs on its own task and
//!    finishes even if that request goes away; if it fails (error, panic,
//!    timeout), every waiter shares the failure or the stale-if-error copy
//!    rather than calling the origin itself. If its answer is meant for the
//!    client that asked (a 403, a 429), the waiters do not get it: one of them
//!    rebuilds. If the key's answers cannot be shared (a private response),
//!    the key is marked hit-for-miss for a moment so its requests run side by
//!    side instead of one after another, until one gets a shareable answer.
//! 5. **Fleet** (with `Backend::redis`): the flight asks Redis, in one round
//!    trip, for the entry or the key's rebuild lease. The lease holder runs the
//!    handler (a watchdog renews the lease; a fencing number guards its
//!    commit); every other instance waits for its publish or serves stale.
//!    A slow or dead Redis costs at most a deadline, then a circuit breaker
//!    keeps the layer on its in-process tier until Redis is back.
//!
//! Responses carry `x-cache`, the RFC 9211 `Cache-Status` header (see
//! [`StampedeGuard::cache_status`]) and `Age`. Counters, histograms and
//! gauges labelled by route and namespace go through the [`metrics`] facade
//! (see [`mod@metrics`] and [`describe_metrics`]); slow paths open `tracing`
//! spans.
//!
//! ## Without HTTP
//! [`Cache`] gives any async value the same protection, on the same backend.
//! A value type is shared across a fleet (one rebuild per key for the fleet)
//! only if its [`CacheValue`] implementation sets `SHARED = true` with
//! `encode` and `decode`, as `Bytes`, `String` and `Vec<u8>` do; any other
//! is rebuilt once per instance.
//!
//! ## The guide
//! [`guide::topology`] says what a fleet needs from Redis (settings, ACL
//! users, Sentinel, Cluster) and what each topology promises;
//! [`guide::semantics`] how the layer behaves on each path, in detail;
//! [`guide::failures`] what happens when Redis fails. [`Lock`]'s page says
//! what the lock guarantees and what it does not.
//!
//! ## Safe by default
//! Never stored or shared unless the route opts in: requests with
//! `Authorization`/`Cookie`, responses with `Set-Cookie`, `private`, `no-store`,
//! `no-cache`, a `Vary` the route does not key on, bodies over the size cap
//! (streamed, never buffered whole). Range and conditional requests never
//! reach the origin in a form whose answer would not fit every waiter.
//!
//! The key is what the client asked for, exactly as the handler sees it: an
//! absolute-form target or HTTP/2 `:authority` replaces `Host` before the
//! handler runs and is the host keyed on; nested axum routers are keyed on
//! the `OriginalUri`; an absolute-form target's scheme is keyed; query pairs
//! are sorted by name only, stably; the forwarding headers frameworks read
//! the host and scheme from are keyed
//! ([`StampedeGuard::forwarded_headers`]); a `GET`/`HEAD`'s content, which
//! has no defined meaning (RFC 9110 §9.3.1), is read and discarded, as
//! Varnish does, so the handler sees the request without it and the request
//! is cached and coalesced like any `GET` (the request body type must be
//! `Unpin`); a protocol switch (`Upgrade` with `Connection: upgrade`)
//! reaches the handler until it answers one for the key as a plain `GET`,
//! after which the key's switches are taken as plain `GET`s for the ttl; and
//! `Accept-Encoding` is keyed in a normalised form once
//! the origin varies on it (see [`StampedeGuard::vary`], which also says
//! where the guard goes relative to a compression layer).
//!
//! ## Cargo features
//! - `redis` (default): the Redis tier (L2, fleet-wide lease, pub/sub
//!   wake-ups), on one server or through Sentinel.
//! - `axum` (default): key nested routes on the URI the client sent, read
//!   from axum's `OriginalUri` request extension.
//! - `redis-tls` (opt-in): `rediss://` URLs. The application installs
//!   rustls's process-wide crypto provider (for example
//!   `rustls::crypto::ring::default_provider().install_default()`) before
//!   connecting; the crate never picks one, and without one connecting fails
//!   with [`ErrorKind::InvalidConfig`].
//! - `redis-cluster` (opt-in): Redis Cluster.
//! - `serde` (opt-in): `Deserialize` for `RedisConfig` and
//!   [`RouteConfig`], durations in human form; `Serialize` for the stats
//!   and the readiness answer.
//! - `admin` (opt-in): `Admin`, an axum router for operators (purges,
//!   stats, readiness), mounted behind the application's own auth.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod backend;
mod cache;
mod engine;
mod error;
mod fence;
pub mod guide;
mod http;
mod key;
mod limits;
mod lock;
pub mod metrics;
mod random;
mod store;

#[cfg(feature = "admin")]
pub use crate::http::Admin;
/// The type [`StampedeGuard::key_fn`] stores its function as. No method
/// takes or returns it (`key_fn` takes any closure), so it is not part of
/// the documented API; kept for code that names it.
#[doc(hidden)]
pub use crate::http::KeyFn;
pub use crate::http::{BoxError, SharedBodyError};
pub use crate::http::{
    GuardBody, GuardService, RefreshAheadConfig, ResponseFuture, RouteConfig, RouteConfigError,
    StampedeGuard, WaitTimeout,
};

/// Another name of [`GuardBody`], for code that names it so.
#[doc(hidden)]
#[deprecated(note = "renamed `GuardBody`, so as not to clash with `axum::body::Body`")]
pub type Body<B> = GuardBody<B>;
pub use crate::metrics::describe_metrics;
pub use backend::{
    Backend, BackendBuilder, BackendStats, Health, ShutdownReport, Status, DEFAULT_L1_MAX_BYTES,
};
#[cfg(feature = "redis")]
pub use backend::{
    Breaker, NodeStats, RedisBackendBuilder, RedisConfig, RedisHealth, RedisStats, TlsFiles,
    DEFAULT_OUTAGE_GRACE,
};
pub use cache::{Cache, RebuildError};
pub use engine::CacheValue;
pub use error::{Error, ErrorKind};
pub use fence::FencingToken;
pub use key::Key;
pub use lock::{Lock, LockError, LockGuard, LockOwner};

/// The README's examples, compiled (and run, unless marked `no_run`) as
/// doc tests. They use the `redis` and `admin` features.
#[cfg(all(doctest, feature = "redis", feature = "admin"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Entry points for the crate's own benchmarks (key building, the entry
/// codec), behind the `bench-internals` feature. Not part of the API: no
/// stability promise.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod __bench {
    pub use crate::bench::{decode_response, encode_response, request_key};
}

/// What [`__bench`] exports, built in every configuration so that a build
/// without the feature checks it too (and the codec it measures is not
/// dead code in a build without Redis).
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
mod bench {
    use std::time::Duration;

    use ::http::{HeaderMap, HeaderName, StatusCode};
    use bytes::Bytes;

    use crate::engine::codec::{self, Envelope};
    use crate::engine::{CacheValue, Lifetime};
    use crate::http::response::CachedResponse;

    /// The key of a request, as the layer computes it on every request.
    pub fn request_key(parts: &::http::request::Parts, vary: &[HeaderName]) -> crate::Key {
        let rules = crate::http::key::KeyRules {
            namespace: "bench",
            guard: 0,
            vary,
            forwarded: &crate::http::key::DEFAULT_FORWARDED,
            accept_encoding: false,
        };
        crate::http::key::request_key(&rules, parts, None)
    }

    /// A response as stored in Redis: envelope + response codec.
    pub fn encode_response(status: StatusCode, headers: HeaderMap, body: Bytes) -> Bytes {
        let response = CachedResponse {
            status,
            headers,
            body: body.into(),
        };
        let envelope = Envelope {
            lifetime: Lifetime {
                ttl: Duration::from_secs(30),
                ..Lifetime::default()
            },
            initial_age: Duration::ZERO,
            rebuild_cost: Duration::from_millis(100),
        };
        let stamp = crate::engine::tags::Stamp::default();
        codec::encode(&envelope, &stamp, &response.encode().unwrap_or_default())
    }

    /// Reads back what [`encode_response`] wrote; the body length, or `None`.
    pub fn decode_response(bytes: Bytes) -> Option<usize> {
        let (_, _, payload) = codec::decode(bytes)?;
        CachedResponse::decode(payload).map(|r| r.body.len())
    }
}
