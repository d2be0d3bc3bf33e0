//! [`LockError`]: why a lock was not acquired or released.

use std::fmt;

/// Why a lock was not acquired or released.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner held the lock for the whole wait budget.
    Timeout,
    /// The backend could not be asked (Redis unreachable or failing; the
    /// error says which, and keeps the cause). A lock never falls back to a
    /// local one: that would not exclude other processes.
    Unavailable(crate::Error),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Timeout => f.write_str("lock not acquired within the wait budget"),
            LockError::Unavailable(why) => write!(f, "lock backend unavailable: {why}"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Timeout => None,
            LockError::Unavailable(e) => Some(e),
        }
    }
}
