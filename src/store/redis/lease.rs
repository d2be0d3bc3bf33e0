//! The rebuild lease: who in the fleet may rebuild a key, and for how long.
//!
//! A lease is a Redis key set with `NX PX` to a random owner token, so it
//! expires by itself if its holder dies, and only its holder can release or
//! renew it (both are compare-token scripts). While the rebuild runs, a
//! watchdog renews it every third of its time; it stops the moment the lease
//! is settled or dropped, so it never outlives the rebuild.
//!
//! A lease that expired anyway (a long pause, a partition) may overlap with
//! the next holder's. That is why each lease also carries a fencing number:
//! the commit script refuses a value whose number is older than the stored
//! one, so a stalled holder cannot overwrite a newer value.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::RedisTier;
use crate::key::Key;

pub(crate) use crate::fence::FencingToken;

pub(crate) struct Lease {
    pub(crate) key: Key,
    pub(crate) token: String,
    pub(crate) fence: FencingToken,
    lost: Arc<AtomicBool>,
    watchdog: Option<JoinHandle<()>>,
    tier: Arc<RedisTier>,
    settled: bool,
}

impl Lease {
    pub(crate) fn new(
        tier: Arc<RedisTier>,
        key: Key,
        token: String,
        fence: u64,
        time: Duration,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let watchdog = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            runtime.spawn(watchdog(
                tier.clone(),
                key,
                token.clone(),
                time,
                lost.clone(),
            ))
        });
        Lease {
            key,
            token,
            fence: FencingToken(fence),
            lost,
            watchdog,
            tier,
            settled: false,
        }
    }

    /// A random owner token: 128 bits, so no other owner can guess it.
    pub(crate) fn new_token() -> String {
        format!("{:032x}", rand::random::<u128>())
    }

    /// Whether the watchdog found the lease gone (another owner may rebuild).
    #[allow(dead_code)] // exposed by the public lock API
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the lease as handled by a commit or release, and stops renewing.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        if !self.settled {
            // The rebuild was abandoned: free the key now, and tell the
            // waiters, rather than make them sleep out the lease.
            let tier = self.tier.clone();
            let key = self.key;
            let token = std::mem::take(&mut self.token);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = tier.release_token(&key, &token).await;
                });
            }
        }
    }
}

async fn watchdog(
    tier: Arc<RedisTier>,
    key: Key,
    token: String,
    time: Duration,
    lost: Arc<AtomicBool>,
) {
    let period = (time / 3).max(Duration::from_millis(1));
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match tier.renew(&key, &token, time).await {
            Ok(true) => renewed = Instant::now(),
            Ok(false) => {
                tracing::warn!(key = %key, "rebuild lease lost: another instance may rebuild this key");
                lost.store(true, Ordering::Release);
                return;
            }
            // Redis unreachable: the lease lapses on its own once `time` has
            // passed since the last renewal; until then, keep trying.
            Err(_) if renewed.elapsed() >= time => {
                lost.store(true, Ordering::Release);
                return;
            }
            Err(_) => {}
        }
    }
}
