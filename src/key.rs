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
        let mut h = KeyHasher::new(b"value");
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

struct KeyHasher(blake3::Hasher);

impl KeyHasher {
    fn new(domain: &[u8]) -> Self {
        let mut h = KeyHasher(blake3::Hasher::new());
        h.part(domain);
        h
    }

    fn part(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    fn finish(&self) -> Key {
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.0.finalize().as_bytes()[..16]);
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
    let mut h = KeyHasher::new(b"http");
    h.part(namespace.as_bytes());
    // HEAD is answered from the GET entry; everything else that reaches here is GET.
    h.part(b"GET");
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
            h.part(&host.to_ascii_lowercase());
            h.part(parts.uri.path().as_bytes());
            let query = normalize_query(parts.uri.query().unwrap_or(""));
            h.part(query.as_bytes());
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
/// different, as an origin may treat them differently.
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

    proptest! {
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
