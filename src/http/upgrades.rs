//! What the handler did with a key's protocol switches: learned from the
//! origin, per key, for a window.
//!
//! A request that asks to switch protocols (`Upgrade` with `Connection:
//! upgrade`) must reach the handler, which alone can accept it. But any
//! client can add those two headers to a GET: on a resource whose handler
//! never switches, they would send every request to the origin. So the
//! first such request for a key is passed through as a probe, and its
//! answer says what the resource does: a `101` (it switches: later upgrade
//! requests pass through at once), or an answer the route would store (it
//! answered a plain GET: later upgrade requests lose the `Upgrade` and are
//! cached and coalesced like any GET). Any other answer (a refusal, an
//! error, a handshake the endpoint rejected) teaches nothing. Upgrade
//! requests that come while the probe runs wait for its answer. A complete
//! WebSocket handshake is learned apart from every other switch (see
//! [`Upgrades::ask`]). In-process and bounded: a key is remembered for its
//! window, and the table holds at most [`CAPACITY`] keys.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderValue, CONNECTION, UPGRADE};
use http::HeaderMap;
use moka::ops::compute::Op;
use moka::sync::Cache;
use moka::Expiry;
use tokio::sync::watch;

use super::rfc::cache_control::tokens;
use crate::key::Key;

/// The most keys remembered at once.
pub(crate) const CAPACITY: u64 = 16 * 1024;

/// What a key's upgrade requests do.
#[derive(Clone)]
enum Known {
    /// A probe is at the handler: wait for its answer.
    Probing(watch::Receiver<()>),
    /// The handler answered an upgrade request as a plain GET.
    Plain(Instant),
    /// The handler switched protocols.
    Switches(Instant),
}

/// What to do with an upgrade request now.
pub(crate) enum Ask {
    /// Take it as the plain GET it is: strip the switch.
    Plain,
    /// Pass it through: the handler switches.
    Switch,
    /// Pass it through as the key's probe, and learn from its answer.
    Probe(Probe),
    /// Wait for the probe's answer, then ask again.
    Wait(watch::Receiver<()>),
}

/// The per-route table of what keys' handlers did with a switch.
#[derive(Clone)]
pub(crate) struct Upgrades {
    /// By the request's key and whether it is a complete WebSocket
    /// handshake (see [`Upgrades::ask`]).
    known: Cache<(Key, bool), Known>,
}

impl Default for Upgrades {
    fn default() -> Self {
        Upgrades {
            known: Cache::builder()
                .max_capacity(CAPACITY)
                .expire_after(Until)
                .build(),
        }
    }
}

impl fmt::Debug for Upgrades {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upgrades")
            .field("keys", &self.known.entry_count())
            .finish()
    }
}

impl Upgrades {
    /// What to do with an upgrade request for `key`. A complete WebSocket
    /// handshake (see [`is_handshake`]) is learned apart from every other
    /// switch: a handler that serves a page and a WebSocket on one path
    /// answers a malformed or made-up switch with the page, and that must
    /// not turn its real handshakes into page hits. Two kinds only, so that
    /// made-up protocol names cannot each start a probe.
    pub(crate) fn ask(self: &Arc<Self>, key: Key, handshake: bool) -> Ask {
        let key = (key, handshake);
        let now = Instant::now();
        let (tx, rx) = watch::channel(());
        let mine = rx.clone();
        let entry = self
            .known
            .entry(key)
            .or_insert_with_if(|| Known::Probing(rx), |known| !known.live(now));
        match entry.into_value() {
            Known::Probing(rx) if rx.same_channel(&mine) => Ask::Probe(Probe {
                table: self.clone(),
                key,
                mine,
                _done: tx,
            }),
            Known::Probing(rx) => Ask::Wait(rx),
            Known::Plain(_) => Ask::Plain,
            Known::Switches(_) => Ask::Switch,
        }
    }
}

impl Known {
    fn live(&self, now: Instant) -> bool {
        match self {
            Known::Probing(_) => true,
            Known::Plain(until) | Known::Switches(until) => now < *until,
        }
    }
}

/// The key's probe: its answer is learned with [`Probe::learn`]; dropped
/// without one, the key is unknown again and its waiters ask again.
pub(crate) struct Probe {
    table: Arc<Upgrades>,
    key: (Key, bool),
    mine: watch::Receiver<()>,
    /// Dropped with the probe: wakes the waiters.
    _done: watch::Sender<()>,
}

