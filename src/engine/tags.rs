//! Invalidation by tag, and of everything, in O(1): generations checked on
//! read, never a scan of keys.
//!
//! Each backend keeps a [`TagTable`]: a generation above everything, and for
//! each namespace one for the whole namespace and one per tag bucket (see
//! [`crate::store::generations`]). An entry records, in its [`Stamp`], its
//! namespace and the generations of everything, of its namespace and of
//! each of its tags' buckets as they were when the rebuild that produced it
//! began; it is served only while none of those has moved since. A purge
//! through one namespace moves only that namespace's generations, so the
//! entries of another never see it. A hit compares a few `u64`s, with no
//! allocation (and, in a namespace other than the empty one, a shared read
//! lock on the short list of namespaces).
//!
//! With Redis the generations are Redis's (one hash per prefix), moved by
//! `invalidate_tag`/`invalidate_all` and heard by every instance on the event
//! channel; an instance that may have missed a message (a gap in its
//! subscription, its lease unconfirmed) reloads the table, and until then
//! checks each entry it takes from Redis against Redis itself. Without
//! Redis they are this process's own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::store::generations::{bucket_of, Field, Scope, BUCKETS};

/// The most tag buckets one entry may carry. An answer with tags in more
/// buckets than this is served but not stored: dropping some of its tags
/// would let an invalidation miss it.
pub(crate) const MAX_TAGS: usize = 256;

/// The tags of an entry, as buckets (sorted, each once). Its namespace is
/// the route's, given when it is stamped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TagSet {
    buckets: Vec<u16>,
    /// More than [`MAX_TAGS`] buckets were asked for.
    overflow: bool,
}

impl TagSet {
    /// Adds a tag (surrounding whitespace trimmed; an empty tag is none).
    pub(crate) fn insert(&mut self, tag: &str) {
        let tag = tag.trim();
        if tag.is_empty() {
            return;
        }
        self.insert_bucket(bucket_of(tag));
    }

    fn insert_bucket(&mut self, bucket: u16) {
        if let Err(at) = self.buckets.binary_search(&bucket) {
            if self.buckets.len() >= MAX_TAGS {
                self.overflow = true;
            } else {
                self.buckets.insert(at, bucket);
            }
        }
    }

    /// Adds every tag of `other`.
    pub(crate) fn extend(&mut self, other: &TagSet) {
        for &bucket in &other.buckets {
            self.insert_bucket(bucket);
        }
        self.overflow |= other.overflow;
    }

    /// Whether it is too large to be stored.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow
    }
}

/// The generations an entry was built under.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The table's epoch (see [`TagTable::admits`]); 0 without Redis, and
    /// for entries written before epochs existed.
    pub(crate) epoch: u64,
    /// The generation above every namespace's.
    pub(crate) all: u64,
    /// The namespace it belongs to: only its generations judge it.
    pub(crate) scope: Scope,
    /// The generation of its whole namespace.
    pub(crate) own: u64,
    /// (bucket, its generation) in its namespace, sorted by bucket.
    pub(crate) tags: Box<[(u16, u64)]>,
}

impl Stamp {
    /// The entry's tags.
    pub(crate) fn tag_set(&self) -> TagSet {
        TagSet {
            buckets: self.tags.iter().map(|&(b, _)| b).collect(),
            overflow: false,
        }
    }
}

