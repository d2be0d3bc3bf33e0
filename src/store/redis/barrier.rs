//! The invalidation barrier: an invalidation returns only once every
//! instance that may still trust what it read before has dropped it, or has
//! stopped trusting its in-process tier.
//!
//! [`Barrier`] holds everything that makes that so: the invalidations that
//! did not reach Redis yet ([`Pending`]), the fleet's membership (whom an
//! invalidation waits for), the acknowledgements and their proof, and the
//! namespace's invalidation table (tag and whole-namespace generations),
//! whose moves wait for the fleet exactly as a group's invalidation does.
//! What bounds the wait is the subscription lease (see
//! [`super::liveness`]).
//!
//! **Acknowledgements.** An invalidation message carries its sender and a
//! nonce. Every instance that receives it first drops its copies (detaches
//! the group's flights, removes the group from its L1), then acknowledges
//! on the sender's own channel, `{channel}:ack:<instance>`. The sender
//! acknowledges its own echo locally, and counts the others as they come
//! (see the module doc).
//!
//! **Acknowledgements an invalidator can tell from forged ones.**
//! An acknowledgement published on the channel proves nothing by itself: a
//! client that may publish there can name any instance, and the channel
//! tells it the names and the nonces. So an instance acknowledges with
//! `ack.lua`, which first adds its name to the invalidation's own set,
//! `{prefix}:acks:{<sender>}:<nonce>`, then publishes. The name comes with
//! what the message it handled invalidated (`<instance>:<subject>`, the
//! subject a group's key, or a table field and its new generation): a
//! message of its own that copies a purge's nonce (on a cluster it may
//! reach an instance before the purge does, which crosses the cluster bus)
//! gets an acknowledgement of what it named, not of the purge. The sender
//! counts the published acknowledgements as they come (see
//! the module doc); once they cover the fleet, it reads that set once
//! and accepts them only if it names every member it waits for, with the
//! purge's subject. Otherwise (a forged acknowledgement, an
//! instance of an earlier version that acknowledged by a bare `PUBLISH`,
//! the read failing) it waits out the subscription lease, as for an
//! instance that never acknowledged. Adding to the set takes write access
//! to the crate's keys: a client that has it can do worse anyway.
//!
//! **Bursts.** None of this costs a round trip per invalidation queued
//! behind the others'. An instance acknowledges everything it handled
//! since its last acknowledgement at once: per sender, one `ack.lua` adds
//! its name to every set (a sender's sets share its hash tag, so one
//! cluster slot) and publishes one message naming every nonce. A sender's
//! reads are batched likewise (see [`Batches`]): the membership read and
//! the reads of its sets serve every invalidation that asked while the
//! previous read was under way, in one round trip, and each is made after
//! every invalidation it serves asked for it, so what the read says holds
//! for each as if it had read alone. The acknowledgements and the reads
//! are tried again while Redis may not have run them, within half a
//! lease: a call that met a deadline under a burst is queueing, not a
//! member that did not acknowledge.
//!
//! **Membership.**
//! `PUBLISH` counts only the subscribers it reached. An instance whose
//! subscriber connection Redis dropped a moment before (or one Redis is slow
//! to deliver to) is not counted, yet may still trust its in-process tier
//! until its subscription lease runs out. So every instance keeps itself in
//! one sorted set, `{prefix}:members` (its own cluster slot), scored with the
//! end of its lease on Redis's clock, and renews it only right after its
//! subscription was confirmed live (a keepalive PONG): an instance that
//! cannot hear the channel stops renewing and drops out once its own lease,
//! which began earlier on its own clock, has lapsed. A clean shutdown leaves
//! the set at once.
//!
//! An invalidation, once Redis has it, reads the members and waits until
//! every one of them (and as many instances as `PUBLISH` counted) has
//! acknowledged, and every member recorded its acknowledgement (see
//! the module doc), at most one subscription lease from the moment Redis
//! answered. A member not read has lapsed before the read; one that did not
//! acknowledge in time has lapsed by the end of the wait: either way it
//! serves nothing it read before the invalidation (see the module doc).
//! While acknowledgements are missing the membership is read again: a
//! member that left meanwhile (a shutdown, after which it is outside the
//! fleet and trusts its in-process tier as in an outage) is no longer
//! waited for.
//!
//! **Group invalidations.** The script removes the entry's keys, moves the
//! group's generation and publishes the purge; it is retried while Redis
//! does not have it, and one that never reached Redis is remembered here,
//! per group, and retried by the supervisor until Redis has it.
//!
//! **The invalidation table.** One hash, `{prefix}:tags`, with a generation
//! above everything (`all`: moved by the repair below, and by versions that
//! knew no namespaces), and for each namespace one for the whole namespace
//! and one per tag bucket: `n.all` and `b<n>` for the empty namespace,
//! `s<hex>.all` and `s<hex>.b<n>` for another (see
//! [`Field`]). A purge through one namespace moves only its own fields. It
//! is one key, in its own cluster slot, apart from every entry: no script
//! touches it together with an entry's keys. Entries record their
//! namespace and the generations they were built under; each instance
//! keeps the fields of the namespaces it has guards or caches for in
//! memory, moved by the messages [`bump`](Barrier::bump_generation)
//! publishes (a move of another namespace is ignored) and reloaded after
//! any gap in its subscription or a namespace new to it, and compares on
//! every read.
//!
//! **A Redis that went back in time.** Restored from a copy older than a
//! purge (or a replica that lagged promoted), Redis may hold entries purged
//! since, under the same epoch. Instances that heard a tag's or
//! everything's purge keep its generation, never lower; but a key's purge
//! moves nothing an instance keeps, and an instance started after the
//! restore knows no generation at all. So every purge also moves the
//! table's purge mark (`purges`): a key's after the purge itself
//! (`note_purge.lua`: a copy that holds the mark holds the purge), a tag's
//! or everything's with its generation. Each instance remembers the highest
//! mark it saw under the table's epoch (from its own purges and from every
//! read of the table). A read that finds the same epoch with a lower mark
//! repairs the table (`load_generations.lua`): `all` moves and every
//! instance hears it, so every entry stored before is void (one rebuild per
//! key for the fleet), and the mark is set back so the repair is made once.
//! So once an instance that made a purge, or read the table after one, is
//! connected, the restored copies of what was purged are misses from its
//! first read of the table on (the read that ends its rejoin). Before that,
//! and for good when no such instance is left, nothing tells the restored
//! table from the real one: an instance that reads it serves the restored
//! entries (until their TTL, or until that repair).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisError;
use tokio::sync::watch;
use tokio::time::Instant;

