//! Acknowledgements an invalidator can tell from forged ones.
//!
//! An acknowledgement published on the channel proves nothing by itself: a
//! client that may publish there can name any instance, and the channel
//! tells it the names and the nonces. So an instance acknowledges with
//! `ack.lua`, which first adds its name to the invalidation's own set,
//! `{prefix}:acks:<sender>:<nonce>`, then publishes. The name comes with
//! what the message it handled invalidated (`<instance>:<subject>`, the
//! subject a group's key, or a table field and its new generation): a
//! message of its own that copies a purge's nonce (on a cluster it may
//! reach an instance before the purge does, which crosses the cluster bus)
//! gets an acknowledgement of what it named, not of the purge. The sender
//! counts the published acknowledgements as they come (see
//! [`super::barrier`]); once they cover the fleet, it reads that set once
//! and accepts them only if it names every member it waits for, with the
//! purge's subject. Otherwise (a forged acknowledgement, an
//! instance of an earlier version that acknowledged by a bare `PUBLISH`,
//! the read failing) it waits out the subscription lease, as for an
//! instance that never acknowledged. Adding to the set takes write access
//! to the crate's keys: a client that has it can do worse anyway.

use std::collections::HashSet;

use super::barrier::{ack_channel, ack_message};
use super::Shared;
use crate::error::{classify, ErrorKind};
use crate::store::millis;

/// How many subscription leases an acknowledgement set is kept: its sender
/// reads it within one lease of its message.
const ACKS_KEPT: u32 = 3;

impl Shared {
    /// The set of the instances that acknowledged `sender`'s invalidation
    /// `nonce`.
    fn acks_key(&self, sender: &str, nonce: u64) -> String {
        format!("{}:acks:{sender}:{nonce}", self.config.prefix)
    }

    /// Acknowledges `sender`'s invalidation `nonce`, of `subject`: records
    /// this instance in the invalidation's set, then publishes on
    /// `sender`'s channel. On
    /// a cluster it runs on the set's primary (the published message
    /// reaches every node). Best effort: an acknowledgement that fails
    /// makes the sender wait out its lease.
    pub(super) async fn acknowledge(&self, sender: &str, nonce: u64, subject: &str) {
        let key = self.acks_key(sender, nonce);
        let mut invocation = self.scripts.ack.key(&key);
        invocation
            .arg(recorded(&self.notifier.instance, subject))
            .arg(millis(self.notifier.liveness.lease() * ACKS_KEPT).max(1))
            .arg(ack_channel(&self.channel, sender))
            .arg(ack_message(nonce, &self.notifier.instance));
        let invocation = &invocation;
        let sent = self.routed(&key, self.config.deadline, |mut conn| async move {
            invocation.invoke_async::<i64>(&mut conn).await
        });
        match sent.await {
            Ok(_) => {}
            Err(e) if classify(&e) == ErrorKind::Permission => tracing::warn!(
                error = %e,
                "cannot acknowledge an invalidation: the redis user needs +sadd (see the \
                 ACL in docs/TOPOLOGY.md); its sender waits a whole subscription lease"
            ),
            Err(e) => tracing::debug!(error = %e, "cannot acknowledge an invalidation"),
        }
    }

    /// Whether every one of `members` recorded its acknowledgement of this
    /// instance's invalidation `nonce`, of `subject`: one read, under the
    /// deadline. False if it cannot be read.
    pub(super) async fn recorded_by(&self, nonce: u64, subject: &str, members: &[String]) -> bool {
        if members.is_empty() {
            return true;
        }
        let key = self.acks_key(&self.notifier.instance, nonce);
        let key = &key;
        let read = self.routed(key, self.config.deadline, |mut conn| async move {
            let mut cmd = redis::cmd("SMEMBERS");
            cmd.arg(key);
            cmd.query_async::<Vec<Vec<u8>>>(&mut conn).await
        });
        match read.await {
            Ok(ackers) => {
                let ackers: HashSet<&[u8]> = ackers.iter().map(Vec::as_slice).collect();
                members
                    .iter()
                    .all(|m| ackers.contains(recorded(m, subject).as_bytes()))
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read an invalidation's acknowledgements");
                false
            }
        }
    }
}

/// How `instance`'s acknowledgement of a message invalidating `subject` is
/// recorded.
fn recorded(instance: &str, subject: &str) -> String {
    format!("{instance}:{subject}")
}
