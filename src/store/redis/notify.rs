//! Fleet-wide wake-ups over one pub/sub channel per namespace.
//!
//! Each process keeps one subscriber connection (RESP3, resubscribed
//! automatically after a reconnect) on the namespace's channel. Messages name
//! a key and what happened to it: a value was committed (carrying it when it
//! is small: see [`super::carried`]), a rebuild failed, or the key was
//! invalidated. A task about to wait registers its key *before* it
//! asks Redis whether the key is ready, so a message that lands between the
//! question and the wait is never lost.
//!
//! Within a process only one task per key talks to Redis (the flight leader),
//! so the map holds at most one slot per key being rebuilt somewhere else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;

use super::acks::Acks;
use super::carried::{self, Carried};
use super::keys::ack_channel;
use super::liveness::Liveness;
#[cfg(test)]
use super::messages::ack_message;
use super::messages::{
    generation_subject, is_instance, key_subject, parse_ack, parse_moved, parse_nonce, AckDue,
};
use crate::key::Key;
use crate::store::generations::Field;

/// What happened to a key, as told on the channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Nothing yet.
    None,
    /// A new value was stored.
    Committed,
    /// The lease holder gave up without a value; retry at once.
    Failed,
    /// The lease holder's rebuild failed, with this code: the instances
    /// that were waiting share the failure rather than each retry it.
    FailedWith(u8),
    /// The entry was dropped.
    Invalidated,
    /// A lock was released, or its queue changed.
    Released,
    /// The subscriber lost its connection: messages may have been missed.
    Reconnected,
}

impl Event {
    fn tag(self) -> char {
        match self {
            Event::Committed => 'c',
            Event::Failed => 'f',
            Event::FailedWith(_) => 'x',
            Event::Invalidated => 'i',
            Event::Released => 'r',
            Event::None | Event::Reconnected => '-',
        }
    }

    /// The message that announces this event for `key`.
    pub(crate) fn message(self, key: &Key) -> String {
        format!("{}:{key}", self.tag())
    }

    /// A failure notice with its code.
    pub(crate) fn failure(key: &Key, code: u8) -> String {
        format!("x:{key}:{code}")
    }

    /// The message, signed by the instance that sends it.
    #[cfg(test)]
    fn message_from(self, key: &Key, sender: &str) -> String {
        format!("{}:{key}:{sender}", self.tag())
    }

    /// The event, its key and, if signed, its sender.
    fn parse(message: &[u8]) -> Option<(Event, Key, Option<&str>)> {
        let text = std::str::from_utf8(message).ok()?;
        let (tag, rest) = text.split_once(':')?;
        let (hex, sender) = match rest.split_once(':') {
            Some((hex, sender)) => (hex, Some(sender)),
            None => (rest, None),
        };
        let event = match tag {
            "c" => Event::Committed,
            "f" => Event::Failed,
            "x" => Event::FailedWith(sender?.parse().ok()?),
            "i" => Event::Invalidated,
            "r" => Event::Released,
            _ => return None,
        };
        Some((event, Key::from_hex(hex)?, sender))
    }
}

/// What the channel says the in-process tier may no longer trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invalidated {
    /// Another instance invalidated this key.
    Key(Key),
    /// Another instance moved this generation of the invalidation table (a
    /// tag's bucket, or everything) to this value.
    Generation(Field, u64),
    /// The subscription had a gap (a lost connection, a new primary):
    /// invalidations sent meanwhile were missed, so nothing held in the
    /// process is confirmed any more.
    Everything,
    /// The subscription is back after a gap, with an outage grace set:
    /// invalidations sent during the gap may have been missed, so what the
    /// process held then is no longer confirmed, but the outage rule would
    /// have served it until this instant (see
    /// [`Liveness::next_drop`]). Everything heard from now on reaches it as
    /// usual. The owner of the in-process tier decides how much of it to
    /// keep (see `engine::fleet`); it keeps nothing past this instant.
    Rejoined(Instant),
}

