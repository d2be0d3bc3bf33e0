//! The public lock across the fleet: tasks of owner processes acquiring,
//! queueing, renewing and releasing one lock (src/lock.rs,
//! src/store/redis/lock.rs), Redis running the four lock scripts.

use stateright::{Model, Property};

use super::cache::LEASE;
use super::lock_redis::{Acquired, Effects, LockRedis};
use super::Protocol;

/// A waiter's heartbeat now: one tick, refreshed every tick while it waits.
pub const BEAT: u8 = 1;
/// Before the fixes a queue place lasted the waiter's whole wait budget.
pub const OLD_BEAT: u8 = 4;

#[derive(Clone, Debug)]
pub struct Locks {
    pub protocol: Protocol,
    /// The owner of each task: tasks of one owner share its token.
    pub tasks: Vec<u8>,
    pub max_tick: u8,
    pub deaths: bool,
    pub restarts: bool,
    /// Whether acquire calls may go unanswered within their deadline.
    pub deadlines: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum TStep {
    Idle,
    Acquire,
    Queued,
    Held { fence: u64, tenure: u8 },
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Call {
    Acquire,
    Renew { fence: u64, tenure: u8 },
    Release { fence: u64, tenure: u8 },
    Leave,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Task {
    pub step: TStep,
    pub reply: Option<Acquired>,
    pub woken: bool,
    pub tried: u8,
    pub renewed: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LState {
    pub redis: LockRedis,
    pub us: u64,
    pub now: u8,
    pub tasks: Vec<Task>,
    /// Owners whose process died.
    pub dead: Vec<u8>,
    /// Calls on their way to Redis: (task, call), in order.
    pub calls: Vec<(usize, Call)>,
    pub restarted: bool,
    pub tenures: u8,
    pub gave_up: Vec<usize>,
    /// Ghost: the tick each task gave up or died at.
    pub gone_at: Vec<(usize, u8)>,
    // Ghost state for the invariants.
    pub max_fence: u64,
    pub fence_went_back: bool,
    pub stale_guard_hit: bool,
    pub orphan_waited_out: bool,
    pub stalled: u8,
    pub stall_too_long: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum LAction {
    Start(usize),
    Reply(usize),
    Deadline(usize),
    /// The deadline fires and the connection is replaced: the attempt's
    /// bytes, held on the old one, reach Redis after the undo.
    Replaced(usize),
    Retry(usize),
    Watchdog(usize),
    Release(usize),
    /// Redis runs the first call in transit from this owner's process.
    Run(u8),
    Tick,
    Die(u8),
    Restart,
}

impl Locks {
    fn alive(&self, s: &LState, task: usize) -> bool {
        !s.dead.contains(&self.tasks[task])
    }

    fn beat(&self) -> u8 {
        match self.protocol {
            Protocol::Current => BEAT,
            Protocol::Old => OLD_BEAT,
        }
    }

    /// A free lock, and a live waiter in the queue with nobody alive and
    /// still waiting ahead of it.
    fn stalled(&self, s: &LState) -> bool {
        if s.redis.lock.is_some() {
            return false;
        }
        let waiting = |owner: u8| {
            !s.dead.contains(&owner)
                && s.tasks
                    .iter()
                    .enumerate()
                    .any(|(t, task)| self.tasks[t] == owner && task.step == TStep::Queued)
        };
        // The first live waiter in the queue has nobody alive ahead.
        s.redis.queue.iter().any(|&(owner, _)| waiting(owner))
    }

    /// The clock waits for calls on the wire, for replies not yet taken (a
    /// round trip is much shorter than a tick) and for live waiters' timers.
    fn quiet(&self, s: &LState) -> bool {
        s.calls.is_empty()
            && s.tasks.iter().enumerate().all(|(t, task)| {
                !self.alive(s, t)
                    || (task.reply.is_none() && (task.step != TStep::Queued || task.tried >= s.now))
            })
    }
}

impl Model for Locks {
    type State = LState;
    type Action = LAction;

    fn init_states(&self) -> Vec<LState> {
        let task = Task {
            step: TStep::Idle,
            reply: None,
            woken: false,
            tried: 0,
            renewed: 0,
        };
        vec![LState {
            redis: LockRedis::default(),
            us: 100,
            now: 0,
            tasks: vec![task; self.tasks.len()],
            dead: vec![],
            calls: vec![],
            restarted: false,
            tenures: 0,
            gave_up: vec![],
            gone_at: vec![],
            max_fence: 0,
            fence_went_back: false,
            stale_guard_hit: false,
            orphan_waited_out: false,
            stalled: 0,
            stall_too_long: false,
        }]
    }

    fn actions(&self, s: &LState, out: &mut Vec<LAction>) {
        for (t, task) in s.tasks.iter().enumerate() {
            if !self.alive(s, t) {
                continue;
            }
            match &task.step {
                TStep::Idle => out.push(LAction::Start(t)),
                TStep::Acquire => {
                    if task.reply.is_some() {
                        out.push(LAction::Reply(t));
                    }
                    if self.deadlines {
                        out.push(LAction::Deadline(t));
                        if s.calls
                            .iter()
                            .any(|(c, call)| *c == t && *call == Call::Acquire)
                        {
                            out.push(LAction::Replaced(t));
                        }
                    }
                }
                TStep::Queued if task.woken || task.tried < s.now => out.push(LAction::Retry(t)),
                TStep::Held { .. } => {
                    if task.renewed < s.now {
                        out.push(LAction::Watchdog(t));
                    }
                    out.push(LAction::Release(t));
                }
                _ => {}
            }
        }
        let mut senders: Vec<u8> = s.calls.iter().map(|(t, _)| self.tasks[*t]).collect();
        senders.sort();
        senders.dedup();
        out.extend(senders.into_iter().map(LAction::Run));
        let busy = s
            .tasks
            .iter()
            .enumerate()
            .any(|(t, k)| self.alive(s, t) && k.step != TStep::Done);
        // Past its bound the clock still runs while only time can help
        // (live waiters sleeping out a dead holder's lease or a queue place).
        let only_time = out.is_empty();
        if (s.now < self.max_tick || only_time) && self.quiet(s) && busy {
            out.push(LAction::Tick);
        }
        if self.deaths && s.dead.is_empty() {
            let mut owners = self.tasks.clone();
            owners.dedup();
            out.extend(owners.into_iter().map(LAction::Die));
        }
        if self.restarts && !s.restarted {
            out.push(LAction::Restart);
        }
    }

    fn next_state(&self, last: &LState, action: LAction) -> Option<LState> {
        let mut s = last.clone();
        match action {
            LAction::Start(t) => {
                s.tasks[t].step = TStep::Acquire;
                s.tasks[t].tried = s.now;
                s.calls.push((t, Call::Acquire));
            }
            LAction::Reply(t) => {
                let task = &mut s.tasks[t];
                match task.reply.take()? {
                    Acquired::Held { fence, tenure } => {
                        task.step = TStep::Held { fence, tenure };
                        task.renewed = s.now;
                    }
                    Acquired::Wait { .. } => {
                        task.step = TStep::Queued;
                        task.woken = false;
                    }
                }
            }
            LAction::Deadline(t) => {
                // The attempt is abandoned: lock_abandon undoes what it may
                // take. (Before the fixes, leave only dropped the queue place.)
                s.tasks[t].step = TStep::Done;
                s.tasks[t].reply = None;
                s.gave_up.push(t);
                s.gone_at.push((t, s.now));
                s.calls.push((t, Call::Leave));
            }
            LAction::Replaced(t) => {
                s.tasks[t].step = TStep::Done;
                s.tasks[t].reply = None;
                s.gave_up.push(t);
                s.gone_at.push((t, s.now));
                let at = s
                    .calls
                    .iter()
                    .position(|(c, call)| *c == t && *call == Call::Acquire)?;
                let late = s.calls.remove(at);
                s.calls.push((t, Call::Leave));
                s.calls.push(late);
            }
            LAction::Retry(t) => {
                s.tasks[t].step = TStep::Acquire;
                s.tasks[t].tried = s.now;
                s.calls.push((t, Call::Acquire));
            }
            LAction::Watchdog(t) => {
                if let TStep::Held { fence, tenure } = s.tasks[t].step {
                    s.tasks[t].renewed = s.now;
                    s.calls.push((t, Call::Renew { fence, tenure }));
                }
            }
            LAction::Release(t) => {
                if let TStep::Held { fence, tenure } = s.tasks[t].step {
                    s.tasks[t].step = TStep::Done;
                    s.calls.push((t, Call::Release { fence, tenure }));
                }
            }
            LAction::Run(owner) => self.run(&mut s, owner),
            LAction::Tick => {
                if self.stalled(&s) {
                    s.stalled += 1;
                    if s.stalled > BEAT + 1 {
                        s.stall_too_long = true;
                    }
                } else {
                    s.stalled = 0;
                }
                s.now += 1;
                if let Some(hold) = s.redis.expire(s.now) {
                    let orphan = hold
                        .attempts
                        .iter()
                        .any(|a| s.gave_up.contains(&(*a as usize - 1)));
                    if orphan && !s.restarted {
                        s.orphan_waited_out = true;
                    }
                }
            }
            LAction::Die(owner) => {
                s.dead.push(owner);
                for t in 0..self.tasks.len() {
                    if self.tasks[t] == owner && !s.gone_at.iter().any(|(g, _)| *g == t) {
                        s.gone_at.push((t, s.now));
                    }
                }
            }
            LAction::Restart => {
                s.redis = LockRedis::default();
                s.restarted = true;
                for task in s.tasks.iter_mut() {
                    task.woken = true;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("lapsed guard touches no newer hold", |_, s: &LState| {
                !s.stale_guard_hit
            }),
            Property::always("lock fences never decrease", |_, s: &LState| {
                !s.fence_went_back
            }),
            Property::always("abandoned hold released by its holder", |_, s: &LState| {
                !s.orphan_waited_out
            }),
            Property::always("orphan hold outlives no lease", |_, s: &LState| {
                let Some(hold) = &s.redis.lock else {
                    return true;
                };
                // The latest tick a task of the hold gave up or died at, if
                // all of them did.
                let gone = hold.attempts.iter().try_fold(0u8, |latest, a| {
                    let t = usize::from(*a).saturating_sub(1);
                    let at = s.gone_at.iter().find(|(g, _)| *g == t)?.1;
                    Some(latest.max(at))
                });
                match gone {
                    Some(at) => hold.expires <= at.saturating_add(LEASE),
                    None => true,
                }
            }),
            Property::always("free lock taken within a heartbeat", |_, s: &LState| {
                !s.stall_too_long
            }),
            Property::eventually("every waiter answered", |m: &Locks, s: &LState| {
                s.tasks.iter().enumerate().all(|(t, k)| {
                    !m.alive(s, t) || matches!(k.step, TStep::Held { .. } | TStep::Done)
                })
            }),
        ]
    }
}

impl Locks {
    fn run(&self, s: &mut LState, owner: u8) {
        let first = s
            .calls
            .iter()
            .position(|(t, _)| self.tasks[*t] == owner)
            .expect("enabled");
        let (t, call) = s.calls.remove(first);
        s.us += 1;
        let (p, now, token, attempt) = (self.protocol, s.now, self.tasks[t], t as u8 + 1);
        let mut fx = Effects::default();
        match call {
            Call::Acquire => {
                let got = s.redis.acquire(
                    p,
                    s.us,
                    now,
                    token,
                    attempt,
                    self.beat(),
                    LEASE,
                    &mut s.tenures,
                    &mut fx,
                );
                if s.tasks[t].step == TStep::Acquire && self.alive(s, t) {
                    s.tasks[t].reply = Some(got);
                }
            }
            Call::Renew { fence, tenure } => {
                s.redis.renew(p, now, token, fence, LEASE, &mut fx);
                s.stale_guard_hit |= fx.touched.is_some_and(|h| h != tenure);
            }
            Call::Release { fence, tenure } => {
                s.redis.release(p, token, fence, attempt, &mut fx);
                s.stale_guard_hit |= fx.touched.is_some_and(|h| h != tenure);
            }
            Call::Leave => s.redis.leave(p, now, token, attempt, LEASE, &mut fx),
        }
        if let Some(fence) = fx.issued {
            s.fence_went_back |= fence < s.max_fence;
            s.max_fence = s.max_fence.max(fence);
        }
        if fx.published {
            for task in s.tasks.iter_mut() {
                task.woken = true;
            }
        }
    }
}
