//! Request → cache key.
//!
//! A key is a 128-bit BLAKE3 digest of everything that selects a response:
//! namespace, method class (HEAD shares GET's entry), host, path, the query with
//! its pairs sorted, and the values of the route's Vary headers. Every part is
//! written with its length first, so no two different requests can run
//! together into the same input. A cryptographic hash keeps an attacker
//! who controls the query string from forging a collision with another page.

use std::fmt;

use http::header::HOST;
use http::request::Parts;
use http::HeaderName;

/// A fixed-length cache key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; 16]);

impl Key {
    /// The key of an application value for the generic [`Cache`](crate::Cache).
    pub(crate) fn for_value(namespace: &str, key: &[u8]) -> Key {
        let mut h = KeyHasher::new(b"v1");
        h.part(namespace.as_bytes());
        h.part(key);
        h.finish()
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses the 32 lowercase hex digits that `Display` writes.
    pub fn from_hex(hex: &str) -> Option<Key> {
        let hex = hex.as_bytes();
        if hex.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Key(out))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Feeds the key's parts to BLAKE3. Requests keys are short, so the parts are
/// gathered in a stack buffer and hashed in one call, which is much cheaper
/// than many small updates; a longer input spills over into the incremental
/// hasher (same digest either way).
struct KeyHasher {
    buf: [u8; 256],
    len: usize,
    // Boxed: the incremental hasher is almost 2 KiB, and carrying it inline
    // made every key cost a 2 KiB copy.
    spill: Option<Box<blake3::Hasher>>,
}

impl KeyHasher {
    fn new(domain: &[u8]) -> Self {
        let mut h = KeyHasher {
            buf: [0; 256],
            len: 0,
            spill: None,
        };
        h.part(domain);
        h
    }

    fn write(&mut self, bytes: &[u8]) {
        if let Some(spill) = &mut self.spill {
            spill.update(bytes);
        } else if self.len + bytes.len() <= self.buf.len() {
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            let mut spill = Box::new(blake3::Hasher::new());
            spill.update(&self.buf[..self.len]);
            spill.update(bytes);
            self.spill = Some(spill);
        }
    }

    /// A part's length, LEB128-encoded: one byte for the short parts a key is
    /// made of, so a typical request key fits one 64-byte BLAKE3 block, and
    /// still unambiguous.
    fn prefix(&mut self, len: usize) {
        let mut len = len as u64;
        let mut out = [0u8; 10];
        let mut n = 0;
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out[n] = byte;
                n += 1;
                break;
            }
            out[n] = byte | 0x80;
            n += 1;
        }
        self.write(&out[..n]);
    }

    fn part(&mut self, bytes: &[u8]) {
        self.prefix(bytes.len());
        self.write(bytes);
    }

    /// A part written in ASCII lowercase, without allocating.
    fn part_lowercase(&mut self, bytes: &[u8]) {
        self.prefix(bytes.len());
        let mut chunk = [0u8; 64];
        for piece in bytes.chunks(chunk.len()) {
            let out = &mut chunk[..piece.len()];
            out.copy_from_slice(piece);
            out.make_ascii_lowercase();
            self.write(out);
        }
    }

    /// The query with its pairs sorted and empty pairs dropped, as one part
    /// (the same bytes `normalize_query` returns), without allocating for the
    /// usual handful of pairs.
    fn part_query(&mut self, query: &str) {
        const INLINE: usize = 16;
        let mut inline = [""; INLINE];
        let mut count = 0;
        let mut spilled = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            if count < INLINE {
                inline[count] = pair;
            } else {
                if spilled.is_empty() {
                    spilled.extend_from_slice(&inline);
                }
                spilled.push(pair);
            }
            count += 1;
        }
        let pairs: &mut [&str] = if count > INLINE {
            &mut spilled
        } else {
            &mut inline[..count]
        };
        pairs.sort_unstable();
        let len = pairs.iter().map(|p| p.len()).sum::<usize>() + pairs.len().saturating_sub(1);
        self.prefix(len);
        for (i, pair) in pairs.iter().enumerate() {
            if i > 0 {
                self.write(b"&");
            }
            self.write(pair.as_bytes());
        }
    }

    fn finish(&self) -> Key {
        let digest = match &self.spill {
            Some(spill) => spill.finalize(),
            None => blake3::hash(&self.buf[..self.len]),
        };
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest.as_bytes()[..16]);
        Key(out)
    }
}

/// The key of a request. `custom` replaces host, path and query when the route
/// supplies its own key function.
pub(crate) fn request_key(
    namespace: &str,
    parts: &Parts,
    vary: &[HeaderName],
    custom: Option<&str>,
) -> Key {
    // "h1": responses, key format 1. HEAD is answered from the GET entry and
    // nothing else reaches here, so the method adds nothing to the key.
    let mut h = KeyHasher::new(b"h1");
    h.part(namespace.as_bytes());
    match custom {
        Some(custom) => {
            h.part(b"custom");
            h.part(custom.as_bytes());
        }
        None => {
            let host = parts
                .uri
                .authority()
                .map(|a| a.as_str().as_bytes())
                .or_else(|| parts.headers.get(HOST).map(|v| v.as_bytes()))
                .unwrap_or_default();
            h.part_lowercase(host);
            h.part(parts.uri.path().as_bytes());
            h.part_query(parts.uri.query().unwrap_or(""));
        }
    }
    for name in vary {
        h.part(name.as_str().as_bytes());
        let mut values = parts.headers.get_all(name).iter().peekable();
        if values.peek().is_none() {
            // "absent" must differ from "present and empty".
            h.part(b"\x00absent");
        }
        for value in values {
            h.part(value.as_bytes());
        }
    }
    h.finish()
}

