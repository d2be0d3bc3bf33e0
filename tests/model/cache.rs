//! The fleet's cache protocol for one key: instances with requests, an
//! invalidator, Redis running the scripts atomically, pub/sub with its
//! losses, the subscription lease, and Redis faults. See docs/MODEL.md.

use stateright::{Model, Property};

use super::client::{Inst, Msg};
use super::redis::{Redis, Reply};
use super::Protocol;

/// Lease time (rebuild lease and lock lease), in ticks.
pub const LEASE: u8 = 2;
/// The subscription lease (`StampedeGuard::invalidate`'s wait), in ticks.
pub const SUB_LEASE: u8 = 2;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Fault {
    Restart,
    Evict,
    /// Foreign bytes in the fence hash's `next` or `committed`, or in the
    /// generation.
    Foreign,
    /// Failover to a replica that missed the last write (asynchronous
    /// replication): see "Known limits" in docs/MODEL.md.
    Failover,
}

/// The bounds of one check.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub protocol: Protocol,
    pub instances: usize,
    pub requests: u8,
    pub invalidations: u8,
    /// The faults the environment may inject, and how many in one run.
    pub faults: Vec<Fault>,
    pub max_faults: u8,
    pub max_tick: u8,
    /// Whether pub/sub messages may be lost (a frozen link).
    pub lossy: bool,
    /// Whether processes may die.
    pub deaths: bool,
    /// Whether calls may go unanswered within their deadline.
    pub deadlines: bool,
    /// Whether rebuilds renew their lease (the watchdog).
    pub watchdog: bool,
    /// Whether the subscription is confirmed by pings (the L1 is trusted
    /// only then).
    pub pings: bool,
    /// Whether the key was leased before the run: its fence hash exists.
    pub history: bool,
    /// Whether a rebuild under the lease may fail (the failure marker).
    pub failures: bool,
}

/// The invalidator's steps.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Inv {
    Idle,
    /// The script was sent; its reply not yet taken.
    Sent,
    /// Waiting for `want` acknowledgements until tick `until`.
    Acks {
        want: u8,
        got: u8,
        until: u8,
        floor: u8,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub redis: Redis,
    /// The Redis state before the last script that wrote (the replica that
    /// missed it), kept only when failover is a modelled fault.
    pub replica: Option<Redis>,
    pub us: u64,
    pub now: u8,
    pub insts: Vec<Inst>,
    pub inv: Inv,
    pub inv_left: u8,
    /// Invalidator's call in transit, and whether its reply is pending.
    pub inv_call: bool,
    pub inv_reply: Option<u8>,
    pub inv_acks_in: u8,
    /// The data version at the origin (each invalidation covers one write).
    pub origin: u8,
    /// Ghost: the data version every request starting now must see at least
    /// (raised when an invalidation returns).
    pub floor: u8,
    pub faults: u8,
    pub publishes: u8,
    // Ghost state for the invariants.
    pub issued: u8,
    pub max_fence: u64,
    pub fence_went_back: bool,
    pub overwrote_newer: bool,
    pub stale_answer: bool,
    pub orphan_waited_out: bool,
    /// Ghost: lease tokens whose caller gave up on them or died, and when.
    pub gone: Vec<(u8, u8)>,
    /// Ghost: a commit, release or renew changed a lease of another token.
    pub lapsed_lease_hit: bool,
    /// Ghost: the commit of the lease Redis still held was refused with no
    /// invalidation or fault since the lease was taken.
    pub current_commit_refused: bool,
    /// Ghost: invalidations run so far, and how many had run when each
    /// lease (by issue order) was taken.
    pub inv_runs: u8,
    pub lease_inv: Vec<(u8, (u8, u8))>,
    /// Ghost: a lease was given back without a message to a waiter.
    pub waiter_unwoken: bool,
    /// The lease issue order when the last invalidation ran.
    pub inv_issued: u8,
    /// The tick of the last failure marker written.
    pub last_failure: Option<u8>,
    pub blocked_past_cap: bool,
    pub shared_failure: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// Instance `i` takes its next client step (see `client.rs`).
    Client(usize, super::client::Act),
    /// Redis runs the first call in transit from instance `i`.
    Run(usize),
    InvWrite,
    InvRun,
    InvReply,
    InvDeadline,
    InvAck,
    InvReturn,
    Tick,
    Fault(Fault, u8),
}

impl Fleet {
    pub fn new(protocol: Protocol) -> Self {
        Fleet {
            protocol,
            instances: 2,
            requests: 1,
            invalidations: 1,
            faults: vec![],
            max_faults: 0,
            max_tick: 3,
            lossy: false,
            deaths: false,
            deadlines: false,
            watchdog: false,
            pings: false,
            history: false,
            failures: false,
        }
    }

