//! Everything HTTP: the tower layer, its service and response future, and
//! the rules that turn requests into keys and origin responses into entries.
//!
//! [`StampedeGuard`] (layer.rs) holds a route's configuration and builds a
//! [`GuardService`] (service.rs) around the inner service; its
//! [`ResponseFuture`] (future.rs) is a ready response on a hit. A miss goes to
//! the engine, which knows no HTTP: the service hands it an `Origin` to
//! rebuild with, `admit` decides what the origin's response may become, and
//! `respond` presents what comes back.
//!
//! # Map
//!
//! Each file imports only the ones below it in this list.
//!
//! The layer and a request's path, top down:
//! - `layer.rs`: [`StampedeGuard`], every builder method, invalidation by
//!   request, tag or all.
//! - `route_config.rs`: [`RouteConfig`], a route's settings as data.
//! - `service.rs`: [`GuardService`]`::call` (policy, key, one L1 read),
//!   pass-through, unsafe methods, and a miss's answer as a response.
//! - `origin.rs`: `Origin`, the engine's `Rebuild` for the inner service.
//! - `future.rs`: [`ResponseFuture`]: ready on a hit, the inner future on a
//!   pass-through, boxed on a miss.
//! - `revalidate.rs`: asking the origin conditionally, and renewing an entry
//!   from a `304`.
//! - `admit.rs`: an origin answer in four steps: decide, stream the head to
//!   the request that started the rebuild, fill the spool, make the entry.
//! - `unsafe_methods.rs`: what a successful unsafe method invalidates.
//! - `respond.rs`: an entry as a response (`HEAD`, `304`, ranges, `Age`), and
//!   the layer's own answers (a failure, a wait timeout).
//! - `admin.rs`: [`Admin`] (feature `admin`), the operators' router over
//!   the layer's purges and the backend's stats and readiness.
//! - `labels.rs`: a request's metric labels (the route's name, never its
//!   path).
//!
//! A route's policy, split by who reads it:
//! - `policy.rs`: `Policy`, the whole of a route's settings as pieces;
//!   `StoreRules` with `classify` (what may become of an origin answer) and
//!   `admission` (how the cache takes a request: whole, once its content
//!   is discarded, as a protocol switch, or not at all).
//! - `upgrades.rs`: `Upgrades`, what each key's handler did with a protocol
//!   switch (learned from the origin), and `strip_upgrade`.
//! - `flight.rs`: `FlightSettings`, how misses run in the engine, and
//!   [`WaitTimeout`].
//! - `vary.rs`: a response's `Vary` against the key, and the digest that
//!   selects a URL's variants by a `Vary` learned from the response.
//! - `coding.rs`: an entry's content codings and whether a request accepts
//!   them: the implied `Vary` of `Content-Encoding`.
//! - `select.rs`: the keys a request looks under in turn for its variant,
//!   and the rebuild that stamps what it stores.
//! - `key.rs`: `KeySettings`, [`KeyFn`] and what the route learned to key on;
//!   a request's key.
//! - `cache_status.rs`: `Presentation`, `CacheStatus` and `StatusHeaders`
//!   (`x-cache` and the RFC 9211 `Cache-Status` member).
//! - `tags.rs`: `TagRules`, the tags of an entry.
//! - `passes.rs`: `Pass`, why a request or an answer passes the cache, with
//!   its text and its warn-once bit.
//!
//! Bodies and what is stored:
//! - `range.rs`: a range cut from a whole entry.
//! - `response.rs`: `CachedResponse`, what an entry holds, and its wire form.
//! - `body.rs`: [`GuardBody`], the body every response of the layer has.
//! - `spool.rs`: one origin body, filled once and read by many.
//!
//! Leaves:
//! - `rfc/`: parsers of what the RFCs define (`Cache-Control`, structured
//!   fields, URI references, the key's forms of request headers).

#[cfg(feature = "admin")]
mod admin;
mod admit;
mod body;
mod cache_status;
mod coding;
mod flight;
mod future;
pub(crate) mod key;
mod labels;
mod layer;
mod origin;
mod passes;
mod policy;
mod range;
mod respond;
pub(crate) mod response;
mod revalidate;
mod revalidation_window;
mod rfc;
mod route_config;
mod select;
mod service;
mod spool;
mod tags;
mod unsafe_methods;
mod upgrades;
mod vary;

#[doc(inline)]
#[cfg(feature = "admin")]
pub use admin::Admin;
pub use body::{BoxError, GuardBody, SharedBodyError};
#[doc(inline)]
pub use flight::WaitTimeout;
#[doc(inline)]
pub use future::ResponseFuture;
#[doc(inline)]
pub use key::KeyFn;
#[doc(inline)]
pub use layer::StampedeGuard;
pub use route_config::{RefreshAheadConfig, RouteConfig, RouteConfigError};
#[doc(inline)]
pub use service::GuardService;
