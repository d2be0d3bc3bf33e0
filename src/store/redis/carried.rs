//! The commit's wake-up, carrying the entry when it is small.
//!
//! A commit publishes `c:<key>` on the namespace's channel; instances whose
//! requests wait for the key then read it from Redis. When the encoded
//! entry is at most [`CARRY_LIMIT`], the message carries it, so a woken
//! instance answers its waiters without reading Redis again:
//!
//! ```text
//! c:<key hex>:1:<secret>:<fence>:<fresh ms>:<keep ms>:<entry, base64>
//! ```
//!
//! `1` is the format's version. The message starts as a plain wake-up does:
//! an instance that reads only `c:<key>` (an older version, or this one
//! when the rest does not parse) is woken and fetches, as before. Base64
//! keeps the message text, as every other message on the channel is.
//!
//! Pub/sub sends every message to every subscriber of the channel, whether
//! or not it waits for the key: a carried entry costs every instance's
//! bandwidth. The limit keeps that cost near a wake-up's for the small
//! entries that are most of a hot fleet's traffic (an API answer, a page
//! fragment); a larger entry is fetched by the instances that wait for it
//! only.
//!
//! A carried entry is untrusted input, as a fetched one is. It is taken
//! only for the lease the waiter saw held: the waiter's `fetch_or_lease`
//! answered with that lease's fencing number and the SHA-1 of its token
//! ([`Holder`]), and the message must name the same fencing number and
//! reveal the lease's secret, whose SHA-1 (hex) is the token. Redis stores
//! only the token, so the secret is known to the holder alone until the
//! commit: a client that can read the lease key (and publish) cannot forge
//! the commit's message. The commit runs only while that lease's fence and
//! generation still hold, so the message is that commit's. Everything else
//! (the codec, the tags, the invalidations heard meanwhile) is checked by
//! the waiter as for a fetched entry; a message that fails any check is a
//! plain wake-up.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;

use crate::key::Key;

/// The largest encoded entry a commit's message carries: 16 KiB. Larger
/// entries are announced with a plain wake-up, and fetched.
pub(crate) const CARRY_LIMIT: usize = 16 * 1024;

/// The format's version, the message's third field.
const VERSION: &str = "1";

/// Longest a lease secret may be (ours are 32 hex digits).
const SECRET_MAX: usize = 64;

/// The longest message parsed for an entry: the fields, and the entry's
/// base64. A longer one is a plain wake-up.
const MESSAGE_MAX: usize = 256 + CARRY_LIMIT.div_ceil(3) * 4;

/// What a waiter learned of the lease it waits on: its fencing number and
/// the SHA-1 (hex) of its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub fence: u64,
    proof: [u8; 20],
}

impl Holder {
    /// Parses the `<fence>:<sha1 hex>` that `fetch_or_lease.lua` answers
    /// beside a lease held by another owner. `None` for anything else (an
    /// older script's empty string): then no carried entry is taken.
    pub(crate) fn parse(text: &str) -> Option<Holder> {
        let (fence, hex) = text.split_once(':')?;
        if hex.len() != 40 {
            return None;
        }
        let mut proof = [0u8; 20];
        for (i, byte) in proof.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Holder {
            fence: parse_u64(fence)?,
            proof,
        })
    }

    /// Whether `carried` is the commit of this lease: its secret's token
    /// is the lease's.
    pub(crate) fn proves(&self, carried: &Carried) -> bool {
        carried.fence == self.fence
            && sha1_smol::Sha1::from(token_of(&carried.secret).as_bytes())
                .digest()
                .bytes()
                == self.proof
    }
}

/// The owner token a lease stores in Redis for `secret`: its SHA-1, hex.
pub(crate) fn token_of(secret: &str) -> String {
    sha1_smol::Sha1::from(secret.as_bytes())
        .digest()
        .to_string()
}

/// An entry carried by a commit's message, not yet checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Carried {
    /// The committing lease's secret, revealed by its commit.
    pub secret: String,
    /// The committing lease's fencing number.
    pub fence: u64,
    /// Freshness given at the commit.
    pub fresh: Duration,
    /// Lifetime of the value in Redis given at the commit.
    pub keep: Duration,
    /// The entry as the message carries it (base64 of the engine's
    /// codec), decoded by [`Carried::entry`] only once the secret proved
    /// the commit: a forged message costs a waiter no decoding.
    encoded: Bytes,
}

impl Carried {
    /// The encoded entry (the engine's codec); `None` if the carried text
    /// is not base64 or decodes to more than [`CARRY_LIMIT`].
    pub(crate) fn entry(&self) -> Option<Bytes> {
        let entry = STANDARD.decode(&self.encoded).ok()?;
        (entry.len() <= CARRY_LIMIT).then(|| Bytes::from(entry))
    }
}