/// Called with what the channel invalidated. The owner of the in-process
/// tier decides what that means there: drop the entries, and keep any
/// rebuild already running from storing what it read before.
pub(crate) type OnInvalidate = Arc<dyn Fn(Invalidated) + Send + Sync>;

/// Counts of how waits ended, for tests and diagnostics.
#[derive(Default)]
pub(crate) struct WakeStats {
    pub by_message: AtomicU64,
    pub by_timeout: AtomicU64,
    /// Waits answered by the entry the commit's message carried.
    pub carried: AtomicU64,
}

/// A key's last event, and the entry its commit carried, if any.
#[derive(Clone)]
struct Wake {
    event: Event,
    carried: Option<Arc<Carried>>,
}

impl Wake {
    fn plain(event: Event) -> Self {
        Wake {
            event,
            carried: None,
        }
    }
}

/// The most acknowledgements waiting to be sent. Past it (a flood of
/// invalidations from a client that may publish, naming senders no
/// instance is), more are not queued: their senders wait out the
/// subscription lease, which is safe, and this instance's memory stays
/// bounded.
const ACKS_QUEUED_MAX: usize = 65_536;

pub(crate) struct Notifier {
    slots: Mutex<HashMap<Key, watch::Sender<Wake>>>,
    /// Counts what the channel told this process to stop trusting (an
    /// invalidation, a moved generation, a gap): a carried entry is taken
    /// only by a waiter that registered after the last of them.
    heard: AtomicU64,
    on_invalidate: OnInvalidate,
    /// This process's signature on the invalidations it sends. Its own come
    /// back on the channel; the sender already did the local half before it
    /// returned, and doing it again later could stop a rebuild that began
    /// after the invalidation from storing.
    pub(super) instance: String,
    pub(crate) stats: WakeStats,
    /// The subscription lease: whether the in-process tier may be trusted.
    pub(crate) liveness: Liveness,
    /// This process's invalidations waiting for their acknowledgements.
    pub(crate) acks: Acks,
    /// Acknowledgements to publish (see [`AckDue`]). The
    /// supervisor publishes them; the subscriber's reader only queues.
    ack_queue: tokio::sync::mpsc::Sender<AckDue>,
    ack_out: Mutex<Option<tokio::sync::mpsc::Receiver<AckDue>>>,
    /// Set while the subscription may be missing messages: from a lost
    /// connection (or a link about to be replaced) until it is confirmed
    /// again.
    gap: AtomicBool,
    /// Gaps that ended with an outage grace set, and how many of them the
    /// in-process tier has caught up with (the table read again, and what
    /// it held decided on: see [`Invalidated::Rejoined`]). Until it has,
    /// the subscription does not count as hearing everything.
    rejoins: AtomicU64,
    caught_up: AtomicU64,
    /// Signalled when the subscriber lost a connection, for the tier's
    /// supervisor (a cluster subscription must then be opened again).
    pub(crate) disconnected: tokio::sync::Notify,
}

impl Notifier {
    /// A notifier whose in-process tier is trusted for `lease` after each
    /// confirmed ping of the subscriber (see [`Liveness`]).
    #[cfg(test)]
    pub(crate) fn new(on_invalidate: OnInvalidate, lease: Duration) -> Self {
        Self::with_grace(on_invalidate, lease, Duration::ZERO)
    }

    /// As [`Notifier::new`], with the in-process tier still served for
    /// `grace` past the lease while the subscription is not confirmed.
    pub(crate) fn with_grace(
        on_invalidate: OnInvalidate,
        lease: Duration,
        grace: Duration,
    ) -> Self {
        let (ack_queue, ack_out) = tokio::sync::mpsc::channel(ACKS_QUEUED_MAX);
        Notifier {
            slots: Mutex::new(HashMap::new()),
            heard: AtomicU64::new(0),
            on_invalidate,
            instance: format!("{:016x}", crate::random::unguessable_u64()),
            stats: WakeStats::default(),
            liveness: Liveness::with_grace(lease, grace),
            acks: Acks::default(),
            ack_queue,
            ack_out: Mutex::new(Some(ack_out)),
            gap: Default::default(),
            rejoins: AtomicU64::new(0),
            caught_up: AtomicU64::new(0),
            disconnected: tokio::sync::Notify::new(),
        }
    }

