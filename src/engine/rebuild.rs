//! Step 4's contract with the adapters: how to rebuild a key ([`Rebuild`]),
//! what a rebuild made ([`Built`]), what becomes of the waiters of an answer
//! for one client ([`Waiters`]), and whether an invalidation overtook a
//! running rebuild ([`Overtaken`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::entry::{CacheValue, Held, Lifetime};
use super::flight::Watch;
use super::tags::{TagSet, TagTable};
use super::SharedError;

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
        /// The key's answers cannot be stored (a body over the size cap):
        /// after this flight the key skips coalescing for this long, so that
        /// later requests go to the origin side by side instead of queueing
        /// behind one whose answer will not be kept.
        hit_for_miss: Option<Duration>,
    },
    /// An answer for the request that started the rebuild alone; `waiters`
    /// says what becomes of the requests waiting on it.
    Unshared { private: P, waiters: Waiters },
    /// The rebuild failed: `shared` is what the waiters may have of the
    /// error, `private` what its starter gets, and `answer`, if any, what
    /// the waiters and the fleet's failure backoff present in its place
    /// (the origin's status, for an answer that may not be shared whole).
    Failed {
        shared: Option<SharedError>,
        private: Option<P>,
        answer: Option<V>,
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
    /// `private`): the waiters go to the origin side by side, and the key is
    /// marked for this long (its requests still coalesce; a flight whose
    /// answer is again for one client releases its waiters at once). A
    /// shareable answer is stored and ends the mark.
    HitForMiss(Duration),
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
