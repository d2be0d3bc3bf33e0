//! Tag generations across the fleet: `bump_generation.lua` and
//! `load_generations.lua` as atomic actions, the engine's client-side checks
//! (`TagTable::admits`, `stamp`, `adopt`, `raise`, the reload after a gap),
//! entries that record their tag's generation and the table's epoch, and
//! Redis's faults. One tag (its bucket is the table's one field), 1–2 keys.
//! See docs/MODEL.md, "Tag generations".
//!
//! The per-key lease and commit checks are not part of this model (they are
//! the cache model's, `cache.rs`): every miss rebuilds, and a commit writes
//! the entry. The subscription lease is abstracted as in the doc: an
//! instance whose message was lost lapses (drops its L1, detaches its
//! flights, distrusts its table) at the latest when the invalidator returns.

use stateright::{Model, Property};

/// A variant of the protocol that a check must catch (docs/MODEL.md, "What
/// the checks catch").
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mutation {
    /// `TagTable::admits` ignores the epoch an entry recorded.
    AdmitsIgnoresEpoch,
    /// bump_generation.lua moves the field without the clock
    /// (`HINCRBY` from a lost field: 1).
    BumpWithoutClock,
    /// `TagTable::stamp` stamps a rebuild that saw a generation move.
    StampIgnoresMoves,
    /// load_generations.lua keeps a table that lost its epoch (answers 0,
    /// no new epoch, fields kept).
    LostEpochKept,
    /// `TagTable::adopt` as it was: a new epoch is not counted as a move,
    /// so a rebuild running across it stores under the new epoch.
    EpochNotAMove,
    /// bump_generation.lua as it was: at least the clock, not above the
    /// table's epoch (an epoch ahead of the clock keeps the purge below
    /// what entries recorded).
    BumpBelowEpoch,
    /// `admits_remote` reads the table from Redis only when the entry's
    /// epoch differs, not when the table is distrusted (a gap, a lapse).
    RemoteTrustsALapsedTable,
    /// The table is trusted again once the subscription is back, without
    /// the full reload (`is_loaded` not checked).
    NoReloadAfterAGap,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum TagFault {
    /// Redis restarts with empty memory (every subscription drops).
    Restart,
    /// One key is evicted: the table, or an entry.
    Evict,
    /// Failover to a replica that missed the last write (every
    /// subscription drops).
    Failover,
    /// Redis restarts with empty memory on a host whose clock is behind
    /// every epoch and generation the instances know (every subscription
    /// drops): the next table read starts an epoch at `floor + 1`, ahead of
    /// the clock.
    RestartBehind,
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Tags {
    pub instances: usize,
    pub requests: u8,
    pub keys: u8,
    pub invalidations: u8,
    pub lossy: bool,
    pub faults: Vec<TagFault>,
    pub max_faults: u8,
    pub mutation: Option<Mutation>,
    /// The tag's generation before the run (in Redis and in every
    /// instance's memory); `None`: never purged in this epoch.
    pub initial: Option<u64>,
}

/// An entry (in Redis or an L1): its data version and its stamp.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Entry {
    pub data: u8,
    pub epoch: u64,
    pub generation: u64,
}

/// The table `{prefix}:tags`: `epoch` and the tag's bucket field. Both
/// absent: the key does not exist.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Table {
    pub epoch: Option<u64>,
    pub generation: Option<u64>,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct TagRedis {
    pub table: Table,
    pub entries: Vec<Option<Entry>>,
}

/// Redis's clock after `RestartBehind`: below the initial epoch (50) and
/// generation (60), and every later one (the clock starts at 100).
const CLOCK_BEHIND: u64 = 40;

/// fence.lua's and the tag scripts' `plain`: below 2^53.
fn plain(n: u64) -> bool {
    n < 1 << 53
}

impl TagRedis {
    /// bump_generation.lua: above the old generation, at least the clock,
    /// and above the table's epoch. The script also starts a new epoch
    /// first when the table has none it may keep (`load`'s rule); the model
    /// leaves that out, because that step is a `load` followed at once by
    /// this move, an interleaving the model explores already. (The script's
    /// purge mark is not modelled either: the model has no restore from a
    /// copy.)
    fn bump(&mut self, us: u64, mutation: Option<Mutation>) -> u64 {
        let least = match self.table.epoch {
            Some(e) if plain(e) && e >= us && mutation != Some(Mutation::BumpBelowEpoch) => e + 1,
            _ => us,
        };
        let generation = match self.table.generation {
            _ if mutation == Some(Mutation::BumpWithoutClock) => {
                self.table.generation.unwrap_or(0).saturating_add(1)
            }
            // `old + 1 >= 2^53` (exhausted) is unreachable: generations
            // come from the clock.
            Some(old) if plain(old) && old >= least => old + 1,
            _ => least,
        };
        self.table.generation = Some(generation);
        generation
    }

    /// load_generations.lua with the caller's `floor`: (epoch, the field if
    /// `field`). A table without an epoch, or one behind the floor, starts
    /// a new epoch from the clock (above the floor) with every field
    /// dropped. Returns whether it wrote. (The script's purge mark, which
    /// tells a table restored from an older copy and then moves `all`, is
    /// not modelled: the model has no restore from a copy.)
    fn load(
        &mut self,
        us: u64,
        floor: u64,
        field: bool,
        m: Option<Mutation>,
    ) -> (u64, Option<u64>, bool) {
        let kept = match self.table.epoch {
            Some(e) => plain(e) && e >= floor && e <= us.saturating_add(3_600_000_000),
            None => m == Some(Mutation::LostEpochKept),
        };
        let mut wrote = false;
        if !kept {
            let new = if us <= floor { floor + 1 } else { us };
            self.table = Table {
                epoch: Some(new),
                generation: None,
            };
            wrote = true;
        }
        let epoch = self.table.epoch.unwrap_or(0);
        (
            epoch,
            if field { self.table.generation } else { None },
            wrote,
        )
    }
}

/// A request's steps.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Req {
    Idle,
    /// Read the key's entry from Redis (a fresh hit of `fetch_or_lease`).
    Fetch {
        key: u8,
        floor: u8,
    },
    /// An entry read from Redis, to be admitted (`admits_remote`).
    Check {
        key: u8,
        floor: u8,
        entry: Entry,
    },
    /// A rebuild that read `data` from the origin when it began.
    Learn {
        key: u8,
        data: u8,
        since: u8,
        detached: bool,
    },
    Store {
        key: u8,
        data: u8,
        since: u8,
        detached: bool,
    },
    Commit {
        key: u8,
        entry: Entry,
    },
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Link {
    Ok,
    /// The subscription is gone, unknown to the instance: messages are lost.
    Broken,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct TagInst {
    /// `TagTable`: the epoch, the bucket's generation, `changes`, and the
    /// counts `lost` / `loaded`.
    pub epoch: u64,
    pub generation: u64,
    pub changes: u8,
    pub lost: u8,
    pub loaded: u8,
    pub gap: bool,
    pub link: Link,
    pub l1: Vec<Option<Entry>>,
    /// Generation messages not yet handled.
    pub inbox: Vec<u64>,
    pub req: Req,
    pub left: u8,
    /// Acknowledged (or lapsed) since the invalidation in progress was
    /// published.
    pub answered: bool,
}

impl TagInst {
    fn trusted(&self, m: Option<Mutation>) -> bool {
        (self.loaded >= self.lost || m == Some(Mutation::NoReloadAfterAGap)) && !self.gap
    }

    fn admits(&self, e: &Entry, m: Option<Mutation>) -> bool {
        (e.epoch == self.epoch || m == Some(Mutation::AdmitsIgnoresEpoch))
            && e.generation >= self.generation
    }

    /// `flights.detach_all()`.
    fn detach(&mut self) {
        match &mut self.req {
            Req::Learn { detached, .. } | Req::Store { detached, .. } => *detached = true,
            _ => {}
        }
    }

    /// `TagTable::raise`: counted first, never lowers; a move detaches.
    fn raise(&mut self, generation: u64) {
        if self.generation < generation {
            self.changes = self.changes.saturating_add(1);
            self.generation = generation;
            self.detach();
        }
    }

    /// `apply_to`: a newer epoch drops the L1 and counts as a move
    /// (`TagTable::adopt`); a field at or above the epoch is raised to.
    fn apply(&mut self, epoch: u64, generation: Option<u64>, m: Option<Mutation>) -> bool {
        if self.epoch < epoch {
            if m != Some(Mutation::EpochNotAMove) {
                self.changes = self.changes.saturating_add(1);
                self.detach();
            }
            self.epoch = epoch;
            self.l1.iter_mut().for_each(|e| *e = None);
        }
        match generation {
            Some(g) if g >= epoch => {
                self.raise(g);
                false
            }
            // A field below the epoch: no script writes one (it would be
            // bumped by the caller); reported as reached.
            Some(_) => true,
            None => false,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum InvStep {
    Idle,
    Written,
    Waiting,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct TagState {
    pub redis: TagRedis,
    pub replica: Option<TagRedis>,
    pub us: u64,
    pub insts: Vec<TagInst>,
    pub inv: InvStep,
    pub inv_left: u8,
    pub origin: u8,
    /// Ghost: the data every request starting now must see at least.
    pub floor: u8,
    pub faults: u8,
    pub stale: bool,
    pub below_epoch: bool,
    pub served_after: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum TagAction {
    Begin(usize, u8),
    Step(usize),
    Deliver(usize),
    Lose(usize),
    Lapse(usize),
    Reconnect(usize),
    Reload(usize),
    InvWrite,
    InvRun,
    InvReturn,
    Fault(TagFault, u8),
}

impl TagState {
    /// A script that writes is about to run: the replica keeps the state
    /// before it.
    fn write(&mut self, failover: bool) {
        if failover {
            self.replica = Some(self.redis.clone());
        }
    }

    fn answer(&mut self, i: usize, data: u8, floor: u8, cached: bool) {
        if data < floor {
            self.stale = true;
        }
        if cached && floor > 0 {
            self.served_after = true;
        }
        self.insts[i].req = Req::Idle;
    }
}

impl Tags {
    fn failover(&self) -> bool {
        self.faults.contains(&TagFault::Failover)
    }

    /// The rebuild begins (`tags.start()`) and reads the origin.
    fn rebuild(&self, s: &mut TagState, i: usize, key: u8) {
        let inst = &mut s.insts[i];
        inst.req = Req::Learn {
            key,
            data: s.origin,
            since: inst.changes,
            detached: false,
        };
    }

    /// `load_generations` for `i` (the tag's field or none) and `apply`.
    fn load(&self, s: &mut TagState, i: usize, field: bool) {
        s.us += 1;
        let before = s.redis.clone();
        let (epoch, generation, wrote) = s.redis.load(s.us, s.insts[i].epoch, field, self.mutation);
        if wrote && self.failover() {
            s.replica = Some(before);
        }
        if s.insts[i].apply(epoch, generation, self.mutation) {
            s.below_epoch = true;
        }
    }
}

impl Model for Tags {
    type State = TagState;
    type Action = TagAction;

    fn init_states(&self) -> Vec<TagState> {
        let keys = usize::from(self.keys);
        let inst = TagInst {
            epoch: 50,
            generation: self.initial.unwrap_or(0),
            changes: 0,
            lost: 0,
            loaded: 0,
            gap: false,
            link: Link::Ok,
            l1: vec![None; keys],
            inbox: vec![],
            req: Req::Idle,
            left: self.requests,
            answered: true,
        };
        vec![TagState {
            redis: TagRedis {
                table: Table {
                    epoch: Some(50),
                    generation: self.initial,
                },
                entries: vec![None; keys],
            },
            replica: None,
            us: 100,
            insts: vec![inst; self.instances],
            inv: InvStep::Idle,
            inv_left: self.invalidations,
            origin: 1,
            floor: 0,
            faults: 0,
            stale: false,
            below_epoch: false,
            served_after: false,
        }]
    }

    fn actions(&self, s: &TagState, out: &mut Vec<TagAction>) {
        for (i, inst) in s.insts.iter().enumerate() {
            match inst.req {
                Req::Idle if inst.left > 0 => {
                    for k in 0..self.keys {
                        out.push(TagAction::Begin(i, k));
                    }
                }
                Req::Idle => {}
                _ => out.push(TagAction::Step(i)),
            }
            if !inst.inbox.is_empty() {
                out.push(TagAction::Deliver(i));
                if self.lossy && inst.link == Link::Ok {
                    out.push(TagAction::Lose(i));
                }
            }
            if inst.link == Link::Broken && (!inst.gap || !inst.answered) {
                out.push(TagAction::Lapse(i));
            }
            if inst.gap {
                out.push(TagAction::Reconnect(i));
            } else if inst.loaded < inst.lost {
                out.push(TagAction::Reload(i));
            }
        }
        match s.inv {
            InvStep::Idle if s.inv_left > 0 => out.push(TagAction::InvWrite),
            InvStep::Idle => {}
            InvStep::Written => out.push(TagAction::InvRun),
            InvStep::Waiting => {
                if s.insts.iter().all(|i| i.answered) {
                    out.push(TagAction::InvReturn);
                }
            }
        }
        if s.faults < self.max_faults {
            for f in &self.faults {
                match f {
                    TagFault::Evict => {
                        for w in 0..=self.keys {
                            out.push(TagAction::Fault(*f, w));
                        }
                    }
                    TagFault::Failover if s.replica.is_none() => {}
                    _ => out.push(TagAction::Fault(*f, 0)),
                }
            }
        }
    }

    fn next_state(&self, last: &TagState, action: TagAction) -> Option<TagState> {
        let mut s = last.clone();
        let m = self.mutation;
        match action {
            TagAction::Begin(i, key) => {
                let floor = s.floor;
                let inst = &mut s.insts[i];
                inst.left -= 1;
                match inst.l1[usize::from(key)] {
                    Some(e) if inst.admits(&e, m) => s.answer(i, e.data, floor, true),
                    _ => inst.req = Req::Fetch { key, floor },
                }
            }
            TagAction::Step(i) => match s.insts[i].req.clone() {
                Req::Fetch { key, floor } => match s.redis.entries[usize::from(key)] {
                    Some(entry) => s.insts[i].req = Req::Check { key, floor, entry },
                    None => self.rebuild(&mut s, i, key),
                },
                Req::Check { key, floor, entry } => {
                    let inst = &s.insts[i];
                    let distrusted =
                        !inst.trusted(m) && m != Some(Mutation::RemoteTrustsALapsedTable);
                    if distrusted || entry.epoch != inst.epoch {
                        self.load(&mut s, i, true);
                    }
                    if s.insts[i].admits(&entry, m) {
                        s.answer(i, entry.data, floor, true);
                    } else {
                        self.rebuild(&mut s, i, key);
                    }
                }
                Req::Learn {
                    key,
                    data,
                    since,
                    detached,
                } => {
                    if !s.insts[i].trusted(m) {
                        self.load(&mut s, i, false);
                    }
                    // The load may have detached this flight.
                    let detached =
                        detached || matches!(s.insts[i].req, Req::Learn { detached: true, .. });
                    s.insts[i].req = Req::Store {
                        key,
                        data,
                        since,
                        detached,
                    };
                }
                Req::Store {
                    key,
                    data,
                    since,
                    detached,
                } => {
                    let inst = &mut s.insts[i];
                    let moved = inst.changes != since || detached;
                    if moved && m != Some(Mutation::StampIgnoresMoves) {
                        inst.req = Req::Idle;
                    } else {
                        let entry = Entry {
                            data,
                            epoch: inst.epoch,
                            generation: inst.generation.max(inst.epoch),
                        };
                        inst.l1[usize::from(key)] = Some(entry);
                        inst.req = Req::Commit { key, entry };
                    }
                }
                Req::Commit { key, entry } => {
                    s.us += 1;
                    s.write(self.failover());
                    s.redis.entries[usize::from(key)] = Some(entry);
                    s.insts[i].req = Req::Idle;
                }
                Req::Idle => return None,
            },
            TagAction::Deliver(i) => {
                let inst = &mut s.insts[i];
                let generation = inst.inbox.remove(0);
                inst.raise(generation);
                inst.answered = true;
            }
            TagAction::Lose(i) => {
                let inst = &mut s.insts[i];
                inst.inbox.clear();
                inst.link = Link::Broken;
            }
            TagAction::Lapse(i) => {
                // `invalidate_everything_here`, at the latest a
                // subscription lease after the publish.
                let inst = &mut s.insts[i];
                inst.gap = true;
                inst.inbox.clear();
                inst.l1.iter_mut().for_each(|e| *e = None);
                inst.detach();
                inst.lost = inst.lost.saturating_add(1);
                inst.answered = true;
            }
            TagAction::Reconnect(i) => {
                let inst = &mut s.insts[i];
                inst.gap = false;
                inst.link = Link::Ok;
            }
            TagAction::Reload(i) => {
                let lost = s.insts[i].lost;
                self.load(&mut s, i, true);
                s.insts[i].loaded = lost;
            }
            TagAction::InvWrite => {
                s.origin += 1;
                s.inv = InvStep::Written;
            }
            TagAction::InvRun => {
                s.us += 1;
                s.write(self.failover());
                let generation = s.redis.bump(s.us, m);
                for inst in &mut s.insts {
                    inst.answered = false;
                    if inst.link == Link::Ok {
                        inst.inbox.push(generation);
                    }
                }
                s.inv = InvStep::Waiting;
            }
            TagAction::InvReturn => {
                s.floor = s.origin;
                s.inv_left -= 1;
                s.inv = InvStep::Idle;
            }
            TagAction::Fault(f, w) => {
                s.faults += 1;
                match f {
                    TagFault::Evict if w == 0 => s.redis.table = Table::default(),
                    TagFault::Evict => s.redis.entries[usize::from(w - 1)] = None,
                    TagFault::Restart | TagFault::Failover | TagFault::RestartBehind => {
                        if f == TagFault::RestartBehind {
                            s.us = CLOCK_BEHIND;
                        }
                        s.redis = match f {
                            TagFault::Restart | TagFault::RestartBehind => TagRedis {
                                table: Table::default(),
                                entries: vec![None; usize::from(self.keys)],
                            },
                            _ => s.replica.take()?,
                        };
                        for inst in &mut s.insts {
                            inst.inbox.clear();
                            inst.link = Link::Broken;
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("tag invalidation is a barrier", |_, s: &TagState| !s.stale),
            Property::always("no field below the epoch", |_, s: &TagState| !s.below_epoch),
            Property::sometimes(
                "a cached entry is served after a tag invalidation",
                |_, s: &TagState| s.served_after,
            ),
        ]
    }
}