    /// Whether every message published until now has been heard, or will
    /// be: no gap in the subscription, the last one caught up with, and its
    /// lease confirmed at `now`.
    pub(crate) fn hears_everything(&self, now: Instant) -> bool {
        !self.in_gap()
            && self.caught_up.load(Ordering::Acquire) >= self.rejoins.load(Ordering::Acquire)
            && self.liveness.is_live(now)
    }

    /// How many gaps ended with an outage grace set: pass it to
    /// [`caught_up`](Self::caught_up) once a read of the table that began
    /// after them has been applied.
    pub(crate) fn rejoins(&self) -> u64 {
        self.rejoins.load(Ordering::Acquire)
    }

    /// The in-process tier caught up with the first `rejoins` gaps.
    pub(crate) fn caught_up(&self, rejoins: u64) {
        self.caught_up.fetch_max(rejoins, Ordering::AcqRel);
    }

    /// Whether the subscription may be missing messages now.
    pub(crate) fn in_gap(&self) -> bool {
        self.gap.load(Ordering::Acquire)
    }

    /// This process's signature on a message whose acknowledgements name
    /// `nonce`: `<instance>:<nonce>`.
    pub(super) fn signature(&self, nonce: u64) -> String {
        format!("{}:{nonce}", self.instance)
    }

    /// A generation of the invalidation table moved (the message after its
    /// `g:`): handled here first, then acknowledged to its sender, like an
    /// invalidation. This process's own echo was handled before it was
    /// sent: it is only acknowledged, locally.
    pub(super) fn on_generation(&self, message: &[u8]) {
        let Some((field, generation, sender, nonce)) = parse_moved(message) else {
            tracing::debug!("ignoring a malformed generation message");
            return;
        };
        // Its own move too (see `on_invalidation`): the caller that moved it
        // may have been dropped before it recorded the new generation here.
        (self.on_invalidate)(Invalidated::Generation(field, generation));
        if sender == self.instance {
            self.acks.acked(nonce, Some(&self.instance));
            return;
        }
        if is_instance(sender) {
            let subject = generation_subject(&field.name(), generation);
            let _ = self.ack_queue.try_send((sender.to_owned(), nonce, subject));
        }
    }

    /// Records that messages may be missed until the next subscription.
    pub(crate) fn mark_gap(&self) {
        self.gap.store(true, Ordering::Release);
    }