impl Probe {
    /// The handler's answer to the probe: `switched` (a `101`), or
    /// `plain` (an answer the route would store), for `window`; anything
    /// else teaches nothing.
    pub(crate) fn learn(self, switched: bool, plain: bool, window: Duration) {
        let until = Instant::now().checked_add(window);
        match (switched, plain, until) {
            (true, _, Some(until)) => self.table.known.insert(self.key, Known::Switches(until)),
            (false, true, Some(until)) => self.table.known.insert(self.key, Known::Plain(until)),
            _ => {}
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // Still probing under this probe: nothing was learned.
        let mine = &self.mine;
        let _ = self.table.known.entry(self.key).and_compute_with(|known| {
            match known.map(moka::Entry::into_value) {
                Some(Known::Probing(rx)) if rx.same_channel(mine) => Op::Remove,
                _ => Op::Nop,
            }
        });
    }
}

/// Whether a switch is a complete WebSocket handshake (RFC 6455 §4.1):
/// `websocket` among the protocols of `Upgrade`, with a `Sec-WebSocket-Key`
/// and a `Sec-WebSocket-Version`.
pub(crate) fn is_handshake(headers: &HeaderMap) -> bool {
    headers.contains_key("sec-websocket-key")
        && headers.contains_key("sec-websocket-version")
        && headers.get_all(UPGRADE).iter().any(|line| {
            tokens(line.as_bytes()).any(|t| {
                let name = t.split(|b| *b == b'/').next().unwrap_or_default();
                name.eq_ignore_ascii_case(b"websocket")
            })
        })
}

/// Removes what makes a request a protocol switch: the `Upgrade` header,
/// and the `upgrade` option of `Connection` (its other options stay).
pub(crate) fn strip_upgrade(headers: &mut HeaderMap) {
    headers.remove(UPGRADE);
    let kept: Vec<Vec<u8>> = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|line| tokens(line.as_bytes()))
        .filter(|t| !t.eq_ignore_ascii_case(b"upgrade"))
        .map(<[u8]>::to_vec)
        .collect();
    headers.remove(CONNECTION);
    if !kept.is_empty()
        && let Ok(value) = HeaderValue::from_bytes(&kept.join(&b", "[..]))
    {
        headers.insert(CONNECTION, value);
    }
}

/// Each key is kept until its window closes; a probe until it answers.
struct Until;

impl Expiry<(Key, bool), Known> for Until {
    fn expire_after_create(
        &self,
        _: &(Key, bool),
        known: &Known,
        now: Instant,
    ) -> Option<Duration> {
        match known {
            Known::Probing(_) => None,
            Known::Plain(until) | Known::Switches(until) => {
                Some(until.saturating_duration_since(now))
            }
        }
    }

    fn expire_after_update(
        &self,
        key: &(Key, bool),
        known: &Known,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, known, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_is_told_from_other_switches() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (name, value) in pairs {
                h.append(*name, HeaderValue::from_static(value));
            }
            is_handshake(&h)
        };
        let key = ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
        let version = ("sec-websocket-version", "13");
        assert!(with(&[("upgrade", "WebSocket"), key, version]));
        assert!(with(&[("upgrade", "foo, websocket"), key, version]));
        assert!(!with(&[("upgrade", "websocket"), key]));
        assert!(!with(&[("upgrade", "websocket"), version]));
        assert!(!with(&[("upgrade", "websockets"), key, version]));
        assert!(!with(&[key, version]));
    }

    #[test]
    fn the_switch_is_stripped_and_the_other_options_stay() {
        let mut h = HeaderMap::new();
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.append(CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        h.append(CONNECTION, HeaderValue::from_static("close"));
        strip_upgrade(&mut h);
        assert!(!h.contains_key(UPGRADE));
        assert_eq!(h.get(CONNECTION).unwrap(), "keep-alive, close");
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        strip_upgrade(&mut h);
        assert!(!h.contains_key(CONNECTION));
    }

    #[tokio::test]
    async fn one_probe_per_key_and_its_answer_is_learned() {
        let table = Arc::new(Upgrades::default());
        let key = Key::for_value("t", b"k");
        let Ask::Probe(probe) = table.ask(key, false) else {
            panic!("the first asks")
        };
        let Ask::Wait(mut rx) = table.ask(key, false) else {
            panic!("the second waits")
        };
        probe.learn(false, true, Duration::from_secs(60));
        assert!(rx.changed().await.is_err(), "the waiter is woken");
        assert!(matches!(table.ask(key, false), Ask::Plain));
        // A real handshake is learned apart.
        let Ask::Probe(probe) = table.ask(key, true) else {
            panic!("a handshake asks on its own")
        };
        probe.learn(true, false, Duration::from_secs(60));
        assert!(matches!(table.ask(key, true), Ask::Switch));
        assert!(matches!(table.ask(key, false), Ask::Plain));
    }

    #[tokio::test]
    async fn a_probe_that_teaches_nothing_lets_the_next_one_ask() {
        let table = Arc::new(Upgrades::default());
        let key = Key::for_value("t", b"k");
        let Ask::Probe(probe) = table.ask(key, false) else {
            panic!("the first asks")
        };
        probe.learn(false, false, Duration::from_secs(60));
        assert!(matches!(table.ask(key, false), Ask::Probe(_)));
    }
}
