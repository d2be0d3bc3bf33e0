//! The embedded backend's lock store: the same rules as the Redis lock
//! scripts (queue order, fencing numbers, reentrant holds), under a mutex,
//! for one process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::key::Key;

/// In-process locks for the embedded backend: the same rules as the Redis
/// scripts (queue order, fencing numbers, reentrant holds), under a mutex.
#[derive(Default)]
pub(crate) struct LocalLocks {
    locks: Mutex<HashMap<Key, LocalLock>>,
}

#[derive(Default)]
struct LocalLock {
    owner: Option<(String, u64)>,
    fence: u64,
    queue: VecDeque<String>,
    released: Arc<Notify>,
}

impl LocalLocks {
    pub(crate) async fn acquire(
        &self,
        id: Key,
        token: &str,
        wait: Option<Duration>,
        reenter: bool,
    ) -> Option<(u64, u64)> {
        let give_up = wait.map(|w| Instant::now() + w);
        // Armed before the first look: a waiter cancelled while it waits
        // leaves the queue, or the lock would stall behind it forever (there
        // is no heartbeat in one process: a waiter gone is gone at once).
        let mut leave = LeaveOnDrop {
            locks: self,
            id,
            token,
            armed: wait.is_some(),
        };
        loop {
            let released = self
                .locks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id)
                .or_default()
                .released
                .clone();
            // Listen before looking, so a release in between still wakes us.
            let notified = released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
                let lock = locks.entry(id).or_default();
                match &mut lock.owner {
                    Some((owner, holds)) if owner == token && reenter => {
                        *holds += 1;
                        leave.armed = false;
                        return Some((lock.fence, *holds));
                    }
                    None if lock.queue.front().is_none_or(|head| head == token) => {
                        lock.queue.retain(|t| t != token);
                        lock.fence += 1;
                        lock.owner = Some((token.to_owned(), 1));
                        leave.armed = false;
                        return Some((lock.fence, 1));
                    }
                    _ => {}
                }
                if wait.is_some() && !lock.queue.iter().any(|t| t == token) {
                    lock.queue.push_back(token.to_owned());
                }
            }
            let left = give_up.map_or(Duration::ZERO, |at| {
                at.saturating_duration_since(Instant::now())
            });
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                // Dropping `leave` gives the place back.
                return None;
            }
        }
    }

    /// Takes `token` out of the queue and lets the others look again (the
    /// head may have changed).
    fn leave(&self, id: Key, token: &str) {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lock) = locks.get_mut(&id)
            && lock.queue.iter().any(|t| t == token)
        {
            lock.queue.retain(|t| t != token);
            lock.released.notify_waiters();
        }
    }

    pub(crate) fn release(&self, id: Key, token: &str) -> bool {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let Some(lock) = locks.get_mut(&id) else {
            return false;
        };
        match &mut lock.owner {
            Some((owner, holds)) if owner == token => {
                *holds -= 1;
                if *holds == 0 {
                    lock.owner = None;
                    lock.released.notify_waiters();
                }
                true
            }
            _ => false,
        }
    }
}

/// A waiter's place, given back when its acquisition ends without the lock
/// (gave up, or cancelled).
struct LeaveOnDrop<'a> {
    locks: &'a LocalLocks,
    id: Key,
    token: &'a str,
    armed: bool,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locks.leave(self.id, self.token);
        }
    }
}
