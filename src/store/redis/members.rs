//! The fleet's membership: whom an invalidation waits for.
//!
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
//! [`super::acks`]), at most one subscription lease from the moment Redis
//! answered. A member not read has lapsed before the read; one that did not
//! acknowledge in time has lapsed by the end of the wait: either way it
//! serves nothing it read before the invalidation (see [`super::barrier`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::barrier::{all_acked, is_instance, Acked};
use super::{RedisTier, Shared, TierError};

/// The most members an invalidation waits for by name. With more in Redis,
/// it waits a whole lease instead (some members would go unread).
const MEMBERS_MAX: usize = 1_000;

impl Shared {
    pub(super) fn members_key(&self) -> String {
        format!("{}:members", self.config.prefix)
    }

    fn lease_millis(&self) -> u64 {
        u64::try_from(self.notifier.liveness.lease().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Keeps this instance a member for one more lease. Call only right
    /// after the subscription was confirmed live, and extend the
    /// subscription lease only if it returns true: an instance that is not
    /// a member is not waited for, so it must not trust its in-process tier
    /// past its membership. Best effort: a renewal that fails leaves the
    /// member to lapse, as a dead one would.
    pub(super) async fn renew_membership(&self) -> bool {
        let route = self.members_key();
        let mut invocation = self.scripts.member_renew.key(&route);
        invocation
            .arg(&self.notifier.instance)
            .arg(self.lease_millis());
        let invocation = &invocation;
        // On a cluster, on the tier's own connection to the set's primary:
        // through the cluster client, a rebuild of its connections (a lock
        // call met a dead node while another is frozen) would fail the
        // renewal, and this instance would drop its in-process tier for
        // every shard's keys.
        let renew = self.routed(&route, self.config.deadline, |mut conn| async move {
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
        let mut conn = self.link().conn.clone();
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.members_key()).arg(&self.notifier.instance);
        let leave = cmd.query_async::<i64>(&mut conn);
        if !matches!(
            tokio::time::timeout(self.config.deadline, leave).await,
            Ok(Ok(_))
        ) {
            tracing::debug!("cannot leave the fleet membership; it lapses within a lease");
        }
    }
}

impl RedisTier {
    /// The members an invalidation must hear from: those Redis holds
    /// unexpired, in the form an instance signs with, but this one (its
    /// own half is done before the message is sent).
    /// Also how long until the membership is one lease old: a younger one
    /// (lost and started again) may miss an instance whose lease still runs.
    async fn members(self: &Arc<Self>) -> Result<(Vec<String>, Duration), TierError> {
        let shared = &self.shared;
        let mut invocation = shared.scripts.members.key(shared.members_key());
        invocation.arg(shared.lease_millis()).arg(MEMBERS_MAX + 1);
        let script = &invocation;
        let members: Vec<Vec<u8>> = self
            .call_past_breaker(async move {
                let mut conn = self.conn();
                script.invoke_async(&mut conn).await
            })
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

    /// After Redis answered the invalidation `nonce` (of `subject`: see
    /// [`super::acks`]) that `PUBLISH` delivered to `receivers`
    /// subscribers: waits for their acknowledgements and every member's,
    /// at most one subscription lease from now, then checks once that
    /// every member recorded its own. Returns whether they all came and
    /// were recorded; if not, it returns only once the lease is over. If
    /// the membership cannot be read (or has more than [`MEMBERS_MAX`]
    /// members), waits the whole lease: whoever did not hear the message
    /// has lapsed by then.
    pub(super) async fn await_fleet(
        self: &Arc<Self>,
        acks: &mut watch::Receiver<Acked>,
        receivers: u64,
        nonce: u64,
        subject: &str,
    ) -> bool {
        let until = Instant::now() + self.notifier.liveness.lease();
        match self.members().await {
            Ok((members, young)) => {
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
                let mut acked = all_acked(acks, receivers, &members, until).await;
                // The acknowledgements heard name every member: each must
                // also have recorded its own (see [`super::acks`]), or the
                // names may be forged.
                if acked && !self.shared.recorded_by(nonce, subject, &members).await {
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
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "cannot read the fleet membership; the invalidation waits a whole \
                     subscription lease"
                );
                tokio::time::sleep_until(until).await;
                false
            }
        }
    }

    /// This instance's name in the membership.
    #[cfg(test)]
    pub(crate) fn instance(&self) -> &str {
        &self.notifier.instance
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::redis::testing::{connect, RedisServer};

    #[tokio::test]
    async fn a_tier_is_a_member_from_its_start_until_it_is_dropped() {
        let redis = RedisServer::start();
        let a = connect(&redis).await;
        let b = connect(&redis).await;
        assert_eq!(
            a.members().await.unwrap().0,
            [b.instance().to_owned()],
            "the others, not itself"
        );
        drop(b);
        for _ in 0..300 {
            if a.members().await.unwrap().0.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("a dropped tier stays a member");
    }
}
