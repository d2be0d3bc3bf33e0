//! Redis's side of the cache protocol: the keys of one entry and one atomic
//! action per Lua script, with exactly the script's logic (see the hashes in
//! `scripts.rs`). `Protocol::Old` runs the scripts as they were before the
//! fleet-fault fixes.

use super::Protocol;

/// The value key: `<generation>|<data>`. `by` is ghost state: the issue order of
/// the lease whose commit stored it (0: none).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Stored {
    pub generation: Option<u64>,
    pub data: u8,
    pub by: u8,
}

/// The fence hash `{next, committed}`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct FenceHash {
    pub next: Option<u64>,
    pub committed: Option<u64>,
}

/// The failure marker `<gen>:<code>:<step>` (release.lua), with the tick
/// at which its PX runs out. The model's failures have one code. `by` is
/// ghost state: the issue order of the lease whose release wrote it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Marker {
    pub generation: Option<u64>,
    pub step: u8,
    pub until: u8,
    pub by: u8,
}

/// The first backoff after a failed rebuild, in ticks (`FAILURE_BACKOFF`).
pub const FAIL_BASE: u8 = 1;
/// The longest backoff, and how long a marker outlives its backoff, in
/// ticks (`FAILURE_BACKOFF_CAP`).
pub const FAIL_CAP: u8 = 2;

/// The six keys of one entry (`KEYS[1..6]`), and Redis's clock.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Redis {
    pub value: Option<Stored>,
    pub fresh: bool,
    /// The lease: (token, tick at which its PX runs out).
    pub lease: Option<(u8, u8)>,
    pub fence: Option<FenceHash>,
    pub generation: Option<u64>,
    /// When the fence hash and the generation run out ([`Lifetime`]).
    pub fence_until: Lifetime,
    pub generation_until: Lifetime,
    /// The failure marker (`{base}:x`).
    pub failed: Option<Marker>,
}

/// A key's TTL: `None` when it has none (a key created and not yet given
/// one, or written by a foreign client), else the tick at which its PX runs
/// out; [`KEEP`] is a value's keep, longer than the bounds checked (values
/// do not expire in the model).
pub type Lifetime = Option<u8>;

/// A value's keep: past every bound checked.
pub const KEEP: u8 = u8::MAX;

/// fence.lua `at_least`: PEXPIRE to `until` if the key has no TTL or a
/// shorter one.
fn at_least(lifetime: &mut Lifetime, until: u8) {
    if lifetime.is_none_or(|u| u < until) {
        *lifetime = Some(until);
    }
}

/// What a script answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Reply {
    /// `{1, value}`: a fresh hit, with the value's data.
    Fresh(u8),
    /// `{2, ...}`: the lease, with its fence and generation.
    Leased {
        fence: u64,
        generation: Option<u64>,
        by: u8,
    },
    /// `{3, ...}`: another owner holds the lease until this tick.
    Held(u8),
    /// `{4, ...}`: the last rebuild failed; its backoff runs this many more
    /// ticks.
    Failing(u8),
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

/// Foreign bytes in a number field (`Fault::Foreign`): not plain.
pub const FOREIGN: u64 = u64::MAX;

/// fence.lua `plain`: a number the scripts wrote (below 2^53).
fn plain(n: u64) -> bool {
    n < 1 << 53
}

impl Redis {
    /// fence.lua `seed_fence`: a lost `next`, or foreign bytes in either
    /// field, start both again from the clock (or from `next`, if plain and
    /// above it).
    fn seed_fence(&mut self, us: u64) {
        let hash = self.fence.get_or_insert_with(FenceHash::default);
        let next_plain = hash.next.filter(|n| plain(*n));
        if next_plain.is_none() || hash.committed.is_some_and(|c| !plain(c)) {
            let mut seed = clock(us);
            if let Some(next) = next_plain
                && next > seed
            {
                seed = next;
            }
            hash.next = Some(seed);
            if hash.committed.is_some() {
                hash.committed = Some(seed);
            }
        }
    }

    /// fence.lua `generation`: lost or foreign, it starts again from the
    /// clock (a SET: with no TTL); then it lasts until `until` at least.
    fn generation(&mut self, us: u64, until: u8) -> u64 {
        let g = match self.generation {
            Some(g) if plain(g) => g,
            _ => {
                self.generation = Some(clock(us));
                self.generation_until = None;
                clock(us)
            }
        };
        at_least(&mut self.generation_until, until);
        g
    }

