//! The cache's calls on the shared tier: an entry and its rebuild lease.
//!
//! Every call is one script, one round trip, on the keys of one entry (one
//! hash tag, so one cluster slot). A call whose reply never comes may still
//! have run: whatever lease it may have taken or kept is released by its
//! token in the background, so a deadline leaves nothing behind.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::RedisError;

use super::barrier::Barrier;
use super::carried::{self, Holder};
use super::connection::Conn;
use super::connections::Connections;
use super::notify::Event;
use super::{Lease, RedisTier, TierError};
use crate::key::Key;
use crate::metrics::{self as m, count, Labels};
use crate::store::millis;

/// How long a lease may be held by a token whose release went unanswered,
/// when the caller does not know the lease's own time.
const DEFAULT_ORPHAN_WINDOW: Duration = Duration::from_secs(30);

/// The first backoff after a failed rebuild: for this long, every instance
/// that misses the key shares the failure instead of calling the origin.
pub(crate) const FAILURE_BACKOFF: Duration = Duration::from_millis(250);

/// The longest backoff: each further failure of an episode doubles it, up to
/// this. Also how long a failure is remembered after its backoff ends, so
/// that a failure within that time continues the episode.
pub(crate) const FAILURE_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// An entry as Redis holds it, with its remaining lifetimes.
pub(crate) struct Remote {
    pub bytes: Bytes,
    /// Remaining freshness; `None` when stale.
    pub fresh: Option<Duration>,
    /// Time until the value expires from Redis altogether, if it has a TTL.
    pub remaining: Option<Duration>,
}

/// What `fetch_or_lease` found.
pub(crate) enum Fetched {
    /// A fresh entry.
    Fresh(Remote),
    /// The lease is ours: rebuild, then commit. The old entry, if any.
    Leased {
        lease: Box<Lease>,
        stale: Option<Remote>,
    },
    /// Someone else holds the lease for `lease_pttl`. The old entry, if
    /// any, and what proves that lease's commit (see [`carried`]).
    Held {
        lease_pttl: Duration,
        stale: Option<Remote>,
        holder: Option<Holder>,
    },
    /// The last rebuild failed with this code, and its backoff runs for
    /// `backoff` more: share the failure, do not call the origin.
    Failing {
        code: u8,
        backoff: Duration,
        stale: Option<Remote>,
        /// The origin's own answer to that failure, if one was kept.
        answer: Option<Bytes>,
    },
}

/// The longest answer to a failed rebuild kept beside its failure marker
/// (an encoded entry: its status, headers and body). A longer one is not
/// kept: requests during the backoff then get the layer's own answer.
pub(crate) const FAILURE_ANSWER_MAX: usize = 64 * 1024;

/// The longest value `fetch_or_lease` returns in its reply. A longer one
/// is read by a call of its own, whose time limit allows for its size (see
/// [`transfer`]): a value of many megabytes takes longer than a deadline to
/// cross a link, and that is no failure of Redis.
const INLINE_VALUE: u64 = 256 * 1024;

/// The least rate at which a value is expected to cross the link and be
/// read, in bytes a second.
const TRANSFER_RATE: u64 = 16 << 20;

/// How much longer than its deadline a call that carries `bytes` may take.
fn transfer(bytes: u64) -> Duration {
    Duration::from_millis(bytes.saturating_mul(1000) / TRANSFER_RATE)
}

/// The entry / lease protocol of one tier: every call names the keys of one
/// entry.
pub(crate) struct Entries {
    conns: Arc<Connections>,
    /// Whose pending invalidations a fetch makes Redis hear first.
    barrier: Arc<Barrier>,
}

impl Entries {
    pub(super) fn new(conns: Arc<Connections>, barrier: Arc<Barrier>) -> Self {
        Entries { conns, barrier }
    }

