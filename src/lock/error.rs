//! [`LockError`]: why a lock was not acquired or released.

use std::fmt;

/// Why a lock was not acquired or released.
///
/// ```
/// use stampede_guard::{Backend, Lock, LockError};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// match Lock::new(Backend::local()).acquire("job").await {
///     Ok(guard) => { /* do the work */ drop(guard) }
///     Err(LockError::Timeout) => { /* someone else is doing it */ }
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner held the lock for the whole wait budget.
    Timeout,
    /// The backend could not be asked (Redis unreachable or failing; the
    /// error says which, and keeps the cause). A lock never falls back to a
    /// local one: that would not exclude other processes.
    Unavailable(crate::Error),
    /// The Redis that would have granted the lock may evict its key (a
    /// `maxmemory` set and a `maxmemory-policy` other than `noeviction`, as
    /// that server read them in the same atomic step), and
    /// [`Lock::allow_evicting_server`](crate::Lock::allow_evicting_server)
    /// was not set: an evicted hold would be a free lock while its holder
    /// still works. Nothing was taken, and a waiter left the queue. Use a
    /// Redis with `noeviction` for locks, or opt in.
    EvictingServer {
        /// That server's `maxmemory-policy` (on a cluster, the lock's
        /// primary's).
        policy: String,
        /// Its `maxmemory`, in bytes.
        maxmemory: u64,
    },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Timeout => f.write_str("lock not acquired within the wait budget"),
            // The cause is the source, not repeated here.
            LockError::Unavailable(_) => f.write_str("lock backend unavailable"),
            LockError::EvictingServer { policy, maxmemory } => write!(
                f,
                "lock refused: redis may evict its key (maxmemory-policy {policy}, \
                 maxmemory {maxmemory}); use maxmemory-policy noeviction for locks, \
                 or opt in with Lock::allow_evicting_server(true)"
            ),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Timeout | LockError::EvictingServer { .. } => None,
            LockError::Unavailable(e) => Some(e),
        }
    }
}