    fn quiet(&self, s: &State) -> bool {
        // The clock moves only when no call is on its way to Redis: a lease
        // is much longer than a round trip (see "Time" in docs/MODEL.md).
        !s.inv_call && s.insts.iter().all(|i| i.calls.is_empty())
    }
}

impl Model for Fleet {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut redis = Redis::default();
        if self.history {
            redis.fence = Some(super::redis::FenceHash {
                next: Some(50),
                committed: None,
            });
            // Committed before the run: it lasts the value's keep.
            redis.fence_until = Some(super::redis::KEEP);
        }
        vec![State {
            redis,
            replica: None,
            us: 100,
            now: 0,
            insts: (0..self.instances)
                .map(|_| Inst::new(self.requests))
                .collect(),
            inv: Inv::Idle,
            inv_left: self.invalidations,
            inv_call: false,
            inv_reply: None,
            inv_acks_in: 0,
            origin: 1,
            floor: 0,
            faults: 0,
            publishes: 0,
            issued: 0,
            max_fence: 0,
            fence_went_back: false,
            overwrote_newer: false,
            stale_answer: false,
            orphan_waited_out: false,
            gone: vec![],
            lapsed_lease_hit: false,
            current_commit_refused: false,
            inv_runs: 0,
            lease_inv: vec![],
            waiter_unwoken: false,
            inv_issued: 0,
            last_failure: None,
            blocked_past_cap: false,
            shared_failure: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for (i, inst) in s.insts.iter().enumerate() {
            for act in inst.actions(self, s) {
                out.push(Action::Client(i, act));
            }
            if !inst.calls.is_empty() {
                out.push(Action::Run(i));
            }
        }
        match &s.inv {
            Inv::Idle if s.inv_left > 0 => out.push(Action::InvWrite),
            Inv::Sent => {
                if s.inv_call {
                    out.push(Action::InvRun);
                }
                if s.inv_reply.is_some() {
                    out.push(Action::InvReply);
                }
                out.push(Action::InvDeadline);
            }
            Inv::Acks {
                want, got, until, ..
            } => {
                if s.inv_acks_in > 0 {
                    out.push(Action::InvAck);
                }
                if got >= want || s.now >= *until {
                    out.push(Action::InvReturn);
                }
            }
            Inv::Idle => {}
        }
        // Past the bound the clock still runs while only time can help
        // (waiters sleeping out a lease), so that the bound never strands one.
        let only_time =
            s.insts.iter().all(|i| {
                !i.alive || i.done() || matches!(i.step, super::client::Step::Wait { .. })
            }) && matches!(s.inv, Inv::Idle | Inv::Acks { .. });
        let clock =
            s.now < self.max_tick || (only_time && s.now < self.max_tick + LEASE + SUB_LEASE);
        if clock && self.quiet(s) && !self.idle(s) {
            out.push(Action::Tick);
        }
        if s.faults < self.max_faults {
            for fault in &self.faults {
                match fault {
                    Fault::Evict => (0..6).for_each(|k| out.push(Action::Fault(Fault::Evict, k))),
                    Fault::Foreign => {
                        (0..3).for_each(|k| out.push(Action::Fault(Fault::Foreign, k)))
                    }
                    Fault::Failover if s.replica.is_none() => {}
                    f => out.push(Action::Fault(*f, 0)),
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Client(i, act) => super::client::step(self, &mut s, i, act),
            Action::Run(i) => super::client::run(self, &mut s, i),
            Action::InvWrite => {
                s.origin += 1;
                s.inv_left -= 1;
                s.inv = Inv::Sent;
                s.inv_call = true;
            }
            Action::InvRun => {
                s.inv_call = false;
                s.inv_runs += 1;
                self.before_write(&mut s);
                s.redis.invalidate(self.protocol, s.us);
                s.inv_issued = s.issued;
                // PUBLISH: every instance whose subscription is up hears it.
                let mut receivers = 0;
                s.publishes += 1;
                let seq = s.publishes;
                for inst in s.insts.iter_mut() {
                    if inst.subscribed() {
                        inst.inbox.push((seq, Msg::Invalidated));
                        receivers += 1;
                    }
                }
                s.inv_reply = Some(receivers);
            }
            Action::InvReply => {
                let want = s.inv_reply.take().unwrap_or(0);
                let floor = s.origin;
                s.inv = match self.protocol {
                    // Before the barrier, invalidate returned at once.
                    Protocol::Old => {
                        s.floor = s.floor.max(floor);
                        Inv::Idle
                    }
                    Protocol::Current => Inv::Acks {
                        want,
                        got: 0,
                        until: s.now.saturating_add(SUB_LEASE),
                        floor,
                    },
                };
            }
            Action::InvDeadline => {
                // An error to its caller: no barrier is claimed. (The code
                // remembers it as pending and retries; not modelled.)
                s.inv = Inv::Idle;
                s.inv_reply = None;
            }
            Action::InvAck => {
                s.inv_acks_in -= 1;
                if let Inv::Acks { got, .. } = &mut s.inv {
                    *got += 1;
                }
            }
            Action::InvReturn => {
                if let Inv::Acks { floor, .. } = s.inv {
                    s.floor = s.floor.max(floor);
                }
                s.inv = Inv::Idle;
                s.inv_acks_in = 0;
            }
            Action::Tick => {
                s.now += 1;
                if let Some(token) = s.redis.expire(s.now)
                    && s.insts.iter().any(|i| i.gave_up.contains(&token))
                {
                    s.orphan_waited_out = true;
                }
            }
            Action::Fault(fault, k) => {
                s.faults += 1;
                match fault {
                    Fault::Evict => s.redis.evict(k),
                    Fault::Foreign => s.redis.corrupt(k),
                    Fault::Restart => {
                        s.redis = Redis::default();
                        super::client::gap_everywhere(&mut s);
                    }
                    Fault::Failover => {
                        s.redis = s.replica.take()?;
                        super::client::gap_everywhere(&mut s);
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one rebuild per fence", |_, s: &State| {
                let fences: Vec<u64> = s.insts.iter().filter_map(|i| i.rebuild_fence()).collect();
                (0..fences.len()).all(|a| (a + 1..fences.len()).all(|b| fences[a] != fences[b]))
            }),
            Property::always("no overwrite by an older lease", |_, s: &State| {
                !s.overwrote_newer
            }),
            Property::always("fences never decrease", |_, s: &State| !s.fence_went_back),
            Property::always("invalidate is a barrier", |_, s: &State| !s.stale_answer),
            Property::always("orphan lease outlives no lease", |_, s: &State| {
                // A lease whose caller gave up on it or died at `at` runs out
                // by `at` plus one lease (a watchdog of a lapsed holder must
                // not keep it alive).
                let Some((token, until)) = s.redis.lease else {
                    return true;
                };
                s.gone
                    .iter()
                    .find(|(t, _)| *t == token)
                    .is_none_or(|(_, at)| until <= at.saturating_add(LEASE))
            }),
            Property::always("lapsed lease touches no newer lease", |_, s: &State| {
                !s.lapsed_lease_hit
            }),
            Property::always("the current lease's commit is stored", |_, s: &State| {
                !s.current_commit_refused
            }),
            Property::always("a lease given back wakes its waiters", |_, s: &State| {
                !s.waiter_unwoken
            }),
            Property::always("orphan lease released by its holder", |_, s: &State| {
                !s.orphan_waited_out
            }),
            // A failure marker that fetch_or_lease honours was written by
            // the release of a lease issued after the last invalidation.
            Property::always(
                "no failure marker outlives an invalidation",
                |_, s: &State| {
                    s.redis.backoff_left(s.now).is_none()
                        || s.redis.failed.as_ref().is_some_and(|m| m.by > s.inv_issued)
                },
            ),
            // A lease is refused for a failure only within the cap of the
            // last failure: the marker never blocks the key for longer.
            Property::always(
                "a failure blocks the lease at most the cap",
                |_, s: &State| !s.blocked_past_cap,
            ),
            // Not vacuous: with failures on, some request shares one, and a
            // second failure of an episode backs off longer.
            Property::sometimes("a request shares a failure", |m: &Fleet, s: &State| {
                !m.failures || s.shared_failure
            }),
            Property::sometimes("an episode's backoff doubles", |m: &Fleet, s: &State| {
                !m.failures || s.redis.failed.as_ref().is_some_and(|f| f.step >= 2)
            }),
            Property::eventually("every request answered", |_, s: &State| {
                s.insts.iter().all(|i| !i.alive || i.done())
            }),
        ]
    }
}

impl Fleet {
    /// Whether nothing is left to do but let time pass.
    fn idle(&self, s: &State) -> bool {
        matches!(s.inv, Inv::Idle) && s.insts.iter().all(|i| !i.alive || i.done())
    }

    /// Remembers Redis before a write, for the failover fault.
    pub fn before_write(&self, s: &mut State) {
        s.us += 1;
        if self.faults.contains(&Fault::Failover) {
            s.replica = Some(s.redis.clone());
        }
    }

    pub fn redis_reply(&self, s: &mut State, reply: &Reply) {
        if let Reply::Leased { fence, .. } = reply {
            if *fence < s.max_fence {
                s.fence_went_back = true;
            }
            s.max_fence = s.max_fence.max(*fence);
        }
    }
}
