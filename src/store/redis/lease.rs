//! The rebuild lease: who in the fleet may rebuild a key, and for how long.
//!
//! A lease is a Redis key set with `NX PX` to an owner token (the SHA-1
//! of a random secret the holder keeps; see `carried`), so it
//! expires by itself if its holder dies, and only its holder can release or
//! renew it (both are compare-token scripts). While the rebuild runs, a
//! [`Renewer`] keeps it; it stops the moment the lease is settled (committed
//! or released), and releases it if the lease is dropped unsettled, so it
//! never outlives the rebuild.
//!
//! A lease that expired anyway (a long pause, a partition) may overlap with
//! the next holder's. That is why each lease also carries a fencing number:
//! the commit script refuses a value whose number is older than the stored
//! one, so a stalled holder cannot overwrite a newer value.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::held::LeaseKind;
use super::renew::Renewer;
use super::RedisTier;
use crate::key::Key;

pub(crate) use crate::fence::FencingToken;

pub(crate) struct Lease {
    pub(crate) key: Key,
    pub(crate) fence: FencingToken,
    /// How long the lease lasts in Redis without renewal.
    pub(crate) time: Duration,
    /// The key's group generation when the lease was taken: the commit is
    /// refused if the group was invalidated since.
    pub(crate) generation: String,
    /// What the commit's wake-up reveals to prove it is this lease's: the
    /// token is its SHA-1, so Redis (and whoever reads the lease key) never
    /// learns it before the commit.
    secret: String,
    renewer: Renewer,
}

impl Lease {
    pub(crate) fn new(
        tier: Arc<RedisTier>,
        key: Key,
        (secret, token): (String, String),
        fence: u64,
        time: Duration,
        generation: String,
        sent: Instant,
    ) -> Self {
        // The lease's validity counts from when the request that took it was
        // first sent, never from the reply nor from any moment before the
        // send: Redis cannot have started the lease's time earlier, so the
        // holder never counts on time Redis does not give it, and a lease is
        // usable when taken whatever the deadline.
        Lease {
            key,
            fence: FencingToken(fence),
            time,
            generation,
            secret,
            renewer: Renewer::start(tier, LeaseKind::Rebuild, key, token, time, sent, None),
        }
    }

    /// A random secret (128 bits, so no other owner can guess it) and the
    /// owner token stored in Redis, its SHA-1: a client that reads the
    /// lease key cannot tell the secret the commit's wake-up reveals.
    pub(crate) fn new_secret() -> (String, String) {
        let secret = format!("{:032x}", crate::random::unguessable_u128());
        let token = super::carried::token_of(&secret);
        (secret, token)
    }

    /// The secret the commit's wake-up reveals (see [`super::carried`]).
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    pub(crate) fn token(&self) -> &str {
        self.renewer.token()
    }

    /// Whether the lease is known gone (another owner may rebuild).
    pub(crate) fn is_lost(&self) -> bool {
        self.renewer.is_lost()
    }

    /// Marks the lease as handled by a commit or release, and stops renewing.
    pub(crate) fn settle(&mut self) {
        self.renewer.settle();
    }
}
