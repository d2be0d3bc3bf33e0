//! A lock across processes: [`Lock`], whose documentation says what it
//! guarantees and what it does not.

use std::fmt;
#[cfg(feature = "redis")]
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

use crate::backend::Backend;
use crate::key::Key;
use crate::limits;
#[cfg(feature = "redis")]
use crate::store::redis::held::LeaseKind;
#[cfg(feature = "redis")]
use crate::store::redis::lock::{new_attempt, AbandonOnDrop, Attempt, QUEUE_HEARTBEAT};
#[cfg(feature = "redis")]
use crate::store::redis::renew::Renewer;
#[cfg(feature = "redis")]
use crate::store::redis::{migrating, RedisTier};

/// How long an acquisition pauses before trying again on a slot on the move.
#[cfg(feature = "redis")]
const MIGRATION_PAUSE: Duration = Duration::from_millis(10);

use crate::fence::FencingToken;

mod error;
mod guard;
pub use error::LockError;
use guard::never_lost;
pub use guard::LockGuard;

/// A named lock for critical sections across processes: a flash sale that
/// must not oversell, a job that must run on one node. On Redis it is the
/// rebuild lease, made public; on [`Backend::local()`] it covers **one process
/// only** (see [On the embedded backend](#on-the-embedded-backend)). Clone it
/// freely.
///
/// **Read this first.** The lock alone is an *efficiency* lock: a holder that
/// is alive but stalled (a long pause, a partition) can outlive its lease, and
/// another holder then takes the lock while the first still works. Use the
/// [fencing token](LockGuard::fencing_token) with the protected resource for
/// correctness, and stop when [`lost`](LockGuard::lost) completes, as below.
///
/// ```no_run
/// use std::time::Duration;
/// use stampede_guard::{Backend, FencingToken, Lock};
///
/// # async fn run(backend: Backend) -> Result<(), Box<dyn std::error::Error>> {
/// // backend: Backend::redis("redis://127.0.0.1:6379").await?, shared by the fleet
/// let lock = Lock::new(backend)
///     .lease(Duration::from_secs(10))
///     .wait_budget(Duration::from_secs(5));
///
/// let guard = lock.acquire("stock:sku-42").await?;
/// // Hand the fencing token to the resource on the read *and* the write, so
/// // it can refuse a holder whose lease ran out (see `FencingToken`).
/// let fence = guard.fencing_token();
/// tokio::select! {
///     _ = sell_one(fence) => {}
///     _ = guard.lost() => { /* the lease is ending: stop, do not commit */ }
/// }
/// guard.release().await?;
/// # Ok(()) }
/// # async fn sell_one(_: FencingToken) {}
/// ```
///
/// # Guarantees
/// On Redis, a lock is a hash holding a random owner token,
/// the tenure's fencing number and one record per hold, with a lease: only
/// that owner, under that fencing number, can renew or release it (a guard
/// whose lease lapsed cannot touch a newer hold of the same owner), and a
/// guard releases exactly its own hold, once. A watchdog renews the lease
/// every third of it while the guard lives (or until
/// [`max_hold`](Lock::max_hold)); a holder that dies loses it when the lease
/// runs out.
///
/// A lease can still run out under a holder that is alive but stalled (a long
/// pause, a partition), so the lock alone is an *efficiency* lock. The
/// guard's [`lost`](LockGuard::lost) future completes *before* the lease can
/// lapse: the watchdog counts the lease from when a renewal was sent, less a
/// margin (a tenth of the lease, at most a second), and reports the loss when
/// that passes without a confirmed renewal. That narrows the overlap to a
/// holder that does not look, or stalls between looking and acting. For
/// *correctness*, pass the guard's [`FencingToken`] to the protected resource
/// and have it refuse a token lower than one it has seen, on reads as well as
/// writes (or write conditionally on what was read).
///
/// # Eviction
/// Redis cannot exempt a key from eviction: with a `maxmemory`
/// and any `maxmemory-policy` but `noeviction` it may evict a held lock's
/// key, and a second owner would then take the lock while the first still
/// works. So on such a server acquisitions fail with
/// [`LockError::EvictingServer`], unless
/// [`allow_evicting_server`](Lock::allow_evicting_server) opts in. Every
/// attempt is judged by the server that would grant it, in the same atomic
/// script (it reads `INFO memory`): a policy set at runtime, a failover, a
/// slot moved to another primary or a reconnect is seen by the very next
/// attempt, a waiter's included. Where `INFO` is refused to the user the
/// policy is unknown: a warning is logged once and locks go on (a script
/// cannot run `CONFIG`, so `CONFIG GET` rights do not help). Opted in, the watchdog finds an evicted
/// hold at its next renewal and the guard is lost, and fencing tokens keep
/// rising across the eviction; until that renewal two owners may hold the
/// lock, so fence the resource. Keep locks on a Redis with `noeviction`, a
/// separate one if the cache's Redis must evict (see
/// [the topology guide](crate::guide::topology)).
///
/// # Faults
/// Acquiring goes through the backend's circuit breaker: with
/// Redis failing, [`acquire`](Lock::acquire) says so at once. Giving back
/// does not: [`release`](LockGuard::release), a dropped guard, renewals and a
/// waiter leaving the queue bypass the breaker and are retried, each try
/// under the deadline, until the lease (or queue place) would have lapsed by
/// itself; `release` fails only if no try was answered by then. An attempt
/// whose reply never came (its deadline passed, or its caller was cancelled)
/// is undone in the background by its owner token and attempt id, so what it
/// took is not held by nobody; a retried attempt is never counted twice.
///
/// # Fairness
/// Waiters are served first come, first served: each joins a
/// queue in Redis, and the lock goes to the head of the queue, so a waiter
/// cannot starve while others release and re-acquire. A waiter's place lasts
/// a short heartbeat (750 ms), refreshed while it waits whatever its wait
/// budget: a waiter that gives up or is cancelled leaves at once, and one
/// that died or is paused drops out when its heartbeat lapses, so a free lock
/// waits for a dead head for about one heartbeat.
///
/// # Waking
/// A release, a waiter leaving and a lapsed head dropped from the
/// queue publish on the backend's channel, and every waiter for that lock
/// retries at once; a lease that expires (holder died) wakes them when it
/// runs out. Waiters also refresh their places (every 250 ms), which is when
/// they notice a lapsed head nobody announced.
///
/// # On the embedded backend
/// On [`Backend::local()`] the same API locks within the process (with the
/// same queue order, fencing numbers and reentrancy, and a cancelled waiter
/// leaving the queue at once); leases cannot be lost there. Such a lock does
/// not exclude another process or another machine: use a Redis backend for
/// that.
///
/// ```
/// use stampede_guard::{Backend, Lock};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lock = Lock::new(Backend::local()); // this process only
/// let guard = lock.acquire("nightly-report").await.unwrap();
/// // ... the work only one holder in this process may do ...
/// assert!(guard.release().await.unwrap());
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    backend: Backend,
    lease: Duration,
    wait_budget: Duration,
    max_hold: Option<Duration>,
    synced: Option<(u32, Duration)>,
    allow_evicting_server: bool,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("lease", &self.lease)
            .field("wait_budget", &self.wait_budget)
            .field("max_hold", &self.max_hold)
            .field("synced", &self.synced)
            .field("allow_evicting_server", &self.allow_evicting_server)
            .finish()
    }
}