use super::acks::{all_acked, Acked, Batches};
use super::connection::Conn;
use super::connections::Connections;
use super::error::ErrorMeaning;
use super::keys;
use super::messages::{self, generation_subject, is_instance, recorded, AckDue, ACKED_MAX};
use super::notify::Notifier;
use super::TierError;
use crate::error::ErrorKind;
use crate::key::Key;
use crate::store::generations::{parse_generation, Field, Scope, BUCKETS};
use crate::store::millis;

/// How many subscription leases an acknowledgement set is kept: its sender
/// reads it within one lease of its message.
const ACKS_KEPT: u32 = 3;

/// The most members an invalidation waits for by name. With more in Redis,
/// it waits a whole lease instead (some members would go unread).
const MEMBERS_MAX: usize = 1_000;

/// An invalidation waiting for acknowledgements reads the membership again
/// this many times a subscription lease (see [`Barrier::acked_by_members`]).
const REREAD_EVERY: u32 = 6;

/// How long, in deadlines, an invalidation is tried before its caller is
/// told it failed (a few tries, with growing pauses between them).
const INVALIDATE_TRIES: u32 = 4;

/// How long, in deadlines, a bump is tried before its caller is told it
/// failed (as an invalidation).
const BUMP_TRIES: u32 = 4;

/// The invalidation barrier of one tier (see the module doc).
pub(crate) struct Barrier {
    conns: Arc<Connections>,
    notifier: Arc<Notifier>,
    /// Invalidations that did not reach Redis, retried until they do.
    pub(super) pending: Pending,
    /// The reads of the invalidations waiting for the fleet.
    reads: Arc<Reads>,
    /// The highest purge mark seen, and the epoch it was seen under (see
    /// the module doc, "a Redis that went back in time").
    seen: Mutex<(u64, u64)>,
    /// The highest epoch of the table read: a move on a table without an
    /// epoch it may keep starts one above it (see `bump_generation.lua`).
    epoch: std::sync::atomic::AtomicU64,
}