    /// Marks a gap, and keeps it marked for a new link until
    /// [`Opening::swapped_in`]: a link that subscribed (its subscription
    /// seen to end the gap) and then failed to open, or whose opening was
    /// given up, is dropped, while the link in use may still hear nothing.
    /// Its `retired` flag is set then too, so its late pushes are ignored.
    pub(crate) fn opening(&self, retired: Arc<AtomicBool>) -> Opening<'_> {
        self.mark_gap();
        Opening {
            notifier: self,
            retired,
            done: false,
        }
    }

    /// The invalidation notice for `key`, signed by this process, with the
    /// nonce its acknowledgements name.
    pub(crate) fn invalidation(&self, key: &Key, nonce: u64) -> String {
        format!(
            "{}:{key}:{}:{nonce}",
            Event::Invalidated.tag(),
            self.instance
        )
    }

    /// The channel this process hears acknowledgements on.
    pub(crate) fn ack_channel(&self, channel: &str) -> String {
        ack_channel(channel, &self.instance)
    }

    /// The acknowledgements to publish, for the supervisor (once).
    pub(crate) fn take_ack_queue(&self) -> Option<tokio::sync::mpsc::Receiver<AckDue>> {
        self.ack_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The subscription was seen to fail (a keepalive unanswered, a lost
    /// connection): invalidations may be going unheard from now on, so
    /// nothing held in the process is trusted any more, at once rather
    /// than only once the subscription is back.
    ///
    /// Only the first sign of a gap drops it: a flight that starts later
    /// read nothing from before the gap, and dropping again at every failed
    /// ping while Redis is down would detach the flights that coalesce this
    /// process's misses. (The subscription lease drops it again once per
    /// lease for as long as the gap lasts.)
    ///
    /// With an outage grace (see [`super::liveness`]) nothing is dropped
    /// here: the grace drops it once it runs out, and the end of the gap
    /// leaves its owner to decide (see [`Invalidated::Rejoined`]).
    pub(crate) fn subscription_lost(&self) {
        self.heard.fetch_add(1, Ordering::AcqRel);
        if !self.gap.swap(true, Ordering::AcqRel) && !self.liveness.has_grace() {
            self.liveness.dropped(std::time::Instant::now());
            (self.on_invalidate)(Invalidated::Everything);
        }
        self.wake_all();
    }

    /// Starts listening for `key`. Hold the returned handle across the check
    /// and the wait.
    pub(crate) fn register(self: &Arc<Self>, key: Key) -> Registration {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let rx = match slots.get(&key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(Wake::plain(Event::None));
                slots.insert(key, tx);
                rx
            }
        };
        Registration {
            notifier: self.clone(),
            key,
            rx,
            heard: self.heard.load(Ordering::Acquire),
            carried: None,
        }
    }

    /// Handles one push from the subscriber connection. Runs on the
    /// connection's reader, so it only parses and signals.
    pub(crate) fn on_push(&self, push: PushInfo) {
        match push.kind {
            PushKind::Message => {
                // data: [channel, payload]
                let Some(Value::BulkString(payload)) = push.data.get(1) else {
                    return;
                };
                if let Some(ack) = payload.strip_prefix(b"a:") {
                    if let Some((nonces, by)) = parse_ack(ack) {
                        self.acks.acked_all(&nonces, by);
                    }
                    return;
                }
                if let Some(moved) = payload.strip_prefix(b"g:") {
                    self.heard.fetch_add(1, Ordering::AcqRel);
                    self.on_generation(moved);
                    return;
                }
                let Some((event, key, sender)) = Event::parse(payload) else {
                    tracing::debug!("ignoring a foreign message on the event channel");
                    return;
                };
                if event == Event::Invalidated {
                    self.heard.fetch_add(1, Ordering::AcqRel);
                    self.on_invalidation(key, sender);
                }
                self.signal(&key, event, payload);
            }
            PushKind::Disconnection => {
                // Messages sent while we reconnect are lost: drop what the
                // process holds now (not only once the subscription is
                // back), wake everyone so each re-checks Redis instead of
                // sleeping out its lease, and remember the gap.
                self.subscription_lost();
                self.disconnected.notify_one();
            }
            // Subscribed again after a gap: whatever was invalidated
            // meanwhile was not heard (Redis's client-side caching guidance:
            // flush on reconnection). With an outage grace, what was held
            // may still be served as long as the outage rule allowed, no
            // longer; its owner decides (see `Invalidated::Rejoined`).
            // (The acknowledgement channel's subscription is not the one
            // that ends the gap.)
            PushKind::Subscribe
                if !self.is_ack_subscription(&push) && self.gap.swap(false, Ordering::AcqRel) =>
            {
                self.heard.fetch_add(1, Ordering::AcqRel);
                if self.liveness.has_grace() {
                    tracing::debug!("event channel subscribed again after a gap");
                    self.rejoins.fetch_add(1, Ordering::AcqRel);
                    (self.on_invalidate)(Invalidated::Rejoined(self.liveness.next_drop()));
                } else {
                    tracing::debug!(
                        "event channel subscribed again after a gap; the in-process tier is dropped"
                    );
                    (self.on_invalidate)(Invalidated::Everything);
                }
                self.wake_all();
            }
            _ => {}
        }
    }

    fn is_ack_subscription(&self, push: &PushInfo) -> bool {
        let suffix = format!(":ack:{}", self.instance);
        matches!(push.data.first(), Some(Value::BulkString(c)) if c.ends_with(suffix.as_bytes()))
    }

    /// Another instance's invalidation is handled here first (the group's
    /// flights detached, its L1 copies dropped), then acknowledged to its
    /// sender. This process's own echo was handled before it was sent: it
    /// is only acknowledged, locally.
    fn on_invalidation(&self, key: Key, sender: Option<&str>) {
        let (sender, nonce) = match sender.and_then(|s| s.split_once(':')) {
            Some((sender, nonce)) => (Some(sender), parse_nonce(nonce.as_bytes())),
            None => (sender, None),
        };
        // Redis ran the purge: this instance drops its copies too, even its
        // own purge's (whose caller drops them once the purge returns, but
        // may have been dropped itself, half way, and never will).
        (self.on_invalidate)(Invalidated::Key(key));
        if sender == Some(self.instance.as_str()) {
            if let Some(nonce) = nonce {
                self.acks.acked(nonce, Some(&self.instance));
            }
            return;
        }
        if let (Some(sender), Some(nonce)) = (sender, nonce) {
            // Only a sender that looks like one of ours is answered.
            if is_instance(sender) {
                let _ = self
                    .ack_queue
                    .try_send((sender.to_owned(), nonce, key_subject(&key)));
            }
        }
    }

    /// Wakes every waiter so each re-checks Redis: messages may have been
    /// missed (the connections were replaced).
    pub(crate) fn wake_all(&self) {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for tx in slots.values() {
            tx.send_replace(Wake::plain(Event::Reconnected));
        }
    }

    /// Wakes the key's waiters, if any. A commit's entry is decoded only
    /// for a key that is waited for, and only if the message is the key's.
    fn signal(&self, key: &Key, event: Event, payload: &[u8]) {
        let waited = || {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.contains_key(key)
        };
        // Decoded outside the lock: the waiters' registrations need it.
        let carried = (event == Event::Committed && waited())
            .then(|| carried::parse(payload))
            .flatten()
            .filter(|(named, _)| named == key)
            .map(|(_, carried)| Arc::new(carried));
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = slots.get(key) {
            tx.send_replace(Wake { event, carried });
        }
    }
}

