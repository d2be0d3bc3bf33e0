//! One origin call per key: coalescing, stale serving, leader hand-over and
//! refresh-ahead, through both adapters (the HTTP layer and `Cache<V>`), and
//! what a failing or slow origin costs.

#[path = "../common/mod.rs"]
mod common;

mod driver;
mod failures;
mod generic_cache;
mod herd;
mod rebuild_spans;
mod refresh_ahead;
mod refresh_ahead_http;
