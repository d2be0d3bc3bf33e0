//! The cached response: what the layer stores for a URL, and its wire form in
//! the shared tier.
//!
//! Hop-by-hop headers are gone before a response gets here, and a stored
//! body is whole in one `Bytes`, so a hit copies no body. The wire form is
//! versioned by the engine's envelope around it; anything that does not parse
//! is a miss, never a panic.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::SET_COOKIE;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::rfc::cache_control::{qualified_fields, KEPT_WHATEVER_NAMED};
use super::rfc::headers::{AUTHENTICATION_INFO, PROXY_AUTHENTICATION_INFO, SET_COOKIE2};
use super::spool::Hold;
use crate::engine::CacheValue;

/// An HTTP response as the layer stores it.
#[derive(Clone, Debug)]
pub(crate) struct CachedResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: CachedBody,
}

/// The body of a [`CachedResponse`].
#[derive(Clone)]
pub(crate) enum CachedBody {
    /// Whole, in a buffer of its own.
    Full(Bytes),
    /// Still arriving from the origin: a body over `max_body_bytes`, shared
    /// by the requests that waited for it and never stored. The hold keeps
    /// its start for them while any copy of the response lives.
    Spooled(Arc<Hold>),
}

impl CachedBody {
    /// The whole body, if it is in memory.
    pub(crate) fn full(&self) -> Option<&Bytes> {
        match self {
            CachedBody::Full(bytes) => Some(bytes),
            CachedBody::Spooled(_) => None,
        }
    }

    /// Bytes held so far.
    pub(crate) fn len(&self) -> usize {
        match self {
            CachedBody::Full(bytes) => bytes.len(),
            CachedBody::Spooled(hold) => hold.spool().len(),
        }
    }
}

impl From<Bytes> for CachedBody {
    fn from(bytes: Bytes) -> Self {
        CachedBody::Full(bytes)
    }
}

impl std::fmt::Debug for CachedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CachedBody::Full(bytes) => write!(f, "Full({} bytes)", bytes.len()),
            CachedBody::Spooled(hold) => write!(f, "Spooled({} bytes so far)", hold.spool().len()),
        }
    }
}

/// Heap bytes a stored response costs beyond its body, its header bytes
/// and its header slots, as measured with a counting allocator (see
/// `tests/http/memory.rs`): the `HeaderMap` itself, the `Entry` and `Arc` around
/// the value, and moka's per-entry bookkeeping (its value entry, access-order
/// and expiry nodes). Charging it keeps the byte bound true for a flood of
/// small answers.
const RESPONSE_OVERHEAD: usize = 448;

/// The status bit of the wire form that marks an entry selected by a
/// learned `Vary` (statuses stop at 999).
const SELECTED_FLAG: u16 = 0x8000;

/// Heap bytes of one slot of a `HeaderMap`, used or not: its entry (name,
/// value, hash and links) and its share of the index table.
const HEADER_SLOT: usize = 112;

/// Response fields that belong to the one client whose request the origin
/// answered, never sent to another:
///
/// - `Set-Cookie` and `Set-Cookie2` (its session): by default an answer
///   that sets one is not shared at all (see `policy::classify`); a route
///   that strips cookies stores the rest;
/// - `Authentication-Info` and `Proxy-Authentication-Info` (RFC 9110
///   §11.6.3, §11.7.3): the next nonce or the server's proof for that
///   client's credentials, not part of the resource, so always stripped;
/// - the fields a qualified `private="…"` or `no-cache="…"` names (RFC 9111
///   §5.2.2.7, §5.2.2.4), in `Cache-Control` or a targeted field of
///   `targets`: the rest of such a response is stored (by default, when
///   the qualified forms are its only `private` and `no-cache`; see
///   `CacheControl::parse`), those fields are not, rather than sent later
///   without revalidation.
///
/// `Vary` and `Content-Encoding` are kept whatever names them
/// (`KEPT_WHATEVER_NAMED`): the entry is selected by the one and read by
/// the other. A list that names either is read as the plain directive, so
/// only a route that stores private answers keeps such a response.
///
/// Removed from `headers` (what is stored and shared) and returned, for the
/// answer of the request that asked alone. The fields a `Connection` header
/// names are gone before this (hop-by-hop, RFC 9110 §7.6.1): never stored
/// nor sent on, that client's answer included.
pub(crate) fn take_one_clients(
    headers: &mut HeaderMap,
    strip_cookies: bool,
    targets: &[HeaderName],
) -> Vec<(HeaderName, HeaderValue)> {
    // Never `Vary` nor `Content-Encoding`: without the one the entry would
    // be served to every request, without the other its body misread.
    let mut names = qualified_fields(headers, targets);
    names.retain(|name| !KEPT_WHATEVER_NAMED.contains(name));
    names.extend([AUTHENTICATION_INFO, PROXY_AUTHENTICATION_INFO].map(HeaderName::from_static));
    if strip_cookies {
        names.extend([SET_COOKIE, HeaderName::from_static(SET_COOKIE2)]);
    }
    let mut taken = Vec::new();
    for name in names {
        if let http::header::Entry::Occupied(entry) = headers.entry(&name) {
            let (name, values) = entry.remove_entry_mult();
            taken.extend(values.map(|value| (name.clone(), value)));
        }
    }
    taken
}