/// A link being opened (see [`Notifier::opening`]).
pub(crate) struct Opening<'a> {
    notifier: &'a Notifier,
    retired: Arc<AtomicBool>,
    done: bool,
}

impl Opening<'_> {
    /// The link is in use (or another, opened later, is): its subscription
    /// ended the gap for good.
    pub(crate) fn swapped_in(mut self) {
        self.done = true;
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.retired.store(true, Ordering::Release);
            self.notifier.mark_gap();
        }
    }
}

/// A task's interest in one key's next event.
pub(crate) struct Registration {
    notifier: Arc<Notifier>,
    key: Key,
    rx: watch::Receiver<Wake>,
    /// The notifier's count of what it heard, when this registered.
    heard: u64,
    /// The entry the last event's commit carried.
    carried: Option<Arc<Carried>>,
}

impl Registration {
    /// Waits for the next event on the key, at most `limit`. Returns the event,
    /// or `None` on timeout.
    pub(crate) async fn wait(&mut self, limit: Duration) -> Option<Event> {
        match tokio::time::timeout(limit, self.rx.changed()).await {
            Ok(Ok(())) => {
                self.notifier
                    .stats
                    .by_message
                    .fetch_add(1, Ordering::Relaxed);
                let wake = self.rx.borrow_and_update().clone();
                self.carried = wake.carried;
                Some(wake.event)
            }
            Ok(Err(_)) | Err(_) => {
                self.notifier
                    .stats
                    .by_timeout
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

impl Registration {
    /// The entry the commit that woke this wait carried, if nothing was
    /// invalidated (nor a gap seen) on the channel since this registered,
    /// before the question to Redis that found the lease held: then no
    /// invalidation this process applied can be newer than the entry.
    pub(crate) fn carried(&self) -> Option<&Carried> {
        let quiet = self.notifier.heard.load(Ordering::Acquire) == self.heard
            && !self.notifier.gap.load(Ordering::Acquire);
        self.carried.as_deref().filter(|_| quiet)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut slots = self
            .notifier
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Our receiver is still alive here, so one remaining means only us.
        if slots
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests;