/// Who holds a lock. Acquisitions with the same owner are reentrant: the lock
/// counts its holds and is released when the last guard goes.
///
/// ```
/// use stampede_guard::{Backend, Lock, LockOwner};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lock = Lock::new(Backend::local());
/// let owner = LockOwner::new();
/// let outer = lock.acquire_as("account:7", &owner).await.unwrap();
/// let inner = lock.acquire_as("account:7", &owner).await.unwrap();
/// assert_eq!(inner.holds(), 2);
/// # drop((inner, outer));
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockOwner {
    token: String,
}

impl LockOwner {
    /// A new owner with a random 128-bit token (not guessable).
    ///
    /// ```
    /// let owner = stampede_guard::LockOwner::new();
    /// assert_ne!(owner, stampede_guard::LockOwner::new());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        LockOwner {
            token: format!("{:032x}", crate::random::unguessable_u128()),
        }
    }
}

impl Default for LockOwner {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a capability: do not print it.
        f.write_str("LockOwner(..)")
    }
}

impl Lock {
    /// A lock on `backend`: 10 s lease (renewed while held), 10 s wait budget.
    ///
    /// ```
    /// use stampede_guard::{Backend, Lock};
    ///
    /// let lock = Lock::new(Backend::local());
    /// ```
    #[must_use]
    pub fn new(backend: Backend) -> Self {
        Lock {
            backend,
            lease: Duration::from_secs(10),
            wait_budget: Duration::from_secs(10),
            max_hold: None,
            synced: None,
            allow_evicting_server: false,
        }
    }

