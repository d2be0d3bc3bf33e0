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
                        return Some((lock.fence, *holds));
                    }
                    None if lock.queue.front().map_or(true, |head| head == token) => {
                        lock.queue.retain(|t| t != token);
                        lock.fence += 1;
                        lock.owner = Some((token.to_owned(), 1));
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
                let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(lock) = locks.get_mut(&id) {
                    // The head may have changed: let the others look again.
                    lock.queue.retain(|t| t != token);
                    lock.released.notify_waiters();
                }
                return None;
            }
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
