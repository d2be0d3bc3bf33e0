//! The namespace's invalidation table in Redis: one hash, `{prefix}:tags`,
//! with a generation for everything (`all`) and one per tag bucket (`b<n>`).
//!
//! It is one key, in its own cluster slot, apart from every entry: no script
//! touches it together with an entry's keys. Entries record the generations
//! they were built under; each instance keeps the table in memory, moved by
//! the messages [`bump`](RedisTier::bump_generation) publishes and reloaded
//! after any gap in its subscription, and compares on every read.

use std::sync::Arc;
use std::time::Instant;

use redis::RedisError;

use super::notify::{Invalidated, Notifier};
use super::{RedisTier, TierError};
use crate::store::generations::{parse_generation, Field, BUCKETS};

/// How long, in deadlines, a bump is tried before its caller is told it
/// failed (as an invalidation).
const BUMP_TRIES: u32 = 4;

impl RedisTier {
    fn table_key(&self) -> String {
        format!("{}:tags", self.shared.config.prefix)
    }

    /// Moves `field`'s generation in Redis and tells every instance, then
    /// waits for their acknowledgements (and every fleet member's) exactly
    /// as an invalidation does (at most one subscription lease). `here` gets the new generation as soon
    /// as Redis has it, before the wait.
    pub(crate) async fn bump_generation(
        self: &Arc<Self>,
        field: Field,
        here: impl FnOnce(u64),
    ) -> Result<(), TierError> {
        let nonce = rand::random::<u64>();
        let mut acks = self.notifier.acks.expect(nonce);
        let until = Instant::now() + self.shared.config.deadline * BUMP_TRIES;
        let tier = self;
        let table = self.table_key();
        let bumped = self
            .call_owed_until(&table, until, |conn| tier.bump_script(conn, field, nonce))
            .await;
        let (generation, receivers) = match bumped {
            Ok(reply) => reply,
            Err(error) => {
                self.notifier.acks.forget(nonce);
                tracing::warn!(field = ?field, error = %error, "tag invalidation did not reach redis");
                return Err(error);
            }
        };
        here(generation);
        let subject = super::barrier::generation_subject(&field.name(), generation);
        let acked = self
            .await_fleet(&mut acks, receivers, nonce, &subject)
            .await;
        self.notifier.acks.forget(nonce);
        if !acked {
            self.stats
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
        mut conn: super::Conn,
        field: Field,
        nonce: u64,
    ) -> Result<(u64, u64), RedisError> {
        let signed = self.notifier.signature(nonce);
        let (generation, receivers): (Vec<u8>, i64) = self
            .shared
            .scripts
            .bump_generation
            .key(self.table_key())
            .arg(field.name())
            .arg(&self.shared.channel)
            .arg(signed)
            .invoke_async(&mut conn)
            .await?;
        let generation = parse_generation(&generation).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Client,
                "unexpected generation from a stampede-guard script",
            ))
        })?;
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
        self: &Arc<Self>,
        fields: Option<&[Field]>,
        floor: u64,
    ) -> Result<(u64, Vec<(Field, u64)>), TierError> {
        let all: Vec<Field>;
        let reload = fields.is_none();
        let fields = match fields {
            Some(fields) => fields,
            None => {
                all = std::iter::once(Field::All)
                    .chain((0..BUCKETS).map(Field::Bucket))
                    .collect();
                &all
            }
        };
        let table = self.table_key();
        let mut invocation = self.shared.scripts.load_generations.key(&table);
        invocation.arg(floor);
        for field in fields {
            invocation.arg(field.name());
        }
        let script = &invocation;
        // A whole reload happens after a gap or at start-up, off any
        // request's path: its failure is not the breaker's business.
        let values: Vec<Option<Vec<u8>>> = if reload {
            let mut conn = self.conn();
            self.call_past_breaker(invocation.invoke_async(&mut conn))
                .await?
        } else {
            self.call(&table, move |mut conn| async move {
                script.invoke_async(&mut conn).await
            })
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
        let raw = fields.iter().copied().zip(values);
        let mut loaded = Vec::new();
        for (field, value) in raw {
            let Some(value) = value else { continue };
            match parse_generation(&value) {
                Some(generation) if generation >= epoch => loaded.push((field, generation)),
                _ => {
                    tracing::warn!(field = ?field, "unreadable generation in redis; invalidating its tags");
                    let nonce = rand::random();
                    let (generation, _) = self
                        .call(&table, |conn| self.bump_script(conn, field, nonce))
                        .await?;
                    loaded.push((field, generation));
                }
            }
        }
        Ok((epoch, loaded))
    }
}

impl Notifier {
    /// Whether every message published until now has been heard, or will
    /// be: no gap in the subscription, and its lease confirmed at `now`.
    pub(crate) fn hears_everything(&self, now: Instant) -> bool {
        !self.in_gap() && self.liveness.is_live(now)
    }

    /// Whether the subscription may be missing messages now.
    pub(crate) fn in_gap(&self) -> bool {
        self.gap.load(std::sync::atomic::Ordering::Acquire)
    }

    /// This process's signature on a message whose acknowledgements name
    /// `nonce`: `<instance>:<nonce>`.
    pub(super) fn signature(&self, nonce: u64) -> String {
        format!("{}:{nonce}", self.instance)
    }

    /// A generation of the invalidation table moved (the message after its
    /// `g:`): handled here first, then acknowledged to its sender, like an
    /// invalidation. This process's own echo was handled before it was
    /// sent: it is only acknowledged, locally.
    pub(super) fn on_generation(&self, message: &[u8]) {
        let Some((field, generation, sender, nonce)) = parse_moved(message) else {
            tracing::debug!("ignoring a malformed generation message");
            return;
        };
        if sender == self.instance {
            self.acks.acked(nonce, Some(&self.instance));
            return;
        }
        (self.on_invalidate)(Invalidated::Generation(field, generation));
        if super::barrier::is_instance(sender) {
            let subject = super::barrier::generation_subject(&field.name(), generation);
            let _ = self.ack_queue.send((sender.to_owned(), nonce, subject));
        }
    }
}

/// A generation message, `<field>:<generation>:<instance>:<nonce>` (after
/// its `g:`): the field, its new generation, the sender and its nonce.
pub(super) fn parse_moved(message: &[u8]) -> Option<(Field, u64, &str, u64)> {
    let text = std::str::from_utf8(message).ok()?;
    let mut parts = text.splitn(4, ':');
    let field = Field::parse(parts.next()?.as_bytes())?;
    let generation = parse_generation(parts.next()?.as_bytes())?;
    let sender = parts.next()?;
    let nonce = parts.next()?.parse().ok()?;
    Some((field, generation, sender, nonce))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_messages_parse_and_foreign_ones_do_not() {
        assert_eq!(
            parse_moved(b"b17:1732270000000001:0123456789abcdef:9"),
            Some((
                Field::Bucket(17),
                1_732_270_000_000_001,
                "0123456789abcdef",
                9
            ))
        );
        assert_eq!(parse_moved(b"all:5:x:1").map(|m| m.0), Some(Field::All));
        for foreign in [
            &b""[..],
            b"b17",
            b"b17:1",
            b"b17:1:s",
            b"b17:-1:s:1",
            b"b99999:1:s:1",
            b"b1:99999999999999999999:s:1",
            b"b1:1:s:nonce",
            b"\xff:1:s:1",
        ] {
            assert_eq!(parse_moved(foreign), None, "{foreign:?}");
        }
    }
}
