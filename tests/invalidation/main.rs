//! Invalidation as a barrier: once `invalidate` returns, no instance serves
//! what it held before. Every `Vary` variant of a URL, acknowledgements and
//! the fleet membership the barrier waits for, and the faults and foreign
//! bytes that must not break it.

#[path = "../common/mod.rs"]
mod common;

mod acks;
mod acks_in_redis;
mod admin;
mod burst_faults;
mod by_url;
mod foreign_bytes;
mod membership;
mod membership_lost;
mod membership_renewal;
mod purge_burst;
mod variant_faults;
mod variants;
mod when_it_takes_effect;
