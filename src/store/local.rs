//! The in-process tier: a `moka` cache bounded in bytes.
//!
//! A slot is either a value or a *hit-for-miss* marker. The marker remembers,
//! for a short while, that this key's answers cannot be shared (a private
//! response, a `Set-Cookie`), so that requests for it go to the origin side by
//! side instead of queueing behind one another for an answer they could never
//! use (the "waiting list serialisation" trap of request-coalescing caches).

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::sync::Cache as Moka;
use moka::Expiry;

use crate::engine::entry::{Entry, ENTRY_OVERHEAD};
use crate::key::Key;

/// What the L1 holds for one key.
#[derive(Clone)]
pub(crate) enum Slot {
    Value(Arc<Entry>),
    /// Until this instant, requests for the key bypass coalescing.
    HitForMiss(Instant),
}

/// Each slot leaves the L1 when its last window closes, so memory is not held
/// by entries nobody may serve.
struct SlotExpiry;

impl SlotExpiry {
    fn remaining(slot: &Slot, now: Instant) -> Option<Duration> {
        let until = match slot {
            Slot::Value(entry) => entry.last_use(),
            Slot::HitForMiss(until) => *until,
        };
        Some(until.saturating_duration_since(now))
    }
}

impl Expiry<Key, Slot> for SlotExpiry {
    fn expire_after_create(&self, _: &Key, slot: &Slot, now: Instant) -> Option<Duration> {
        Self::remaining(slot, now)
    }

    fn expire_after_update(
        &self,
        _: &Key,
        slot: &Slot,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Self::remaining(slot, now)
    }
}

/// The byte-bounded L1.
#[derive(Clone)]
pub(crate) struct LocalTier {
    cache: Moka<Key, Slot>,
    max_bytes: u64,
}

impl LocalTier {
    pub(crate) fn new(max_bytes: u64) -> Self {
        let cache = Moka::builder()
            .max_capacity(max_bytes)
            .weigher(|_: &Key, slot: &Slot| match slot {
                Slot::Value(entry) => entry.weight(),
                Slot::HitForMiss(_) => ENTRY_OVERHEAD as u32,
            })
            .expire_after(SlotExpiry)
            .build();
        LocalTier { cache, max_bytes }
    }

    pub(crate) fn get(&self, key: &Key) -> Option<Slot> {
        self.cache.get(key)
    }

    /// Stores `slot`, unless it alone outweighs the whole bound: moka would
    /// admit it and evict it only at its next housekeeping, letting one huge
    /// value push out every hot entry in the meantime.
    pub(crate) fn insert(&self, key: Key, slot: Slot) {
        if let Slot::Value(entry) = &slot {
            if u64::from(entry.weight()) > self.max_bytes {
                self.cache.invalidate(&key);
                return;
            }
        }
        self.cache.insert(key, slot);
    }

    /// Stores a stale entry found in the shared tier, unless this process
    /// already holds one that is fresher.
    pub(crate) fn insert_unless_newer(&self, key: Key, entry: Arc<Entry>) {
        let newer_here = matches!(
            self.get(&key),
            Some(Slot::Value(current)) if current.fresh_until() >= entry.fresh_until()
        );
        if !newer_here {
            self.insert(key, Slot::Value(entry));
        }
    }

    pub(crate) fn remove(&self, key: &Key) {
        self.cache.invalidate(key);
    }

    /// Bytes held, after applying pending evictions.
    pub(crate) fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }

    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}
