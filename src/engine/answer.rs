//! What passes between the driver and its adapters: how to rebuild
//! ([`Rebuild`]), what a rebuild made ([`Built`]), and what a caller gets
//! back ([`Answer`]).

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::entry::{CacheValue, Entry, Held, Lifetime};
use super::flight::Watch;
use super::tags::{TagSet, TagTable};
use super::SharedError;
use crate::key::Key;

/// How an adapter rebuilds a key: the HTTP layer calls the inner service, the
/// generic cache calls the caller's closure. It runs on the flight's task.
pub(crate) trait Rebuild: Send + Sized + 'static {
    /// What the engine stores and shares.
    type Value: CacheValue;
    /// What only the request that started the rebuild may have: its own
    /// response when it may not be shared, its own error.
    type Private: Send + 'static;

    /// Runs the rebuild once. `stale` is the entry it replaces, if any;
    /// `overtaken` tells it, while it runs, whether an invalidation came
    /// since it began (what it builds is then not stored).
    fn rebuild(
        self,
        stale: Option<Held<Self::Value>>,
        overtaken: Overtaken,
    ) -> impl Future<Output = Built<Self::Value, Self::Private>> + Send + 'static;
}

/// What a rebuild made.
pub(crate) enum Built<V, P> {
    /// A value the waiters may share. `store`: keep it in the tiers too.
    /// `failure`: an error answer (a 5xx) that a stale-if-error entry may
    /// replace.
    Value {
        value: V,
        lifetime: Lifetime,
        initial_age: Duration,
        store: bool,
        failure: bool,
        private: Option<P>,
        /// Its tags: an invalidation of any of them drops it.
        tags: TagSet,
    },
    /// An answer for the request that started the rebuild alone; `waiters`
    /// says what becomes of the requests waiting on it.
    Unshared { private: P, waiters: Waiters },
    /// The rebuild failed: `shared` is what the waiters may have of the
    /// error, `private` what its starter gets.
    Failed {
        shared: Option<SharedError>,
        private: Option<P>,
    },
}

/// What the waiters of a flight do when its answer was for one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiters {
    /// The answer says something about who asked, not about the key (a
    /// refusal such as a 403 or 429): one waiter leads a new flight, the
    /// others wait on it, and the key is left as it was. If that flight was
    /// itself such a re-lead, two answers in a row were unshareable: they
    /// look like the key's own (a redirect the route does not store), and
    /// the key gets this hit-for-miss window rather than queue its requests
    /// one behind the other.
    Relead(Duration),
    /// The answer says the key's answers are per client (a cookie,
    /// `private`): for this long the key skips coalescing, and the waiters go
    /// to the origin side by side. A shareable answer one of them gets is
    /// stored and ends the window.
    HitForMiss(Duration),
}

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
}

impl Failure {
    pub(crate) fn new(kind: FailureKind) -> Self {
        Failure { kind, error: None }
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

/// Whether an invalidation overtook a running rebuild: once it has, what the
/// rebuild builds is not stored. An adapter that must tell its caller
/// whether the answer is stored before the engine has decided (a response
/// head sent while its body still streams in) asks this first.
#[derive(Clone)]
pub(crate) struct Overtaken {
    tags: Arc<TagTable>,
    since: u64,
    flight: Option<Watch>,
}

impl Overtaken {
    pub(super) fn new(tags: Arc<TagTable>, since: u64, flight: Option<Watch>) -> Self {
        Overtaken {
            tags,
            since,
            flight,
        }
    }

    /// Whether a generation moved since the rebuild began, or an
    /// invalidation detached its flight.
    pub(crate) fn happened(&self) -> bool {
        self.tags.start() != self.since || self.flight.as_ref().is_some_and(Watch::detached)
    }
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
