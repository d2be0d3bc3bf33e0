//! The tiers that hold cached values.
//!
//! Nothing here depends on the engine, the HTTP layer or the backend above
//! it: the tiers see keys, bytes and durations, and the layers above decide
//! what those mean.

use std::time::Duration;

pub(crate) mod generations;
pub(crate) mod local;
pub(crate) mod locks;
#[cfg(feature = "redis")]
pub(crate) mod redis;

/// Default L1 bound: 64 MiB of cached values.
///
/// ```
/// use stampede_guard::{Backend, DEFAULT_L1_MAX_BYTES};
///
/// assert_eq!(Backend::local().l1_max_bytes(), DEFAULT_L1_MAX_BYTES);
/// ```
pub const DEFAULT_L1_MAX_BYTES: u64 = 64 << 20;

/// A duration in whole milliseconds, as Redis and the entry codec take it.
/// Saturates rather than wraps: a header may ask for an absurd lifetime.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}