    /// fence.lua `current`: the value if it carries the current generation.
    pub fn current(&self, protocol: Protocol) -> Option<&Stored> {
        let value = self.value.as_ref()?;
        match protocol {
            Protocol::Old => Some(value),
            Protocol::Current => {
                let generation = self.generation?;
                (value.generation == Some(generation)).then_some(value)
            }
        }
    }

    /// HINCRBY fence next 1, as each protocol issues it.
    fn issue(&mut self, protocol: Protocol, us: u64) -> u64 {
        if protocol == Protocol::Current {
            self.seed_fence(us);
        }
        let hash = self.fence.get_or_insert_with(FenceHash::default);
        let next = hash.next.unwrap_or(0).saturating_add(1);
        hash.next = Some(next);
        next
    }

    /// fetch_or_lease.lua's marker check: the backoff left of a marker of
    /// the current generation (the stored generation, `GET KEYS[5]`, not
    /// one seeded now), if its PTTL minus the memory is in `(0, memory]`.
    /// A marker of another generation, or with a TTL no backoff gives, is
    /// ignored.
    pub fn backoff_left(&self, now: u8) -> Option<u8> {
        let marker = self.failed.as_ref()?;
        let pttl = i16::from(marker.until) - i16::from(now);
        let left = pttl - i16::from(FAIL_CAP);
        let ours = marker.generation.is_some() && marker.generation == self.generation;
        (ours && left > 0 && left <= i16::from(FAIL_CAP)).then_some(left as u8)
    }

    /// fetch_or_lease.lua (no early refresh: `ARGV[3]` is -1). `issued` is
    /// the ghost issue order given to a lease taken here. A value too long
    /// for the script's reply is read by a `GET` after it and taken only if
    /// it still carries the generation read here: the same as reading it
    /// here, or, if it is gone, a failed call (both modelled already).
    pub fn fetch_or_lease(
        &mut self,
        protocol: Protocol,
        us: u64,
        now: u8,
        token: u8,
        lease: u8,
    ) -> Reply {
        if let Some(value) = self.current(protocol)
            && self.fresh
        {
            return Reply::Fresh(value.data);
        }
        // The failure marker (the scripts before the fleet-fault fixes had
        // none). The script's second fresh check (an early refresh during an
        // episode) cannot fire with `ARGV[3]` = -1.
        if protocol == Protocol::Current
            && let Some(left) = self.backoff_left(now)
        {
            return Reply::Failing(left);
        }
        if self.lease.is_none() {
            let until = now.saturating_add(lease);
            self.lease = Some((token, until));
            let fence = self.issue(protocol, us);
            let generation = match protocol {
                Protocol::Current => {
                    // The fence hash and the generation last the lease.
                    at_least(&mut self.fence_until, until);
                    Some(self.generation(us, until))
                }
                Protocol::Old => None,
            };
            return Reply::Leased {
                fence,
                generation,
                by: 0,
            };
        }
        // The script also names the holder (its fence, its token's SHA-1),
        // which lets a waiter take the entry its commit's wake-up carries.
        // The model's clients do not take it: a wake-up is followed by a
        // fetch (docs/MODEL.md, "Carried entries").
        Reply::Held(self.lease.map_or(now, |(_, until)| until))
    }

