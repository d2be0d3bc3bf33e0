//! A held lock: its fencing token, its loss, and its release.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

#[cfg(doc)]
use super::Lock;
use super::LockError;
use crate::fence::FencingToken;
use crate::key::Key;
use crate::store::locks::LocalLocks;
#[cfg(feature = "redis")]
use crate::store::redis::renew::Renewer;

/// The loss flag of a lock that cannot be lost (the embedded backend): a
/// channel closed at `false`.
pub(super) fn never_lost() -> watch::Receiver<bool> {
    watch::channel(false).1
}

/// A held lock. Dropping it releases the hold in the background; call
/// [`release`](Self::release) to wait for that and see its result.
///
/// ```
/// use stampede_guard::{Backend, Lock};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lock = Lock::new(Backend::local());
/// let guard = lock.acquire("job").await.unwrap();
/// let first = guard.fencing_token();
/// assert!(!guard.is_lost());
/// assert!(guard.release().await.unwrap());
/// let again = lock.acquire("job").await.unwrap();
/// assert!(again.fencing_token() > first);
/// # }
/// ```
pub struct LockGuard {
    pub(super) id: Key,
    pub(super) token: String,
    pub(super) fence: FencingToken,
    pub(super) holds: u64,
    /// The renewer's loss flag (on Redis), read by `is_lost` and `lost`.
    pub(super) lost: watch::Receiver<bool>,
    /// Keeps the lease on Redis, and releases this hold if the guard is
    /// dropped; `None` on the embedded backend.
    #[cfg(feature = "redis")]
    pub(super) renewer: Option<Renewer>,
    pub(super) locks: Arc<LocalLocks>,
    pub(super) released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("fence", &self.fence)
            .field("holds", &self.holds)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The fencing number of this acquisition: larger than that of every
    /// earlier acquisition of the lock (a reentrant hold shares the first
    /// hold's number).
    ///
    /// See [`LockGuard`] for an example.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// How many holds the owner had when this guard was made (1 unless
    /// reentrant).
    ///
    /// See [`LockOwner`](super::LockOwner) for an example.
    #[must_use]
    pub fn holds(&self) -> u64 {
        self.holds
    }

    /// Whether the lease is lost or about to be: a renewal was refused, no
    /// renewal was confirmed within the lease's validity (counted from when
    /// it was sent, less a margin), or [`max_hold`](Lock::max_hold) passed.
    /// Another owner may hold the lock now or very soon.
    ///
    /// See [`LockGuard`] for an example.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        #[cfg(feature = "redis")]
        if let Some(renewer) = &self.renewer {
            return renewer.is_lost();
        }
        *self.lost.borrow()
    }

    /// Completes when the lease is lost, before it can lapse in Redis (see
    /// [`is_lost`](Self::is_lost)). Select on it beside the critical section
    /// to stop before committing anything.
    ///
    /// ```
    /// # use stampede_guard::{Backend, Lock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = Lock::new(Backend::local()).acquire("job").await.unwrap();
    /// tokio::select! {
    ///     () = guard.lost() => { /* stop: another owner may hold it */ }
    ///     () = async { /* the critical section */ } => {}
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|lost| *lost).await.is_err() {
            // The renewer is gone without reporting a loss (released, or the
            // embedded backend, where a lock cannot be lost): never completes.
            std::future::pending::<()>().await;
        }
    }

    /// Releases this hold now. Returns whether it was still ours (false if
    /// the lease had run out and perhaps passed to another owner).
    ///
    /// On Redis this bypasses the circuit breaker and is retried until the
    /// lease would have ended; it returns [`LockError::Unavailable`] only if
    /// Redis answered no try by then, and the hold has then lapsed by
    /// itself.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`], as above.
    ///
    /// See [`LockGuard`] for an example.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.released = true;
        #[cfg(feature = "redis")]
        if let Some(renewer) = &mut self.renewer {
            return renewer
                .release()
                .await
                .map_err(|e| LockError::Unavailable(e.into()));
        }
        Ok(self.locks.release(self.id, &self.token))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // On Redis the renewer releases an unsettled hold as it drops (in the
        // background; without a runtime the lease runs out by itself).
        #[cfg(feature = "redis")]
        if self.renewer.is_some() {
            return;
        }
        if !self.released {
            self.locks.release(self.id, &self.token);
        }
    }
}
