//! Fleet-wide protection on a real redis-server: one rebuild per key for
//! K instances, the lease and its deadline, the entry a commit's wake-up
//! carries, fleet failure memory, instances in separate OS processes,
//! Redis failing, slow or gone, and the per-key state left in Redis.

#[path = "../common/mod.rs"]
mod common;

mod attacks_on_outages;
mod attacks_on_slow_links;
mod avalanche;
mod call_faults;
mod carried;
mod carried_forgery;
mod config;
mod driver;
mod error_messages;
mod extreme_settings;
mod failure_backoff;
mod failures;
mod invalidation_faults;
mod join_barrier;
mod key_lifetimes;
mod lease_deadline;
mod model_scripts;
mod outage_grace;
mod outage_visibility;
mod processes;
mod protection;
mod real_faults;
mod redis_down;
mod redis_keys;
mod refresh_ahead;
mod review_faults;
mod shutdown;
mod start_without_redis;