    /// Returns the entry if fresh; otherwise tries to take the lease. With
    /// `early`, also takes the lease for a fresh entry that has no more than
    /// that much freshness left. One round trip.
    /// A lease taken renews and is given back through `tier`.
    pub(crate) async fn fetch_or_lease(
        self: &Arc<Self>,
        tier: &Arc<RedisTier>,
        key: &Key,
        lease_time: Duration,
        early: Option<Duration>,
    ) -> Result<Fetched, TierError> {
        if let Some(invalidated) = self.barrier.pending.get(&key.group()) {
            // This instance invalidated the group and Redis has not heard:
            // what Redis holds for it is old. Tell it now, or this is a
            // failed call (the caller rebuilds here, from the origin).
            self.barrier.invalidate_once(&invalidated).await?;
        }
        let keys = self.conns.keys.entry(key);
        let (secret, token) = Lease::new_secret();
        let mut invocation = self.conns.scripts.fetch_or_lease.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        invocation.key(self.conns.keys.failure_answer(key));
        invocation
            .arg(&token)
            .arg(millis(lease_time).max(1))
            .arg(early.map_or(-1, |d| millis(d).min(1 << 52) as i64))
            .arg(millis(FAILURE_BACKOFF_CAP))
            .arg(INLINE_VALUE);
        let script = &invocation;
        // The lease's validity counts from the first send of the script, not
        // from the call's start: a call under the breaker may wait in the
        // process for room on the connection first (see `Breaker::admit`).
        let first_send = std::sync::OnceLock::new();
        let first_send = &first_send;
        let run = move |mut conn: Conn| {
            first_send.get_or_init(std::time::Instant::now);
            async move { script.invoke_async(&mut conn).await }
        };
        // While the slot moves, the script (which names the lease key) is
        // refused; a fresh entry is read without it first, and only a key
        // that needs the lease waits for the move, within the deadline.
        let started = std::time::Instant::now();
        let reply = match self.conns.call(&keys[2]).once().run(run).await {
            Err(e) if e.is_moving() => match self.fetch_fresh(&keys).await {
                Ok(Some(entry)) => return Ok(Fetched::Fresh(entry)),
                _ => self.conns.call(&keys[2]).run(run).await,
            },
            reply => reply,
        };
        type Reply = (i64, Vec<u8>, i64, i64, String, i64, String, Vec<u8>);
        let (status, value, a, value_pttl, generation, foreign, withheld, answer): Reply =
            match reply {
                Ok(reply) => reply,
                Err(e) if e.is_moving() => {
                    // The slot is on the move and the script did not run: a
                    // fresh entry can still be read without the lease key.
                    return match self.fetch_fresh(&keys).await {
                        Ok(Some(entry)) => Ok(Fetched::Fresh(entry)),
                        _ => Err(e),
                    };
                }
                Err(e) => {
                    // The script may have run, and taken the lease, after we
                    // stopped waiting: nobody else knows the token.
                    if e.may_have_run() {
                        self.release_orphan(*key, token, lease_time);
                    }
                    return Err(e);
                }
            };
        if foreign == 1 {
            self.count_corrupt(key);
        }
        let value = match withheld.as_str() {
            "" => value,
            withheld => match self.fetch_value(&keys[0], withheld).await {
                Ok(Some(value)) => value,
                // Gone or replaced since: a fresh hit is a miss now, and a
                // stale copy there is none.
                Ok(None) if status == 1 => return Err(TierError::Busy),
                Err(e) if status == 1 => return Err(e),
                _ => Vec::new(),
            },
        };
        let value = Bytes::from(value);
        let remote = |fresh: Option<Duration>| {
            Some(Remote {
                bytes: without_generation(&value)?,
                fresh,
                remaining: positive(value_pttl),
            })
        };
        Ok(match status {
            1 => match remote(positive(a)) {
                Some(entry) => Fetched::Fresh(entry),
                None => return Err(protocol_error()),
            },
            2 => Fetched::Leased {
                stale: remote(None),
                lease: Box::new(Lease::new(
                    tier.clone(),
                    *key,
                    (secret, token),
                    a.max(0) as u64,
                    lease_time,
                    generation,
                    first_send.get().copied().unwrap_or(started),
                )),
            },
            3 => Fetched::Held {
                lease_pttl: positive(a).unwrap_or(Duration::ZERO),
                stale: remote(None),
                holder: Holder::parse(&generation),
            },
            4 => Fetched::Failing {
                // A code this version does not know is a failure still.
                code: generation.parse().unwrap_or(0),
                backoff: positive(a).unwrap_or(Duration::ZERO),
                stale: remote(None),
                answer: (!answer.is_empty()).then(|| Bytes::from(answer)),
            },
            _ => return Err(protocol_error()),
        })
    }