/// The commit's message for `key`: carrying `entry` when it is at most
/// [`CARRY_LIMIT`], else the plain wake-up.
pub(crate) fn message(
    key: &Key,
    secret: &str,
    fence: u64,
    fresh: Duration,
    keep: Duration,
    entry: &[u8],
) -> String {
    if entry.len() > CARRY_LIMIT || secret.len() > SECRET_MAX || secret.contains(':') {
        return format!("c:{key}");
    }
    format!(
        "c:{key}:{VERSION}:{secret}:{fence}:{}:{}:{}",
        millis(fresh),
        millis(keep),
        STANDARD.encode(entry)
    )
}

/// The key and entry a commit's message carries; `None` for a plain
/// wake-up, another version, or anything malformed or too long.
pub(crate) fn parse(message: &[u8]) -> Option<(Key, Carried)> {
    if message.len() > MESSAGE_MAX {
        return None;
    }
    let text = std::str::from_utf8(message).ok()?;
    let mut fields = text.splitn(8, ':');
    if fields.next()? != "c" {
        return None;
    }
    let key = Key::from_hex(fields.next()?)?;
    if fields.next()? != VERSION {
        return None;
    }
    let secret = fields.next()?;
    if secret.is_empty() || secret.len() > SECRET_MAX {
        return None;
    }
    let fence = parse_u64(fields.next()?)?;
    let fresh = Duration::from_millis(parse_u64(fields.next()?)?);
    let keep = Duration::from_millis(parse_u64(fields.next()?)?);
    let encoded = fields.next()?;
    // Only the alphabet is checked here; the decoding waits for the proof.
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    if encoded.len() > CARRY_LIMIT.div_ceil(3) * 4
        || encoded.len() % 4 != 0
        || !encoded.bytes().all(alphabet)
    {
        return None;
    }
    Some((
        key,
        Carried {
            secret: secret.to_owned(),
            fence,
            fresh,
            keep,
            encoded: Bytes::copy_from_slice(encoded.as_bytes()),
        },
    ))
}

