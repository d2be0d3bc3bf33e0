//! The versioned binary form of entries in the shared tier.
//!
//! Every entry in Redis is an envelope (format version, lifetime, the age the
//! value had when stored, how long it took to build) around the value's own
//! bytes. Anything that does not parse (another program's data at our keys, a
//! future format, a truncated write) decodes to `None` and is treated as a
//! miss: never a panic, never a wrong answer.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub(crate) use super::entry::Envelope;
use super::entry::{Lifetime, MAX_DELTA};
use super::tags::{Stamp, MAX_TAGS};
use crate::store::generations::{Scope, BUCKETS};

const MAGIC: &[u8; 2] = b"SG";
/// Version 5: after the header, the revalidation window (u64
/// milliseconds), then the stamp: the table's epoch, `all`, the namespace's
/// scope and its own generation (u64 each), a count (u16), then each tag
/// bucket (u16) and its generation (u64). Versions 1 to 4 recorded no
/// namespace: whichever namespace's purges they missed is unknown, so
/// they read as nothing (a miss), and versions that know no version 5 read
/// it as nothing too.
const VERSION: u8 = 5;
const HEADER_LEN: usize = 2 + 1 + 6 * 8;

pub(crate) fn encode(envelope: &Envelope, stamp: &Stamp, payload: &[u8]) -> Bytes {
    let stamp_len = 4 * 8 + 2 + stamp.tags.len() * 10;
    let mut out = BytesMut::with_capacity(HEADER_LEN + stamp_len + payload.len());
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u64_le(millis(envelope.lifetime.ttl));
    out.put_u64_le(millis(envelope.lifetime.stale_while_revalidate));
    out.put_u64_le(millis(envelope.lifetime.stale_if_error));
    out.put_u64_le(millis(envelope.initial_age));
    out.put_u64_le(envelope.rebuild_cost.as_micros().min(u64::MAX as u128) as u64);
    out.put_u64_le(millis(envelope.lifetime.revalidation));
    out.put_u64_le(stamp.epoch);
    out.put_u64_le(stamp.all);
    out.put_u64_le(stamp.scope.id());
    out.put_u64_le(stamp.own);
    // At most MAX_TAGS, so the count fits.
    out.put_u16_le(stamp.tags.len().min(MAX_TAGS) as u16);
    for &(bucket, generation) in stamp.tags.iter().take(MAX_TAGS) {
        out.put_u16_le(bucket);
        out.put_u64_le(generation);
    }
    out.put_slice(payload);
    out.freeze()
}

pub(crate) fn decode(mut bytes: Bytes) -> Option<(Envelope, Stamp, Bytes)> {
    if bytes.len() < HEADER_LEN || &bytes[..2] != MAGIC || bytes[2] != VERSION {
        return None;
    }
    bytes.advance(3);
    // Bytes from Redis are untrusted: every duration is clamped, so nothing
    // computed from them can overflow.
    let mut millis = || Duration::from_millis(bytes.get_u64_le()).min(MAX_DELTA);
    let ttl = millis();
    let swr = millis();
    let sie = millis();
    let initial_age = millis();
    let rebuild_cost = Duration::from_micros(bytes.get_u64_le()).min(MAX_DELTA);
    let revalidation = Duration::from_millis(bytes.get_u64_le()).min(MAX_DELTA);
    let envelope = Envelope {
        lifetime: Lifetime {
            ttl,
            stale_while_revalidate: swr,
            stale_if_error: sie,
            revalidation,
        },
        initial_age,
        rebuild_cost,
    };
    let stamp = decode_stamp(&mut bytes)?;
    Some((envelope, stamp, bytes))
}

/// The stamp. Untrusted: a count past [`MAX_TAGS`], a bucket out of range,
/// buckets out of order or a short read is `None`.
fn decode_stamp(bytes: &mut Bytes) -> Option<Stamp> {
    if bytes.len() < 4 * 8 + 2 {
        return None;
    }
    let epoch = bytes.get_u64_le();
    let all = bytes.get_u64_le();
    let scope = Scope::from_id(bytes.get_u64_le());
    let own = bytes.get_u64_le();
    let count = usize::from(bytes.get_u16_le());
    if count > MAX_TAGS || bytes.len() < count.saturating_mul(10) {
        return None;
    }
    let mut tags = Vec::with_capacity(count);
    for _ in 0..count {
        let bucket = bytes.get_u16_le();
        let generation = bytes.get_u64_le();
        let ordered = !matches!(tags.last(), Some(&(last, _)) if last >= bucket);
        if bucket >= BUCKETS || !ordered {
            return None;
        }
        tags.push((bucket, generation));
    }
    Some(Stamp {
        epoch,
        all,
        scope,
        own,
        tags: tags.into(),
    })
}

