//! An entry's invalidation on the shared tier: the script that removes the
//! entry's keys and publishes the purge, its retries while Redis does not
//! have it, and the wait for the fleet's acknowledgements.

use std::sync::Arc;

use redis::RedisError;

use super::entries::FENCE_KEEP;
use super::{RedisTier, Retryable, TierError};
use crate::key::Key;
use crate::store::millis;

/// How long, in deadlines, an invalidation is tried before its caller is
/// told it failed (a few tries, with growing pauses between them).
const INVALIDATE_TRIES: u32 = 4;

impl RedisTier {
    /// Drops the key's whole group (every variant of its URL) from Redis and
    /// from every instance's L1, in one step whatever the number of variants:
    /// the group's generation moves.
    ///
    /// An invalidation is a write the caller is owed, not a read the cache
    /// can do without: it goes to Redis even while the circuit is open, and
    /// is tried for [`INVALIDATE_TRIES`] deadlines (each try under the
    /// deadline, with growing pauses) before the caller is told it did not
    /// reach Redis. Then this instance remembers it (see [`super::barrier::Pending`]) and
    /// the supervisor retries it until Redis has it.
    ///
    /// Once Redis has it, this waits for the acknowledgements of every
    /// instance that received the message and of every member of the fleet
    /// (see [`super::members`]), at most one subscription lease: an
    /// instance that has not acknowledged by then has stopped trusting
    /// anything it read before the message.
    pub(crate) async fn invalidate(self: &Arc<Self>, key: &Key) -> Result<(), TierError> {
        let nonce = rand::random::<u64>();
        let mut acks = self.notifier.acks.expect(nonce);
        let until = std::time::Instant::now() + self.shared.config.deadline * INVALIDATE_TRIES;
        let tier = self;
        let [_, _, route, ..] = self.keys(key);
        let purged = self
            .call_owed_until(&route, until, |conn| {
                tier.invalidate_script(conn, key, nonce)
            })
            .await;
        let receivers = match purged {
            Ok((_, receivers)) => receivers,
            Err(error) => {
                self.notifier.acks.forget(nonce);
                tracing::warn!(key = %key, error = %error, "invalidation did not reach redis");
                let retry = match &error {
                    TierError::Redis(e) => e.may_have_run_or_transient(),
                    TierError::Open | TierError::Timeout => true,
                };
                if retry && !self.shared.pending.remember(key) {
                    tracing::error!(key = %key, "too many invalidations waiting for redis");
                }
                return Err(error);
            }
        };
        // A newer invalidation of the group supersedes a pending one.
        self.shared.pending.forget(key);
        let receivers = u64::try_from(receivers).unwrap_or(0);
        let subject = super::barrier::key_subject(&key.group());
        let acked = self
            .await_fleet(&mut acks, receivers, nonce, &subject)
            .await;
        self.notifier.acks.forget(nonce);
        if !acked {
            self.stats
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
    pub(crate) async fn invalidate_once(self: &Arc<Self>, key: &Key) -> Result<(), TierError> {
        let [_, _, route, ..] = self.keys(key);
        self.call(&route, |conn| {
            self.invalidate_script(conn, key, rand::random())
        })
        .await?;
        self.shared.pending.forget(key);
        Ok(())
    }

    /// Retries the pending invalidations, once each, past the breaker.
    pub(crate) async fn retry_pending(self: &Arc<Self>) {
        for key in self.shared.pending.all() {
            let [_, _, route, ..] = self.keys(&key);
            let tried = self
                .call_owed(&route, |conn| {
                    self.invalidate_script(conn, &key, rand::random())
                })
                .await;
            if tried.is_ok() {
                self.shared.pending.forget(&key);
                tracing::info!(key = %key, "a pending invalidation reached redis");
            }
        }
    }

    /// The invalidation script: (entry keys removed, instances that
    /// received the message).
    async fn invalidate_script(
        &self,
        mut conn: super::Conn,
        key: &Key,
        nonce: u64,
    ) -> Result<(i64, i64), RedisError> {
        let [value, fresh, _, fence, generation, failed] = self.keys(key);
        // The message names the group: each instance drops all its variants.
        let message = self.notifier.invalidation(&key.group(), nonce);
        let mut invocation = self.shared.scripts.invalidate.key(value);
        invocation
            .key(fresh)
            .key(fence)
            .key(generation)
            .key(failed)
            .arg(&self.shared.channel)
            .arg(message)
            .arg(millis(FENCE_KEEP));
        invocation.invoke_async(&mut conn).await
    }
}
