//! The tiers that hold cached values.

pub(crate) mod local;
#[cfg(feature = "redis")]
pub(crate) mod redis;
