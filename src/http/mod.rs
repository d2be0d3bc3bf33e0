//! Everything HTTP: the tower layer, its service and response future, and
//! the rules that turn requests into keys and origin responses into entries.
//!
//! [`StampedeGuard`] (layer.rs) holds a route's configuration and builds a
//! [`GuardService`] (service.rs) around the inner service; its
//! [`ResponseFuture`] (future.rs) is a ready response on a hit. A miss goes to
//! the engine, which knows no HTTP: the service hands it an `Origin` to
//! rebuild with, `admit` decides what the origin's response may become, and
//! `respond` presents what comes back.

mod admit;
mod body;
mod cache_status;
mod flight;
mod future;
pub(crate) mod key;
mod labels;
mod layer;
mod passes;
mod policy;
mod range;
mod respond;
pub(crate) mod response;
mod revalidate;
mod rfc;
mod route_config;
mod service;
mod spool;
mod tags;
mod unsafe_methods;
mod vary;

#[doc(inline)]
pub use body::{BoxError, GuardBody, SharedBodyError};
#[doc(inline)]
pub use flight::WaitTimeout;
#[doc(inline)]
pub use future::ResponseFuture;
#[doc(inline)]
pub use key::KeyFn;
#[doc(inline)]
pub use layer::StampedeGuard;
pub use route_config::RouteConfig;
#[doc(inline)]
pub use service::GuardService;
