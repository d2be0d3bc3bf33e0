//! Every lease this process holds now, rebuild leases and locks alike, so
//! a shutdown can wait for the rebuilds to settle and hand back whatever is
//! still held when its deadline comes.
//!
//! A [`Renewer`](super::renew::Renewer) registers its lease when it starts
//! and takes it out when it is dropped: a rebuild lease stays registered
//! while its commit or release runs, so "none registered" means every
//! rebuild's publish has landed (or failed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

use super::{RedisTier, TierError};
use crate::key::Key;

/// Which compare-token scripts keep a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A cache entry's rebuild lease (`renew.lua`, `release.lua`).
    Rebuild,
    /// A public lock (`lock_renew.lua`, `lock_release.lua`): a hold is the
    /// owner token, the tenure's fencing number and the attempt that took it.
    Lock { fence: u64, attempt: String },
}

impl LeaseKind {
    pub(super) async fn renew(
        &self,
        tier: &Arc<RedisTier>,
        key: &Key,
        token: &str,
        time: Duration,
    ) -> Result<bool, TierError> {
        match self {
            LeaseKind::Rebuild => tier.renew(key, token, time).await,
            LeaseKind::Lock { fence, .. } => tier.lock_renew(key, token, *fence, time).await,
        }
    }

    /// Gives the lease back; a lock's release is retried until `until`.
    pub(super) async fn release(
        &self,
        tier: &Arc<RedisTier>,
        key: &Key,
        token: &str,
        until: Instant,
    ) -> Result<bool, TierError> {
        match self {
            LeaseKind::Rebuild => tier.release_token(key, token).await,
            LeaseKind::Lock { fence, attempt } => {
                tier.lock_release(key, token, *fence, attempt, until).await
            }
        }
    }

    pub(super) fn report_loss(&self, key: &Key) {
        match self {
            LeaseKind::Rebuild => tracing::warn!(
                key = %key,
                "rebuild lease lost: another instance may rebuild this key"
            ),
            LeaseKind::Lock { .. } => tracing::warn!(lock = %key, "lock lease lost"),
        }
    }
}

/// One lease held, as the registry sees it.
pub(super) struct Hold {
    pub kind: LeaseKind,
    pub key: Key,
    pub token: String,
    /// When the lease ends on Redis unless renewed (shared with its
    /// renewer).
    pub ends: Arc<Mutex<Instant>>,
    /// Set once its holder committed or released it itself.
    pub settled: Arc<AtomicBool>,
    /// The renewal task, stopped when the lease is handed back.
    pub task: Option<AbortHandle>,
    /// The renewer's loss flag, told when the lease is handed back (gone
    /// once the renewal task ended).
    pub lost: Weak<watch::Sender<bool>>,
}

/// The leases held now, and a signal for every change.
#[derive(Default)]
pub(crate) struct HeldLeases {
    next: AtomicU64,
    holds: Mutex<HashMap<u64, Hold>>,
    changed: Notify,
}

/// What a shutdown did with the leases it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HandedBack {
    /// Rebuild leases given back by token (their waiters told to retry).
    pub rebuilds: u64,
    /// Lock holds given back by token and fence.
    pub locks: u64,
    /// Leases that could not be given back (no longer ours, or Redis did
    /// not answer): they lapse by themselves.
    pub lost: u64,
}

impl HeldLeases {
    pub(super) fn register(&self, hold: Hold) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, hold);
        id
    }

    pub(super) fn deregister(&self, id: u64) {
        if self.lock().remove(&id).is_some() {
            self.changed.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Hold>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rebuilds(&self) -> usize {
        self.lock()
            .values()
            .filter(|h| h.kind == LeaseKind::Rebuild)
            .count()
    }

    /// Waits until no rebuild lease is held, or until `deadline`. Returns
    /// how many are still held.
    pub(crate) async fn drained(&self, deadline: Instant) -> usize {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let held = self.rebuilds();
            if held == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return self.rebuilds();
            }
        }
    }

    /// Stops renewing every lease not settled by its holder, tells its
    /// holder it is lost, and gives it back by token, so another instance
    /// takes over at once (a rebuild lease's release wakes its waiters).
    ///
    /// The releases run side by side, at most [`HAND_BACK_AT_ONCE`] at a
    /// time, and the whole hand-back ends `patience` from now, however many
    /// leases there are and however Redis answers: a release still running
    /// then (a lock's retries included) is given up, and a lease not handed
    /// back by then is counted `lost` and lapses by itself.
    pub(crate) async fn hand_back(&self, tier: &Arc<RedisTier>, patience: Duration) -> HandedBack {
        let taken: Vec<(LeaseKind, Key, String, Instant)> = {
            let mut holds = self.lock();
            let ids: Vec<u64> = holds
                .iter()
                .filter(|(_, h)| !h.settled.load(Ordering::Acquire))
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter()
                .filter_map(|id| holds.remove(&id))
                .map(|hold| {
                    hold.settled.store(true, Ordering::Release);
                    // Told before the task (which owns the flag) is stopped.
                    if let Some(lost) = hold.lost.upgrade() {
                        lost.send_replace(true);
                    }
                    if let Some(task) = &hold.task {
                        task.abort();
                    }
                    let ends = *hold.ends.lock().unwrap_or_else(|p| p.into_inner());
                    (hold.kind, hold.key, hold.token, ends)
                })
                .collect()
        };
        self.changed.notify_waiters();
        let mut done = HandedBack::default();
        let until = Instant::now()
            .checked_add(patience)
            .unwrap_or_else(Instant::now);
        let mut pending = taken.into_iter();
        let mut running = tokio::task::JoinSet::new();
        let mut given_up = 0u64;
        loop {
            while running.len() < HAND_BACK_AT_ONCE {
                let Some((kind, key, token, ends)) = pending.next() else {
                    break;
                };
                let tier = tier.clone();
                // Past its own end the lease has lapsed: nothing to give back.
                let limit = until.min(ends);
                running.spawn(async move {
                    let release = kind.release(&tier, &key, &token, limit);
                    let released = tokio::time::timeout_at(limit.into(), release).await;
                    (kind, matches!(released, Ok(Ok(true))))
                });
            }
            let next = tokio::time::timeout_at(until.into(), running.join_next()).await;
            match next {
                Ok(Some(Ok((LeaseKind::Rebuild, true)))) => done.rebuilds += 1,
                Ok(Some(Ok((LeaseKind::Lock { .. }, true)))) => done.locks += 1,
                Ok(Some(_)) => done.lost += 1,
                Ok(None) => break,
                Err(_) => {
                    // Out of time: what still runs, and what never started,
                    // lapses.
                    given_up = running.len() as u64 + pending.len() as u64;
                    running.abort_all();
                    break;
                }
            }
        }
        done.lost = done.lost.saturating_add(given_up);
        done
    }
}

/// The most releases a hand-back keeps in flight at once: enough that a
/// frozen Redis costs the hand-back its time limit once, not once per
/// lease, and few enough not to flood a Redis that answers.
const HAND_BACK_AT_ONCE: usize = 64;
