//! Keeping a lease alive while its holder works, and giving it back.
//!
//! The cache's rebuild lease and a lock guard's lease are both a Redis key
//! holding a random owner token with a PX expiry. A holder keeps it by
//! renewing it, with a compare-token script, every third of its time: two
//! renewals can fail before the lease runs out. The [`Renewer`] is that loop,
//! written once for both; which scripts it calls is the only difference.
//!
//! The renewer owns its task. It stops the moment the holder settles (commits
//! or releases by itself), and when it is dropped unsettled (the holder gave
//! up, was cancelled or panicked) it releases the lease by token in the
//! background, so the next holder need not wait the lease out. Without a
//! runtime to release on, the lease lapses by itself.
//!
//! Loss is reported through a `watch`: the renewer's holder (a rebuild, a
//! lock guard) reads the same flag whether it polls it or awaits it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{RedisTier, TierError};
use crate::key::Key;

/// Which compare-token scripts keep a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A cache entry's rebuild lease (`renew.lua`, `release.lua`).
    Rebuild,
    /// A public lock (`lock_renew.lua`, `lock_release.lua`).
    Lock,
}

impl LeaseKind {
    async fn renew(
        self,
        tier: &Arc<RedisTier>,
        key: &Key,
        token: &str,
        time: Duration,
    ) -> Result<bool, TierError> {
        match self {
            LeaseKind::Rebuild => tier.renew(key, token, time).await,
            LeaseKind::Lock => tier.lock_renew(key, token, time).await,
        }
    }

    async fn release(self, tier: &Arc<RedisTier>, key: &Key, token: &str) {
        let _ = match self {
            LeaseKind::Rebuild => tier.release_token(key, token).await,
            LeaseKind::Lock => tier.lock_release(key, token).await,
        };
    }

    fn report_loss(self, key: &Key) {
        match self {
            LeaseKind::Rebuild => tracing::warn!(
                key = %key,
                "rebuild lease lost: another instance may rebuild this key"
            ),
            LeaseKind::Lock => tracing::warn!(lock = %key, "lock lease lost"),
        }
    }
}

/// Renews one lease until its holder settles it; releases it if dropped
/// unsettled.
pub(crate) struct Renewer {
    tier: Arc<RedisTier>,
    kind: LeaseKind,
    key: Key,
    /// The owner token: the capability to renew and release.
    token: String,
    /// Becomes true once the lease is known gone. The sender lives in the
    /// renewal task; if the task ends without a loss (settled, no runtime),
    /// the channel closes with `false`.
    lost: watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
    /// Set when the holder committed or released the lease itself, so the
    /// drop must not release it again.
    settled: bool,
}

impl Renewer {
    /// Starts renewing a lease of `time` just taken with `token`.
    pub(crate) fn start(
        tier: Arc<RedisTier>,
        kind: LeaseKind,
        key: Key,
        token: String,
        time: Duration,
    ) -> Self {
        let (report, lost) = watch::channel(false);
        let task = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            runtime.spawn(renew(tier.clone(), kind, key, token.clone(), time, report))
        });
        Renewer {
            tier,
            kind,
            key,
            token,
            lost,
            task,
            settled: false,
        }
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    pub(crate) fn tier(&self) -> &Arc<RedisTier> {
        &self.tier
    }

    /// Whether the lease is known gone: a renewal was refused (the token is
    /// no longer there), or Redis could not be reached for a whole lease (it
    /// lapsed). Another owner may hold it now.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// The loss flag, to await (`wait_for(|lost| *lost)`); closed without a
    /// loss once renewal stopped for another reason.
    pub(crate) fn lost(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }

    /// The holder commits or releases the lease itself: stop renewing, and
    /// leave it alone on drop.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop();
        // A lost lease is not ours to release: the token is gone from Redis.
        if self.settled || self.is_lost() {
            return;
        }
        // Abandoned: free the key now (a rebuild lease also tells its waiters
        // to retry) rather than make the next holder sleep out the lease.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tier, kind, key) = (self.tier.clone(), self.kind, self.key);
        let token = std::mem::take(&mut self.token);
        runtime.spawn(async move { kind.release(&tier, &key, &token).await });
    }
}

