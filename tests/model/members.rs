//! The fleet's membership and the invalidation barrier's wait:
//! `member_renew.lua` and `members.lua` as atomic actions on the sorted set
//! (scores on Redis's clock, the `born` marker, the set's PEXPIRE), renewal
//! only after a confirmed keepalive, the subscription lease, subscriptions
//! Redis drops unannounced, and the set's loss. See docs/MODEL.md,
//! "Membership".
//!
//! Abstracted: an instance's L1 is one data version, filled from the origin
//! while its subscription lease runs and dropped when the lease lapses or a
//! gap is noticed (the cache model checks the L1's rule after a drop and the
//! flights); an acknowledgement reaches the invalidator as soon as the
//! message is handled; the clock of every process is Redis's.

use stateright::{Model, Property};

/// The subscription lease, in ticks (also the members' lease).
pub const LEASE: u8 = 2;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mutation {
    /// The barrier waits only for the instances `PUBLISH` counted (before
    /// the membership).
    NoMembers,
    /// The barrier does not wait out a set younger than a lease.
    NoYoungWait,
    /// members.lua: a set without `born` counts as a lease old (answers 0).
    NoBornIsOld,
    /// The keepalive extends the subscription lease before its renewal
    /// succeeded (the supervisor before the fix).
    ConfirmBeforeRenew,
    /// member_renew.lua scores the member one tick short of the lease the
    /// keepalive trusts (a lease rounded down in the script).
    ScoreShort,
    /// The keepalive's lease counts from the renewal, not from when the
    /// PING was sent (`confirm(Instant::now())`).
    LeaseFromRenewal,
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Members {
    pub instances: usize,
    pub max_tick: u8,
    /// Subscriptions Redis may drop unannounced, and losses of the set.
    pub drops: u8,
    pub losses: u8,
    /// Whether a renewal may fail (best effort: a deadline, a broken
    /// command connection) while the keepalive it follows extended the
    /// subscription lease. Without, it runs before the clock moves on.
    pub renew_failures: bool,
    /// A proposed fix, not in the library: a set younger than a lease
    /// makes the barrier wait a whole lease from the read (not only until
    /// the set is a lease old), covering a renewal still on its way.
    pub young_waits_a_lease: bool,
    /// Whether Redis's clock may jump ahead of the processes' by more than
    /// a lease, once (a replica promoted on a host whose clock is ahead).
    pub clock_jumps: bool,
    pub mutation: Option<Mutation>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Sub {
    Subscribed,
    /// Redis dropped the subscriber; the instance does not know yet.
    Dropped,
    /// The instance saw the gap (its L1 dropped) and subscribes again.
    Gap,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct MInst {
    pub sub: Sub,
    /// `Liveness`: the L1 is trusted while `now < until`.
    pub until: u8,
    /// A keepalive sent at this tick was confirmed; its renewal not yet
    /// run. The subscription lease is extended once the renewal succeeded.
    pub renew_due: Option<u8>,
    pub l1: Option<u8>,
    /// An invalidation message waiting to be handled.
    pub inbox: bool,
    pub acked: bool,
}

/// The sorted set `{prefix}:members` (absent: no scores, no born).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Set {
    pub scores: Vec<Option<u8>>,
    pub born: Option<u8>,
    /// Where its PEXPIRE runs out.
    pub expires: Option<u8>,
}

impl Set {
    fn exists(&self) -> bool {
        self.born.is_some() || self.scores.iter().any(Option::is_some)
    }

    fn gone(&mut self) {
        self.scores.iter_mut().for_each(|s| *s = None);
        self.born = None;
        self.expires = None;
    }

    /// `ZREMRANGEBYSCORE -inf now` (the born marker included).
    fn remove_expired(&mut self, now: u8) {
        for s in &mut self.scores {
            if s.is_some_and(|s| s <= now) {
                *s = None;
            }
        }
        if self.born.is_some_and(|b| b <= now) {
            self.born = None;
        }
    }

    /// member_renew.lua.
    fn renew(&mut self, i: usize, now: u8, m: Option<Mutation>) {
        let born = match self.born {
            Some(b) if b <= now => b,
            _ => now,
        };
        self.remove_expired(now);
        self.scores[i] = Some(match m {
            Some(Mutation::ScoreShort) => now + LEASE - 1,
            _ => now + LEASE,
        });
        self.born = Some(born);
        self.expires = Some(now + 2 * LEASE);
    }

    /// members.lua: (ticks until the set is a lease old, the members).
    fn read(&mut self, now: u8, m: Option<Mutation>) -> (u8, Vec<usize>) {
        let born = self.born.map(|b| b.min(now));
        self.remove_expired(now);
        for s in &mut self.scores {
            if s.is_some_and(|s| s > now + 2 * LEASE) {
                *s = None;
            }
        }
        let mut young = if m == Some(Mutation::NoBornIsOld) {
            0
        } else {
            LEASE
        };
        if let Some(b) = born {
            if self.exists() || self.scores.iter().any(Option::is_some) {
                self.born = Some(b);
            }
            young = (b + LEASE).saturating_sub(now);
        }
        if !self.exists() {
            self.expires = None;
        }
        let members = (0..self.scores.len())
            .filter(|&i| self.scores[i].is_some())
            .collect();
        (young, members)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Inv {
    Idle,
    Written,
    /// Published to `want` subscribers; waits until `until`.
    Published {
        want: u8,
        until: u8,
    },
    Waiting {
        want: u8,
        until: u8,
        members: Vec<usize>,
        grown: u8,
    },
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct MState {
    pub now: u8,
    pub set: Set,
    pub insts: Vec<MInst>,
    pub inv: Inv,
    pub origin: u8,
    pub floor: u8,
    pub drops: u8,
    pub losses: u8,
    /// Ghost: the invalidation returned without every instance's ack.
    pub returned_unacked: bool,
    /// How far Redis's clock is ahead of the processes' (the scores, the
    /// born marker and the set's PEXPIRE are on Redis's).
    pub ahead: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum MAction {
    Fill(usize),
    Ping(usize),
    Renew(usize),
    RenewFails(usize),
    Deliver(usize),
    Drop(usize),
    Notice(usize),
    Resubscribe(usize),
    LoseSet,
    ClockJump,
    InvWrite,
    InvPublish,
    InvMembers,
    InvReturn,
    Tick,
}

impl MState {
    /// An instance trusts its L1 now and holds data older than the floor.
    fn stale(&self) -> bool {
        self.insts
            .iter()
            .any(|i| self.now < i.until && i.l1.is_some_and(|v| v < self.floor))
    }
}

impl Model for Members {
    type State = MState;
    type Action = MAction;

    fn init_states(&self) -> Vec<MState> {
        // Every instance confirmed its subscription and renewed at tick 0.
        let mut set = Set {
            scores: vec![None; self.instances],
            ..Set::default()
        };
        for i in 0..self.instances {
            set.renew(i, 0, None);
        }
        vec![MState {
            now: 0,
            set,
            insts: vec![
                MInst {
                    sub: Sub::Subscribed,
                    until: LEASE,
                    renew_due: None,
                    l1: None,
                    inbox: false,
                    acked: false,
                };
                self.instances
            ],
            inv: Inv::Idle,
            origin: 1,
            floor: 0,
            drops: 0,
            losses: 0,
            returned_unacked: false,
            ahead: 0,
        }]
    }

    fn actions(&self, s: &MState, out: &mut Vec<MAction>) {
        for (i, inst) in s.insts.iter().enumerate() {
            if s.now < inst.until && inst.l1.is_none() {
                out.push(MAction::Fill(i));
            }
            if inst.sub == Sub::Subscribed && !inst.inbox {
                out.push(MAction::Ping(i));
            }
            if inst.renew_due.is_some() {
                out.push(MAction::Renew(i));
                if self.renew_failures {
                    out.push(MAction::RenewFails(i));
                }
            }
            if inst.inbox {
                out.push(MAction::Deliver(i));
            }
            match inst.sub {
                Sub::Subscribed if s.drops < self.drops => out.push(MAction::Drop(i)),
                Sub::Dropped => out.push(MAction::Notice(i)),
                Sub::Gap => out.push(MAction::Resubscribe(i)),
                Sub::Subscribed => {}
            }
        }
        if s.losses < self.losses && s.set.exists() {
            out.push(MAction::LoseSet);
        }
        if self.clock_jumps && s.ahead == 0 {
            out.push(MAction::ClockJump);
        }
        match &s.inv {
            Inv::Idle => out.push(MAction::InvWrite),
            Inv::Written => out.push(MAction::InvPublish),
            Inv::Published { .. } => out.push(MAction::InvMembers),
            Inv::Waiting {
                want,
                until,
                members,
                grown,
            } => {
                let acks = s.insts.iter().filter(|i| i.acked).count() as u8;
                let members_acked = match self.mutation {
                    Some(Mutation::NoMembers) => true,
                    _ => members.iter().all(|&m| s.insts[m].acked),
                };
                let grown = self.mutation == Some(Mutation::NoYoungWait) || s.now >= *grown;
                if grown && ((acks >= *want && members_acked) || s.now >= *until) {
                    out.push(MAction::InvReturn);
                }
            }
            Inv::Done => {}
        }
        // A renewal is on its way to Redis: the clock waits for it (a lease
        // is much longer than a round trip), unless it may fail.
        let renewing = s.insts.iter().any(|i| i.renew_due.is_some());
        if s.now < self.max_tick && (self.renew_failures || !renewing) {
            out.push(MAction::Tick);
        }
    }

    fn next_state(&self, last: &MState, action: MAction) -> Option<MState> {
        let mut s = last.clone();
        match action {
            MAction::Fill(i) => s.insts[i].l1 = Some(s.origin),
            MAction::Ping(i) => {
                // The PONG comes after every message published before the
                // PING: none is waiting.
                let inst = &mut s.insts[i];
                if self.mutation == Some(Mutation::ConfirmBeforeRenew) {
                    inst.until = inst.until.max(s.now + LEASE);
                }
                inst.renew_due = Some(s.now);
            }
            MAction::Renew(i) => {
                let inst = &mut s.insts[i];
                if let Some(sent) = inst.renew_due.take() {
                    let from = match self.mutation {
                        Some(Mutation::LeaseFromRenewal) => s.now,
                        _ => sent,
                    };
                    inst.until = inst.until.max(from + LEASE);
                }
                s.set.renew(i, s.now + s.ahead, self.mutation);
            }
            MAction::RenewFails(i) => s.insts[i].renew_due = None,
            MAction::Deliver(i) => {
                let inst = &mut s.insts[i];
                inst.inbox = false;
                inst.l1 = None;
                inst.acked = true;
            }
            MAction::Drop(i) => {
                s.drops += 1;
                s.insts[i].sub = Sub::Dropped;
                s.insts[i].inbox = false;
            }
            MAction::Notice(i) => {
                // `invalidate_everything_here` (the lease is left to run
                // out: the weaker assumption).
                let inst = &mut s.insts[i];
                inst.sub = Sub::Gap;
                inst.l1 = None;
            }
            MAction::Resubscribe(i) => {
                // Subscribed again after a gap: what was published meanwhile
                // went unheard, the L1 is dropped again.
                s.insts[i].sub = Sub::Subscribed;
                s.insts[i].l1 = None;
            }
            MAction::LoseSet => {
                s.losses += 1;
                s.set.gone();
            }
            MAction::ClockJump => {
                s.ahead = LEASE + 1;
                if s.set.expires.is_some_and(|e| e <= s.now + s.ahead) {
                    s.set.gone();
                }
            }
            MAction::InvWrite => {
                s.origin += 1;
                s.inv = Inv::Written;
            }
            MAction::InvPublish => {
                let mut want = 0;
                for inst in &mut s.insts {
                    if inst.sub == Sub::Subscribed {
                        inst.inbox = true;
                        want += 1;
                    }
                }
                s.inv = Inv::Published {
                    want,
                    until: s.now + LEASE,
                };
            }
            MAction::InvMembers => {
                let Inv::Published { want, until } = s.inv else {
                    return None;
                };
                let (young, members) = s.set.read(s.now + s.ahead, self.mutation);
                s.inv = Inv::Waiting {
                    want,
                    until,
                    members,
                    grown: match young {
                        0 => s.now,
                        _ if self.young_waits_a_lease => s.now + LEASE,
                        y => s.now + y.min(LEASE),
                    },
                };
            }
            MAction::InvReturn => {
                s.floor = s.origin;
                s.returned_unacked = s.insts.iter().any(|i| !i.acked);
                s.inv = Inv::Done;
            }
            MAction::Tick => {
                s.now += 1;
                if s.set.expires.is_some_and(|e| e <= s.now + s.ahead) {
                    s.set.gone();
                }
                for inst in &mut s.insts {
                    // `must_drop`: the lease lapsed, the L1 goes.
                    if inst.until <= s.now {
                        inst.l1 = None;
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "invalidate is a barrier with membership",
                |_, s: &MState| !s.stale(),
            ),
            Property::sometimes(
                "an invalidation returns without every instance's ack",
                |_, s: &MState| s.returned_unacked,
            ),
            Property::sometimes(
                "an instance serves its L1 after the invalidation returned",
                |_, s: &MState| {
                    s.inv == Inv::Done
                        && s.insts
                            .iter()
                            .any(|i| s.now < i.until && i.l1 == Some(s.origin))
                },
            ),
        ]
    }
}
