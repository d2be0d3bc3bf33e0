//! Every Redis key and channel name the tier uses, under its prefix.
//!
//! Every key of one entry shares a hash tag, `{prefix}:{<group>}:…`, so
//! value, freshness marker, lease, fence, failure marker and the group's
//! generation sit in one cluster slot and every script touches one slot
//! only. A lock's keys share the hash tag of its name's digest. The fleet's
//! membership and the invalidation table are keys of their own, each in
//! its own slot, apart from every entry; the acknowledgement sets of one
//! invalidating instance share the hash tag of its name.

use crate::key::Key;

/// The names of one namespace (one prefix).
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// The namespace's event channel: commits, failures, invalidations,
    /// lock releases and generation moves.
    pub(crate) fn channel(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// The Redis keys of an entry: value, freshness marker, lease, fence
    /// hash, its group's generation, and the failure marker. All carry the
    /// group's hash tag, so every variant of a URL shares one cluster slot
    /// with the generation.
    pub(crate) fn entry(&self, key: &Key) -> [String; 6] {
        let prefix = &self.prefix;
        let group = key.group();
        let generation = format!("{prefix}:{{{group}}}:g");
        let base = if key.is_group() {
            format!("{prefix}:{{{key}}}")
        } else {
            format!("{prefix}:{{{group}}}:{key}")
        };
        [
            format!("{base}:v"),
            format!("{base}:f"),
            format!("{base}:l"),
            format!("{base}:n"),
            generation,
            format!("{base}:x"),
        ]
    }

    /// The origin's answer to the key's last failed rebuild, kept beside
    /// its failure marker (`entry`'s last key) with the same hash tag.
    pub(crate) fn failure_answer(&self, key: &Key) -> String {
        let [.., failed] = self.entry(key);
        format!("{failed}:a")
    }

    /// The fleet's membership (see [`super::barrier`]).
    pub(crate) fn members(&self) -> String {
        format!("{}:members", self.prefix)
    }

    /// The namespace's invalidation table (see [`super::barrier`]).
    pub(crate) fn table(&self) -> String {
        format!("{}:tags", self.prefix)
    }

    /// The set of the instances that acknowledged `sender`'s invalidation
    /// `nonce`. Every set of one sender shares its hash tag: an instance
    /// records many acknowledgements to one sender in one script, and the
    /// sender reads many of its sets in one round trip.
    pub(crate) fn acks(&self, sender: &str, nonce: u64) -> String {
        format!("{}:acks:{{{sender}}}:{nonce}", self.prefix)
    }

    /// The common base of a lock's keys.
    fn lock_base(&self, id: &Key) -> String {
        format!("{}:lock:{{{id}}}", self.prefix)
    }

    /// A lock's keys: hold, counters, queue, heartbeats, tickets, and the
    /// tombstones of abandoned attempts.
    pub(crate) fn lock(&self, id: &Key) -> [String; 6] {
        let base = self.lock_base(id);
        [
            format!("{base}:l"),
            format!("{base}:n"),
            format!("{base}:q"),
            format!("{base}:b"),
            format!("{base}:t"),
            format!("{base}:x"),
        ]
    }

    /// The receipt of one release attempt of a lock.
    pub(crate) fn lock_receipt(&self, id: &Key, attempt: &str) -> String {
        format!("{}:r:{attempt}", self.lock_base(id))
    }
}

/// A Redis key in the slot of every key of `key`'s entry (its hash tag).
pub(crate) fn route(key: &Key) -> String {
    if key.is_group() {
        format!("{{{key}}}")
    } else {
        format!("{{{}}}", key.group())
    }
}

/// The channel on which `instance` hears acknowledgements.
pub(crate) fn ack_channel(channel: &str, instance: &str) -> String {
    format!("{channel}:ack:{instance}")
}
