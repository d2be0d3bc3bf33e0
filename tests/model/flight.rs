//! The in-process flight map (src/engine/flight.rs) as a state machine:
//! `join` under the shard lock, the leader's `finish` (store, then leave the
//! map if it is still there, then answer), its drop without an outcome
//! (a panic or a cancellation: the flight is answered `Abandoned`), a
//! follower cancelled while it waits, and `detach_group`. The real code runs
//! under stress in src/engine/flight/stress.rs.

use stateright::{Model, Property};

#[derive(Clone, Debug)]
pub struct Flights {
    pub tasks: usize,
    /// How many leaders may fail (panic, be cancelled) in one run.
    pub failures: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    Value,
    Abandoned,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Flight {
    pub done: Option<Outcome>,
    pub detached: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Task {
    Start,
    Leading(usize),
    Following(usize),
    /// Answered with a value.
    Done,
    /// Gone without an answer: it panicked or was cancelled.
    Gone,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct FState {
    pub map: Option<usize>,
    pub flights: Vec<Flight>,
    pub tasks: Vec<Task>,
    pub failures: u8,
    pub detached: bool,
    pub stores: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum FAction {
    Join(usize),
    Finish(usize),
    LeaderGone(usize),
    FollowerGone(usize),
    Observe(usize),
    Detach,
}

impl Model for Flights {
    type State = FState;
    type Action = FAction;

    fn init_states(&self) -> Vec<FState> {
        vec![FState {
            map: None,
            flights: vec![],
            tasks: vec![Task::Start; self.tasks],
            failures: 0,
            detached: false,
            stores: 0,
        }]
    }

    fn actions(&self, s: &FState, out: &mut Vec<FAction>) {
        let fail = s.failures < self.failures;
        for (t, task) in s.tasks.iter().enumerate() {
            match task {
                Task::Start => out.push(FAction::Join(t)),
                Task::Leading(_) => {
                    out.push(FAction::Finish(t));
                    if fail {
                        out.push(FAction::LeaderGone(t));
                    }
                }
                Task::Following(f) => {
                    if s.flights[*f].done.is_some() {
                        out.push(FAction::Observe(t));
                    }
                    if fail {
                        out.push(FAction::FollowerGone(t));
                    }
                }
                Task::Done | Task::Gone => {}
            }
        }
        if !s.detached && s.map.is_some() {
            out.push(FAction::Detach);
        }
    }

    fn next_state(&self, last: &FState, action: FAction) -> Option<FState> {
        let mut s = last.clone();
        match action {
            FAction::Join(t) => match s.map {
                Some(f) => s.tasks[t] = Task::Following(f),
                None => {
                    s.flights.push(Flight {
                        done: None,
                        detached: false,
                    });
                    let f = s.flights.len() - 1;
                    s.map = Some(f);
                    s.tasks[t] = Task::Leading(f);
                }
            },
            FAction::Finish(t) | FAction::LeaderGone(t) => {
                let Task::Leading(f) = s.tasks[t] else {
                    return None;
                };
                let value = matches!(action, FAction::Finish(_));
                // close(): under the shard lock, store (with a value) and
                // leave the map only if still attached and still there.
                if !s.flights[f].detached {
                    if value {
                        s.stores += 1;
                    }
                    if s.map == Some(f) {
                        s.map = None;
                    }
                }
                s.flights[f].done = Some(if value {
                    Outcome::Value
                } else {
                    Outcome::Abandoned
                });
                s.tasks[t] = if value { Task::Done } else { Task::Gone };
                if !value {
                    s.failures += 1;
                }
            }
            FAction::FollowerGone(t) => {
                s.tasks[t] = Task::Gone;
                s.failures += 1;
            }
            FAction::Observe(t) => {
                let Task::Following(f) = s.tasks[t] else {
                    return None;
                };
                s.tasks[t] = match s.flights[f].done? {
                    Outcome::Value => Task::Done,
                    // A waiter takes over: it joins again.
                    Outcome::Abandoned => Task::Start,
                };
            }
            FAction::Detach => {
                if let Some(f) = s.map.take() {
                    s.flights[f].detached = true;
                }
                s.detached = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no double leader", |_, s: &FState| {
                let attached = s
                    .tasks
                    .iter()
                    .filter(|t| matches!(t, Task::Leading(f) if !s.flights[*f].detached));
                attached.count() <= 1
            }),
            Property::always("the map's flight has its leader", |_, s: &FState| {
                s.map.is_none_or(|f| s.tasks.contains(&Task::Leading(f)))
            }),
            Property::always("no waiter stranded", |_, s: &FState| {
                s.tasks.iter().all(|t| match t {
                    Task::Following(f) => {
                        s.flights[*f].done.is_some() || s.tasks.contains(&Task::Leading(*f))
                    }
                    _ => true,
                })
            }),
            Property::eventually("every request answered or gone", |_, s: &FState| {
                s.tasks.iter().all(|t| matches!(t, Task::Done | Task::Gone))
            }),
            Property::sometimes("a waiter takes over", |_, s: &FState| {
                s.flights.len() >= 2 && s.flights[0].done == Some(Outcome::Abandoned)
            }),
        ]
    }
}
