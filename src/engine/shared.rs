//! The flight's step in the shared tier: the entry another instance built,
//! the key's rebuild lease, or a wait for the holder's publish (which may
//! carry the entry: then no second read); and, after the rebuild, the commit
//! under the lease's fence.
//!
//! Without Redis (or with its circuit open) the plan is always "rebuild", and
//! the in-process flight is the only protection.

use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

#[cfg(feature = "redis")]
use super::codec;
#[cfg(feature = "redis")]
use super::entry::CacheValue;
use super::entry::Entry;
use super::FailureKind;
#[cfg(feature = "redis")]
use super::{Engine, FlightPolicy};
#[cfg(feature = "redis")]
use crate::key::Key;
#[cfg(feature = "redis")]
use crate::metrics::{self as m, count};
#[cfg(feature = "redis")]
use std::sync::atomic::Ordering;

#[cfg(feature = "redis")]
use super::entry::Freshness;
#[cfg(feature = "redis")]
use crate::store::redis::carried::Holder;
#[cfg(feature = "redis")]
use crate::store::redis::notify::{Event, Registration};
#[cfg(feature = "redis")]
pub(crate) use crate::store::redis::Lease;
#[cfg(feature = "redis")]
use crate::store::redis::{Fetched, RedisTier, Remote};

/// A rebuild lease: the fleet-wide right to rebuild a key. On the embedded
/// backend there is no such thing, and the type is empty.
#[cfg(not(feature = "redis"))]
pub(crate) enum Lease {}

/// Why a flight was started.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start {
    /// A request missed: it waits for the answer.
    Miss,
    /// A stale entry is being served: refresh it, nobody waits.
    Refresh,
    /// An early refresh of an entry with this much freshness left: refresh
    /// it unless another instance already did or is doing so (only the
    /// shared tier can tell).
    Early(#[cfg_attr(not(feature = "redis"), allow(dead_code))] Duration),
}

/// What the flight does next, after asking the shared tier. Without the
/// shared tier it is always `Rebuild`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Plan {
    /// A fresh entry from Redis. `waited`: another instance's rebuild was
    /// waited for to get it.
    Hit { entry: Arc<Entry>, waited: bool },
    /// Rebuild now, with this lease (`None`: no shared tier, or it is down).
    Rebuild {
        lease: Option<Lease>,
        stale: Option<Arc<Entry>>,
    },
    /// Serve this stale entry at once (stale-while-revalidate) and refresh
    /// it in the background, with the lease if one was taken.
    StaleNow {
        entry: Arc<Entry>,
        lease: Option<Lease>,
    },
    /// Waited the whole budget for another instance's rebuild.
    TimedOut { stale: Option<Arc<Entry>> },
    /// The instance that held the lease failed to rebuild, while this one
    /// waited for it, or the key's failure backoff runs: share its failure
    /// rather than call the origin again.
    Failed {
        kind: FailureKind,
        stale: Option<Arc<Entry>>,
    },
}