    /// The value at `key` that was too long for the reply of
    /// `fetch_or_lease`, which named it `<size>:<generation>`, if it still
    /// carries that generation (the one the script found current): read
    /// with a plain `GET`, so Redis copies it once rather than through a
    /// script, under a time limit that allows for its size.
    async fn fetch_value(&self, key: &str, withheld: &str) -> Result<Option<Vec<u8>>, TierError> {
        // Bytes from Redis: a reply that does not parse is no value.
        let Some((size, generation)) = withheld.split_once(':') else {
            return Ok(None);
        };
        let Ok(size) = size.parse::<u64>() else {
            return Ok(None);
        };
        let bytes: Option<Vec<u8>> = self
            .conns
            .call(key)
            .within(self.conns.config.deadline.saturating_add(transfer(size)))
            .run(|mut conn| async move { redis::cmd("GET").arg(key).query_async(&mut conn).await })
            .await?;
        let carries = |b: &[u8]| {
            b.strip_prefix(generation.as_bytes())
                .is_some_and(|rest| rest.first() == Some(&b'|'))
        };
        Ok(bytes.filter(|b| carries(b)))
    }

    /// The entry if it is fresh, read with its value, freshness marker and
    /// generation only (no lease key): what a slot on the move still serves.
    async fn fetch_fresh(
        self: &Arc<Self>,
        keys: &[String; 6],
    ) -> Result<Option<Remote>, TierError> {
        let [value, fresh, _, _, generation, _] = keys;
        let mut invocation = self.conns.scripts.fetch_fresh.prepare_invoke();
        invocation.key(value).key(fresh).key(generation);
        let script = &invocation;
        let (status, value, fresh_pttl, value_pttl): (i64, Vec<u8>, i64, i64) = self
            .conns
            .call(value)
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
            .await?;
        if status != 1 {
            return Ok(None);
        }
        Ok(without_generation(&Bytes::from(value)).map(|bytes| Remote {
            bytes,
            fresh: positive(fresh_pttl),
            remaining: positive(value_pttl),
        }))
    }