pub(crate) use crate::store::millis;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn envelope() -> Envelope {
        Envelope {
            lifetime: Lifetime {
                ttl: Duration::from_millis(1500),
                stale_while_revalidate: Duration::from_secs(30),
                stale_if_error: Duration::from_secs(600),
                revalidation: Duration::ZERO,
            },
            initial_age: Duration::from_secs(3),
            rebuild_cost: Duration::from_micros(123_456),
        }
    }

    fn stamp() -> Stamp {
        Stamp {
            epoch: 1_732_270_000_000_000,
            all: 7,
            scope: Scope::of("shop"),
            own: 8,
            tags: vec![(1, 10), (4095, u64::MAX)].into(),
        }
    }

    #[test]
    fn envelope_round_trips() {
        let bytes = encode(&envelope(), &stamp(), b"payload");
        let (env, read, payload) = decode(bytes).expect("decodes");
        assert_eq!(env, envelope());
        assert_eq!(read, stamp());
        assert_eq!(&payload[..], b"payload");
        let mut kept = envelope();
        kept.lifetime.revalidation = Duration::from_secs(300);
        let bytes = encode(&kept, &stamp(), b"payload");
        let (env, read, _) = decode(bytes.clone()).expect("decodes");
        assert_eq!((env, read), (kept, stamp()));
        assert!(decode(bytes.slice(..HEADER_LEN + 4)).is_none());
    }

    #[test]
    fn foreign_truncated_or_older_bytes_are_rejected() {
        assert!(decode(Bytes::from_static(b"")).is_none());
        assert!(decode(Bytes::from_static(b"{\"json\":true}")).is_none());
        let good = encode(&envelope(), &Stamp::default(), b"x");
        assert!(decode(good.slice(..HEADER_LEN - 1)).is_none());
        for version in [1, 2, 3, 4, VERSION + 1] {
            let mut other = BytesMut::from(&good[..]);
            other[2] = version;
            assert!(decode(other.freeze()).is_none(), "version {version}");
        }
    }

    #[test]
    fn a_forged_stamp_is_rejected() {
        let good = encode(&envelope(), &Stamp::default(), b"x");
        // After the epoch, `all`, the scope and its own generation.
        let stamp_at = HEADER_LEN + 32;
        let forge = |count: u16, entries: &[(u16, u64)]| {
            let mut raw = BytesMut::from(&good[..stamp_at]);
            raw.put_u16_le(count);
            for &(b, g) in entries {
                raw.put_u16_le(b);
                raw.put_u64_le(g);
            }
            decode(raw.freeze())
        };
        assert!(forge(0, &[]).is_some());
        assert!(forge(1, &[(BUCKETS, 1)]).is_none(), "bucket out of range");
        assert!(forge(2, &[(5, 1), (5, 2)]).is_none(), "out of order");
        assert!(forge(3, &[(1, 1)]).is_none(), "short");
        assert!(forge(u16::MAX, &[]).is_none(), "too many");
        assert!(decode(good.slice(..stamp_at + 1)).is_none());
        assert!(
            decode(good.slice(..HEADER_LEN + 20)).is_none(),
            "a cut stamp"
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let bytes = Bytes::from(bytes);
            let _ = decode(bytes);
        }

        #[test]
        fn decoded_durations_are_bounded(fields in proptest::array::uniform6(any::<u64>())) {
            let mut raw = BytesMut::new();
            raw.put_slice(MAGIC);
            raw.put_u8(VERSION);
            for field in fields {
                raw.put_u64_le(field);
            }
            raw.put_slice(&[0; 34]);
            let (envelope, _, _) = decode(raw.freeze()).expect("well-formed");
            for d in [envelope.lifetime.ttl, envelope.lifetime.stale_while_revalidate,
                      envelope.lifetime.stale_if_error, envelope.initial_age, envelope.rebuild_cost,
                      envelope.lifetime.revalidation] {
                prop_assert!(d <= MAX_DELTA);
            }
        }

    }
}