/// One namespace's generations.
struct Generations {
    own: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

impl Default for Generations {
    fn default() -> Self {
        Generations {
            own: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Generations {
    fn bucket(&self, b: u16) -> &AtomicU64 {
        &self.buckets[usize::from(b) % self.buckets.len()]
    }
}

/// The current generations, in memory.
pub(crate) struct TagTable {
    /// The epoch of Redis's table as last read: a new one each time Redis
    /// lost the table. Every generation counts as at least the epoch.
    epoch: AtomicU64,
    all: AtomicU64,
    /// The empty namespace's generations.
    root: Generations,
    /// Every other namespace of a guard or cache on this backend: a
    /// namespace is known from the moment one is built, and the table
    /// holds no other (moves of the others are not this process's
    /// business: none of its entries recorded them).
    scopes: RwLock<Vec<(Scope, Box<Generations>)>>,
    /// Moved before any generation is: a rebuild that saw it move between
    /// its start and its end may have read data from before the move.
    changes: AtomicU64,
}

impl Default for TagTable {
    fn default() -> Self {
        TagTable {
            epoch: AtomicU64::new(0),
            all: AtomicU64::new(0),
            root: Generations::default(),
            scopes: RwLock::new(Vec::new()),
            changes: AtomicU64::new(0),
        }
    }
}

impl TagTable {
    /// Runs `f` on `scope`'s generations; `None` for a namespace no guard
    /// or cache of this backend has.
    fn with<R>(&self, scope: Scope, f: impl FnOnce(&Generations) -> R) -> Option<R> {
        if scope == Scope::ROOT {
            return Some(f(&self.root));
        }
        let scopes = self.scopes.read().unwrap_or_else(PoisonError::into_inner);
        scopes
            .iter()
            .find(|(s, _)| *s == scope)
            .map(|(_, generations)| f(generations))
    }

    /// Runs `f` on `field`'s generation; `None` for a field of a namespace
    /// no guard or cache of this backend has.
    fn with_slot<R>(&self, field: Field, f: impl FnOnce(&AtomicU64) -> R) -> Option<R> {
        match field {
            Field::All => Some(f(&self.all)),
            Field::Own(scope) => self.with(scope, |g| f(&g.own)),
            Field::Bucket(scope, b) => self.with(scope, |g| f(g.bucket(b))),
        }
    }

    /// Makes `scope` known here, its generations at 0 until a read of the
    /// table raises them. Returns whether it was new.
    pub(crate) fn register(&self, scope: Scope) -> bool {
        if self.scopes().contains(&scope) {
            return false;
        }
        let mut scopes = self.scopes.write().unwrap_or_else(PoisonError::into_inner);
        if scopes.iter().any(|(s, _)| *s == scope) {
            return false;
        }
        scopes.push((scope, Box::default()));
        true
    }

    /// Every namespace known here, the empty one first.
    pub(crate) fn scopes(&self) -> Vec<Scope> {
        let scopes = self.scopes.read().unwrap_or_else(PoisonError::into_inner);
        std::iter::once(Scope::ROOT)
            .chain(scopes.iter().map(|(s, _)| *s))
            .collect()
    }

    /// Whether an entry stamped so may be served: it was built under the
    /// table's current epoch, in a namespace known here, and nothing it
    /// recorded has moved since. An entry of another epoch was built under
    /// a table Redis has lost since (or one this process has not read
    /// yet): which invalidations it missed is unknown, so it is a miss.
    pub(crate) fn admits(&self, stamp: &Stamp) -> bool {
        stamp.epoch == self.table_epoch()
            && stamp.all >= self.all.load(Ordering::Acquire)
            && self
                .with(stamp.scope, |g| {
                    stamp.own >= g.own.load(Ordering::Acquire)
                        && stamp
                            .tags
                            .iter()
                            .all(|&(b, recorded)| g.bucket(b).load(Ordering::Acquire) <= recorded)
                })
                .unwrap_or(false)
    }

    /// Whether an entry that lived through a gap in the subscription (see
    /// `engine::fleet::outlived`) is rejected by no invalidation this
    /// process knows of, whatever the epoch it was built under: none of
    /// its generations moved past what it recorded, nor past the current
    /// epoch (every generation moved on a table since its epoch began is
    /// above it). An entry of a newer epoch than the one known here is
    /// not admitted.
    pub(crate) fn admits_outlived(&self, stamp: &Stamp) -> bool {
        let epoch = self.table_epoch();
        let below = |now: u64, recorded: u64| now <= recorded && now <= epoch;
        stamp.epoch <= epoch
            && below(self.all.load(Ordering::Acquire), stamp.all)
            && self
                .with(stamp.scope, |g| {
                    below(g.own.load(Ordering::Acquire), stamp.own)
                        && stamp.tags.iter().all(|&(b, recorded)| {
                            below(g.bucket(b).load(Ordering::Acquire), recorded)
                        })
                })
                .unwrap_or(false)
    }

    /// The epoch of the table as this process knows it.
    pub(crate) fn table_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Takes `epoch`, read from Redis, if it is newer than the one known.
    /// Counted as a move: a rebuild running now stores nothing. A new epoch
    /// drops the fields Redis held without one, among them the generation
    /// of a purge that landed on a lost table after the rebuild read its
    /// data and that this process has not heard yet; stamped under the new
    /// epoch (every generation counts as at least the epoch), that data
    /// would pass for newer than the purge. Returns whether the epoch
    /// changed.
    pub(crate) fn adopt(&self, epoch: u64) -> bool {
        if self.epoch.load(Ordering::SeqCst) >= epoch {
            return false;
        }
        // Counted first, as in `raise`.
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.epoch.fetch_max(epoch, Ordering::SeqCst) < epoch
    }

    /// Raises `field` to `generation` (never lowers it). Returns whether it
    /// moved; a field of a namespace not known here never does.
    pub(crate) fn raise(&self, field: Field, generation: u64) -> bool {
        self.with_slot(field, |slot| {
            if slot.load(Ordering::SeqCst) >= generation {
                return false;
            }
            // Counted first: a rebuild that sees the new generation also
            // sees that something moved since it began.
            self.changes.fetch_add(1, Ordering::SeqCst);
            slot.fetch_max(generation, Ordering::SeqCst) < generation
        })
        .unwrap_or(false)
    }

    /// Moves `field` without a shared tier: above its current generation and
    /// at least the wall clock in microseconds (its namespace made known
    /// here first). Returns the new generation.
    pub(crate) fn bump_here(&self, field: Field) -> u64 {
        if let Field::Own(scope) | Field::Bucket(scope, _) = field {
            self.register(scope);
        }
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.with_slot(field, |slot| {
            self.changes.fetch_add(1, Ordering::SeqCst);
            let mut current = slot.load(Ordering::SeqCst);
            loop {
                let next = current.saturating_add(1).max(clock);
                match slot.compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return next,
                    Err(seen) => current = seen,
                }
            }
        })
        .unwrap_or(clock)
    }

    /// Marks the start of a rebuild: pass it to [`stamp`](Self::stamp).
    pub(crate) fn start(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// The stamp of an entry of `scope` with `tags` whose rebuild began at
    /// `since`, or `None` if any generation moved meanwhile (the entry may
    /// hold data from before that invalidation: it is not to be stored), or
    /// if the namespace is not known here.
    pub(crate) fn stamp(&self, scope: Scope, tags: &TagSet, since: u64) -> Option<Stamp> {
        // Generations from before the epoch count as the epoch: instances
        // that lived through the table's loss and those started after it
        // stamp alike.
        let epoch = self.epoch.load(Ordering::SeqCst);
        let stamp = self.with(scope, |g| Stamp {
            epoch,
            all: self.all.load(Ordering::SeqCst).max(epoch),
            scope,
            own: g.own.load(Ordering::SeqCst).max(epoch),
            tags: tags
                .buckets
                .iter()
                .map(|&b| (b, g.bucket(b).load(Ordering::SeqCst).max(epoch)))
                .collect(),
        })?;
        (self.changes.load(Ordering::SeqCst) == since).then_some(stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(names: &[&str]) -> TagSet {
        let mut set = TagSet::default();
        for name in names {
            set.insert(name);
        }
        set
    }

    #[test]
    fn an_entry_is_admitted_until_one_of_its_generations_moves() {
        let table = TagTable::default();
        let since = table.start();
        let stamp = table.stamp(Scope::ROOT, &tags(&["a", "b"]), since).unwrap();
        assert!(table.admits(&stamp));
        let Field::Bucket(_, other) = Field::of_tag(Scope::ROOT, "zzz-unrelated") else {
            unreachable!()
        };
        assert!(!stamp.tags.iter().any(|&(b, _)| b == other));
        table.raise(Field::Bucket(Scope::ROOT, other), 10);
        assert!(table.admits(&stamp), "another bucket leaves it alone");
        table.raise(Field::of_tag(Scope::ROOT, "b"), 10);
        assert!(!table.admits(&stamp));
    }

    #[test]
    fn everything_moves_every_entry_tagged_or_not() {
        let table = TagTable::default();
        let stamp = table
            .stamp(Scope::ROOT, &TagSet::default(), table.start())
            .unwrap();
        table.bump_here(Field::All);
        assert!(!table.admits(&stamp));
        let after = table
            .stamp(Scope::ROOT, &TagSet::default(), table.start())
            .unwrap();
        assert!(table.admits(&after));
    }

    #[test]
    fn a_rebuild_that_saw_a_move_gets_no_stamp() {
        let table = TagTable::default();
        let since = table.start();
        table.raise(Field::of_tag(Scope::ROOT, "unrelated"), 5);
        assert!(table.stamp(Scope::ROOT, &tags(&["a"]), since).is_none());
    }

    #[test]
    fn generations_never_go_back() {
        let table = TagTable::default();
        let field = Field::of_tag(Scope::ROOT, "a");
        assert!(table.raise(field, 100));
        assert!(!table.raise(field, 50));
        assert!(!table.raise(field, 100));
        let bumped = table.bump_here(field);
        assert!(bumped > 100);
        assert!(table.bump_here(field) > bumped);
    }

    #[test]
    fn an_entry_of_another_epoch_is_a_miss_and_old_generations_count_as_the_epoch() {
        let table = TagTable::default();
        table.adopt(1_000);
        table.raise(Field::of_tag(Scope::ROOT, "a"), 500);
        let old = table
            .stamp(Scope::ROOT, &tags(&["a"]), table.start())
            .unwrap();
        assert_eq!(
            old.tags[0].1, 1_000,
            "a generation below the epoch counts as it"
        );
        assert!(table.admits(&old));
        assert!(table.adopt(2_000));
        assert!(!table.admits(&old), "built under a lost table");
        assert!(!table.adopt(1_500), "an epoch never goes back");
        let new = table
            .stamp(Scope::ROOT, &tags(&["a"]), table.start())
            .unwrap();
        assert_eq!((new.epoch, new.all), (2_000, 2_000));
        assert!(table.admits(&new));
        let other = TagTable::default();
        other.adopt(2_000);
        assert!(
            other.admits(&new),
            "an instance started after the loss agrees"
        );
    }

    #[test]
    fn an_outlived_entry_of_a_lost_table_is_rejected_by_a_move_on_the_new_one() {
        let table = TagTable::default();
        table.adopt(1_000);
        table.raise(Field::of_tag(Scope::ROOT, "a"), 1_200);
        let old = table
            .stamp(Scope::ROOT, &tags(&["a", "b"]), table.start())
            .unwrap();
        assert!(table.adopt(2_000));
        assert!(!table.admits(&old), "built under a lost table");
        assert!(table.admits_outlived(&old), "no move known since");
        table.raise(Field::of_tag(Scope::ROOT, "c-unrelated-bucket"), 2_500);
        assert!(table.admits_outlived(&old), "another bucket");
        table.raise(Field::of_tag(Scope::ROOT, "b"), 2_100);
        assert!(
            !table.admits_outlived(&old),
            "its tag moved on the new table"
        );
        let newer = TagTable::default();
        newer.adopt(500);
        assert!(!newer.admits_outlived(&old), "an epoch not known here yet");
        let all = TagTable::default();
        all.adopt(1_000);
        let kept = all.stamp(Scope::ROOT, &tags(&["a"]), all.start()).unwrap();
        all.adopt(2_000);
        all.raise(Field::All, 2_001);
        assert!(!all.admits_outlived(&kept), "everything moved");
    }

    #[test]
    fn a_rebuild_that_saw_a_new_epoch_gets_no_stamp() {
        let table = TagTable::default();
        table.adopt(1_000);
        let since = table.start();
        assert!(table.adopt(2_000));
        assert!(table.stamp(Scope::ROOT, &tags(&["a"]), since).is_none());
        let since = table.start();
        assert!(!table.adopt(2_000), "the same epoch is no move");
        assert!(table.stamp(Scope::ROOT, &tags(&["a"]), since).is_some());
    }

    #[test]
    fn a_namespace_is_judged_by_its_own_generations_only() {
        let table = TagTable::default();
        let (shop, blog) = (Scope::of("shop"), Scope::of("blog"));
        assert!(table.register(shop) && table.register(blog));
        assert!(!table.register(shop), "known already");
        let ours = table.stamp(shop, &tags(&["a"]), table.start()).unwrap();
        let theirs = table.stamp(blog, &tags(&["a"]), table.start()).unwrap();
        let root = table
            .stamp(Scope::ROOT, &tags(&["a"]), table.start())
            .unwrap();
        table.bump_here(Field::of_tag(blog, "a"));
        table.bump_here(Field::Own(blog));
        table.bump_here(Field::Own(Scope::ROOT));
        table.bump_here(Field::of_tag(Scope::ROOT, "a"));
        assert!(table.admits(&ours), "other namespaces' purges");
        assert!(!table.admits(&theirs) && !table.admits(&root));
        table.bump_here(Field::of_tag(shop, "a"));
        assert!(!table.admits(&ours));
        let ours = table.stamp(shop, &tags(&["a"]), table.start()).unwrap();
        table.bump_here(Field::Own(shop));
        assert!(!table.admits(&ours), "its whole namespace");
        let ours = table.stamp(shop, &tags(&["a"]), table.start()).unwrap();
        table.bump_here(Field::All);
        assert!(!table.admits(&ours), "everything above the namespaces");
        let unknown = Stamp {
            scope: Scope::of("elsewhere"),
            ..table.stamp(shop, &tags(&["a"]), table.start()).unwrap()
        };
        assert!(!table.admits(&unknown), "a namespace not known here");
        assert!(!table.raise(Field::Own(Scope::of("elsewhere")), 5));
        assert_eq!(table.scopes(), vec![Scope::ROOT, shop, blog]);
    }

    #[test]
    fn tag_sets_are_bounded_and_deduplicated() {
        let mut set = tags(&["a", " a ", "", "  "]);
        assert_eq!(set.buckets.len(), 1);
        for i in 0..10_000 {
            set.insert(&format!("t{i}"));
        }
        assert!(set.overflowed());
        assert_eq!(set.buckets.len(), MAX_TAGS);
    }
}