impl Barrier {
    pub(super) fn new(conns: Arc<Connections>, notifier: Arc<Notifier>) -> Self {
        Barrier {
            reads: Arc::new(Reads {
                conns: conns.clone(),
                notifier: notifier.clone(),
                members: Batches::default(),
                records: Batches::default(),
            }),
            conns,
            notifier,
            pending: Pending::default(),
            seen: Mutex::new((0, 0)),
            epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Remembers purge `mark`, seen in the table under `epoch`: a newer
    /// epoch's mark replaces an older one's, and within one epoch only the
    /// highest is kept.
    fn saw_mark(&self, epoch: u64, mark: u64) {
        self.epoch
            .fetch_max(epoch, std::sync::atomic::Ordering::AcqRel);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if epoch > seen.0 {
            *seen = (epoch, mark);
        } else if epoch == seen.0 {
            seen.1 = seen.1.max(mark);
        }
    }

    /// Moves the table's purge mark once a key's purge reached Redis (see
    /// the module doc). Its failure is only logged: the purge itself is
    /// made, and an older copy of Redis restored afterwards is then not
    /// told from the real one by this purge.
    async fn note_purge(&self, key: &Key, until: Option<std::time::Instant>) {
        let table = self.conns.keys.table();
        let script = self.conns.scripts.note_purge.key(&table);
        let script = &script;
        let call = self.conns.call(&table).owed();
        let call = match until {
            Some(until) => call.until(until),
            None => call,
        };
        let noted: Result<(Vec<u8>, Vec<u8>), TierError> = call
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
            .await;
        match noted {
            Ok((mark, epoch)) => {
                if let (Some(mark), Some(epoch)) =
                    (parse_generation(&mark), parse_generation(&epoch))
                {
                    self.saw_mark(epoch, mark);
                }
            }
            Err(error) => tracing::warn!(
                key = %key,
                error = %error,
                "a purge reached redis, but not its mark in the invalidation table"
            ),
        }
    }

    /// Drops the key's whole group (every variant of its URL) from Redis and
    /// from every instance's L1, in one step whatever the number of variants:
    /// the group's generation moves.
    ///
    /// An invalidation is a write the caller is owed, not a read the cache
    /// can do without: it goes to Redis even while the circuit is open, and
    /// is tried for [`INVALIDATE_TRIES`] deadlines (each try under the
    /// deadline, with growing pauses) before the caller is told it did not
    /// reach Redis. Then this instance remembers it (see [`Pending`]) and
    /// the supervisor retries it until Redis has it.
    ///
    /// Once Redis has it, this waits for the acknowledgements of every
    /// instance that received the message and of every member of the fleet
    /// (see the module doc), at most one subscription lease: an
    /// instance that has not acknowledged by then has stopped trusting
    /// anything it read before the message.
    pub(crate) async fn invalidate(&self, key: &Key, what: &Purged) -> Result<(), TierError> {
        let nonce = crate::random::unguessable_u64();
        let mut acks = self.notifier.acks.expect(nonce);
        let _forget = self.notifier.acks.forget_when_dropped(nonce);
        let until = std::time::Instant::now() + self.conns.config.deadline * INVALIDATE_TRIES;
        let tier = self;
        let [_, _, route, ..] = self.conns.keys.entry(key);
        let purged = self
            .conns
            .call(&route)
            .until(until)
            .run(|conn| tier.invalidate_script(conn, key, nonce))
            .await;
        let receivers = match purged {
            Ok((_, receivers)) => receivers,
            Err(error) => {
                if !error.retry_may_help() {
                    tracing::warn!(purged = %what, key = %key, error = %error,
                        "invalidation did not reach redis, and is not retried");
                } else if self.pending.remember(key, what) {
                    tracing::warn!(purged = %what, key = %key, error = %error,
                        "invalidation did not reach redis; kept, and retried until redis has it");
                } else {
                    tracing::error!(purged = %what, key = %key, error = %error,
                        "invalidation did not reach redis, and too many wait for it: not kept");
                }
                return Err(error);
            }
        };
        // A newer invalidation of the group supersedes a pending one.
        self.pending.forget(key);
        self.note_purge(key, Some(until)).await;
        let receivers = u64::try_from(receivers).unwrap_or(0);
        let subject = messages::key_subject(&key.group());
        let acked = self
            .await_fleet(&mut acks, receivers, nonce, &subject)
            .await;
        if !acked {
            self.conns
                .stats
                .unconfirmed_invalidations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                key = %key,
                "not every instance acknowledged the invalidation within a subscription \
                 lease: those have stopped trusting their in-process tier"
            );
        }
        Ok(())
    }

    /// One try of a pending invalidation, under the deadline and the
    /// breaker, without waiting for acknowledgements. Forgets it once done.
    pub(crate) async fn invalidate_once(&self, key: &Key) -> Result<(), TierError> {
        let [_, _, route, ..] = self.conns.keys.entry(key);
        self.conns
            .call(&route)
            .run(|conn| self.invalidate_script(conn, key, crate::random::unguessable_u64()))
            .await?;
        self.pending.forget(key);
        self.note_purge(key, None).await;
        Ok(())
    }

    /// Retries the pending invalidations, once each, past the breaker.
    pub(crate) async fn retry_pending(&self) {
        for (key, what) in self.pending.all() {
            let [_, _, route, ..] = self.conns.keys.entry(&key);
            let tried = self
                .conns
                .call(&route)
                .owed()
                .run(|conn| self.invalidate_script(conn, &key, crate::random::unguessable_u64()))
                .await;
            if tried.is_ok() {
                self.pending.forget(&key);
                self.note_purge(&key, None).await;
                tracing::info!(purged = %what, key = %key, "a pending invalidation reached redis");
            }
        }
    }

    /// The invalidation script: (entry keys removed, instances that
    /// received the message).
    async fn invalidate_script(
        &self,
        mut conn: Conn,
        key: &Key,
        nonce: u64,
    ) -> Result<(i64, i64), RedisError> {
        let [value, fresh, _, fence, generation, failed] = self.conns.keys.entry(key);
        // The message names the group: each instance drops all its variants.
        let message = self.notifier.invalidation(&key.group(), nonce);
        let mut invocation = self.conns.scripts.invalidate.key(value);
        invocation
            .key(fresh)
            .key(fence)
            .key(generation)
            .key(failed)
            .arg(&self.conns.channel)
            .arg(message);
        invocation.invoke_async(&mut conn).await
    }

    /// Moves `field`'s generation in Redis and tells every instance, then
    /// waits for their acknowledgements (and every fleet member's) exactly
    /// as an invalidation does (at most one subscription lease). `here` gets the new generation as soon
    /// as Redis has it, before the wait.
    pub(crate) async fn bump_generation(
        &self,
        field: Field,
        here: impl FnOnce(u64),
    ) -> Result<(), TierError> {
        let nonce = crate::random::unguessable_u64();
        let mut acks = self.notifier.acks.expect(nonce);
        let _forget = self.notifier.acks.forget_when_dropped(nonce);
        let until = std::time::Instant::now() + self.conns.config.deadline * BUMP_TRIES;
        let tier = self;
        let table = self.conns.keys.table();
        let bumped = self
            .conns
            .call(&table)
            .until(until)
            .run(|conn| tier.bump_script(conn, field, nonce))
            .await;
        let (generation, receivers) = match bumped {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(field = ?field, error = %error, "tag invalidation did not reach redis");
                return Err(error);
            }
        };
        here(generation);
        let subject = generation_subject(&field.name(), generation);
        let acked = self
            .await_fleet(&mut acks, receivers, nonce, &subject)
            .await;
        if !acked {
            self.conns
                .stats
                .unconfirmed_invalidations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                field = ?field,
                "not every instance acknowledged the tag invalidation within a subscription \
                 lease: those have stopped trusting their in-process tier"
            );
        }
        Ok(())
    }

    /// One run of the bump script: (the new generation, instances that
    /// received the message).
    async fn bump_script(
        &self,
        mut conn: Conn,
        field: Field,
        nonce: u64,
    ) -> Result<(u64, u64), RedisError> {
        let signed = self.notifier.signature(nonce);
        let (generation, receivers, mark, epoch): (Vec<u8>, i64, Vec<u8>, Vec<u8>) = self
            .conns
            .scripts
            .bump_generation
            .key(self.conns.keys.table())
            .arg(field.name())
            .arg(&self.conns.channel)
            .arg(signed)
            .arg(self.epoch.load(std::sync::atomic::Ordering::Acquire))
            .invoke_async(&mut conn)
            .await?;
        let generation = parse_generation(&generation).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Client,
                "unexpected generation from a stampede-guard script",
            ))
        })?;
        if let (Some(mark), Some(epoch)) = (parse_generation(&mark), parse_generation(&epoch)) {
            self.saw_mark(epoch, mark);
        }
        Ok((generation, u64::try_from(receivers).unwrap_or(0)))
    }

    /// The table's epoch and generations as Redis holds them now: `fields`,
    /// or the whole table (every field by name: one script, no command
    /// beyond the other scripts' own). `floor` is the epoch the caller
    /// knows: a table without an epoch, or one behind it, starts a new one
    /// (see the script). A field holding anything but a number this crate
    /// wrote, or one below the epoch (no script writes one), is treated as
    /// invalidated: it is moved (from Redis's clock, which the fleet hears)
    /// and its new generation returned. Fields Redis does not have are left
    /// out (never invalidated in this epoch).
    pub(crate) async fn load_generations(
        &self,
        fields: Option<&[Field]>,
        floor: u64,
    ) -> Result<(u64, Vec<(Field, u64)>), TierError> {
        self.load_generations_until(fields, &[], floor, None).await
    }

    /// [`Barrier::load_generations`]; a whole reload (every field of
    /// `scopes`' namespaces, and `all`) with `until` is tried again, past
    /// the breaker, until Redis answers or that instant passes.
    pub(crate) async fn load_generations_until(
        &self,
        fields: Option<&[Field]>,
        scopes: &[Scope],
        floor: u64,
        until: Option<std::time::Instant>,
    ) -> Result<(u64, Vec<(Field, u64)>), TierError> {
        let all: Vec<Field>;
        let reload = fields.is_none();
        let fields = match fields {
            Some(fields) => fields,
            None => {
                all = std::iter::once(Field::All)
                    .chain(scopes.iter().flat_map(|&scope| {
                        std::iter::once(Field::Own(scope))
                            .chain((0..BUCKETS).map(move |b| Field::Bucket(scope, b)))
                    }))
                    .collect();
                &all
            }
        };
        let table = self.conns.keys.table();
        let (seen_epoch, seen_mark) = *self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut invocation = self.conns.scripts.load_generations.key(&table);
        invocation
            .arg(floor)
            .arg(seen_epoch)
            .arg(seen_mark)
            .arg(&self.conns.channel)
            .arg(self.notifier.signature(crate::random::unguessable_u64()));
        for field in fields {
            invocation.arg(field.name());
        }
        let script = &invocation;
        // A whole reload happens after a gap or at start-up, off any
        // request's path: its failure is not the breaker's business.
        let values: Vec<Option<Vec<u8>>> = if reload {
            let call = self.conns.call_past_breaker();
            let call = match until {
                Some(until) => call.until(until),
                None => call,
            };
            call.run(move |mut conn| async move { script.invoke_async(&mut conn).await })
                .await?
        } else {
            self.conns
                .call(&table)
                .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
                .await?
        };
        let mut values = values.into_iter();
        let epoch = values
            .next()
            .flatten()
            .as_deref()
            .and_then(parse_generation)
            .ok_or_else(|| {
                TierError::Redis(RedisError::from((
                    redis::ErrorKind::Client,
                    "unexpected epoch from a stampede-guard script",
                )))
            })?;
        self.epoch
            .fetch_max(epoch, std::sync::atomic::Ordering::AcqRel);
        if let Some(mark) = values
            .next()
            .flatten()
            .as_deref()
            .and_then(parse_generation)
        {
            self.saw_mark(epoch, mark);
        }
        let mut loaded = Vec::new();
        if let Some(all) = values
            .next()
            .flatten()
            .as_deref()
            .and_then(parse_generation)
        {
            tracing::warn!(
                "redis holds an older copy of the invalidation table than this instance saw \
                 (restored from a snapshot, or a lagging replica took over): every entry \
                 stored before is invalidated"
            );
            loaded.push((Field::All, all));
        }
        let raw = fields.iter().copied().zip(values);
        for (field, value) in raw {
            let Some(value) = value else { continue };
            match parse_generation(&value) {
                Some(generation) if generation >= epoch => loaded.push((field, generation)),
                _ => {
                    tracing::warn!(field = ?field, "unreadable generation in redis; invalidating its tags");
                    let nonce = crate::random::unguessable_u64();
                    let (generation, _) = self
                        .conns
                        .call(&table)
                        .run(|conn| self.bump_script(conn, field, nonce))
                        .await?;
                    loaded.push((field, generation));
                }
            }
        }
        Ok((epoch, loaded))
    }

    /// The members an invalidation must hear from, read alone (see
    /// [`Reads::read_members`]).
    #[cfg(test)]
    async fn members(&self) -> Result<Membership, TierError> {
        self.reads.read_members().await
    }

    /// The membership as a read made after this call reads it, shared
    /// with every invalidation of this instance that asks meanwhile (see
    /// [`Batches`]): nothing if it could not be read before `until`.
    async fn membership(&self, until: Instant) -> Option<Arc<Membership>> {
        let (answer, start) = self.reads.members.queue(());
        if start {
            tokio::spawn(Reads::run_members(self.reads.clone()));
        }
        tokio::time::timeout_at(until, answer)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
    }

    /// After Redis answered the invalidation `nonce` (of `subject`: see
    /// the module doc) that `PUBLISH` delivered to `receivers`
    /// subscribers: waits for their acknowledgements and every member's,
    /// at most one subscription lease from now, then checks once that
    /// every member recorded its own. Returns whether they all came and
    /// were recorded; if not, it returns only once the lease is over. If
    /// the membership cannot be read (or has more than [`MEMBERS_MAX`]
    /// members), waits the whole lease: whoever did not hear the message
    /// has lapsed by then.
    pub(super) async fn await_fleet(
        &self,
        acks: &mut watch::Receiver<Acked>,
        receivers: u64,
        nonce: u64,
        subject: &str,
    ) -> bool {
        let until = Instant::now() + self.notifier.liveness.lease();
        match self.membership(until).await {
            Some(membership) => {
                let (members, young) = (&membership.0, membership.1);
                // A membership younger than a lease may not name an instance
                // that still trusts its in-process tier: wait a whole lease
                // from the read, as for a membership that cannot be read.
                // (Waiting only until the set is a lease old misses an
                // instance whose renewal lands just after the read, its
                // subscription dropped unannounced: the model's trace in
                // docs/MODEL.md.)
                let grown = Instant::now()
                    + if young.is_zero() {
                        Duration::ZERO
                    } else {
                        self.notifier.liveness.lease()
                    };
                let (mut acked, members) = self
                    .acked_by_members(acks, receivers, members.clone(), until)
                    .await;
                let members = &members;
                // The acknowledgements heard name every member: each must
                // also have recorded its own (see the module doc), or the
                // names may be forged.
                if acked && !self.recorded_by(nonce, subject, members, until).await {
                    tracing::warn!(
                        "acknowledgements of an invalidation name members that did not \
                         record them (forged, or an instance of an earlier version): the \
                         invalidation waits a whole subscription lease"
                    );
                    tokio::time::sleep_until(until).await;
                    acked = false;
                }
                if !young.is_zero() {
                    tracing::debug!(
                        "the fleet membership is younger than a subscription lease; the \
                         invalidation waits a whole lease"
                    );
                    tokio::time::sleep_until(grown).await;
                }
                acked
            }
            None => {
                tracing::warn!(
                    "cannot read the fleet membership; the invalidation waits a whole \
                     subscription lease"
                );
                tokio::time::sleep_until(until).await;
                false
            }
        }
    }

    /// Waits, at most until `until`, for `receivers` acknowledgements and
    /// one from every instance of `members`, reading the membership again
    /// [`REREAD_EVERY`] times a lease while some are missing: a member no
    /// longer in it has left (a shutdown, after which it trusts its
    /// in-process tier for the outage grace at most, as in an outage) or
    /// lapsed (its subscription lease ran out), and is no longer waited
    /// for; each one gone also lowers the receivers waited for by one (a
    /// member is one subscriber at most). A member that joined since is not
    /// waited for: it dropped its in-process tier when it joined. Returns
    /// whether they all came, and the members still waited for.
    async fn acked_by_members(
        &self,
        acks: &mut watch::Receiver<Acked>,
        receivers: u64,
        mut members: Vec<String>,
        until: Instant,
    ) -> (bool, Vec<String>) {
        let mut want = receivers;
        let every = (self.notifier.liveness.lease() / REREAD_EVERY).max(Duration::from_millis(10));
        loop {
            let next = until.min(Instant::now() + every);
            if all_acked(acks, want, &members, next).await {
                return (true, members);
            }
            if Instant::now() >= until {
                return (false, members);
            }
            let Some(again) = self.membership(until).await else {
                continue;
            };
            let before = members.len();
            members.retain(|m| again.0.contains(m));
            let left = u64::try_from(before - members.len()).unwrap_or(u64::MAX);
            if left > 0 {
                tracing::debug!(left, "members left while an invalidation waited for them");
            }
            want = want.saturating_sub(left);
        }
    }

    fn lease_millis(&self) -> u64 {
        lease_millis(&self.notifier)
    }

    /// Keeps this instance a member for one more lease. Call only right
    /// after the subscription was confirmed live, and extend the
    /// subscription lease only if it returns true: an instance that is not
    /// a member is not waited for, so it must not trust its in-process tier
    /// past its membership. Best effort: a renewal that fails leaves the
    /// member to lapse, as a dead one would. `limit` is how long it may go
    /// unanswered (stretched, like any call's, by the link's measured round
    /// trip).
    pub(super) async fn renew_membership(&self, limit: Duration) -> bool {
        let route = self.conns.keys.members();
        let mut invocation = self.conns.scripts.member_renew.key(&route);
        invocation
            .arg(&self.notifier.instance)
            .arg(self.lease_millis());
        let invocation = &invocation;
        // On a cluster, on the tier's own connection to the set's primary:
        // through the cluster client, a rebuild of its connections (a lock
        // call met a dead node while another is frozen) would fail the
        // renewal, and this instance would drop its in-process tier for
        // every shard's keys.
        let renew = self.conns.routed(&route, limit, |mut conn| async move {
            invocation.invoke_async::<i64>(&mut conn).await
        });
        match renew.await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, "cannot renew the fleet membership");
                false
            }
        }
    }

    /// Leaves the membership (a clean shutdown): invalidations stop
    /// waiting for this instance at once. Best effort: if it fails, the
    /// membership lapses within a lease.
    pub(super) async fn leave(&self) {
        let mut conn = self.conns.conn();
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.conns.keys.members())
            .arg(&self.notifier.instance);
        let leave = cmd.query_async::<i64>(&mut conn);
        if !matches!(
            tokio::time::timeout(self.conns.config.deadline, leave).await,
            Ok(Ok(_))
        ) {
            tracing::debug!("cannot leave the fleet membership; it lapses within a lease");
        }
    }

    /// Acknowledges the invalidations `due` (each its sender, nonce and
    /// subject: see the module doc), in as few calls as there are senders:
    /// for each sender, one `ack.lua` records this instance in every
    /// invalidation's set, then publishes one acknowledgement naming them
    /// all on the sender's channel (at most [`ACKED_MAX`] a call). On a
    /// cluster each call runs on the primary of the sender's sets (the
    /// published message reaches every node). Each call is tried again
    /// while Redis may not have run it, for at most half a lease; one that
    /// fails makes its senders wait out their lease.
    pub(super) async fn acknowledge_all(&self, due: Vec<AckDue>) {
        let mut by_sender: Vec<(String, Vec<(u64, String)>)> = Vec::new();
        for (sender, nonce, subject) in due {
            match by_sender.iter_mut().find(|(s, _)| *s == sender) {
                Some((_, acks)) => acks.push((nonce, subject)),
                None => by_sender.push((sender, vec![(nonce, subject)])),
            }
        }
        for (sender, acks) in by_sender {
            for chunk in acks.chunks(ACKED_MAX) {
                self.acknowledge(&sender, chunk).await;
            }
        }
    }

    /// One call of [`Barrier::acknowledge_all`]: `acks` (nonces and
    /// subjects) of `sender`'s invalidations.
    async fn acknowledge(&self, sender: &str, acks: &[(u64, String)]) {
        let keys: Vec<String> = acks
            .iter()
            .map(|(nonce, _)| self.conns.keys.acks(sender, *nonce))
            .collect();
        let Some(route) = keys.first() else {
            return;
        };
        let nonces: Vec<u64> = acks.iter().map(|(nonce, _)| *nonce).collect();
        let mut invocation = self.conns.scripts.ack.prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        invocation
            .arg(millis(self.notifier.liveness.lease() * ACKS_KEPT).max(1))
            .arg(keys::ack_channel(&self.conns.channel, sender))
            .arg(messages::acks_message(&nonces, &self.notifier.instance));
        for (_, subject) in acks {
            invocation.arg(recorded(&self.notifier.instance, subject));
        }
        let invocation = &invocation;
        let sent = self
            .reads
            .retried(route, |mut conn| async move {
                invocation.invoke_async::<i64>(&mut conn).await
            })
            .await;
        match sent {
            Ok(_) => {}
            Err(e) if e.error_kind() == ErrorKind::Permission => tracing::warn!(
                error = %e,
                "cannot acknowledge an invalidation: the redis user needs +sadd (see the \
                 ACL in the guide, stampede_guard::guide::topology); its sender waits a whole subscription lease"
            ),
            Err(e) => tracing::debug!(error = %e, "cannot acknowledge an invalidation"),
        }
    }

    /// Whether every one of `members` recorded its acknowledgement of this
    /// instance's invalidation `nonce`, of `subject`: read after this call,
    /// in one round trip with the other invalidations of this instance
    /// that ask meanwhile (see [`Batches`]). False if it cannot be read
    /// before `until`.
    pub(super) async fn recorded_by(
        &self,
        nonce: u64,
        subject: &str,
        members: &[String],
        until: Instant,
    ) -> bool {
        if members.is_empty() {
            return true;
        }
        let want = members.iter().map(|m| recorded(m, subject)).collect();
        let (answer, start) = self.reads.records.queue((nonce, want));
        if start {
            tokio::spawn(Reads::run_records(self.reads.clone()));
        }
        matches!(tokio::time::timeout_at(until, answer).await, Ok(Ok(true)))
    }
}

