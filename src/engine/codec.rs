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
use crate::store::generations::BUCKETS;

const MAGIC: &[u8; 2] = b"SG";
/// Version 1 had no stamp (read as built under no generation); version 2
/// adds the generations the entry was built under, after the header:
/// `all` (u64), a count (u16), then each tag bucket (u16) and its
/// generation (u64). Version 3 puts the table's epoch (u64) before them.
/// Versions 1 and 2 read as built under epoch 0: with Redis, a miss.
/// Version 4 is version 3 with the revalidation window (u64 milliseconds)
/// after the rebuild cost; an entry without one is still written as version
/// 3, which instances that know no version 4 read.
const VERSION_1: u8 = 1;
const VERSION_2: u8 = 2;
const VERSION_3: u8 = 3;
const VERSION: u8 = 4;
const HEADER_LEN: usize = 2 + 1 + 5 * 8;

pub(crate) fn encode(envelope: &Envelope, stamp: &Stamp, payload: &[u8]) -> Bytes {
    let stamp_len = 8 + 8 + 2 + stamp.tags.len() * 10;
    let mut out = BytesMut::with_capacity(HEADER_LEN + 8 + stamp_len + payload.len());
    out.put_slice(MAGIC);
    let revalidation = millis(envelope.lifetime.revalidation);
    out.put_u8(if revalidation == 0 {
        VERSION_3
    } else {
        VERSION
    });
    out.put_u64_le(millis(envelope.lifetime.ttl));
    out.put_u64_le(millis(envelope.lifetime.stale_while_revalidate));
    out.put_u64_le(millis(envelope.lifetime.stale_if_error));
    out.put_u64_le(millis(envelope.initial_age));
    out.put_u64_le(envelope.rebuild_cost.as_micros().min(u64::MAX as u128) as u64);
    if revalidation != 0 {
        out.put_u64_le(revalidation);
    }
    out.put_u64_le(stamp.epoch);
    out.put_u64_le(stamp.all);
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
    if bytes.len() < HEADER_LEN || &bytes[..2] != MAGIC {
        return None;
    }
    let version = bytes[2];
    if !matches!(version, VERSION_1 | VERSION_2 | VERSION_3 | VERSION) {
        return None;
    }
    if version == VERSION && bytes.len() < HEADER_LEN + 8 {
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
    let revalidation = match version {
        VERSION => Duration::from_millis(bytes.get_u64_le()).min(MAX_DELTA),
        _ => Duration::ZERO,
    };
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
    let stamp = match version {
        VERSION | VERSION_3 if bytes.len() >= 8 => {
            let epoch = bytes.get_u64_le();
            Stamp {
                epoch,
                ..decode_stamp(&mut bytes)?
            }
        }
        VERSION | VERSION_3 => return None,
        VERSION_2 => decode_stamp(&mut bytes)?,
        _ => Stamp::default(),
    };
    Some((envelope, stamp, bytes))
}

/// The stamp of a version 2 entry. Untrusted: a count past [`MAX_TAGS`], a
/// bucket out of range, buckets out of order or a short read is `None`.
fn decode_stamp(bytes: &mut Bytes) -> Option<Stamp> {
    if bytes.len() < 10 {
        return None;
    }
    let all = bytes.get_u64_le();
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
        epoch: 0,
        all,
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

    #[test]
    fn envelope_round_trips() {
        let stamp = Stamp {
            epoch: 1_732_270_000_000_000,
            all: 7,
            tags: vec![(1, 10), (4095, u64::MAX)].into(),
        };
        let bytes = encode(&envelope(), &stamp, b"payload");
        let (env, read, payload) = decode(bytes).expect("decodes");
        assert_eq!(env, envelope());
        assert_eq!(read, stamp);
        assert_eq!(&payload[..], b"payload");
    }

    #[test]
    fn a_revalidation_window_round_trips_and_only_it_needs_version_4() {
        let stamp = Stamp {
            epoch: 9,
            all: 3,
            tags: vec![(2, 5)].into(),
        };
        let plain = encode(&envelope(), &stamp, b"p");
        assert_eq!(plain[2], VERSION_3);
        let mut kept = envelope();
        kept.lifetime.revalidation = Duration::from_secs(300);
        let bytes = encode(&kept, &stamp, b"payload");
        assert_eq!(bytes[2], VERSION);
        let (env, read, payload) = decode(bytes.clone()).expect("decodes");
        assert_eq!((env, read), (kept, stamp));
        assert_eq!(&payload[..], b"payload");
        assert!(decode(bytes.slice(..HEADER_LEN + 4)).is_none());
    }

    #[test]
    fn foreign_or_truncated_bytes_are_rejected() {
        assert!(decode(Bytes::from_static(b"")).is_none());
        assert!(decode(Bytes::from_static(b"{\"json\":true}")).is_none());
        let good = encode(&envelope(), &Stamp::default(), b"x");
        assert!(decode(good.slice(..HEADER_LEN - 1)).is_none());
        let mut future = BytesMut::from(&good[..]);
        future[2] = VERSION + 1;
        assert!(decode(future.freeze()).is_none());
    }

    #[test]
    fn a_forged_stamp_is_rejected() {
        let good = encode(&envelope(), &Stamp::default(), b"x");
        // After the epoch and `all`.
        let stamp_at = HEADER_LEN + 16;
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
    }

    #[test]
    fn an_entry_written_before_epochs_reads_as_epoch_0() {
        let stamp = Stamp {
            epoch: 5,
            all: 7,
            tags: vec![(1, 10)].into(),
        };
        let current = encode(&envelope(), &stamp, b"x");
        // The version 2 layout: the same without the epoch.
        let mut raw = BytesMut::from(&current[..HEADER_LEN]);
        raw[2] = VERSION_2;
        raw.put_slice(&current[HEADER_LEN + 8..]);
        let (_, read, payload) = decode(raw.freeze()).expect("decodes");
        assert_eq!((read.epoch, read.all), (0, 7));
        assert_eq!(&payload[..], b"x");
        assert!(
            decode(current.slice(..HEADER_LEN + 4)).is_none(),
            "a cut epoch"
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let bytes = Bytes::from(bytes);
            let _ = decode(bytes);
        }

        #[test]
        fn decoded_durations_are_bounded(fields in proptest::array::uniform5(any::<u64>())) {
            let mut raw = BytesMut::new();
            raw.put_slice(MAGIC);
            raw.put_u8(VERSION_1);
            for field in fields {
                raw.put_u64_le(field);
            }
            let (envelope, _, _) = decode(raw.freeze()).expect("well-formed");
            for d in [envelope.lifetime.ttl, envelope.lifetime.stale_while_revalidate,
                      envelope.lifetime.stale_if_error, envelope.initial_age, envelope.rebuild_cost] {
                prop_assert!(d <= MAX_DELTA);
            }
        }

    }
}
