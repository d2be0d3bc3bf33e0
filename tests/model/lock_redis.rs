//! Redis's side of the public lock: the keys of one lock and one atomic
//! action per script (lock_acquire, lock_renew, lock_release, lock_leave),
//! with exactly the script's logic. `Protocol::Old` runs them as they were
//! before the fleet-fault fixes.

use super::Protocol;

/// The lock hash. `tenure` is ghost state: which acquisition from free
/// made this hold.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Hold {
    pub owner: u8,
    pub count: u8,
    pub fence: u64,
    pub attempts: Vec<u8>,
    pub expires: u8,
    pub tenure: u8,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct LockRedis {
    pub lock: Option<Hold>,
    pub fence: Option<u64>,
    /// The queue in ticket order: (token, ticket).
    pub queue: Vec<(u8, u8)>,
    /// Heartbeat deadlines (token, tick) and tombstones (attempt, tick).
    pub beats: Vec<(u8, u8)>,
    pub tombs: Vec<(u8, u8)>,
    pub tickets: u8,
    /// Release receipts: (attempt, outcome).
    pub receipts: Vec<(u8, u8)>,
}

/// lock_acquire's answer: the hold's fence and tenure, or the queue place.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Acquired {
    Held { fence: u64, tenure: u8 },
    Wait { position: u8 },
}

/// What a script did that the model's ghost state needs.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Effects {
    pub published: bool,
    pub issued: Option<u64>,
    /// The tenure of a hold a release or renew changed.
    pub touched: Option<u8>,
}

fn remove<K: PartialEq + Copy, V>(list: &mut Vec<(K, V)>, key: K) -> bool {
    let before = list.len();
    list.retain(|(k, _)| *k != key);
    list.len() != before
}

fn get<K: PartialEq + Copy, V: Copy>(list: &[(K, V)], key: K) -> Option<V> {
    list.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

impl LockRedis {
    /// lock_acquire.lua (not reentrant). `tenures` numbers the holds. (The
    /// script's refusal on a server that may evict the hold takes nothing
    /// and changes no state, so it is not modelled.)
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        p: Protocol,
        us: u64,
        now: u8,
        token: u8,
        attempt: u8,
        beat: u8,
        lease: u8,
        tenures: &mut u8,
        fx: &mut Effects,
    ) -> Acquired {
        if p == Protocol::Current
            && let Some(until) = get(&self.tombs, attempt)
        {
            if until >= now {
                return Acquired::Wait { position: 0 };
            }
            remove(&mut self.tombs, attempt);
        }
        let owner = self.lock.as_ref().map(|h| h.owner);
        if p == Protocol::Current && owner == Some(token) {
            let hold = self.lock.as_ref().expect("owned");
            if hold.attempts.contains(&attempt) {
                return Acquired::Held {
                    fence: hold.fence,
                    tenure: hold.tenure,
                };
            }
        }
        let mut head = None;
        let mut dropped = false;
        while let Some(&(first, _)) = self.queue.first() {
            let deadline = get(&self.beats, first).unwrap_or(0);
            if deadline >= now || (p == Protocol::Current && first == token) {
                head = Some(first);
                break;
            }
            self.queue.remove(0);
            remove(&mut self.beats, first);
            dropped = true;
        }
        if dropped && p == Protocol::Current {
            fx.published = true;
        }
        if owner.is_none() && (head.is_none() || head == Some(token)) {
            remove(&mut self.queue, token);
            remove(&mut self.beats, token);
            if self.fence.is_none() && p == Protocol::Current {
                self.fence = Some(us);
            }
            let fence = self.fence.unwrap_or(0) + 1;
            self.fence = Some(fence);
            fx.issued = Some(fence);
            *tenures += 1;
            self.lock = Some(Hold {
                owner: token,
                count: 1,
                fence,
                attempts: vec![attempt],
                expires: now.saturating_add(lease),
                tenure: *tenures,
            });
            return Acquired::Held {
                fence,
                tenure: *tenures,
            };
        }
        let mut position = 0;
        if beat != 0 {
            if get(&self.queue, token).is_none() {
                self.tickets += 1;
                self.queue.push((token, self.tickets));
            }
            remove(&mut self.beats, token);
            self.beats.push((token, now.saturating_add(beat)));
            position = self
                .queue
                .iter()
                .position(|(t, _)| *t == token)
                .unwrap_or(0) as u8
                + 1;
        }
        Acquired::Wait { position }
    }

    /// lock_renew.lua.
    pub fn renew(
        &mut self,
        p: Protocol,
        now: u8,
        token: u8,
        fence: u64,
        lease: u8,
        fx: &mut Effects,
    ) {
        if let Some(hold) = &mut self.lock
            && hold.owner == token
            && (p == Protocol::Old || hold.fence == fence)
        {
            hold.expires = now.saturating_add(lease);
            fx.touched = Some(hold.tenure);
        }
    }

    /// lock_release.lua.
    pub fn release(
        &mut self,
        p: Protocol,
        token: u8,
        fence: u64,
        attempt: u8,
        fx: &mut Effects,
    ) -> u8 {
        if p == Protocol::Current
            && let Some(outcome) = get(&self.receipts, attempt)
        {
            return outcome;
        }
        let Some(hold) = &mut self.lock else { return 0 };
        let ours = match p {
            Protocol::Old => hold.owner == token,
            Protocol::Current => {
                hold.owner == token
                    && hold.fence == fence
                    && remove_item(&mut hold.attempts, attempt)
            }
        };
        if !ours {
            return 0;
        }
        fx.touched = Some(hold.tenure);
        hold.count = hold.count.saturating_sub(1);
        let outcome = if hold.count > 0 {
            2
        } else {
            self.lock = None;
            fx.published = true;
            1
        };
        if p == Protocol::Current {
            self.receipts.push((attempt, outcome));
        }
        outcome
    }

    /// lock_leave.lua.
    pub fn leave(
        &mut self,
        p: Protocol,
        now: u8,
        token: u8,
        attempt: u8,
        tomb: u8,
        fx: &mut Effects,
    ) {
        if p == Protocol::Current {
            // Tombstones past their time are swept where they are added.
            self.tombs.retain(|(_, until)| *until >= now);
            remove(&mut self.tombs, attempt);
            self.tombs.push((attempt, now.saturating_add(tomb)));
        }
        let mut changed = remove(&mut self.queue, token);
        remove(&mut self.beats, token);
        if p == Protocol::Current
            && let Some(hold) = &mut self.lock
            && hold.owner == token
            && remove_item(&mut hold.attempts, attempt)
        {
            changed = true;
            hold.count = hold.count.saturating_sub(1);
            if hold.count == 0 {
                self.lock = None;
            }
        }
        fx.published |= changed;
    }

    /// The clock reached `now`: a hold whose PX ran out is gone. Returns it.
    pub fn expire(&mut self, now: u8) -> Option<Hold> {
        if self.lock.as_ref().is_some_and(|h| h.expires <= now) {
            return self.lock.take();
        }
        None
    }
}

fn remove_item(list: &mut Vec<u8>, item: u8) -> bool {
    let before = list.len();
    list.retain(|x| *x != item);
    list.len() != before
}
