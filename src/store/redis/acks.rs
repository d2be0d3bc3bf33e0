//! The acknowledgements of this process's invalidations, counted as they
//! arrive on its acknowledgement channel.
//!
//! `PUBLISH` says how many subscribers received an invalidation; its sender
//! waits for that many acknowledgements, and for one from every member of
//! the fleet (see [`super::barrier`]). An acknowledgement names the
//! instance that sent it, so the members can be told apart from strangers.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::watch;

use super::messages::is_instance;

/// The acknowledgements of one invalidation so far: how many, and from
/// which instances (those that named themselves).
#[derive(Clone, Debug, Default)]
pub(crate) struct Acked {
    pub count: u64,
    pub by: HashSet<String>,
}

/// The most acknowledging instances remembered per invalidation: past it,
/// acknowledgements are only counted.
const ACKERS_MAX: usize = 10_000;

impl Acked {
    /// Whether `want` acknowledgements came, among them one from every
    /// instance of `members`.
    pub(crate) fn covers(&self, want: u64, members: &[String]) -> bool {
        self.count >= want && members.iter().all(|m| self.by.contains(m))
    }
}

/// Invalidations of this process waiting for their acknowledgements.
#[derive(Default)]
pub(crate) struct Acks {
    waiting: Mutex<HashMap<u64, watch::Sender<Acked>>>,
}

impl Acks {
    /// Starts counting acknowledgements of `nonce`.
    pub(crate) fn expect(&self, nonce: u64) -> watch::Receiver<Acked> {
        let (tx, rx) = watch::channel(Acked::default());
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nonce, tx);
        rx
    }

    /// Stops counting acknowledgements of `nonce`.
    pub(crate) fn forget(&self, nonce: u64) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&nonce);
    }

    /// One acknowledgement of `nonce` arrived, from `by` if it said.
    pub(crate) fn acked(&self, nonce: u64, by: Option<&str>) {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = waiting.get(&nonce) {
            tx.send_modify(|acked| {
                acked.count = acked.count.saturating_add(1);
                if let Some(by) = by
                    && is_instance(by)
                    && acked.by.len() < ACKERS_MAX
                {
                    acked.by.insert(by.to_owned());
                }
            });
        }
    }
}

/// Waits until `want` acknowledgements were counted on `rx`, one of them
/// from every instance of `members`, at most until `until`. Returns whether
/// they all came.
pub(crate) async fn all_acked(
    rx: &mut watch::Receiver<Acked>,
    want: u64,
    members: &[String],
    until: tokio::time::Instant,
) -> bool {
    matches!(
        tokio::time::timeout_at(until, rx.wait_for(|a| a.covers(want, members))).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(10)
    }

    #[tokio::test]
    async fn acks_are_counted_per_nonce() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        acks.acked(7, None);
        acks.acked(8, None);
        assert!(!all_acked(&mut rx, 2, &[], soon()).await);
        acks.acked(7, None);
        assert!(all_acked(&mut rx, 2, &[], soon()).await);
        acks.forget(7);
    }

    #[tokio::test]
    async fn every_member_must_acknowledge_whatever_the_count() {
        let acks = Acks::default();
        let mut rx = acks.expect(7);
        let (a, b) = ("0123456789abcdef".to_owned(), "fedcba9876543210".to_owned());
        let members = [a.clone(), b.clone()];
        // Enough acknowledgements, but anonymous or from strangers.
        acks.acked(7, None);
        acks.acked(7, Some("not an instance"));
        acks.acked(7, Some(&a));
        acks.acked(7, Some(&a));
        assert!(!all_acked(&mut rx, 1, &members, soon()).await);
        acks.acked(7, Some(&b));
        assert!(all_acked(&mut rx, 1, &members, soon()).await);
        assert!(!rx.borrow().covers(6, &members), "and the count too");
    }
}
