//! The versioned binary form of entries in the shared tier.
//!
//! Every entry in Redis is an envelope (format version, lifetime, the age the
//! value had when stored, how long it took to build) around the value's own
//! bytes. Anything that does not parse (another program's data at our keys, a
//! future format, a truncated write) decodes to `None` and is treated as a
//! miss: never a panic, never a wrong answer.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::entry::{CacheValue, CachedResponse, Lifetime};

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
    let ttl = Duration::from_millis(bytes.get_u64_le());
    let swr = Duration::from_millis(bytes.get_u64_le());
    let sie = Duration::from_millis(bytes.get_u64_le());
    let initial_age = Duration::from_millis(bytes.get_u64_le());
    let rebuild_cost = Duration::from_micros(bytes.get_u64_le());
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

impl CachedResponse {
    fn write(&self, out: &mut BytesMut) -> Option<()> {
        out.put_u16(self.status.as_u16());
        out.put_u16(u16::try_from(self.headers.len()).ok()?);
        for (name, value) in &self.headers {
            out.put_u16(u16::try_from(name.as_str().len()).ok()?);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(u32::try_from(value.len()).ok()?);
            out.put_slice(value.as_bytes());
        }
        out.put_slice(&self.body);
        Some(())
    }

    fn read(mut bytes: Bytes) -> Option<Self> {
        if bytes.remaining() < 4 {
            return None;
        }
        let status = StatusCode::from_u16(bytes.get_u16()).ok()?;
        let count = bytes.get_u16() as usize;
        // Untrusted counts must not size an allocation (or trip the map's limit).
        let mut headers = HeaderMap::try_with_capacity(count.min(64)).ok()?;
        for _ in 0..count {
            if bytes.remaining() < 2 {
                return None;
            }
            let len = bytes.get_u16() as usize;
            if bytes.remaining() < len + 4 {
                return None;
            }
            let name = HeaderName::from_bytes(&bytes.split_to(len)).ok()?;
            let len = bytes.get_u32() as usize;
            if bytes.remaining() < len {
                return None;
            }
            let value = HeaderValue::from_maybe_shared(bytes.split_to(len)).ok()?;
            headers.try_append(name, value).ok()?;
        }
        Some(CachedResponse {
            status,
            headers,
            body: bytes,
        })
    }
}

impl CacheValue for CachedResponse {
    fn weight(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum();
        self.body.len() + headers
    }

    fn encode(&self) -> Option<Bytes> {
        let mut out = BytesMut::with_capacity(self.body.len() + 64 * (self.headers.len() + 1));
        self.write(&mut out)?;
        Some(out.freeze())
    }

    fn decode(bytes: Bytes) -> Option<Self> {
        CachedResponse::read(bytes)
    }

    const SHARED: bool = true;
}

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

    #[test]
    fn response_round_trips_with_repeated_headers() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let response = CachedResponse {
            status: StatusCode::NOT_FOUND,
            headers,
            body: Bytes::from_static(b"gone"),
        };
        let back = CachedResponse::decode(response.encode().unwrap()).unwrap();
        assert_eq!(back.status, StatusCode::NOT_FOUND);
        assert_eq!(back.headers, response.headers);
        assert_eq!(back.body, response.body);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let bytes = Bytes::from(bytes);
            let _ = decode(bytes.clone());
            let _ = CachedResponse::decode(bytes);
        }

        #[test]
        fn truncated_responses_are_rejected_or_shorter(cut in 0usize..40) {
            let mut headers = HeaderMap::new();
            headers.append("etag", HeaderValue::from_static("\"v1\""));
            let response = CachedResponse { status: StatusCode::OK, headers, body: Bytes::from_static(b"body") };
            let full = response.encode().unwrap();
            let cut = cut.min(full.len());
            if let Some(back) = CachedResponse::decode(full.slice(..cut)) {
                // Only a cut inside the body can still parse, and then as a prefix.
                prop_assert!(back.body.len() < 4 || cut == full.len());
            }
        }
    }
}
