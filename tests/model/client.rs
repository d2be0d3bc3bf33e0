//! One instance of the fleet, as the code behaves (src/engine/fleet.rs,
//! src/store/redis/{entries,notify,barrier,supervisor}.rs): its requests,
//! its calls to Redis with their deadlines, its subscription and its L1.

use super::cache::{Fleet, Inv, State, LEASE, SUB_LEASE};
use super::redis::{Publish, Reply, Stored, FAIL_CAP};

use super::Protocol;

/// A message on the event channel.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Msg {
    Committed,
    Failed,
    Invalidated,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Call {
    Fetch {
        token: u8,
    },
    Commit {
        token: u8,
        fence: u64,
        generation: Option<u64>,
        data: u8,
        by: u8,
    },
    /// release.lua; `failure`: the lease's generation and (ghost) issue
    /// order, when its rebuild failed (the marker is written).
    Release {
        token: u8,
        failure: Option<(Option<u64>, u8)>,
    },
    Renew {
        token: u8,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Step {
    Idle,
    /// fetch_or_lease sent, its reply awaited.
    Fetch {
        token: u8,
    },
    /// Another instance holds the lease until `until`: wait for its publish.
    Wait {
        until: u8,
    },
    /// Rebuilding, under a lease (`lease`: token, fence, generation, ghost
    /// issue order) or without one (Redis did not answer in time).
    Rebuild {
        lease: Option<(u8, u64, Option<u64>, u8)>,
    },
    /// commit sent, its reply awaited.
    Commit {
        token: u8,
        data: u8,
    },
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Act {
    Request,
    Reply,
    Deadline,
    Retry,
    Build,
    /// The origin fails the rebuild under the lease: release with the
    /// failure, answer the request with it.
    Fail,
    Watchdog,
    Deliver,
    Lose,
    Reconnect,
    Ping,
    Pong,
    Ack,
    Die,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Inst {
    pub alive: bool,
    pub left: u8,
    pub step: Step,
    /// The L1 copy of the key: its data version.
    pub l1: Option<u8>,
    /// The running flight was detached by an invalidation: it may not store.
    pub detached: bool,
    /// The data version the current request must see (ghost).
    pub floor: u8,
    /// Liveness (barrier.rs), in ticks: confirmed until; last drop plus one.
    pub until: u8,
    pub dropped: u8,
    /// The subscriber link is frozen: messages are not delivered.
    pub frozen: bool,
    pub inbox: Vec<(u8, Msg)>,
    /// Calls on their way to Redis, in order (one multiplexed connection).
    pub calls: Vec<Call>,
    pub reply: Option<Reply>,
    pub ping: Option<(u8, u8)>,
    pub acks_out: u8,
    pub woken: bool,
    pub renewed: u8,
    pub tokens: u8,
    /// Ghost: lease tokens whose call this instance gave up on.
    pub gave_up: Vec<u8>,
}

impl Inst {
    pub fn new(requests: u8) -> Self {
        Inst {
            alive: true,
            left: requests,
            step: Step::Idle,
            l1: None,
            detached: false,
            floor: 0,
            until: 0,
            dropped: 0,
            frozen: false,
            inbox: vec![],
            calls: vec![],
            reply: None,
            ping: None,
            acks_out: 0,
            woken: false,
            renewed: 0,
            tokens: 0,
            gave_up: vec![],
        }
    }

    pub fn done(&self) -> bool {
        self.step == Step::Idle && self.left == 0
    }

    /// Whether PUBLISH counts this instance (a frozen link still does).
    pub fn subscribed(&self) -> bool {
        self.alive
    }

    /// The fence of the rebuild this instance runs under a lease.
    pub fn rebuild_fence(&self) -> Option<u64> {
        match &self.step {
            Step::Rebuild {
                lease: Some((_, fence, _, _)),
                ..
            } => Some(*fence),
            _ => None,
        }
    }

    fn awaiting(&self) -> bool {
        matches!(self.step, Step::Fetch { .. } | Step::Commit { .. })
    }

    pub fn actions(&self, fleet: &Fleet, s: &State) -> Vec<Act> {
        let mut out = vec![];
        if !self.alive {
            return out;
        }
        match &self.step {
            Step::Idle if self.left > 0 => out.push(Act::Request),
            Step::Wait { until } if self.woken || s.now >= *until => out.push(Act::Retry),
            Step::Rebuild { lease, .. } => {
                out.push(Act::Build);
                if fleet.failures && lease.is_some() {
                    out.push(Act::Fail);
                }
                if fleet.watchdog && lease.is_some() && self.renewed < s.now {
                    out.push(Act::Watchdog);
                }
            }
            _ => {}
        }
        if self.awaiting() {
            if self.reply.is_some() {
                out.push(Act::Reply);
            }
            if fleet.deadlines {
                out.push(Act::Deadline);
            }
        }
        if !self.frozen && !self.inbox.is_empty() {
            out.push(Act::Deliver);
            if fleet.lossy {
                out.push(Act::Lose);
            }
        }
        if self.frozen {
            out.push(Act::Reconnect);
        }
        if fleet.protocol == Protocol::Current && fleet.pings && !self.frozen {
            match self.ping {
                // A ping once the lease lapsed (earlier pings only confirm sooner).
                None if self.until <= s.now => out.push(Act::Ping),
                Some((_, seq)) if self.inbox.iter().all(|(m, _)| *m > seq) => out.push(Act::Pong),
                _ => {}
            }
        }
        if self.acks_out > 0 {
            out.push(Act::Ack);
        }
        if fleet.deaths && s.insts.iter().all(|i| i.alive) {
            out.push(Act::Die);
        }
        out
    }

    /// barrier.rs `Liveness::must_drop`, in ticks.
    fn must_drop(&mut self, now: u8) -> bool {
        if now < self.until {
            return false;
        }
        let last = self.dropped.saturating_sub(1);
        if self.dropped != 0 && last >= self.until && now < last.saturating_add(SUB_LEASE) {
            return false;
        }
        self.dropped = now.saturating_add(1);
        true
    }

    /// The in-process tier is not trusted any more: drop it, detach.
    fn drop_all(&mut self) {
        self.l1 = None;
        self.detached = true;
        self.woken = true;
    }

    /// notify.rs `subscription_lost` and the resubscription after a gap.
    pub fn gap(&mut self, now: u8) {
        self.inbox.clear();
        self.ping = None;
        self.dropped = self.dropped.max(now.saturating_add(1));
        self.drop_all();
    }

    fn token(&mut self, i: usize) -> u8 {
        self.tokens += 1;
        (i as u8) * 16 + self.tokens
    }

    fn fetch(&mut self, i: usize) {
        let token = self.token(i);
        self.calls.push(Call::Fetch { token });
        self.step = Step::Fetch { token };
        self.woken = false;
    }

    /// The request is answered with data version `data`; the flight ends and
    /// stores it in the L1 unless it was detached.
    fn answer(&mut self, s_floor: &mut bool, data: u8) {
        if data < self.floor {
            *s_floor = true;
        }
        if !self.detached {
            self.l1 = Some(data);
        }
        self.step = Step::Idle;
    }
}

pub fn step(fleet: &Fleet, s: &mut State, i: usize, act: Act) {
    let now = s.now;
    let mut inst = s.insts[i].clone();
    match act {
        Act::Request => {
            inst.left -= 1;
            inst.floor = s.floor;
            inst.detached = false;
            if fleet.protocol == Protocol::Current && inst.must_drop(now) {
                inst.drop_all();
                inst.detached = false;
            }
            if let Some(data) = inst.l1 {
                if data < inst.floor {
                    s.stale_answer = true;
                }
            } else {
                inst.fetch(i);
            }
        }
        Act::Reply => {
            let reply = inst.reply.take().expect("enabled");
            match (inst.step.clone(), reply) {
                (Step::Fetch { .. }, Reply::Fresh(data)) => inst.answer(&mut s.stale_answer, data),
                (
                    Step::Fetch { token },
                    Reply::Leased {
                        fence,
                        generation,
                        by,
                    },
                ) => {
                    inst.step = Step::Rebuild {
                        lease: Some((token, fence, generation, by)),
                    };
                    inst.renewed = now;
                }
                (Step::Fetch { .. }, Reply::Held(until)) => inst.step = Step::Wait { until },
                // The backoff runs: the request shares the failure (no data;
                // stale-if-error is not modelled) and the origin is not called.
                (Step::Fetch { .. }, Reply::Failing(_)) => inst.step = Step::Idle,
                (Step::Commit { data, .. }, Reply::Done(_)) => {
                    inst.answer(&mut s.stale_answer, data)
                }
                (step, reply) => unreachable!("{step:?} got {reply:?}"),
            }
        }
        Act::Deadline => {
            inst.reply = None;
            match inst.step.clone() {
                Step::Fetch { token } => {
                    inst.gave_up.push(token);
                    s.gone.push((token, now));
                    if fleet.protocol == Protocol::Current {
                        inst.calls.push(Call::Release {
                            token,
                            failure: None,
                        });
                    }
                    inst.step = Step::Rebuild { lease: None };
                }
                Step::Commit { token, data } => {
                    inst.gave_up.push(token);
                    s.gone.push((token, now));
                    if fleet.protocol == Protocol::Current {
                        inst.calls.push(Call::Release {
                            token,
                            failure: None,
                        });
                    }
                    inst.answer(&mut s.stale_answer, data);
                }
                _ => unreachable!(),
            }
        }
        Act::Retry => inst.fetch(i),
        // The origin is read, and the commit sent (what could come between
        // the two can as well come while the commit is on its way).
        Act::Build => match inst.step.clone() {
            Step::Rebuild {
                lease: Some((token, fence, generation, by)),
            } => {
                let data = s.origin;
                inst.calls.push(Call::Commit {
                    token,
                    fence,
                    generation,
                    data,
                    by,
                });
                inst.step = Step::Commit { token, data };
            }
            Step::Rebuild { lease: None } => inst.answer(&mut s.stale_answer, s.origin),
            _ => unreachable!(),
        },
        Act::Fail => {
            if let Step::Rebuild {
                lease: Some((token, _, generation, by)),
            } = inst.step
            {
                inst.calls.push(Call::Release {
                    token,
                    failure: Some((generation, by)),
                });
                inst.step = Step::Idle;
            }
        }
        Act::Watchdog => {
            if let Step::Rebuild {
                lease: Some((token, ..)),
                ..
            } = inst.step
            {
                inst.calls.push(Call::Renew { token });
                inst.renewed = now;
            }
        }
        Act::Deliver => {
            let (_, msg) = inst.inbox.remove(0);
            inst.woken = true;
            if msg == Msg::Invalidated {
                inst.l1 = None;
                inst.detached = true;
                if fleet.protocol == Protocol::Current {
                    inst.acks_out += 1;
                }
            }
        }
        Act::Lose => {
            inst.inbox.remove(0);
            inst.frozen = true;
        }
        Act::Reconnect => {
            inst.frozen = false;
            inst.gap(now);
        }
        Act::Ping => inst.ping = Some((now, s.publishes)),
        Act::Pong => {
            let (sent, _) = inst.ping.take().expect("enabled");
            inst.until = inst.until.max(sent.saturating_add(SUB_LEASE));
        }
        Act::Ack => {
            inst.acks_out -= 1;
            if matches!(s.inv, Inv::Acks { .. }) {
                s.inv_acks_in += 1;
            }
        }
        Act::Die => {
            for n in 1..=inst.tokens {
                let token = (i as u8) * 16 + n;
                if !s.gone.iter().any(|(t, _)| *t == token) {
                    s.gone.push((token, now));
                }
            }
            inst.alive = false;
            inst.inbox.clear();
            inst.reply = None;
        }
    }
    s.insts[i] = inst;
}

/// Redis runs the first call in transit from instance `i`.
pub fn run(fleet: &Fleet, s: &mut State, i: usize) {
    let call = s.insts[i].calls.remove(0);
    fleet.before_write(s);
    let (us, now, protocol) = (s.us, s.now, fleet.protocol);
    // Ghost: a lease another token holds, which this call must not touch.
    let caller = match &call {
        Call::Fetch { .. } => None,
        Call::Commit { token, .. } | Call::Release { token, .. } | Call::Renew { token } => {
            Some(*token)
        }
    };
    let other = s.redis.lease.filter(|(t, _)| Some(*t) != caller);
    let mine = s.redis.lease.is_some_and(|(t, _)| Some(t) == caller);
    let heard: Vec<usize> = s.insts.iter().map(|i| i.inbox.len()).collect();
    let reply = match call {
        Call::Fetch { token } => {
            let mut reply = s.redis.fetch_or_lease(protocol, us, now, token, LEASE);
            if let Reply::Failing(_) = reply {
                s.shared_failure = true;
            }
            if let Reply::Failing(_) = reply
                && s.last_failure
                    .is_none_or(|t| now >= t.saturating_add(FAIL_CAP))
            {
                s.blocked_past_cap = true;
            }
            if let Reply::Leased { by, .. } = &mut reply {
                s.issued += 1;
                *by = s.issued;
                s.lease_inv.push((s.issued, (s.inv_runs, s.faults)));
            }
            fleet.redis_reply(s, &reply);
            Some((token, reply))
        }
        Call::Commit {
            token,
            fence,
            generation,
            data,
            by,
        } => {
            let before: Option<Stored> = s.redis.current(protocol).cloned();
            let (stored, published) = s.redis.commit(protocol, token, fence, generation, data, by);
            if stored && before.is_some_and(|v| v.by > by) {
                s.overwrote_newer = true;
            }
            // Ghost: the commit of the lease Redis still holds, with no
            // invalidation since it was taken and no fault, is stored.
            let since = s.lease_inv.iter().find(|(b, _)| *b == by).map(|(_, n)| *n);
            if mine && !stored && since == Some((s.inv_runs, s.faults)) {
                s.current_commit_refused = true;
            }
            if let Some(p) = published {
                publish(s, p);
            }
            Some((token, Reply::Done(stored)))
        }
        Call::Release { token, failure } => {
            if s.redis.release(now, token, failure) {
                if failure.is_some() {
                    s.last_failure = Some(now);
                }
                publish(s, Publish::Failed);
            }
            None
        }
        Call::Renew { token } => {
            s.redis.renew(protocol, now, token, LEASE);
            None
        }
    };
    if caller.is_some() && other.is_some() && s.redis.lease != other {
        s.lapsed_lease_hit = true;
    }
    // Ghost: a lease its holder gave back tells every waiter on the key.
    if mine && s.redis.lease.is_none() {
        let unheard = s.insts.iter().zip(&heard).any(|(inst, before)| {
            inst.alive && matches!(inst.step, Step::Wait { .. }) && inst.inbox.len() == *before
        });
        s.waiter_unwoken |= unheard;
    }
    // The reply reaches the client only if it still awaits that call.
    let inst = &mut s.insts[i];
    if let Some((token, reply)) = reply {
        let awaited = match inst.step {
            Step::Fetch { token: t } | Step::Commit { token: t, .. } => t == token,
            _ => false,
        };
        if inst.alive && awaited {
            inst.reply = Some(reply);
        }
    }
}

fn publish(s: &mut State, what: Publish) {
    s.publishes += 1;
    let seq = s.publishes;
    let msg = match what {
        Publish::Committed => Msg::Committed,
        Publish::Failed => Msg::Failed,
    };
    // Only a flight waiting on the key has registered for its messages.
    for inst in s.insts.iter_mut() {
        if inst.subscribed() && matches!(inst.step, Step::Fetch { .. } | Step::Wait { .. }) {
            inst.inbox.push((seq, msg));
        }
    }
}

/// Every subscriber's connection dropped (a restart, a failover).
pub fn gap_everywhere(s: &mut State) {
    let now = s.now;
    for inst in s.insts.iter_mut().filter(|i| i.alive) {
        inst.gap(now);
    }
}
