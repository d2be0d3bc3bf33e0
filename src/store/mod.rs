//! The tiers that hold cached values.

pub(crate) mod local;