/// The plan with Redis. `Start::Miss` may hand back a stale entry inside
/// stale-while-revalidate at once instead of waiting; `Start::Early` takes
/// the lease even for a fresh entry, as long as the one in Redis has no more
/// freshness left than the one judged due (if it has more, another instance
/// already refreshed it: that is a hit).
#[cfg(feature = "redis")]
pub(super) async fn plan_shared<V: CacheValue>(
    engine: &Engine,
    shared: &Arc<RedisTier>,
    key: Key,
    mut stale: Option<Arc<Entry>>,
    policy: &FlightPolicy,
    start: Start,
) -> Plan {
    // Failing open, a flight waits for another instance's rebuild as long as
    // that rebuild may run (its timeout, plus a lease for its failure notice
    // or its lease to lapse): the holder then commits, shares its failure,
    // or is gone. Giving up sooner would send every instance to an origin
    // that is merely slow. Failing closed, the budget is the route's answer.
    let patience = if policy.fail_open {
        policy
            .wait_budget
            .max(policy.rebuild_timeout.saturating_add(policy.lease))
    } else {
        policy.wait_budget
    };
    let give_up = Instant::now() + patience;
    let serve_stale = matches!(start, Start::Miss);
    let mut early = match start {
        Start::Early(left) => Some(left),
        _ => None,
    };
    // Set once an unreadable entry was counted, so the same bytes seen again
    // beside our lease are not counted twice.
    let mut corrupt = false;
    let mut waited = false;
    // Set when Redis's fresh entry was built before an invalidation of its
    // tags: take the lease over it, once.
    let mut invalidated = false;
    loop {
        if !shared.is_available_for(&key) {
            return Plan::Rebuild { lease: None, stale };
        }
        // Listen before asking, so a publish between the answer and the wait
        // still wakes us.
        let mut registration = shared.notifier.register(key);
        // Redis's remaining freshness is counted from when the question was
        // sent: the reply may come late, and counting from its arrival would
        // call an entry fresh after Redis's own freshness has ended.
        let now = Instant::now();
        let ask = if invalidated {
            Some(Duration::MAX)
        } else {
            early
        };
        let fetched = match shared.fetch_or_lease(&key, policy.lease, ask).await {
            Ok(fetched) => fetched,
            Err(_) => return Plan::Rebuild { lease: None, stale },
        };
        let (lease, lease_pttl, old, holder) = match fetched {
            Fetched::Fresh(remote) => match decode::<V>(remote, now) {
                Some(entry) if !engine.admits_remote(shared, &entry).await => {
                    invalidated = true;
                    continue;
                }
                Some(entry) => {
                    count(m::L2_HITS, policy.labels);
                    return Plan::Hit {
                        entry: Arc::new(entry),
                        waited,
                    };
                }
                None => {
                    shared.count_corrupt(&key);
                    corrupt = true;
                    // Take the lease over the unreadable entry.
                    early = Some(Duration::MAX);
                    continue;
                }
            },
            Fetched::Leased { lease, stale } => (Some(*lease), Duration::ZERO, stale, None),
            Fetched::Held {
                lease_pttl,
                stale,
                holder,
            } => (None, lease_pttl, stale, holder),
            Fetched::Failing {
                code,
                backoff,
                stale: old,
            } => {
                // As below: a copy from before a purge of its tags is none.
                let old = old
                    .and_then(|r| decode_or_count::<V>(shared, &key, r, now, corrupt))
                    .filter(|e| engine.admits_remote_now(shared, e));
                stale = newer(stale, old);
                tracing::debug!(key = %key, ?backoff, "the last rebuild failed: backing off");
                if serve_stale
                    && let Some(entry) = stale
                        .as_ref()
                        .filter(|e| e.servable_while_revalidating(now))
                {
                    return Plan::StaleNow {
                        entry: entry.clone(),
                        lease: None,
                    };
                }
                // A code this version does not know is a plain error.
                let kind = FailureKind::from_code(code).unwrap_or(FailureKind::Error);
                return Plan::Failed { kind, stale };
            }
        };
        // A copy from before an invalidation of its tags is none at all.
        let old = old
            .and_then(|r| decode_or_count::<V>(shared, &key, r, now, corrupt))
            .filter(|e| engine.admits_remote_now(shared, e));
        stale = newer(stale, old);
        if serve_stale
            && let Some(entry) = stale
                .as_ref()
                .filter(|e| e.servable_while_revalidating(now))
        {
            return Plan::StaleNow {
                entry: entry.clone(),
                lease,
            };
        }
        if let Some(lease) = lease {
            return Plan::Rebuild {
                lease: Some(lease),
                stale,
            };
        }
        // Another instance holds the lease. (An early refresh that finds one
        // already refreshing waits for its commit too, and so loads the new
        // entry before its own copy expires.)
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Plan::TimedOut { stale };
        }
        // Woken by the holder's commit or failure notice; failing that, by
        // the lease running out (its holder died), or the budget.
        let woke = registration
            .wait(left.min(lease_pttl + Duration::from_millis(2)))
            .await;
        // The holder's entry is built after the invalidation.
        invalidated = false;
        if let Some(Event::FailedWith(code)) = woke
            && let Some(kind) = FailureKind::from_code(code)
        {
            return Plan::Failed { kind, stale };
        }
        waited = true;
        if woke == Some(Event::Committed)
            && let Some(entry) = carried::<V>(engine, shared, &registration, holder, now).await
        {
            shared
                .notifier
                .stats
                .carried
                .fetch_add(1, Ordering::Relaxed);
            count(m::L2_HITS, policy.labels);
            return Plan::Hit {
                entry: Arc::new(entry),
                waited,
            };
        }
    }
}

/// The entry the holder's commit carried, if it passes every check a
/// fetched entry passes: the commit is of the lease this waiter saw held
/// (its fence and token), nothing was invalidated on the channel since the
/// waiter asked Redis, the codec reads it, and its tags admit it. Its
/// freshness counts from `asked`, before the commit ran. Anything else is
/// a plain wake-up: the caller fetches.
#[cfg(feature = "redis")]
async fn carried<V: CacheValue>(
    engine: &Engine,
    shared: &Arc<RedisTier>,
    registration: &Registration,
    holder: Option<Holder>,
    asked: Instant,
) -> Option<Entry> {
    let carried = registration.carried()?;
    if !holder?.proves(carried) {
        tracing::debug!("a commit's wake-up that is not of the lease waited for");
        return None;
    }
    let remote = Remote {
        bytes: carried.entry()?,
        fresh: Some(carried.fresh).filter(|d| !d.is_zero()),
        remaining: Some(carried.keep).filter(|d| !d.is_zero()),
    };
    let entry = decode::<V>(remote, asked)?;
    // Checked again after the tags' possible read: an invalidation heard
    // meanwhile wins.
    (entry.freshness(Instant::now()) == Freshness::Fresh
        && engine.admits_remote(shared, &entry).await
        && registration.carried().is_some())
    .then_some(entry)
}

#[cfg(feature = "redis")]
fn decode<V: CacheValue>(remote: Remote, now: Instant) -> Option<Entry> {
    let (envelope, stamp, payload) = codec::decode(remote.bytes)?;
    let value = V::decode(payload)?;
    Some(
        Entry::from_remote(value, &envelope, remote.fresh, remote.remaining, now).with_stamp(stamp),
    )
}

#[cfg(feature = "redis")]
fn decode_or_count<V: CacheValue>(
    shared: &RedisTier,
    key: &Key,
    remote: Remote,
    now: Instant,
    counted: bool,
) -> Option<Arc<Entry>> {
    let entry = decode::<V>(remote, now);
    if entry.is_none() && !counted {
        shared.count_corrupt(key);
    }
    entry.map(Arc::new)
}

/// The later of two stale entries.
#[cfg(feature = "redis")]
fn newer(a: Option<Arc<Entry>>, b: Option<Arc<Entry>>) -> Option<Arc<Entry>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.fresh_until() >= a.fresh_until() {
            b
        } else {
            a
        }),
        (a, b) => a.or(b),
    }
}