/// Sorts the query's pairs so that `?b=2&a=1` and `?a=1&b=2` share an entry, and
/// drops empty pairs (`?a=1&&`). Values keep their encoding: `%41` and `A` stay
/// different, as an origin may treat them differently. (The key hashes these
/// bytes without building the string; this is its reference form.)
#[cfg(test)]
pub(crate) fn normalize_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if pairs.len() > 1 {
        pairs.sort_unstable();
    }
    pairs.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use proptest::prelude::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::get(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn key(uri: &str, headers: &[(&str, &str)], vary: &[&str]) -> Key {
        let vary: Vec<HeaderName> = vary.iter().map(|v| v.parse().unwrap()).collect();
        request_key("ns", &parts(uri, headers), &vary, None)
    }

    #[test]
    fn query_order_does_not_change_the_key() {
        assert_eq!(key("/r?a=1&b=2", &[], &[]), key("/r?b=2&a=1&", &[], &[]));
        assert_ne!(key("/r?a=1&b=2", &[], &[]), key("/r?a=1&b=3", &[], &[]));
    }

    #[test]
    fn host_path_and_namespace_separate_keys() {
        let h = |host| key("/r", &[("host", host)], &[]);
        assert_ne!(h("a.example"), h("b.example"));
        assert_eq!(h("A.example"), h("a.example"));
        assert_ne!(key("/r", &[], &[]), key("/s", &[], &[]));
        let p = parts("/r", &[]);
        assert_ne!(
            request_key("a", &p, &[], None),
            request_key("b", &p, &[], None)
        );
    }

    #[test]
    fn vary_headers_split_entries_and_absence_is_distinct() {
        let v = |hs: &[(&str, &str)]| key("/r", hs, &["accept-language"]);
        assert_ne!(
            v(&[("accept-language", "en")]),
            v(&[("accept-language", "fr")])
        );
        assert_ne!(v(&[]), v(&[("accept-language", "")]));
        // Headers the route does not vary on do not matter.
        assert_eq!(v(&[("x-other", "1")]), v(&[("x-other", "2")]));
    }

    #[test]
    fn custom_key_replaces_the_url() {
        let p1 = parts("/a?x=1", &[]);
        let p2 = parts("/b?y=2", &[]);
        assert_eq!(
            request_key("ns", &p1, &[], Some("k")),
            request_key("ns", &p2, &[], Some("k"))
        );
    }

    #[test]
    fn value_keys_and_request_keys_never_meet() {
        let p = parts("/k", &[]);
        assert_ne!(
            Key::for_value("ns", b"/k"),
            request_key("ns", &p, &[], None)
        );
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let k = Key::for_value("ns", b"k");
        assert_eq!(Key::from_hex(&k.to_string()), Some(k));
        assert_eq!(Key::from_hex("zz"), None);
        assert_eq!(Key::from_hex(&"G".repeat(32)), None);
    }

    fn hashed_query(query: &str) -> Key {
        let mut h = KeyHasher::new(b"q");
        h.part_query(query);
        h.finish()
    }

    fn hashed_reference(query: &str) -> Key {
        let mut h = KeyHasher::new(b"q");
        h.part(normalize_query(query).as_bytes());
        h.finish()
    }

    #[test]
    fn long_inputs_spill_over_to_the_same_digest() {
        let long = "x".repeat(1000);
        let mut spilled = KeyHasher::new(b"d");
        spilled.part(long.as_bytes());
        let mut whole = blake3::Hasher::new();
        whole.update(&[1]);
        whole.update(b"d");
        whole.update(&[0xe8, 0x07]); // 1000 in LEB128
        whole.update(long.as_bytes());
        assert_eq!(&spilled.finish().0[..], &whole.finalize().as_bytes()[..16]);
    }

    proptest! {
        #[test]
        fn hashing_the_query_in_place_matches_its_reference_form(pairs in proptest::collection::vec("[a-z]{0,3}=?[a-z0-9]{0,3}", 0..40)) {
            let query = pairs.join("&");
            prop_assert_eq!(hashed_query(&query), hashed_reference(&query));
        }

        #[test]
        fn lowercasing_in_place_matches_to_ascii_lowercase(host in "[A-Za-z0-9.:-]{0,150}") {
            let mut a = KeyHasher::new(b"h");
            a.part_lowercase(host.as_bytes());
            let mut b = KeyHasher::new(b"h");
            b.part(host.to_ascii_lowercase().as_bytes());
            prop_assert_eq!(a.finish(), b.finish());
        }

        #[test]
        fn normalised_query_is_order_independent(mut pairs in proptest::collection::vec("[a-z]{1,3}=[a-z0-9]{0,3}", 0..8)) {
            let a = normalize_query(&pairs.join("&"));
            pairs.reverse();
            let b = normalize_query(&pairs.join("&"));
            prop_assert_eq!(a, b);
        }

        #[test]
        fn length_prefixes_keep_parts_apart(a in "[a-z]{0,6}", b in "[a-z]{0,6}") {
            // Moving a byte from the namespace into the key must change the digest.
            let moved = format!("{a}x");
            prop_assert_ne!(Key::for_value(&moved, b.as_bytes()), Key::for_value(&a, format!("x{b}").as_bytes()));
        }
    }
}
