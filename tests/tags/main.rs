//! Invalidation by tag and of everything: tags from response headers and
//! requests, the tag table and its epoch on Redis, and the barrier across a
//! fleet under forged messages, lost tables, snapshots and stopped
//! processes.

#[path = "../common/mod.rs"]
mod common;

mod barrier;
mod embedded;
mod epoch_ahead;
mod epoch_cost;
mod epoch_foreign_bytes;
mod epoch_race;
mod epoch_snapshot;
mod fleet;
mod forged_generations;
mod namespace_forgery;
mod namespace_names;
mod namespace_races;
mod namespaces;
mod overtaken_rebuilds;
mod stopped_process;
mod table_loss;
mod tag_headers;
