//! Redis deployments beyond one server: Redis Cluster (slot maps, per-primary
//! health, failovers, replaced nodes), Sentinel (failovers, lying or hung
//! sentinels, synced locks) and TLS with ACL users.

#[path = "../common/mod.rs"]
mod common;

mod attacks_on_edges;
mod cluster;
mod cluster_connections;
mod cluster_failover;
mod cluster_faults;
mod cluster_health;
mod cluster_least_privilege;
mod cluster_odd_shapes;
mod cluster_owed_commits;
mod cluster_promises;
mod cluster_replaced_primary;
mod cluster_stalled_shard;
mod cluster_timeouts;
mod cluster_two_bad_shards;
mod from_client;
mod sentinel;
mod sentinel_auth;
mod sentinel_faults;
mod sentinel_lies;
mod sentinel_promises;
mod sentinel_synced_lock;
mod tls;
mod tls_provider;
