//! Invalidation by tag and of everything (see [`super::tags`]): moving a
//! generation here and, with Redis, in the fleet; hearing the fleet's moves;
//! and reloading the table when some may have gone unheard.

use std::sync::Arc;

use super::entry::Entry;
use super::tags::TagSet;
use super::Engine;
use crate::store::generations::Field;
#[cfg(feature = "redis")]
use crate::store::redis::RedisTier;

/// How far ahead of this process's clock, in microseconds, a generation
/// heard on the channel may be (clock skew between hosts, and the few
/// generations a burst of invalidations moves past Redis's clock).
#[cfg(feature = "redis")]
const HEARD_AHEAD_MICROS: u64 = 1_000_000;

impl Engine {
    /// Moves `field`'s generation: every entry that recorded an older one is
    /// a miss from now on, here and (with Redis) on every instance. A
    /// barrier like [`Engine::invalidate`]: a rebuild already running stores
    /// nothing, and a request that starts after this returns does not join
    /// it.
    pub(crate) async fn invalidate_field(&self, field: Field) -> Result<(), crate::Error> {
        #[cfg(feature = "redis")]
        if let Some(shared) = self.shared() {
            return shared
                .bump_generation(field, |generation| self.generation_moved(field, generation))
                .await
                .map_err(crate::Error::from);
        }
        let generation = self.tags.bump_here(field);
        self.generation_moved(field, generation);
        Ok(())
    }

    /// A rebuilt entry with the generations it was built under, and whether
    /// it may be stored: not if any generation moved since its rebuild
    /// began at `since` (it may hold data from before that invalidation),
    /// nor with tags in more buckets than an entry may record.
    pub(super) fn stamped(
        &self,
        entry: Entry,
        tags: &TagSet,
        since: u64,
        store: bool,
    ) -> (Arc<Entry>, bool) {
        let stamp = self.tags.stamp(tags, since);
        let store = store && stamp.is_some() && !tags.overflowed();
        (Arc::new(entry.with_stamp(stamp.unwrap_or_default())), store)
    }

    /// The in-process half of a moved generation. Which flights build
    /// entries with which tags is known only once they end, so every flight
    /// running is detached: it may answer its waiters, and stores nothing.
    pub(crate) fn generation_moved(&self, field: Field, generation: u64) {
        self.tags.raise(field, generation);
        self.flights.detach_all();
        if field == Field::All {
            // Nothing in it can be served any more: free the memory now.
            self.l1.clear();
        }
    }

    /// Another instance's move of a generation, as heard on the channel.
    /// A number ahead of this process's clock by more than
    /// [`HEARD_AHEAD_MICROS`] is not taken: anyone who may publish on the
    /// channel could otherwise raise a generation above the ones Redis's
    /// clock hands out, and the real invalidations that follow would not
    /// pass it until that clock did. Then nothing held here is trusted and
    /// the table is read again from Redis, which has the real number (a
    /// table Redis really holds ahead of the clocks costs a reload per
    /// message, never a stale answer).
    #[cfg(feature = "redis")]
    pub(crate) fn generation_heard(&self, field: Field, generation: u64) {
        let ceiling = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .saturating_add(HEARD_AHEAD_MICROS);
        if generation > ceiling {
            tracing::warn!(
                field = ?field,
                "a generation from the future on the event channel; reloading the table from redis"
            );
            self.invalidate_everything_here();
            return;
        }
        self.generation_moved(field, generation);
    }

    /// Whether an entry read from Redis may be served: none of the
    /// generations it recorded has moved, under the table's current epoch.
    /// While the table may have missed a move (a gap, an unconfirmed
    /// subscription, not reloaded since), or the entry names another epoch
    /// than the one known here (the table was lost and started again since
    /// one of the two was read), the entry's generations and the epoch are
    /// read from Redis first; failing that it is not served.
    #[cfg(feature = "redis")]
    pub(crate) async fn admits_remote(&self, shared: &Arc<RedisTier>, entry: &Entry) -> bool {
        let now = std::time::Instant::now();
        let trusted = self.trusts_table(shared, now);
        if !trusted || entry.stamp().epoch != self.tags.table_epoch() {
            let fields = entry.stamp().fields();
            match shared
                .load_generations(Some(&fields), self.tags.table_epoch())
                .await
            {
                Ok((epoch, loaded)) => self.apply(epoch, loaded),
                Err(_) => return false,
            }
            if !trusted {
                self.reload_tags();
            }
        }
        self.tags.admits(entry.stamp())
    }

