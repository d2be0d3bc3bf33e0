//! The versioned binary form of entries in the shared tier.
//!
//! Every entry in Redis is an envelope (format version, lifetime, the age the
//! value had when stored, how long it took to build) around the value's own
//! bytes. Anything that does not parse (another program's data at our keys, a
//! future format, a truncated write) decodes to `None` and is treated as a
//! miss: never a panic, never a wrong answer.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::entry::{Lifetime, MAX_DELTA};

const MAGIC: &[u8; 2] = b"SG";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 2 + 1 + 5 * 8;

/// An entry's metadata, as written beside its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub lifetime: Lifetime,
    pub initial_age: Duration,
    pub rebuild_cost: Duration,
}

pub(crate) fn encode(envelope: &Envelope, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u64_le(millis(envelope.lifetime.ttl));
    out.put_u64_le(millis(envelope.lifetime.stale_while_revalidate));
    out.put_u64_le(millis(envelope.lifetime.stale_if_error));
    out.put_u64_le(millis(envelope.initial_age));
    out.put_u64_le(envelope.rebuild_cost.as_micros().min(u64::MAX as u128) as u64);
    out.put_slice(payload);
    out.freeze()
}

pub(crate) fn decode(mut bytes: Bytes) -> Option<(Envelope, Bytes)> {
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
    let envelope = Envelope {
        lifetime: Lifetime {
            ttl,
            stale_while_revalidate: swr,
            stale_if_error: sie,
        },
        initial_age,
        rebuild_cost,
    };
    Some((envelope, bytes))
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
            },
            initial_age: Duration::from_secs(3),
            rebuild_cost: Duration::from_micros(123_456),
        }
    }

    #[test]
    fn envelope_round_trips() {
        let bytes = encode(&envelope(), b"payload");
        let (env, payload) = decode(bytes).expect("decodes");
        assert_eq!(env, envelope());
        assert_eq!(&payload[..], b"payload");
    }

    #[test]
    fn foreign_or_truncated_bytes_are_rejected() {
        assert!(decode(Bytes::from_static(b"")).is_none());
        assert!(decode(Bytes::from_static(b"{\"json\":true}")).is_none());
        let good = encode(&envelope(), b"x");
        assert!(decode(good.slice(..HEADER_LEN - 1)).is_none());
        let mut future = BytesMut::from(&good[..]);
        future[2] = VERSION + 1;
        assert!(decode(future.freeze()).is_none());
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
            raw.put_u8(VERSION);
            for field in fields {
                raw.put_u64_le(field);
            }
            let (envelope, _) = decode(raw.freeze()).expect("well-formed");
            for d in [envelope.lifetime.ttl, envelope.lifetime.stale_while_revalidate,
                      envelope.lifetime.stale_if_error, envelope.initial_age, envelope.rebuild_cost] {
                prop_assert!(d <= MAX_DELTA);
            }
        }

    }
}
