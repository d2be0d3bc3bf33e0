//! The lease as a distributed lock: the Redis side.
//!
//! A lock's keys share the hash tag of its name's digest, so every script
//! touches one cluster slot whatever the name contains.
//!
//! Acquisition goes through the circuit breaker like every cache call: with
//! Redis failing, a caller hears so at once. The calls that give something
//! back or keep it (release, renew, leave) do not: a hold or a queue place
//! left behind blocks the whole fleet, so they are retried, each try under
//! the deadline, until what they protect would have lapsed by itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::connection::Conn;
use super::connections::Connections;
use super::eviction::{self, Policy};
use super::notify::Event;
use super::{RedisTier, TierError};
use crate::key::Key;
use crate::store::millis;

/// How long the fence and ticket counters outlive the last acquisition.
/// Fencing numbers keep rising as long as a lock is used at least this often.
const COUNTERS_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a waiter's place in a queue lasts without a refresh. Waiters
/// refresh it every third of this while they wait, whatever their wait
/// budget, so a waiter that died, is paused or was cancelled without a word
/// holds back a free lock for at most this long.
pub(crate) const QUEUE_HEARTBEAT: Duration = Duration::from_millis(750);

/// The answer of one acquisition attempt.
pub(crate) enum Attempt {
    /// The lock is ours, with this fencing number, held `holds` times.
    Held { fence: u64, holds: u64 },
    /// Another owner holds it for `pttl` more (if it has a lease).
    Busy { pttl: Option<Duration> },
    /// The server that would have granted it may evict its key: nothing
    /// was taken, and the caller's place in the queue was given up.
    Evicting { policy: String, maxmemory: u64 },
}

/// A random attempt id: names one acquisition attempt in the lock's hash, so
/// the attempt can be answered again or undone without counting twice.
pub(crate) fn new_attempt() -> String {
    format!("{:016x}", crate::random::unguessable_u64())
}

/// The lock protocol of one tier.
pub(crate) struct Locks {
    conns: Arc<Connections>,
}

impl Locks {
    pub(super) fn new(conns: Arc<Connections>) -> Self {
        Locks { conns }
    }