/// Digits only, at most 20 of them (`u64::MAX`): no sign; an overflow is
/// `None`.
fn parse_u64(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    /// The holder `fetch_or_lease` names for the lease of `secret`.
    fn holder(fence: u64, secret: &str) -> Holder {
        let hex = sha1_smol::Sha1::from(token_of(secret).as_bytes())
            .digest()
            .to_string();
        Holder::parse(&format!("{fence}:{hex}")).expect("well-formed")
    }

    #[test]
    fn a_small_entry_travels_and_proves_its_lease() {
        let key = Key::for_value("t", b"k");
        let entry = b"\x00\x01 any bytes: even colons".to_vec();
        let text = message(
            &key,
            SECRET,
            42,
            Duration::from_millis(1500),
            Duration::from_secs(31),
            &entry,
        );
        assert!(text.starts_with(&format!("c:{key}:1:")));
        let (parsed, carried) = parse(text.as_bytes()).expect("parses");
        assert_eq!(parsed, key);
        assert_eq!(carried.entry().unwrap(), entry);
        assert_eq!(carried.fence, 42);
        assert_eq!(carried.fresh, Duration::from_millis(1500));
        assert_eq!(carried.keep, Duration::from_secs(31));
        assert!(holder(42, SECRET).proves(&carried));
        assert!(
            !holder(41, SECRET).proves(&carried),
            "another lease's fence"
        );
        // What Redis stores (and a reader of the lease key learns) is the
        // token, not the secret: a message revealing it proves nothing.
        let token = token_of(SECRET);
        let forged = message(&key, &token, 42, Duration::ZERO, Duration::ZERO, &entry);
        let (_, forged) = parse(forged.as_bytes()).expect("parses");
        assert!(
            !holder(42, SECRET).proves(&forged),
            "the token is no secret"
        );
        assert!(
            !holder(42, "ffffffffffffffffffffffffffffffff").proves(&carried),
            "another lease's secret"
        );
    }

    #[test]
    fn a_large_entry_is_a_plain_wake_up() {
        let key = Key::for_value("t", b"k");
        let entry = vec![7u8; CARRY_LIMIT + 1];
        let text = message(&key, SECRET, 1, Duration::ZERO, Duration::ZERO, &entry);
        assert_eq!(text, format!("c:{key}"));
        assert!(parse(text.as_bytes()).is_none());
        let at_limit = message(
            &key,
            SECRET,
            1,
            Duration::ZERO,
            Duration::ZERO,
            &entry[..CARRY_LIMIT],
        );
        assert!(parse(at_limit.as_bytes()).is_some());
    }

    #[test]
    fn malformed_messages_carry_nothing() {
        let key = Key::for_value("t", b"k");
        for bad in [
            format!("c:{key}"),
            format!("c:{key}:2:{SECRET}:1:1:1:AAAA"),
            format!("c:{key}:1:{SECRET}:-1:1:1:AAAA"),
            format!("c:{key}:1:{SECRET}:1:99999999999999999999:1:AAAA"),
            format!("c:{key}:1:{SECRET}:1:1:999999999999999999999:AAAA"),
            format!("c:{key}:1::1:1:1:AAAA"),
            format!("c:{key}:1:{SECRET}:1:1:1:not base64!"),
            format!("c:{key}:1:{SECRET}:1:1:1"),
            format!("i:{key}:1:{SECRET}:1:1:1:AAAA"),
            format!("c:zz:1:{SECRET}:1:1:1:AAAA"),
        ] {
            assert!(parse(bad.as_bytes()).is_none(), "{bad}");
        }
        // Base64's alphabet but not base64: parsed, never decoded to an entry.
        let (_, odd) = parse(format!("c:{key}:1:{SECRET}:1:1:1:A=AA").as_bytes()).unwrap();
        assert!(odd.entry().is_none());
        for bad in ["", "1", "x:00", "1:zz", &format!("1:{}", "0".repeat(41))] {
            assert!(Holder::parse(bad).is_none(), "{bad}");
        }
    }

    fn push(payload: &str) -> redis::PushInfo {
        redis::PushInfo {
            kind: redis::PushKind::Message,
            data: vec![
                redis::Value::BulkString(b"sg:events".to_vec()),
                redis::Value::BulkString(payload.as_bytes().to_vec()),
            ],
        }
    }

    /// A waiter takes a carried entry only if the channel told of nothing
    /// to distrust since it registered (before it asked Redis).
    #[tokio::test]
    async fn nothing_heard_since_the_waiter_asked() {
        use super::super::notify::{Event, Notifier};
        let notifier = std::sync::Arc::new(Notifier::new(
            std::sync::Arc::new(|_| {}),
            Duration::from_secs(3),
        ));
        let key = Key::for_value("t", b"k");
        let second = Duration::from_secs(1);
        let committed = message(&key, SECRET, 7, second, second, b"entry");
        let limit = Duration::from_secs(5);
        // The commit, then the key's invalidation, both before the waiter
        // looks: the invalidation is what it sees.
        let mut waiter = notifier.register(key);
        notifier.on_push(push(&committed));
        notifier.on_push(push(&Event::Invalidated.message(&key)));
        assert_eq!(waiter.wait(limit).await, Some(Event::Invalidated));
        assert!(waiter.carried().is_none());
        drop(waiter);
        // A tag's generation moved after it asked: not taken.
        let mut waiter = notifier.register(key);
        notifier.on_push(push("g:b12:5"));
        notifier.on_push(push(&committed));
        assert_eq!(waiter.wait(limit).await, Some(Event::Committed));
        assert!(waiter.carried().is_none());
        drop(waiter);
        // Another key's commit is not this key's entry.
        let other = Key::for_value("t", b"other");
        let mut waiter = notifier.register(key);
        let theirs = message(&other, SECRET, 7, second, second, b"entry");
        notifier.on_push(push(&theirs));
        notifier.on_push(push(&committed));
        assert_eq!(waiter.wait(limit).await, Some(Event::Committed));
        let carried = waiter.carried().expect("nothing heard meanwhile");
        assert_eq!(&carried.entry().unwrap()[..], b"entry");
        assert!(holder(7, SECRET).proves(carried));
        // A gap after it was taken in: not taken any more.
        notifier.subscription_lost();
        assert!(waiter.carried().is_none());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let _ = Holder::parse(text);
            }
        }

        #[test]
        fn arbitrary_fields_never_panic(
            fields in proptest::collection::vec("[0-9a-zA-Z+/=:-]{0,40}", 0..10)
        ) {
            let key = Key::for_value("t", b"k");
            let text = format!("c:{key}:1:{}", fields.join(":"));
            if let Some((parsed, carried)) = parse(text.as_bytes()) {
                prop_assert_eq!(parsed, key);
                prop_assert!(carried.entry().is_none_or(|e| e.len() <= CARRY_LIMIT));
            }
        }

        #[test]
        fn what_is_sent_is_what_is_read(
            entry in proptest::collection::vec(any::<u8>(), 0..2048),
            fence in any::<u64>(),
            fresh in any::<u64>(),
        ) {
            let key = Key::for_value("t", b"k");
            let fresh = Duration::from_millis(fresh);
            let text = message(&key, SECRET, fence, fresh, fresh, &entry);
            let (_, carried) = parse(text.as_bytes()).expect("parses");
            prop_assert_eq!(&carried.entry().unwrap()[..], &entry[..]);
            prop_assert_eq!(carried.fence, fence);
            prop_assert_eq!(carried.fresh, fresh);
        }
    }
}