impl CachedResponse {
    fn write(&self, out: &mut BytesMut) -> Option<()> {
        let body = self.body.full()?;
        // An entry selected by a learned `Vary` sets the status's top bit: a
        // reader that does not select variants (an older release, mid
        // rollout) cannot decode it, so it misses rather than serve one
        // variant to every request.
        let selected = match self.headers.contains_key(&super::vary::SELECTED) {
            true => SELECTED_FLAG,
            false => 0,
        };
        out.put_u16(self.status.as_u16() | selected);
        out.put_u16(u16::try_from(self.headers.len()).ok()?);
        for (name, value) in &self.headers {
            out.put_u16(u16::try_from(name.as_str().len()).ok()?);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(u32::try_from(value.len()).ok()?);
            out.put_slice(value.as_bytes());
        }
        out.put_slice(body);
        Some(())
    }

    fn read(mut bytes: Bytes) -> Option<Self> {
        if bytes.remaining() < 4 {
            return None;
        }
        let status = StatusCode::from_u16(bytes.get_u16() & !SELECTED_FLAG).ok()?;
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
            body: CachedBody::Full(bytes),
        })
    }
}

impl CacheValue for CachedResponse {
    fn weight(&self) -> usize {
        let bytes: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len().saturating_add(value.len()))
            .fold(0usize, usize::saturating_add);
        self.body
            .len()
            .saturating_add(bytes)
            .saturating_add(self.headers.capacity().saturating_mul(HEADER_SLOT))
            .saturating_add(RESPONSE_OVERHEAD)
    }

    /// `None` for a spooled body: it is never stored.
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

    #[test]
    fn response_round_trips_with_repeated_headers() {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let response = CachedResponse {
            status: StatusCode::NOT_FOUND,
            headers,
            body: Bytes::from_static(b"gone").into(),
        };
        let back = CachedResponse::decode(response.encode().unwrap()).unwrap();
        assert_eq!(back.status, StatusCode::NOT_FOUND);
        assert_eq!(back.headers, response.headers);
        assert_eq!(back.body.full(), response.body.full());
    }

    #[test]
    fn a_selected_entry_round_trips_and_is_marked_in_its_status() {
        let mut headers = HeaderMap::new();
        headers.insert("vary", HeaderValue::from_static("foo"));
        headers.insert(
            super::super::vary::SELECTED.clone(),
            HeaderValue::from_static("d1"),
        );
        let response = CachedResponse {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(b"x").into(),
        };
        let wire = response.encode().unwrap();
        // What a reader without the flag sees: no status at all.
        assert!(StatusCode::from_u16(u16::from_be_bytes([wire[0], wire[1]])).is_err());
        let back = CachedResponse::decode(wire).unwrap();
        assert_eq!(back.status, StatusCode::OK);
        assert_eq!(back.headers, response.headers);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = CachedResponse::decode(Bytes::from(bytes));
        }

        #[test]
        fn truncated_responses_are_rejected_or_shorter(cut in 0usize..40) {
            let mut headers = HeaderMap::new();
            headers.append("etag", HeaderValue::from_static("\"v1\""));
            let response = CachedResponse { status: StatusCode::OK, headers, body: Bytes::from_static(b"body").into() };
            let full = response.encode().unwrap();
            let cut = cut.min(full.len());
            if let Some(back) = CachedResponse::decode(full.slice(..cut)) {
                // Only a cut inside the body can still parse, and then as a prefix.
                prop_assert!(back.body.len() < 4 || cut == full.len());
            }
        }
    }
}
