//! The lease as a distributed lock: the Redis side.
//!
//! A lock's keys share the hash tag of its name's digest, so every script
//! touches one cluster slot whatever the name contains.

use std::sync::Arc;
use std::time::Duration;

use super::notify::Event;
use super::{RedisTier, TierError};
use crate::key::Key;
use crate::store::millis;

/// How long the fence and ticket counters outlive the last acquisition.
/// Fencing numbers keep rising as long as a lock is used at least this often.
const COUNTERS_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// The answer of one acquisition attempt.
pub(crate) enum Attempt {
    /// The lock is ours, with this fencing number, held `holds` times.
    Held { fence: u64, holds: u64 },
    /// Another owner holds it for `pttl` more (if it has a lease).
    Busy { pttl: Option<Duration> },
}

impl RedisTier {
    fn lock_keys(&self, id: &Key) -> [String; 5] {
        let base = format!("{}:lock:{{{id}}}", self.shared.config.prefix);
        [
            format!("{base}:l"),
            format!("{base}:n"),
            format!("{base}:q"),
            format!("{base}:b"),
            format!("{base}:t"),
        ]
    }

    /// One attempt: take the lock, or (if `queue_for` is set) keep a place
    /// in its queue for that long.
    pub(crate) async fn lock_acquire(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        lease: Duration,
        queue_for: Option<Duration>,
        reenter: bool,
    ) -> Result<Attempt, TierError> {
        let mut conn = self.conn();
        let mut invocation = self.shared.scripts.lock_acquire.prepare_invoke();
        for key in self.lock_keys(id) {
            invocation.key(key);
        }
        invocation
            .arg(token)
            .arg(millis(lease).max(1))
            .arg(queue_for.map_or(0, |d| millis(d).max(1)))
            .arg(millis(COUNTERS_KEEP))
            .arg(if reenter { "1" } else { "0" });
        let (won, a, b): (i64, i64, i64) = self.call(invocation.invoke_async(&mut conn)).await?;
        Ok(if won == 1 {
            Attempt::Held {
                fence: a.max(0) as u64,
                holds: b.max(1) as u64,
            }
        } else {
            Attempt::Busy {
                pttl: (a > 0).then(|| Duration::from_millis(a as u64)),
            }
        })
    }

    /// Releases one hold. `Ok(true)` if the caller held the lock.
    pub(crate) async fn lock_release(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        let [lock, ..] = self.lock_keys(id);
        let mut conn = self.conn();
        let released: i64 = self
            .call(
                self.shared
                    .scripts
                    .lock_release
                    .key(lock)
                    .arg(token)
                    .arg(&self.shared.channel)
                    .arg(Event::Released.message(id))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(released != 0)
    }

    pub(crate) async fn lock_renew(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
        lease: Duration,
    ) -> Result<bool, TierError> {
        let [lock, ..] = self.lock_keys(id);
        let mut conn = self.conn();
        let renewed: i64 = self
            .call(
                self.shared
                    .scripts
                    .lock_renew
                    .key(lock)
                    .arg(token)
                    .arg(millis(lease).max(1))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(renewed == 1)
    }

    /// Leaves the queue (a waiter that gives up).
    pub(crate) async fn lock_leave(
        self: &Arc<Self>,
        id: &Key,
        token: &str,
    ) -> Result<(), TierError> {
        let [_, _, queue, beats, _] = self.lock_keys(id);
        let mut conn = self.conn();
        let _: i64 = self
            .call(
                self.shared
                    .scripts
                    .lock_leave
                    .key(queue)
                    .key(beats)
                    .arg(token)
                    .arg(&self.shared.channel)
                    .arg(Event::Released.message(id))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(())
    }
}