    /// Stores a rebuilt entry under the lease's fence, releases the lease and
    /// wakes the fleet. Returns false if a newer entry won.
    pub(crate) async fn commit(
        self: &Arc<Self>,
        lease: &mut Lease,
        entry: Bytes,
        fresh: Duration,
        keep: Duration,
        labels: Labels,
    ) -> Result<bool, TierError> {
        lease.settle();
        let keys = self.conns.keys.entry(&lease.key);
        let mut invocation = self.conns.scripts.commit.prepare_invoke();
        for k in &keys {
            invocation.key(k);
        }
        let mut tagged = Vec::with_capacity(lease.generation.len() + 1 + entry.len());
        tagged.extend_from_slice(lease.generation.as_bytes());
        tagged.push(b'|');
        tagged.extend_from_slice(&entry);
        // The wake-up carries a small entry (see `carried`).
        let (secret, fence) = (lease.secret(), lease.fence.0);
        let woken = carried::message(&lease.key, secret, fence, fresh, keep, &entry);
        invocation
            .arg(lease.token())
            .arg(lease.fence.0)
            .arg(tagged)
            .arg(millis(fresh))
            .arg(millis(keep).max(1))
            .arg(&self.conns.channel)
            .arg(woken)
            .arg(Event::Failed.message(&lease.key))
            .arg(&lease.generation);
        // Owed whatever the circuit says: the rebuilt value is stored if the
        // node answers within the deadline.
        let script = &invocation;
        let limit = self
            .conns
            .config
            .deadline
            .saturating_add(transfer(entry.len() as u64));
        let commit = self
            .conns
            .call(&keys[2])
            .owed()
            .within(limit)
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await });
        let stored: i64 = match commit.await {
            Ok(stored) => stored,
            Err(e) => {
                // Whether or not the commit ran, the lease must not outlive
                // it: release it by its token (a no-op if the commit did).
                self.release_orphan(lease.key, lease.token().to_owned(), lease.time);
                return Err(e);
            }
        };
        if stored == 0 {
            self.conns
                .stats
                .fenced_writes
                .fetch_add(1, Ordering::Relaxed);
            count(m::FENCED_WRITES, labels);
            tracing::info!(key = %lease.key, fence = lease.fence.0, "late commit refused: a newer entry is stored");
        }
        Ok(stored == 1)
    }

    /// Gives the lease up without storing, telling waiters to retry now
    /// (`failure` `None`) or to share the rebuild's failure, with its code.
    /// Returns false if it was no longer ours.
    /// With a failure, `answer` is the origin's own answer to it (an
    /// encoded entry, at most [`FAILURE_ANSWER_MAX`] bytes), kept beside
    /// the marker for the requests answered during the backoff.
    pub(crate) async fn release(
        self: &Arc<Self>,
        lease: &mut Lease,
        failure: Option<u8>,
        answer: Option<Bytes>,
    ) -> Result<bool, TierError> {
        lease.settle();
        if lease.is_lost() {
            // The token is gone from Redis (renewal refused, or the lease
            // lapsed): the compare-token script would do nothing, and a
            // failing Redis need not be asked again.
            return Ok(false);
        }
        let message = match failure {
            Some(code) => Event::failure(&lease.key, code),
            None => Event::Failed.message(&lease.key),
        };
        let answer = answer.filter(|a| a.len() <= FAILURE_ANSWER_MAX);
        let marker = failure.map(|code| (code, lease.generation.as_str(), answer));
        self.release_with(&lease.key, lease.token(), message, lease.time, marker)
            .await
    }

    pub(crate) async fn release_token(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
    ) -> Result<bool, TierError> {
        self.release_with(
            key,
            token,
            Event::Failed.message(key),
            DEFAULT_ORPHAN_WINDOW,
            None,
        )
        .await
    }

    async fn release_with(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
        message: String,
        window: Duration,
        failure: Option<(u8, &str, Option<Bytes>)>,
    ) -> Result<bool, TierError> {
        let [_, _, route, ..] = self.conns.keys.entry(key);
        let failure = failure.as_ref();
        let release = self
            .conns
            .call(&route)
            .owed()
            .run(|conn| self.release_script(conn, key, token, &message, failure));
        match release.await {
            Ok(released) => Ok(released == 1),
            Err(e) => {
                // Unanswered, or not even sent (the circuit is open): the
                // lease is still held, and only this token can free it.
                self.release_orphan(*key, token.to_owned(), window);
                Err(e)
            }
        }
    }

    /// The release script itself, without the deadline or the breaker.
    /// With `failure` (its code, the lease's generation, and the origin's
    /// answer if kept), it leaves the failure marker that starts or
    /// continues the key's backoff.
    async fn release_script(
        &self,
        mut conn: Conn,
        key: &Key,
        token: &str,
        message: &str,
        failure: Option<&(u8, &str, Option<Bytes>)>,
    ) -> Result<i64, RedisError> {
        let [_, _, lease_key, _, _, failed] = self.conns.keys.entry(key);
        let (code, generation, answer) = match failure {
            Some((code, generation, answer)) => (
                code.to_string(),
                *generation,
                answer.as_deref().unwrap_or(b""),
            ),
            None => (String::new(), "", &b""[..]),
        };
        self.conns
            .scripts
            .release
            .key(lease_key)
            .key(failed)
            .key(self.conns.keys.failure_answer(key))
            .arg(token)
            .arg(&self.conns.channel)
            .arg(message)
            .arg(code)
            .arg(generation)
            .arg(millis(FAILURE_BACKOFF).max(1))
            .arg(millis(FAILURE_BACKOFF_CAP).max(1))
            .arg(answer)
            .invoke_async(&mut conn)
            .await
    }

    /// The origin's answer to the key's last failed rebuild, if one is
    /// kept: for the instances that waited on that rebuild and heard of its
    /// failure, which the release that kept it published.
    pub(crate) async fn failure_answer(&self, key: &Key) -> Result<Option<Bytes>, TierError> {
        let answer_key = self.conns.keys.failure_answer(key);
        let answer_key = answer_key.as_str();
        let bytes: Option<Vec<u8>> = self
            .conns
            .call(answer_key)
            .run(|mut conn| async move {
                redis::cmd("GET")
                    .arg(answer_key)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        // Written `<generation>|<answer>` (release.lua).
        let answer = bytes.and_then(|b| {
            let bar = b.iter().take(24).position(|&c| c == b'|')?;
            b[..bar]
                .iter()
                .all(u8::is_ascii_digit)
                .then(|| Bytes::from(b).slice(bar + 1..))
        });
        Ok(answer.filter(|a| !a.is_empty()))
    }

    /// Releases a lease by its token in the background, for a call whose
    /// outcome is unknown (its deadline passed, its connection failed) or
    /// that could not be made: a script may have taken or kept the lease
    /// after the caller stopped waiting, and then nobody else could release
    /// it, and the fleet would wait it out. Retries past the circuit breaker
    /// until the lease would have lapsed by itself; a release of a token that
    /// no longer holds the lease does nothing.
    pub(crate) fn release_orphan(self: &Arc<Self>, key: Key, token: String, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tier = self.clone();
        let until = std::time::Instant::now() + lease;
        runtime.spawn(async move {
            let message = Event::Failed.message(&key);
            let (tier, key, token, message) = (&tier, &key, &token, &message);
            let [_, _, route, ..] = tier.conns.keys.entry(key);
            let released = tier
                .conns
                .call(&route)
                .until(until)
                .run(|conn| tier.release_script(conn, key, token, message, None))
                .await;
            if let Ok(1) = released {
                tracing::debug!(key = %key, "released a lease whose call had no answer");
            }
        });
    }

    pub(crate) async fn renew(
        self: &Arc<Self>,
        key: &Key,
        token: &str,
        time: Duration,
    ) -> Result<bool, TierError> {
        let [_, _, lease_key, fence, generation, _] = self.conns.keys.entry(key);
        let mut invocation = self.conns.scripts.renew.key(&lease_key);
        invocation
            .key(fence)
            .key(generation)
            .arg(token)
            .arg(millis(time).max(1));
        let script = &invocation;
        // Owed like the commit it keeps possible: a circuit that opened
        // while the node answers again must not cost the lease.
        let renewed: i64 = self
            .conns
            .call(&lease_key)
            .owed()
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
            .await?;
        Ok(renewed == 1)
    }

    pub(crate) fn count_corrupt(&self, key: &Key) {
        self.conns
            .stats
            .corrupt_entries
            .fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::CORRUPT_ENTRIES);
        tracing::warn!(key = %key, "unreadable entry in Redis; treating it as a miss");
    }
}

/// A stored value without its `<generation>|` prefix. A value without one
/// (none at all, foreign bytes, an entry of an earlier version) is not the
/// group's current value: it is absent.
fn without_generation(value: &Bytes) -> Option<Bytes> {
    let head = &value[..value.len().min(24)];
    match head.iter().position(|&b| b == b'|') {
        Some(bar) if bar > 0 && head[..bar].iter().all(u8::is_ascii_digit) => {
            Some(value.slice(bar + 1..))
        }
        _ => None,
    }
}

fn positive(ms: i64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

fn protocol_error() -> TierError {
    TierError::Redis(RedisError::from((
        redis::ErrorKind::Client,
        "unexpected reply from a stampede-guard script",
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_without_a_generation_is_absent() {
        let tagged = Bytes::from_static(b"17|entry");
        assert_eq!(without_generation(&tagged).as_deref(), Some(&b"entry"[..]));
        for foreign in [&b"entry"[..], b"|x", b"abc|x", b""] {
            assert!(without_generation(&Bytes::from(foreign)).is_none());
        }
    }
}
