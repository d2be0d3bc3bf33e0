//! Redis's side of the cache protocol: the keys of one entry and one atomic
//! action per Lua script, with exactly the script's logic (see the hashes in
//! `scripts.rs`). `Protocol::Old` runs the scripts as they were before the
//! fleet-fault fixes.

use super::Protocol;

/// The value key: `<gen>|<data>`. `by` is ghost state: the issue order of
/// the lease whose commit stored it (0: none).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Stored {
    pub gen: Option<u64>,
    pub data: u8,
    pub by: u8,
}

/// The fence hash `{next, committed}`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct FenceHash {
    pub next: Option<u64>,
    pub committed: Option<u64>,
}

/// The five keys of one entry (`KEYS[1..5]`), and Redis's clock.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Redis {
    pub value: Option<Stored>,
    pub fresh: bool,
    /// The lease: (token, tick at which its PX runs out).
    pub lease: Option<(u8, u8)>,
    pub fence: Option<FenceHash>,
    pub gen: Option<u64>,
}

/// What a script answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Reply {
    /// `{1, value}`: a fresh hit, with the value's data.
    Fresh(u8),
    /// `{2, ...}`: the lease, with its fence and generation.
    Leased {
        fence: u64,
        gen: Option<u64>,
        by: u8,
    },
    /// `{3, ...}`: another owner holds the lease until this tick.
    Held(u8),
    /// commit's 1 or 0.
    Done(bool),
}

/// The messages a script publishes on the event channel.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Publish {
    Committed,
    Failed,
}

/// `TIME` in microseconds: the model's Redis clock `us` advances by one
/// before every script (a microsecond passes between two scripts; each
/// script adds at most one to a counter).
fn clock(us: u64) -> u64 {
    us
}

impl Redis {
    /// fence.lua `seed_fence`. Numbers the model writes are always plain,
    /// so "foreign bytes" reduce to "gone".
    fn seed_fence(&mut self, us: u64) {
        let hash = self.fence.get_or_insert_with(FenceHash::default);
        if hash.next.is_none() {
            let seed = clock(us);
            hash.next = Some(seed);
            if hash.committed.is_some() {
                hash.committed = Some(seed);
            }
        }
    }

    /// fence.lua `generation` (lifetimes are longer than the bounds
    /// checked, so its PEXPIRE is not modelled).
    fn generation(&mut self, us: u64) -> u64 {
        *self.gen.get_or_insert(clock(us))
    }

    /// fence.lua `current`: the value if it carries the current generation.
    pub fn current(&self, protocol: Protocol) -> Option<&Stored> {
        let value = self.value.as_ref()?;
        match protocol {
            Protocol::Old => Some(value),
            Protocol::Current => {
                let gen = self.gen?;
                (value.gen == Some(gen)).then_some(value)
            }
        }
    }

    /// HINCRBY fence next 1, as each protocol issues it.
    fn issue(&mut self, protocol: Protocol, us: u64) -> u64 {
        if protocol == Protocol::Current {
            self.seed_fence(us);
        }
        let hash = self.fence.get_or_insert_with(FenceHash::default);
        let next = hash.next.unwrap_or(0) + 1;
        hash.next = Some(next);
        next
    }

    /// fetch_or_lease.lua (no early refresh: `ARGV[3]` is -1). `issued` is
    /// the ghost issue order given to a lease taken here.
    pub fn fetch_or_lease(
        &mut self,
        protocol: Protocol,
        us: u64,
        now: u8,
        token: u8,
        lease: u8,
    ) -> Reply {
        if let Some(value) = self.current(protocol) {
            if self.fresh {
                return Reply::Fresh(value.data);
            }
        }
        if self.lease.is_none() {
            self.lease = Some((token, now.saturating_add(lease)));
            let fence = self.issue(protocol, us);
            let gen = match protocol {
                Protocol::Current => Some(self.generation(us)),
                Protocol::Old => None,
            };
            return Reply::Leased { fence, gen, by: 0 };
        }
        Reply::Held(self.lease.map_or(now, |(_, until)| until))
    }

    /// commit.lua: returns (stored, what it published).
    #[allow(clippy::too_many_arguments)]
    pub fn commit(
        &mut self,
        protocol: Protocol,
        us: u64,
        token: u8,
        fence: u64,
        gen: Option<u64>,
        data: u8,
        by: u8,
    ) -> (bool, Option<Publish>) {
        let allowed = match protocol {
            Protocol::Current => {
                self.seed_fence(us);
                let hash = self.fence.clone().unwrap_or_default();
                let committed = hash.committed.unwrap_or(0);
                let issued = hash.next.unwrap_or(0);
                fence >= committed && fence >= issued && self.gen == gen
            }
            Protocol::Old => {
                let committed = self.fence.as_ref().and_then(|h| h.committed).unwrap_or(0);
                fence >= committed
            }
        };
        if allowed {
            self.value = Some(Stored { gen, data, by });
            self.fresh = true;
            self.fence.get_or_insert_with(FenceHash::default).committed = Some(fence);
            if protocol == Protocol::Current {
                self.generation(us);
            }
        }
        let held = self.lease.is_some_and(|(t, _)| t == token);
        if held {
            self.lease = None;
        }
        let published = if allowed {
            Some(Publish::Committed)
        } else if held {
            Some(Publish::Failed)
        } else {
            None
        };
        (allowed, published)
    }

    /// release.lua.
    pub fn release(&mut self, token: u8) -> bool {
        if self.lease.is_some_and(|(t, _)| t == token) {
            self.lease = None;
            return true;
        }
        false
    }

    /// renew.lua.
    pub fn renew(&mut self, now: u8, token: u8, lease: u8) -> bool {
        match &mut self.lease {
            Some((t, until)) if *t == token => {
                *until = now.saturating_add(lease);
                true
            }
            _ => false,
        }
    }

    /// invalidate.lua (the publish and its receiver count are the caller's).
    pub fn invalidate(&mut self, protocol: Protocol, us: u64) {
        self.value = None;
        self.fresh = false;
        match protocol {
            Protocol::Current => {
                let next = self.issue(protocol, us);
                self.fence.get_or_insert_with(FenceHash::default).committed = Some(next);
                let g = self.generation(us);
                self.gen = Some(g + 1);
            }
            Protocol::Old => {
                let hash = self.fence.get_or_insert_with(FenceHash::default);
                hash.committed = Some(hash.next.unwrap_or(0) + 1);
            }
        }
    }

    /// The clock reached `now`: keys whose PX ran out are gone. Returns the
    /// token of a lease that expired.
    pub fn expire(&mut self, now: u8) -> Option<u8> {
        match self.lease {
            Some((token, until)) if until <= now => {
                self.lease = None;
                Some(token)
            }
            _ => None,
        }
    }

    /// Eviction of one key (`which` in 0..5).
    pub fn evict(&mut self, which: u8) {
        match which {
            0 => self.value = None,
            1 => self.fresh = false,
            2 => self.lease = None,
            3 => self.fence = None,
            _ => self.gen = None,
        }
    }
}
