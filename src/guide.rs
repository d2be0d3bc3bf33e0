//! The guide: what a fleet needs from Redis, how the layer behaves on each
//! path, and what happens when Redis fails. Documentation only.
//!
//! - [`topology`]: running on more than one Redis (TLS, ACL users,
//!   Sentinel, Cluster), the Redis settings a fleet needs, what fencing
//!   guarantees and what the layer costs in memory, round trips and
//!   connections.
//! - [`semantics`]: the fleet's lease and wake-ups, the lock, purges and
//!   their barrier, the HTTP rules (keys, Vary, bodies, revalidation) and
//!   the metrics, in detail.
//! - [`failures`]: what a client, the origin and the logs see when Redis is
//!   down at start-up, fails under load, or is cut off from one instance, and
//!   at shutdown.

// The guide's own links between its documents: these definitions come
// first, so they win over the file-relative ones each document ends with
// (which serve a reader of the repository).
macro_rules! guide_links {
    () => {
        "[topology]: crate::guide::topology\n\
         [semantics]: crate::guide::semantics\n\
         [failures]: crate::guide::failures\n"
    };
}

#[cfg_attr(
    any(not(doctest), all(feature = "redis-cluster", feature = "serde")),
    doc = guide_links!(),
    doc = include_str!("../docs/TOPOLOGY.md")
)]
pub mod topology {}

#[cfg_attr(
    any(not(doctest), all(feature = "redis-cluster", feature = "serde")),
    doc = guide_links!(),
    doc = include_str!("../docs/SEMANTICS.md")
)]
pub mod semantics {}

#[cfg_attr(
    any(not(doctest), all(feature = "redis-cluster", feature = "serde")),
    doc = guide_links!(),
    doc = include_str!("../docs/FAILURES.md")
)]
pub mod failures {}