    /// How long a holder keeps the lock without renewing it. The guard's
    /// watchdog renews it every third of this; a dead holder loses it after
    /// at most this long. Default 10 s; from 3 ms to 2^31 s, a shorter one
    /// taken as 3 ms, a longer one as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Lock};
    /// let lock = Lock::new(Backend::local()).lease(Duration::from_secs(3));
    /// ```
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = limits::LOCK_LEASE.clamp(lease);
        self
    }

    /// How long [`acquire`](Self::acquire) waits for the lock (default
    /// 10 s; from 0 to 2^31 s, a longer one taken as 2^31 s).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Lock};
    /// let lock = Lock::new(Backend::local()).wait_budget(Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn wait_budget(mut self, budget: Duration) -> Self {
        self.wait_budget = limits::LOCK_WAIT_BUDGET.clamp(budget);
        self
    }

    /// The longest a guard keeps the lock: its watchdog stops renewing this
    /// long after the acquisition, so the lease runs out after at most
    /// `max_hold` plus one lease, and the guard is then
    /// [lost](LockGuard::lost). Unset by default (renewed while the guard
    /// lives). From 0 to 2^31 s, a longer one taken as 2^31 s. On the
    /// embedded backend a lock is never lost, and this has no effect.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, Lock};
    /// let lock = Lock::new(Backend::local()).max_hold(Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(limits::LOCK_MAX_HOLD.clamp(max_hold));
        self
    }

    /// Acquisitions wait until `replicas` replicas have acknowledged the
    /// hold and its fencing number (`WAIT`, at most `timeout`), and fail
    /// with [`LockError::Unavailable`] (the hold given back) when fewer did.
    /// This is the way to fencing tokens that keep rising across a
    /// failover: a replica that acknowledged the number and is promoted
    /// hands out greater ones. It is not consensus: Sentinel may promote a
    /// replica that did not acknowledge (ask for every replica), and a
    /// failover during the `WAIT` loses what was not acknowledged. Each
    /// acquisition costs one more round trip, and holds the instance's
    /// command connection until the replicas answer: keep `timeout` short.
    /// On Redis Cluster the replicas are those of the lock's own shard.
    /// On the embedded backend it has no effect. Off by default; `replicas`
    /// 0 turns it off; `timeout` is from 0 to 2^31 s, a longer one taken as
    /// 2^31 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::{Backend, Lock};
    ///
    /// // On Redis, each acquisition waits up to 50 ms for one replica to
    /// // acknowledge it (no effect on the embedded backend used here).
    /// let lock = Lock::new(Backend::local()).synced(1, Duration::from_millis(50));
    /// ```
    #[must_use]
    pub fn synced(mut self, replicas: u32, timeout: Duration) -> Self {
        self.synced =
            (replicas > 0).then_some((replicas, limits::LOCK_SYNCED_TIMEOUT.clamp(timeout)));
        self
    }

    /// Whether to take locks on a Redis that may evict their keys (a
    /// `maxmemory` set and a `maxmemory-policy` other than `noeviction`).
    /// Off by default: such a server may evict a held lock's key, and a
    /// second owner then takes the lock while the first still works, so
    /// acquisitions are refused with [`LockError::EvictingServer`]. The
    /// server that would grant the lock reads its own settings in the
    /// acquisition's script, at every attempt; allowed, that read is skipped.
    ///
    /// Allowed, an evicted hold is found at the holder's next renewal (a
    /// third of the lease at most): its guard is then
    /// [lost](LockGuard::lost). Until then another owner may hold the lock
    /// too, so pass the [`FencingToken`] to the protected resource: tokens
    /// keep rising across the eviction (a lost counter starts again from
    /// Redis's clock in microseconds, above every number issued before),
    /// and the resource refuses the evicted holder once the new one has
    /// been seen. On the embedded backend it has no effect.
    ///
    /// ```
    /// # use stampede_guard::{Backend, Lock};
    /// let lock = Lock::new(Backend::local()).allow_evicting_server(true);
    /// ```
    #[must_use]
    pub fn allow_evicting_server(mut self, allow: bool) -> Self {
        self.allow_evicting_server = allow;
        self
    }

    fn id(name: &str) -> Key {
        Key::for_value("lock", name.as_bytes())
    }

    /// Takes the lock `name`, waiting up to the wait budget.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] if another owner held it for the whole wait
    /// budget; [`LockError::Unavailable`] if the backend could not be asked.
    ///
    /// ```
    /// # use stampede_guard::{Backend, Lock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let lock = Lock::new(Backend::local());
    /// let first = lock.acquire("job").await.unwrap();
    /// drop(first);
    /// let second = lock.acquire("job").await.unwrap();
    /// # drop(second);
    /// # }
    /// ```
    pub async fn acquire(&self, name: &str) -> Result<LockGuard, LockError> {
        self.acquire_inner(name, &LockOwner::new(), Some(self.wait_budget), false)
            .await?
            .ok_or(LockError::Timeout)
    }

    /// Takes the lock `name` if it is free (and nobody queues for it), without
    /// waiting.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] if the backend could not be asked (a lock
    /// held by another owner is `Ok(None)`, not an error).
    ///
    /// ```
    /// # use stampede_guard::{Backend, Lock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let lock = Lock::new(Backend::local());
    /// let held = lock.try_acquire("job").await.unwrap().expect("free");
    /// assert!(lock.try_acquire("job").await.unwrap().is_none());
    /// # drop(held);
    /// # }
    /// ```
    pub async fn try_acquire(&self, name: &str) -> Result<Option<LockGuard>, LockError> {
        self.acquire_inner(name, &LockOwner::new(), None, false)
            .await
    }

    /// Takes the lock `name` for `owner`, waiting up to the wait budget. If
    /// `owner` already holds it, this adds a hold instead (reentrancy): the
    /// lock is released when every guard of the owner is gone.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// See [`LockOwner`] for an example.
    pub async fn acquire_as(&self, name: &str, owner: &LockOwner) -> Result<LockGuard, LockError> {
        self.acquire_inner(name, owner, Some(self.wait_budget), true)
            .await?
            .ok_or(LockError::Timeout)
    }

    async fn acquire_inner(
        &self,
        name: &str,
        owner: &LockOwner,
        wait: Option<Duration>,
        reenter: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let id = Self::id(name);
        #[cfg(feature = "redis")]
        if let Some(l2) = self.backend.engine.fleet.tier() {
            return self.acquire_redis(l2, id, owner, wait, reenter).await;
        }
        // A Redis backend still connecting in the background has no
        // fleet-wide lock yet, and a local one would not exclude the others.
        #[cfg(feature = "redis")]
        if self.backend.engine.fleet.is_connecting() {
            let why = if self.backend.engine.fleet.is_shut() {
                "the backend was shut down"
            } else {
                "redis is not connected yet: the backend started without it"
            };
            return Err(LockError::Unavailable(crate::Error::new(
                crate::ErrorKind::Unavailable,
                why,
            )));
        }
        let locks = &self.backend.locks;
        Ok(locks
            .acquire(id, &owner.token, wait, reenter)
            .await
            .map(|(fence, holds)| LockGuard {
                id,
                token: owner.token.clone(),
                fence: FencingToken(fence),
                holds,
                lost: never_lost(),
                #[cfg(feature = "redis")]
                renewer: None,
                locks: self.backend.locks.clone(),
                released: false,
            }))
    }

    #[cfg(feature = "redis")]
    async fn acquire_redis(
        &self,
        l2: &Arc<RedisTier>,
        id: Key,
        owner: &LockOwner,
        wait: Option<Duration>,
        reenter: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let unavailable = |e: crate::store::redis::TierError| LockError::Unavailable(e.into());
        let give_up = wait.map(|w| Instant::now() + w);
        // A waiter's place lasts one heartbeat, whatever its wait budget, and
        // every attempt refreshes it: a waiter that died, is paused or was
        // cancelled unheard holds back the queue for one heartbeat at most.
        let beat = wait.map(|_| QUEUE_HEARTBEAT);
        let refresh = QUEUE_HEARTBEAT / 3;
        // One id for every try of this acquisition: a hold it took is
        // answered again, never counted twice, and can be undone by the id.
        let attempt = new_attempt();
        // Armed before the first try, and until the lock is handed over as a
        // guard: if the caller gives up on us (drops the future, even with
        // the first try on its way) or a try goes unanswered, the queue place
        // and any hold the tries took are given back in the background.
        let mut abandon = AbandonOnDrop::new(l2, id, &owner.token, &attempt, self.lease);
        loop {
            // Listen before asking, so a release in between still wakes us.
            let mut registration = l2.listen(id);
            let sent = Instant::now();
            let reply = match l2
                .lock_acquire(
                    &id,
                    &owner.token,
                    &attempt,
                    self.lease,
                    beat,
                    reenter,
                    self.synced,
                    !self.allow_evicting_server,
                )
                .await
            {
                // A slot on the move: the same attempt again, shortly, with
                // the same token (one queue place, one hold at most).
                Err(e) if migrating(&e) && give_up.is_some_and(|at| Instant::now() < at) => {
                    tokio::time::sleep(MIGRATION_PAUSE).await;
                    continue;
                }
                reply => reply.map_err(unavailable)?,
            };
            let pttl = match reply {
                Attempt::Held { fence, holds } => {
                    abandon.armed = false;
                    return Ok(Some(
                        self.guard_redis(l2, id, owner, fence, holds, sent, attempt),
                    ));
                }
                Attempt::Busy { pttl } => pttl,
                // Judged by the server that would have granted it, at that
                // moment; the undo gives back a hold an earlier try of this
                // attempt may have taken there.
                Attempt::Evicting { policy, maxmemory } => {
                    return Err(LockError::EvictingServer { policy, maxmemory });
                }
            };
            let left = give_up.map_or(Duration::ZERO, |at| {
                at.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                if wait.is_some() {
                    let until = Instant::now() + QUEUE_HEARTBEAT;
                    let _ = l2.lock_leave(&id, &owner.token, &attempt, until).await;
                }
                abandon.armed = false;
                return Ok(None);
            }
            // Woken by a release or a change in the queue; failing that, by
            // the holder's lease running out (it died), the time to refresh
            // our place, or the budget.
            let sleep = pttl
                .map_or(left, |p| p + Duration::from_millis(2))
                .min(refresh)
                .min(left);
            registration.wait(sleep).await;
        }
    }

    #[cfg(feature = "redis")]
    #[allow(clippy::too_many_arguments)]
    fn guard_redis(
        &self,
        tier: &Arc<RedisTier>,
        id: Key,
        owner: &LockOwner,
        fence: u64,
        holds: u64,
        sent: Instant,
        attempt: String,
    ) -> LockGuard {
        let renewer = Renewer::start(
            tier.clone(),
            LeaseKind::Lock { fence, attempt },
            id,
            owner.token.clone(),
            self.lease,
            sent,
            self.max_hold,
        );
        LockGuard {
            id,
            token: owner.token.clone(),
            fence: FencingToken(fence),
            holds,
            lost: renewer.lost(),
            renewer: Some(renewer),
            locks: self.backend.locks.clone(),
            released: false,
        }
    }
}