/// The fleet's members an invalidation must hear from (but this instance),
/// and how long until the membership is one lease old (see
/// [`Reads::read_members`]).
type Membership = (Vec<String>, Duration);

/// The most acknowledgement sets one read gets.
const SETS_PER_READ: usize = 512;

/// The reads an invalidation makes once Redis has it (the membership; the
/// recorded acknowledgements), each batched over every invalidation of
/// this instance that waits for it at the time (see [`Batches`]): under a
/// burst of invalidations, a few round trips rather than one per
/// invalidation queued behind each other.
struct Reads {
    conns: Arc<Connections>,
    notifier: Arc<Notifier>,
    /// Reads of the membership.
    members: Batches<(), Option<Arc<Membership>>>,
    /// Reads of acknowledgement sets: an invalidation's nonce, and what
    /// its set must hold.
    records: Batches<(u64, Vec<String>), bool>,
}

/// Ends a runner: if it did not end on its own (a panic), what it left
/// queued is answered with nothing, and the next request starts a runner.
struct Runner<'a, Q, A> {
    batches: &'a Batches<Q, A>,
    done: bool,
}

impl<Q, A> Drop for Runner<'_, Q, A> {
    fn drop(&mut self) {
        if !self.done {
            self.batches.abandon();
        }
    }
}

