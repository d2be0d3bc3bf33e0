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
//! lock guard) reads the same flag whether it polls it or awaits it. It is
//! reported *before* anyone else can hold the lease, as in Redlock: a lease
//! granted or renewed by a request sent at `t` lasts until at least
//! `t + time` on Redis's clock (Redis starts it later than that), so the
//! holder may count on it until `t + time - margin`, the margin covering
//! clock drift and the holder's own reaction. When that passes without a
//! confirmed renewal, the lease is reported lost, whether Redis refused the
//! renewal, did not answer, or the renewal is still on its way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::held::{Hold, LeaseKind};
use super::{RedisTier, TierError};
use crate::key::Key;

/// How much earlier than Redis the holder counts its lease as ended: a tenth
/// of the lease, at least 2 ms and at most a second (Redlock's allowance for
/// clock drift, widened to leave the holder time to stop).
pub(crate) fn validity_margin(time: Duration) -> Duration {
    (time / 10).clamp(Duration::from_millis(2), Duration::from_secs(1))
}

/// Renews one lease until its holder settles it; releases it if dropped
/// unsettled.
pub(crate) struct Renewer {
    tier: Arc<RedisTier>,
    kind: LeaseKind,
    key: Key,
    /// The owner token: the capability to renew and release.
    token: String,
    /// When the lease ends on Redis unless renewed again (no earlier than
    /// this): the send time of the last confirmed grant or renewal plus the
    /// lease time. Giving the lease back is worth trying until then.
    ends: Arc<Mutex<Instant>>,
    /// How much earlier than `ends` a lock's holder counts it as lost.
    margin: Duration,
    /// Becomes true once the lease is known gone. The sender lives in the
    /// renewal task; if the task ends without a loss (settled, no runtime),
    /// the channel closes with `false`.
    lost: watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
    /// Set when the holder committed or released the lease itself (or a
    /// shutdown handed it back), so the drop must not release it again.
    settled: Arc<AtomicBool>,
    /// Its place in the tier's registry of leases held.
    registered: u64,
}

impl Renewer {
    /// Starts renewing a lease of `time` granted by a request sent at
    /// `granted`. With `max_hold`, renewals stop that long after `granted`,
    /// and the lease runs out (and is reported lost) after the last one.
    pub(crate) fn start(
        tier: Arc<RedisTier>,
        kind: LeaseKind,
        key: Key,
        token: String,
        time: Duration,
        granted: Instant,
        max_hold: Option<Duration>,
    ) -> Self {
        let (report, lost) = watch::channel(false);
        let report = Arc::new(report);
        let ends = Arc::new(Mutex::new(granted + time));
        let stop_at = max_hold.map(|hold| granted + hold);
        let task = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            runtime.spawn(renew(
                tier.clone(),
                kind.clone(),
                key,
                token.clone(),
                time,
                ends.clone(),
                stop_at,
                report.clone(),
            ))
        });
        let settled = Arc::new(AtomicBool::new(false));
        let registered = tier.held.register(Hold {
            kind: kind.clone(),
            key,
            token: token.clone(),
            ends: ends.clone(),
            settled: settled.clone(),
            task: task.as_ref().map(JoinHandle::abort_handle),
            lost: Arc::downgrade(&report),
        });
        Renewer {
            margin: validity_margin(time),
            tier,
            kind,
            key,
            token,
            ends,
            lost,
            task,
            settled,
            registered,
        }
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Whether the lease is known gone, or about to be: a renewal was
    /// refused (the token is no longer there), or none was confirmed for the
    /// lease's validity. Another owner may hold it now or soon.
    ///
    /// For a lock the clock is read here too, not only by the renewal task:
    /// a holder that was paused (SIGSTOP, a long GC-like stall) past its
    /// validity must be told so the moment it looks, before its renewal
    /// task has had a chance to run.
    pub(crate) fn is_lost(&self) -> bool {
        if *self.lost.borrow() {
            return true;
        }
        match self.kind {
            LeaseKind::Lock { .. } if !self.is_settled() => {
                let ends = *self.ends.lock().unwrap_or_else(|p| p.into_inner());
                Instant::now() + self.margin >= ends
            }
            _ => false,
        }
    }

    /// The loss flag, to await (`wait_for(|lost| *lost)`); closed without a
    /// loss once renewal stopped for another reason.
    pub(crate) fn lost(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }

    /// The holder commits or releases the lease itself: stop renewing, and
    /// leave it alone on drop.
    pub(crate) fn settle(&mut self) {
        self.settled.store(true, Ordering::Release);
        self.stop();
    }

    fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Settles the lease by giving it back now, retrying until it would
    /// have ended by itself. `Ok(false)` if it was no longer ours.
    pub(crate) async fn release(&mut self) -> Result<bool, TierError> {
        self.settle();
        let until = self.ends();
        self.kind
            .release(&self.tier, &self.key, &self.token, until)
            .await
    }

    fn ends(&self) -> Instant {
        *self.ends.lock().unwrap_or_else(|p| p.into_inner())
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
        self.tier.held.deregister(self.registered);
        // A lost rebuild lease is not ours to release: the token is gone, or
        // about to be. A lock's hold reported lost may still be there (loss
        // is reported before the lease ends), and giving it back is a
        // compare-token-and-fence script: a no-op if it is not ours.
        if self.is_settled() || (self.is_lost() && self.kind == LeaseKind::Rebuild) {
            return;
        }
        // Abandoned: free the key now (a rebuild lease also tells its waiters
        // to retry) rather than make the next holder sleep out the lease.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tier, kind, key, until) =
            (self.tier.clone(), self.kind.clone(), self.key, self.ends());
        let token = std::mem::take(&mut self.token);
        runtime.spawn(async move {
            let _ = kind.release(&tier, &key, &token, until).await;
        });
    }
}

