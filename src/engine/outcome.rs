//! What a caller gets back: the L1's [`Miss`], and the [`Answer`] a miss
//! resolves to (an entry [`Served`] with its [`Status`], a [`Failure`] of
//! some [`FailureKind`], or an answer for the caller alone).

use std::any::Any;
use std::sync::Arc;

use super::entry::{Entry, Held};
use super::rebuild::Rebuild;
use super::SharedError;
use crate::key::Key;

/// Why a flight gave no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// The rebuild returned an error.
    Error,
    /// The rebuild panicked.
    Panic,
    /// The rebuild ran past the rebuild timeout.
    Timeout,
    /// The wait budget ran out and the policy fails closed.
    WaitTimeout,
}

/// A failed flight's outcome, as every waiter shares it.
#[derive(Clone)]
pub(crate) struct Failure {
    pub kind: FailureKind,
    pub error: Option<SharedError>,
    /// The origin's own answer to the failure (a 5xx, as the fleet's
    /// failure marker kept it), to present in place of one the layer makes.
    pub answer: Option<Arc<Entry>>,
}

impl Failure {
    pub(crate) fn new(kind: FailureKind) -> Self {
        Failure {
            kind,
            error: None,
            answer: None,
        }
    }
}

/// How a caller was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// A fresh entry, without waiting for anyone.
    Hit,
    /// A stale entry (while one refresh runs, or standing in for a failure).
    Stale,
    /// The rebuild this caller started.
    Miss,
    /// A rebuild someone else started.
    Coalesced,
}

/// An entry to serve.
pub(crate) struct Served<V, P> {
    pub held: Held<V>,
    pub status: Status,
    /// The rebuild this caller started stored the entry (in the L1: the
    /// shared tier's commit may still be fenced off).
    pub stored: bool,
    /// Extras for the request that started the rebuild (its cookies).
    pub private: Option<P>,
}

/// What a miss resolved to, for one caller.
pub(crate) enum Answer<R: Rebuild> {
    Served(Served<R::Value, R::Private>),
    /// An entry a rebuild this caller waited on gave, with the caller's own
    /// rebuild unused: the adapter runs it alone if it cannot take the
    /// entry after all (a streamed body whose start is already gone).
    Shared(Served<R::Value, R::Private>, R),
    /// The caller's own answer from the rebuild it started.
    Private(R::Private),
    /// Nothing to serve; `Status` says whether this caller started the
    /// rebuild (`Miss`) or waited for it (`Coalesced`).
    Failed(Failure, Status),
    /// Call the origin for this caller alone, uncached: the rebuild back.
    Alone(R),
    /// The rebuild this caller started panicked: resume the panic.
    Panicked(Box<dyn Any + Send>),
}

/// A miss, as the L1 left it.
pub(crate) struct Miss {
    pub(super) key: Option<Key>,
    pub(super) stale: Option<Arc<Entry>>,
    /// The key is in a hit-for-miss window: no coalescing.
    pub(super) hit_for_miss: bool,
}

impl Miss {
    pub(crate) fn new(key: Key, stale: Option<Arc<Entry>>) -> Self {
        Miss {
            key: Some(key),
            stale,
            hit_for_miss: false,
        }
    }

    /// A miss that must not coalesce (hit-for-miss).
    pub(crate) fn hit_for_miss(key: Key) -> Self {
        Miss {
            key: Some(key),
            stale: None,
            hit_for_miss: true,
        }
    }

    /// Whether an expired entry was there (one that may stand in for a
    /// failed rebuild).
    pub(crate) fn has_stale(&self) -> bool {
        self.stale.is_some()
    }
}