    /// Whether an entry read from Redis may be served without asking Redis
    /// for its generations (a stale copy that is not worth the round trip).
    #[cfg(feature = "redis")]
    pub(crate) fn admits_remote_now(&self, shared: &Arc<RedisTier>, entry: &Entry) -> bool {
        self.trusts_table(shared, std::time::Instant::now()) && self.tags.admits(entry.stamp())
    }

    #[cfg(feature = "redis")]
    fn trusts_table(&self, shared: &RedisTier, now: std::time::Instant) -> bool {
        self.tags.is_loaded() && shared.notifier.hears_everything(now)
    }

    /// Before a rebuilt entry is stamped while the table is not trusted
    /// (Redis may have lost it and started a new epoch unseen here), reads
    /// the epoch from Redis: an entry stamped under an epoch the table no
    /// longer has would be a miss on every instance that knows the new one.
    /// Failing that, the entry is stamped under the epoch known here (at
    /// worst a miss elsewhere).
    #[cfg(feature = "redis")]
    pub(super) async fn learn_epoch(&self) {
        let Some(shared) = self.shared() else { return };
        if self.trusts_table(shared, std::time::Instant::now()) {
            return;
        }
        if let Ok((epoch, _)) = shared
            .load_generations(Some(&[]), self.tags.table_epoch())
            .await
        {
            self.apply(epoch, Vec::new());
        }
    }

    /// What a read of the table found: its epoch (a new one makes every
    /// entry of an older one a miss; the L1's are dropped at once) and
    /// generations (a move detaches every flight).
    #[cfg(feature = "redis")]
    fn apply(&self, epoch: u64, loaded: Vec<(Field, u64)>) {
        apply_to(&self.tags, &self.flights, &self.l1, epoch, loaded);
    }

    /// Reloads the whole table from Redis in the background (one at a time),
    /// unless the subscription is in a gap: then the end of the gap does.
    #[cfg(feature = "redis")]
    pub(crate) fn reload_tags(&self) {
        let Some(shared) = self.shared().cloned() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.tags.begin_reload() {
            return;
        }
        let (tags, flights, l1) = (self.tags.clone(), self.flights.clone(), self.l1.clone());
        runtime.spawn(async move {
            let epoch = tags.epoch();
            if shared.notifier.in_gap() {
                tags.end_reload();
                return;
            }
            match shared.load_generations(None, tags.table_epoch()).await {
                Ok((table, loaded)) => {
                    apply_to(&tags, &flights, &l1, table, loaded);
                    tags.loaded(epoch);
                }
                Err(error) => {
                    tracing::debug!(error = %error, "could not reload the tag generations");
                }
            }
            tags.end_reload();
        });
    }

    /// Loads the table once, at start-up.
    #[cfg(feature = "redis")]
    pub(crate) async fn load_tags(&self, shared: &Arc<RedisTier>) {
        let epoch = self.tags.epoch();
        if let Ok((table, loaded)) = shared.load_generations(None, self.tags.table_epoch()).await {
            self.apply(table, loaded);
            self.tags.loaded(epoch);
        }
    }
}

#[cfg(feature = "redis")]
fn apply_to(
    tags: &super::tags::TagTable,
    flights: &super::flight::Flights,
    l1: &super::LocalTier,
    epoch: u64,
    loaded: Vec<(Field, u64)>,
) {
    if tags.adopt(epoch) {
        l1.clear();
    }
    for (field, generation) in loaded {
        if tags.raise(field, generation) {
            flights.detach_all();
        }
    }
}