    /// commit.lua: returns (stored, what it published). It reads no
    /// clock: a fence hash it cannot trust refuses the commit.
    pub fn commit(
        &mut self,
        protocol: Protocol,
        token: u8,
        fence: u64,
        generation: Option<u64>,
        data: u8,
        by: u8,
    ) -> (bool, Option<Publish>) {
        let allowed = match protocol {
            Protocol::Current => {
                // A fence hash that is gone or foreign refuses the commit,
                // and nothing is written.
                let hash = self.fence.clone().unwrap_or_default();
                let committed = hash.committed.unwrap_or(0);
                hash.next.is_some_and(|issued| {
                    plain(issued) && plain(committed) && fence >= committed && fence >= issued
                }) && self.generation == generation
            }
            Protocol::Old => {
                let committed = self.fence.as_ref().and_then(|h| h.committed).unwrap_or(0);
                fence >= committed
            }
        };
        if allowed {
            self.value = Some(Stored {
                generation,
                data,
                by,
            });
            self.fresh = true;
            self.fence.get_or_insert_with(FenceHash::default).committed = Some(fence);
            if protocol == Protocol::Current {
                // The fence hash lasts the value's keep, exactly; the
                // generation that at least.
                self.fence_until = Some(KEEP);
                at_least(&mut self.generation_until, KEEP);
                self.failed = None;
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

    /// release.lua. `failure`: the generation the lease was taken under and
    /// (ghost) its issue order, for a rebuild that failed; `None` for a
    /// plain release (ARGV[4] empty). Only the lease's owner token writes a
    /// marker: the step goes on from a marker of the same generation
    /// (`#s <= 2`, capped at 32), else starts at 1; the backoff is none at
    /// step 1, then `min(base * 2^(step-2), cap)`, and the marker's PX that
    /// plus `cap`. (The origin's answer the script keeps beside the marker,
    /// and fetch_or_lease.lua returns with `{4, ...}`, is data the protocol
    /// never decides on: not modelled.)
    pub fn release(&mut self, now: u8, token: u8, failure: Option<(Option<u64>, u8)>) -> bool {
        if self.lease.is_some_and(|(t, _)| t == token) {
            self.lease = None;
            if let Some((generation, by)) = failure {
                let step = match &self.failed {
                    Some(old) if old.generation.is_some() && old.generation == generation => {
                        (old.step + 1).min(32)
                    }
                    _ => 1,
                };
                let backoff = match step {
                    1 => 0,
                    _ => (u32::from(FAIL_BASE) << (step - 2).min(16)).min(u32::from(FAIL_CAP)),
                };
                self.failed = Some(Marker {
                    generation,
                    step,
                    until: now.saturating_add(backoff as u8 + FAIL_CAP),
                    by,
                });
            }
            return true;
        }
        false
    }

    /// renew.lua: the lease, and the fence hash and generation if they are
    /// there, last `lease` more (those two at least).
    pub fn renew(&mut self, protocol: Protocol, now: u8, token: u8, lease: u8) -> bool {
        let until = now.saturating_add(lease);
        match &mut self.lease {
            Some((t, lease_until)) if *t == token => {
                *lease_until = until;
            }
            _ => return false,
        }
        if protocol == Protocol::Current {
            if self.fence.is_some() {
                at_least(&mut self.fence_until, until);
            }
            if self.generation.is_some() {
                at_least(&mut self.generation_until, until);
            }
        }
        true
    }

    /// invalidate.lua (the publish and its receiver count are the caller's).
    pub fn invalidate(&mut self, protocol: Protocol, us: u64) {
        self.value = None;
        self.fresh = false;
        match protocol {
            Protocol::Current => {
                self.failed = None;
                // Creates nothing: a fence hash or generation with a TTL
                // moves (and keeps it); one without, or gone, or a foreign
                // generation, is dropped.
                if self.fence.is_some() && self.fence_until.is_some() {
                    let next = self.issue(protocol, us);
                    self.fence.get_or_insert_with(FenceHash::default).committed = Some(next);
                } else {
                    self.fence = None;
                    self.fence_until = None;
                }
                match self.generation {
                    Some(g) if plain(g) && self.generation_until.is_some() => {
                        self.generation = Some(g + 1);
                    }
                    _ => {
                        self.generation = None;
                        self.generation_until = None;
                    }
                }
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
        if self.failed.as_ref().is_some_and(|m| m.until <= now) {
            self.failed = None;
        }
        if self.fence_until.is_some_and(|u| u <= now) {
            self.fence = None;
            self.fence_until = None;
        }
        if self.generation_until.is_some_and(|u| u <= now) {
            self.generation = None;
            self.generation_until = None;
        }
        match self.lease {
            Some((token, until)) if until <= now => {
                self.lease = None;
                Some(token)
            }
            _ => None,
        }
    }

    /// Foreign bytes written into a number (`which`: the fence hash's
    /// `next`, its `committed`, the generation).
    pub fn corrupt(&mut self, which: u8) {
        match which {
            0 => self.fence.get_or_insert_with(FenceHash::default).next = Some(FOREIGN),
            1 => self.fence.get_or_insert_with(FenceHash::default).committed = Some(FOREIGN),
            _ => {
                // A foreign SET: no TTL.
                self.generation = Some(FOREIGN);
                self.generation_until = None;
            }
        }
    }

    /// Eviction of one key (`which` in 0..6).
    pub fn evict(&mut self, which: u8) {
        match which {
            0 => self.value = None,
            1 => self.fresh = false,
            2 => self.lease = None,
            3 => {
                self.fence = None;
                self.fence_until = None;
            }
            4 => {
                self.generation = None;
                self.generation_until = None;
            }
            _ => self.failed = None,
        }
    }
}