/// Renews every third of the lease until refused, or until Redis has been
/// unreachable for a whole lease; then reports the loss.
async fn renew(
    tier: Arc<RedisTier>,
    kind: LeaseKind,
    key: Key,
    token: String,
    time: Duration,
    lost: watch::Sender<bool>,
) {
    let period = (time / 3).max(Duration::from_millis(1));
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match kind.renew(&tier, &key, &token, time).await {
            Ok(true) => renewed = Instant::now(),
            Ok(false) => break,
            // Unreachable: the lease lapses on its own once `time` has passed
            // since the last renewal; until then, keep trying.
            Err(_) if renewed.elapsed() >= time => break,
            Err(_) => {}
        }
    }
    kind.report_loss(&key);
    lost.send_replace(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::testing::{connect, RedisServer};

    fn lease_key(id: &Key) -> String {
        format!("sg:{{{id}}}:l")
    }

    /// Takes a rebuild lease the way `fetch_or_lease.lua` does.
    fn take(redis: &RedisServer, id: &Key, token: &str, time: Duration) {
        let ms = time.as_millis().to_string();
        let reply = redis.raw(&["SET", &lease_key(id), token, "NX", "PX", &ms]);
        assert_eq!(reply, "+OK");
    }

    async fn eventually(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..200 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_held_lease_outlives_its_time_while_renewed() {
        let redis = RedisServer::start();
        let tier = connect(&redis).await;
        let id = Key::for_value("t", b"renewed");
        let time = Duration::from_millis(150);
        take(&redis, &id, "me", time);
        let mut renewer = Renewer::start(tier, LeaseKind::Rebuild, id, "me".into(), time);
        tokio::time::sleep(time * 3).await;
        assert_eq!(redis.raw(&["GET", &lease_key(&id)]), "me");
        assert!(!renewer.is_lost());
        renewer.settle();
        drop(renewer);
        // Settled: neither renewed nor released any more.
        tokio::time::sleep(time * 2).await;
        assert_eq!(redis.raw(&["EXISTS", &lease_key(&id)]), ":0");
    }

    #[tokio::test]
    async fn a_taken_over_lease_is_reported_lost_to_every_reader() {
        let redis = RedisServer::start();
        let tier = connect(&redis).await;
        let id = Key::for_value("t", b"taken");
        let time = Duration::from_millis(90);
        take(&redis, &id, "me", time);
        let renewer = Renewer::start(tier, LeaseKind::Rebuild, id, "me".into(), time);
        let mut awaited = renewer.lost();
        redis.raw(&["SET", &lease_key(&id), "someone-else"]);
        tokio::time::timeout(Duration::from_secs(2), awaited.wait_for(|lost| *lost))
            .await
            .expect("the loss is announced")
            .expect("by the renewer");
        assert!(renewer.is_lost());
        drop(renewer);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            redis.raw(&["GET", &lease_key(&id)]),
            "someone-else",
            "a lost lease is not released: it is not ours"
        );
    }

    #[tokio::test]
    async fn an_abandoned_lease_is_released_at_once() {
        let redis = RedisServer::start();
        let tier = connect(&redis).await;
        let id = Key::for_value("t", b"abandoned");
        take(&redis, &id, "me", Duration::from_secs(30));
        let renewer = Renewer::start(
            tier.clone(),
            LeaseKind::Rebuild,
            id,
            "me".into(),
            Duration::from_secs(30),
        );
        let mut registration = tier.notifier.register(id);
        drop(renewer);
        assert!(eventually(|| redis.raw(&["EXISTS", &lease_key(&id)]) == ":0").await);
        assert_eq!(
            registration.wait(Duration::from_secs(2)).await,
            Some(crate::store::redis::notify::Event::Failed),
            "waiters are told to retry"
        );
    }

    #[tokio::test]
    async fn a_renewer_ends_its_task_when_settled_or_dropped() {
        let redis = RedisServer::start();
        let tier = connect(&redis).await;
        let id = Key::for_value("t", b"tasks");
        let time = Duration::from_millis(60);
        take(&redis, &id, "me", time);
        let base = Arc::strong_count(&tier);
        let mut renewer = Renewer::start(tier.clone(), LeaseKind::Rebuild, id, "me".into(), time);
        assert_eq!(
            Arc::strong_count(&tier),
            base + 2,
            "the renewer and its task"
        );
        renewer.settle();
        assert!(eventually(|| Arc::strong_count(&tier) == base + 1).await);
        drop(renewer);
        assert_eq!(Arc::strong_count(&tier), base);
    }
}