    /// One attempt: take the lock, or (if `beat` is set) keep a place in its
    /// queue for that long. A retry with the same `attempt` id is answered
    /// with the hold the attempt took, never a second one. With `synced`
    /// (replicas, timeout), a hold counts only once that many replicas have
    /// acknowledged it (`WAIT`); if fewer did, the attempt fails, and the
    /// caller's undo gives the hold back.
    ///
    /// With `judge`, the script refuses the attempt on a server that may
    /// evict the lock's key, read by that server in the same atomic step
    /// (see [`eviction`](super::eviction)). Returns the attempt's answer and
    /// what the server's policy was seen to be (`None` when not judged).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire(
        &self,
        id: &Key,
        token: &str,
        attempt: &str,
        lease: Duration,
        beat: Option<Duration>,
        reenter: bool,
        synced: Option<(u32, Duration)>,
        judge: bool,
    ) -> Result<(Attempt, Option<Policy>), TierError> {
        let conn = self.conns.conn();
        let mut invocation = self.conns.scripts.lock_acquire.prepare_invoke();
        let keys = self.conns.keys.lock(id);
        for key in &keys {
            invocation.key(key);
        }
        invocation
            .arg(token)
            .arg(millis(lease).max(1))
            .arg(beat.map_or(0, |d| millis(d).max(1)))
            .arg(millis(COUNTERS_KEEP))
            .arg(if reenter { "1" } else { "0" })
            .arg(attempt)
            .arg(&self.conns.channel)
            .arg(Event::Released.message(id))
            .arg(if judge { "1" } else { "0" });
        // Every try on the one connection that a synced acquisition's
        // `WAIT` then asks about.
        let script = &invocation;
        let reply: Vec<Value> = self
            .conns
            .call(&keys[0])
            .run(|_| {
                let mut conn = conn.clone();
                async move { script.invoke_async(&mut conn).await }
            })
            .await?;
        let (won, a, b, seen) = read_reply(&reply)?;
        if let Some(Policy::Evicts { policy, maxmemory }) = seen.as_ref().filter(|_| won == 2) {
            let refused = Attempt::Evicting {
                policy: policy.clone(),
                maxmemory: *maxmemory,
            };
            return Ok((refused, seen));
        }
        if let (1, Some((replicas, timeout))) = (won, synced)
            && let Err(e) = self.wait_replicas(&keys[0], conn, replicas, timeout).await
        {
            // Give the unacknowledged hold back before the caller hears
            // of the failure, so the lock is free for the others at
            // once; the caller's undo tries again in the background if
            // this one try goes unanswered.
            let _ = self.leave(id, token, attempt, Instant::now()).await;
            return Err(e);
        }
        let answer = if won == 1 {
            Attempt::Held {
                fence: a.max(0) as u64,
                holds: b.max(1) as u64,
            }
        } else {
            Attempt::Busy {
                pttl: (a > 0).then(|| Duration::from_millis(a as u64)),
            }
        };
        Ok((answer, seen))
    }

    /// Waits until `replicas` replicas acknowledge every write sent on
    /// `conn` so far (the acquisition's), at most `timeout`. `WAIT` runs on
    /// the same connection as the write: it counts the acknowledgements of
    /// that connection's writes. Fewer acknowledgements are an error.
    async fn wait_replicas(
        &self,
        route: &str,
        conn: Conn,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(), TierError> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis(timeout).max(1));
        let limit = self.conns.config.deadline.saturating_add(timeout);
        let wait = &wait;
        let acked: i64 = self
            .conns
            .call(route)
            .within(limit)
            .run(|_| {
                let conn = conn.clone();
                async move { wait_on_slot(conn, route, wait).await }
            })
            .await?;
        if acked >= i64::from(replicas) {
            return Ok(());
        }
        Err(TierError::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
            "the lock's replicas did not acknowledge the acquisition in time",
            format!("{acked} of {replicas} acknowledged"),
        ))))
    }

    /// Releases the hold taken by `attempt`, if the lock is still the
    /// caller's under `fence`. `Ok(true)` if it was; retried past the
    /// circuit breaker until `until` (when the hold lapses by itself).
    pub(crate) async fn release(
        &self,
        id: &Key,
        token: &str,
        fence: u64,
        attempt: &str,
        until: Instant,
    ) -> Result<bool, TierError> {
        let [lock, ..] = self.conns.keys.lock(id);
        let receipt = self.conns.keys.lock_receipt(id, attempt);
        let message = Event::Released.message(id);
        let keep = millis(until.saturating_duration_since(Instant::now())).max(1);
        let (script, lock, receipt, channel, message) = (
            &self.conns.scripts.lock_release,
            &lock,
            &receipt,
            &self.conns.channel,
            &message,
        );
        let released: i64 = self
            .conns
            .call_past_breaker()
            .until(until)
            .run(move |mut conn| async move {
                script
                    .key(lock)
                    .key(receipt)
                    .arg(token)
                    .arg(fence)
                    .arg(attempt)
                    .arg(channel)
                    .arg(message)
                    .arg(keep)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(released != 0)
    }

    /// One renewal try under the deadline, past the circuit breaker (the
    /// renewer decides when to try again). `Ok(false)` if the lock is no
    /// longer the caller's under `fence`.
    pub(crate) async fn renew(
        &self,
        id: &Key,
        token: &str,
        fence: u64,
        lease: Duration,
    ) -> Result<bool, TierError> {
        let [lock, ..] = self.conns.keys.lock(id);
        let mut invocation = self.conns.scripts.lock_renew.key(lock);
        invocation.arg(token).arg(fence).arg(millis(lease).max(1));
        let script = &invocation;
        let renewed: i64 = self
            .conns
            .call_past_breaker()
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
            .await?;
        Ok(renewed == 1)
    }

    /// Leaves the queue and gives back the hold `attempt` may have taken (a
    /// waiter that gives up, or an attempt abandoned without an answer).
    /// Retried past the circuit breaker until `until`.
    pub(crate) async fn leave(
        &self,
        id: &Key,
        token: &str,
        attempt: &str,
        until: Instant,
    ) -> Result<(), TierError> {
        let [lock, _, queue, beats, _, tombs] = self.conns.keys.lock(id);
        let message = Event::Released.message(id);
        let (script, lock, queue, beats, tombs, channel, message) = (
            &self.conns.scripts.lock_leave,
            &lock,
            &queue,
            &beats,
            &tombs,
            &self.conns.channel,
            &message,
        );
        let _: i64 = self
            .conns
            .call_past_breaker()
            .until(until)
            .run(move |mut conn| async move {
                // The attempt may still arrive after this (its bytes held on
                // a connection the tier since replaced): remember it as
                // abandoned until the undo would have given up anyway.
                let tombstone = millis(until.saturating_duration_since(Instant::now())).max(1);
                script
                    .key(lock)
                    .key(queue)
                    .key(beats)
                    .key(tombs)
                    .arg(token)
                    .arg(attempt)
                    .arg(channel)
                    .arg(message)
                    .arg(tombstone)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(())
    }

    /// [`leave`](Self::leave) on its own task, for an attempt
    /// whose caller is gone or had no answer: the script may still run (or
    /// have run) after the caller stopped waiting, and only this token and
    /// attempt id can give back what it took. The leave may reach Redis
    /// before the attempt (the attempt held on a connection that was since
    /// replaced): it then leaves a tombstone, and the late attempt takes
    /// nothing.
    pub(crate) fn abandon(
        self: &Arc<Self>,
        id: Key,
        token: String,
        attempt: String,
        lease: Duration,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let locks = self.clone();
        let until = Instant::now() + lease.max(QUEUE_HEARTBEAT);
        runtime.spawn(async move {
            if locks.leave(&id, &token, &attempt, until).await.is_err() {
                tracing::warn!(lock = %id, "an abandoned lock attempt could not be undone; what it took lapses by itself");
            }
        });
    }
}

/// Reads the acquisition script's reply: `{won, a, b, seen}`, or
/// `{2, 0, 0, policy, maxmemory}` for a server that may evict the lock's
/// key (see `scripts/lock_acquire.lua`).
fn read_reply(reply: &[Value]) -> Result<(i64, i64, i64, Option<Policy>), TierError> {
    let int = |i: usize| -> Result<i64, TierError> {
        redis::from_redis_value_ref(reply.get(i).unwrap_or(&Value::Nil))
            .map_err(|e| TierError::Redis(e.into()))
    };
    let won = int(0)?;
    if won == 2 {
        let text = |i: usize| -> String {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .unwrap_or_default()
        };
        return Ok((2, 0, 0, Some(eviction::refusal(text(3), &text(4)))));
    }
    let seen = match int(3)? {
        1 => Some(Policy::Keeps),
        2 => Some(Policy::Unknown),
        _ => None,
    };
    Ok((won, int(1)?, int(2)?, seen))
}

/// Sends `WAIT` on `conn`. On a cluster the client would send it to every
/// primary and answer the fewest acknowledgements, so one lagging replica
/// on any shard (or a frozen primary) would fail every synced lock: it goes
/// to the primary of `route`'s slot alone, on the client's connection to
/// it, the one the acquisition's write went out on (on a cluster, the
/// replicas counted are the lock's shard's).
#[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
async fn wait_on_slot(
    conn: Conn,
    route: &str,
    wait: &redis::Cmd,
) -> Result<i64, redis::RedisError> {
    match conn {
        #[cfg(feature = "redis-cluster")]
        Conn::Cluster(mut conn) => {
            use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
            let slot = super::health::slot(route.as_bytes());
            let to = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let acked = conn
                .route_command(wait.clone(), RoutingInfo::SingleNode(to))
                .await?;
            Ok(redis::from_redis_value(acked)?)
        }
        mut conn => wait.query_async(&mut conn).await,
    }
}

/// Gives back what an acquisition may hold in Redis (its queue place, a hold
/// taken by a try whose answer never came, a hold the replicas did not
/// acknowledge) when it ends without handing the lock over: cancelled by its
/// caller, or failed.
pub(crate) struct AbandonOnDrop {
    tier: Arc<RedisTier>,
    id: Key,
    token: String,
    attempt: String,
    lease: Duration,
    /// Disarmed once the lock is handed over (or given back some other way).
    pub(crate) armed: bool,
}

impl AbandonOnDrop {
    pub(crate) fn new(
        tier: &Arc<RedisTier>,
        id: Key,
        token: &str,
        attempt: &str,
        lease: Duration,
    ) -> Self {
        AbandonOnDrop {
            tier: tier.clone(),
            id,
            token: token.to_owned(),
            attempt: attempt.to_owned(),
            lease,
            armed: true,
        }
    }
}

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.tier.lock_abandon(
                self.id,
                std::mem::take(&mut self.token),
                std::mem::take(&mut self.attempt),
                self.lease,
            );
        }
    }
}