impl Reads {
    /// How long a read (or an acknowledgement) is tried again while Redis
    /// may not have run it: half a lease, within the wait of the
    /// invalidations it is for.
    fn window(&self) -> Duration {
        self.notifier.liveness.lease() / 2
    }

    /// `call` on the node that serves `route` (see
    /// [`Connections::routed`]), each try under the deadline, tried again
    /// while retrying may help, for at most [`Reads::window`].
    async fn retried<T, F, Fut>(&self, route: &str, mut call: F) -> Result<T, RedisError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let until = Instant::now() + self.window();
        let mut pause = Duration::from_millis(5);
        loop {
            let error = match self
                .conns
                .routed(route, self.conns.config.deadline, &mut call)
                .await
            {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let left = until.saturating_duration_since(Instant::now());
            if !error.retry_may_help() || left.is_zero() {
                return Err(error);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// The members an invalidation must hear from: those Redis holds
    /// unexpired, in the form an instance signs with, but this one (its
    /// own half is done before the message is sent).
    /// Also how long until the membership is one lease old: a younger one
    /// (lost and started again) may miss an instance whose lease still runs.
    /// Tried again while Redis may not have answered, for at most
    /// [`Reads::window`].
    async fn read_members(&self) -> Result<Membership, TierError> {
        let mut invocation = self.conns.scripts.members.key(self.conns.keys.members());
        invocation
            .arg(lease_millis(&self.notifier))
            .arg(MEMBERS_MAX + 1);
        let script = &invocation;
        let members: Vec<Vec<u8>> = self
            .conns
            .call_past_breaker()
            .until(std::time::Instant::now() + self.window())
            .run(move |mut conn| async move { script.invoke_async(&mut conn).await })
            .await?;
        let mut members = members.into_iter();
        let young = members
            .next()
            .and_then(|y| std::str::from_utf8(&y).ok()?.parse::<u64>().ok())
            .map_or(self.notifier.liveness.lease(), Duration::from_millis);
        let members: Vec<Vec<u8>> = members.collect();
        if members.len() > MEMBERS_MAX {
            return Err(TierError::Redis(redis::RedisError::from((
                redis::ErrorKind::Client,
                "more fleet members than an invalidation waits for by name",
            ))));
        }
        let members = members
            .into_iter()
            .filter_map(|m| String::from_utf8(m).ok())
            .filter(|m| is_instance(m) && *m != self.notifier.instance)
            .collect();
        Ok((members, young.min(self.notifier.liveness.lease())))
    }

    /// Serves the membership reads queued, a batch at a time, until none
    /// is left.
    async fn run_members(reads: Arc<Reads>) {
        let mut runner = Runner {
            batches: &reads.members,
            done: false,
        };
        loop {
            let batch = reads.members.take(usize::MAX);
            if batch.is_empty() {
                runner.done = true;
                return;
            }
            let read = match reads.read_members().await {
                Ok(membership) => Some(Arc::new(membership)),
                Err(error) => {
                    tracing::warn!(error = %error, "cannot read the fleet membership");
                    None
                }
            };
            for ((), answer) in batch {
                let _ = answer.send(read.clone());
            }
        }
    }

    /// Serves the reads of acknowledgement sets queued, a batch at a time
    /// (at most [`SETS_PER_READ`] sets, one pipeline), until none is left.
    /// This instance's sets share its hash tag: on a cluster, one node
    /// serves them all.
    async fn run_records(reads: Arc<Reads>) {
        let mut runner = Runner {
            batches: &reads.records,
            done: false,
        };
        loop {
            let batch = reads.records.take(SETS_PER_READ);
            if batch.is_empty() {
                runner.done = true;
                return;
            }
            let keys: Vec<String> = batch
                .iter()
                .map(|((nonce, _), _)| reads.conns.keys.acks(&reads.notifier.instance, *nonce))
                .collect();
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("SMEMBERS").arg(key);
            }
            let pipe = &pipe;
            let route = keys.first().map_or("", String::as_str);
            let sets = reads
                .retried(route, |mut conn| async move {
                    pipe.query_async::<Vec<Vec<Vec<u8>>>>(&mut conn).await
                })
                .await;
            let sets = match sets {
                Ok(sets) => sets,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read invalidations' acknowledgements");
                    Vec::new()
                }
            };
            // A request without its set (the read failed) is answered no.
            let mut sets = sets.into_iter();
            for ((_, want), answer) in batch {
                let set = sets.next().unwrap_or_default();
                let have: HashSet<&[u8]> = set.iter().map(Vec::as_slice).collect();
                let _ = answer.send(want.iter().all(|w| have.contains(w.as_bytes())));
            }
        }
    }
}

fn lease_millis(notifier: &Notifier) -> u64 {
    u64::try_from(notifier.liveness.lease().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The most invalidations an instance remembers as not yet in Redis (one per
/// group). Past it, a further failed invalidation is only reported to its
/// caller.
const PENDING_MAX: usize = 10_000;

/// Invalidations that did not reach Redis, by group: the key that was
/// invalidated, and what the caller purged (see [`crate::key::shown`]), for
/// the log line that says it reached Redis. While one is pending, the
/// group's values in Redis are the old ones, and this instance does not
/// take them; the supervisor retries until Redis has it.
#[derive(Default)]
pub(crate) struct Pending(Mutex<HashMap<Key, (Key, Purged)>>);

/// What a caller purged, as shown in logs.
pub(crate) type Purged = std::sync::Arc<str>;

impl Pending {
    pub(crate) fn remember(&self, key: &Key, what: &Purged) -> bool {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() >= PENDING_MAX && !pending.contains_key(&key.group()) {
            return false;
        }
        pending.insert(key.group(), (*key, what.clone()));
        true
    }

    pub(crate) fn get(&self, group: &Key) -> Option<Key> {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            return None;
        }
        pending.get(group).map(|(key, _)| *key)
    }

    pub(crate) fn forget(&self, key: &Key) {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pending.get(&key.group()).map(|(k, _)| k) == Some(key) {
            pending.remove(&key.group());
        }
    }

    pub(crate) fn all(&self) -> Vec<(Key, Purged)> {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pending.values().cloned().collect()
    }

    /// Every pending invalidation, forgotten here (handed to another
    /// [`Pending`]).
    pub(crate) fn take_all(&self) -> Vec<(Key, Purged)> {
        let mut pending = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pending.drain().map(|(_, kept)| kept).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::redis::testing::{connect, RedisServer};

    #[test]
    fn pending_invalidations_are_bounded_and_kept_per_group() {
        let pending = Pending::default();
        let what: Purged = "https://shop.example/report".into();
        let first = Key::for_value("t", b"first");
        assert!(pending.remember(&first, &what));
        assert_eq!(pending.get(&first.group()), Some(first));
        for i in 1..PENDING_MAX {
            assert!(pending.remember(&Key::for_value("t", &i.to_be_bytes()), &what));
        }
        assert!(!pending.remember(&Key::for_value("t", b"one too many"), &what));
        assert!(
            pending.remember(&first, &what),
            "a group already pending is kept"
        );
        pending.forget(&first);
        assert_eq!(pending.get(&first.group()), None);
        assert_eq!(pending.all().len(), PENDING_MAX - 1);
    }

    #[tokio::test]
    async fn a_tier_is_a_member_from_its_start_until_it_is_dropped() {
        let redis = RedisServer::start();
        let a = connect(&redis).await;
        let b = connect(&redis).await;
        assert_eq!(
            a.barrier.members().await.unwrap().0,
            [b.instance().to_owned()],
            "the others, not itself"
        );
        drop(b);
        for _ in 0..300 {
            if a.barrier.members().await.unwrap().0.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("a dropped tier stays a member");
    }
}
