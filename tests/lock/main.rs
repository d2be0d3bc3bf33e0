//! The public lock: mutual exclusion across tasks and processes, fencing,
//! loss reporting, reentrancy, fairness and wake-ups, and the faults
//! (stopped holders, stalled links, open circuits, lost keys) it must
//! survive, a server that may evict a lock's key, and the tombstones of
//! abandoned attempts, which go in time.

#[path = "../common/mod.rs"]
mod common;

mod attacks_on_edges;
mod attacks_on_slow_links;
mod eviction;
mod exclusion;
mod faults;
mod process_faults;
mod tombstones;