/// Renews every third of the lease until refused, until no renewal was
/// confirmed for the lease's validity, or (with `stop_at`) until the
/// validity of the last renewal before `stop_at` ran out; then reports the
/// loss.
#[allow(clippy::too_many_arguments)]
async fn renew(
    tier: Arc<RedisTier>,
    kind: LeaseKind,
    key: Key,
    token: String,
    time: Duration,
    ends: Arc<Mutex<Instant>>,
    stop_at: Option<Instant>,
    lost: Arc<watch::Sender<bool>>,
) {
    let period = (time / 3).max(Duration::from_millis(1));
    // A lock's holder is told it lost the lock before anyone else can hold
    // it, so its validity keeps a margin. A rebuild lease is nobody's to
    // act on: giving it up early would only let another instance rebuild
    // too, so it keeps renewing for as long as Redis still holds it.
    let margin = match kind {
        LeaseKind::Lock { .. } => validity_margin(time),
        LeaseKind::Rebuild => Duration::ZERO,
    };
    let granted = *ends.lock().unwrap_or_else(|p| p.into_inner()) - time;
    let mut valid_until = granted + time.saturating_sub(margin);
    let mut next = granted + period;
    loop {
        if stop_at.is_some_and(|stop| next >= stop) {
            // Held as long as allowed: let the lease run out.
            tokio::time::sleep_until(valid_until.into()).await;
            break;
        }
        tokio::time::sleep_until(next.min(valid_until).into()).await;
        if Instant::now() >= valid_until {
            break;
        }
        let sent = Instant::now();
        let attempt = kind.renew(&tier, &key, &token, time);
        match tokio::time::timeout_at(valid_until.into(), attempt).await {
            Ok(Ok(true)) => {
                valid_until = sent + time.saturating_sub(margin);
                next = sent + period;
                *ends.lock().unwrap_or_else(|p| p.into_inner()) = sent + time;
            }
            // Refused: the token is gone (taken over, or lapsed).
            Ok(Ok(false)) => break,
            // No answer: try again soon, while the lease is still valid.
            Ok(Err(_)) => next = Instant::now() + (period / 4).max(Duration::from_millis(5)),
            // The validity ran out with the renewal still on its way.
            Err(_) => break,
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
        let mut renewer = Renewer::start(
            tier,
            LeaseKind::Rebuild,
            id,
            "me".into(),
            time,
            Instant::now(),
            None,
        );
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
        let renewer = Renewer::start(
            tier,
            LeaseKind::Rebuild,
            id,
            "me".into(),
            time,
            Instant::now(),
            None,
        );
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
            Instant::now(),
            None,
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
        let mut renewer = Renewer::start(
            tier.clone(),
            LeaseKind::Rebuild,
            id,
            "me".into(),
            time,
            Instant::now(),
            None,
        );
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
