//! The cache key: a 128-bit BLAKE3 digest of the parts that select a value.
//!
//! Every part is written with its length first, so no two different inputs
//! can run together into the same bytes. A cryptographic hash keeps an
//! attacker who controls part of the input (a query string) from forging a
//! collision with another page. What the parts are is the caller's business:
//! `http::key` builds request keys, [`Key::for_value`] the generic cache's.

use std::fmt;

/// A fixed-length cache key.
///
/// A key belongs to a *group*: the entries an invalidation drops together.
/// A response's group is its URL, and the key is one variant of it (RFC 9111
/// §4.1: the values of the headers it varies on); a generic cache value is
/// its own group. Two keys are equal when their digests are: the digest
/// already covers the group.
///
/// ```
/// use http::Request;
/// use stampede_guard::{Backend, Key, StampedeGuard};
///
/// let guard = StampedeGuard::new(Backend::local());
/// let request = Request::get("/report").header("host", "api.example.com").body(()).unwrap();
/// let key = guard.key_for(&request).unwrap();
/// assert_eq!(Key::from_hex(&key.to_string()).unwrap(), key);
/// ```
#[derive(Clone, Copy)]
pub struct Key {
    id: [u8; 16],
    group: [u8; 16],
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // One write of the fixed-size digest: no length prefix to hash.
        state.write(&self.id);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.id.cmp(&other.id)
    }
}

impl Key {
    /// The key of an application value for the generic [`Cache`](crate::Cache).
    pub(crate) fn for_value(namespace: &str, key: &[u8]) -> Key {
        let mut h = KeyHasher::new(b"v1");
        h.part(namespace.as_bytes());
        h.part(key);
        h.finish()
    }

    /// The raw digest.
    ///
    /// ```
    /// let key = stampede_guard::Key::from_hex("000102030405060708090a0b0c0d0e0f").unwrap();
    /// assert_eq!(key.as_bytes()[15], 0x0f);
    /// ```
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.id
    }

    /// The key of this key's group: for a response, its URL, shared by
    /// every variant; for a generic cache value, the key itself.
    ///
    /// ```
    /// use http::Request;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local()).vary([http::header::ACCEPT_LANGUAGE]);
    /// let en = Request::get("/report").header("host", "h").header("accept-language", "en").body(()).unwrap();
    /// let fr = Request::get("/report").header("host", "h").header("accept-language", "fr").body(()).unwrap();
    /// let (en, fr) = (guard.key_for(&en).unwrap(), guard.key_for(&fr).unwrap());
    /// assert_ne!(en, fr);
    /// assert_eq!(en.group(), fr.group());
    /// ```
    #[must_use]
    pub fn group(&self) -> Key {
        Key {
            id: self.group,
            group: self.group,
        }
    }

    /// Whether the key is its own group (nothing else shares it).
    pub(crate) fn is_group(&self) -> bool {
        self.id == self.group
    }

    /// Whether the key belongs to `group`.
    pub(crate) fn in_group(&self, group: &Key) -> bool {
        self.group == group.id
    }

    /// Parses the 32 lowercase hex digits that `Display` writes. The key is
    /// its own group (the digits do not say which group a variant is of).
    ///
    /// ```
    /// use stampede_guard::Key;
    ///
    /// let key = Key::from_hex("000102030405060708090a0b0c0d0e0f").unwrap();
    /// assert_eq!(key.to_string(), "000102030405060708090a0b0c0d0e0f");
    /// assert!(Key::from_hex("not hex").is_none());
    /// ```
    #[must_use]
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
        Some(Key {
            id: out,
            group: out,
        })
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// The most characters of a caller's purge shown in a log line.
pub(crate) const SHOWN_MAX: usize = 200;

/// What a caller purged (a URL, a tag, a cache key as given), as a log line
/// shows it: control characters and quotes escaped (a value from a request
/// cannot forge a line or a field), and at most [`SHOWN_MAX`] characters,
/// cut at a character boundary and marked with `…`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn shown(what: &str) -> std::sync::Arc<str> {
    let mut out = String::with_capacity(what.len().min(SHOWN_MAX + 8));
    for (n, c) in what.chars().enumerate() {
        if n == SHOWN_MAX {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out.into()
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.id {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Feeds the key's parts to BLAKE3. Requests keys are short, so the parts are
/// gathered in a stack buffer and hashed in one call, which is much cheaper
/// than many small updates; a longer input spills over into the incremental
/// hasher (same digest either way).
pub(crate) struct KeyHasher {
    buf: [u8; 256],
    len: usize,
    // Boxed: the incremental hasher is almost 2 KiB, and carrying it inline
    // made every key cost a 2 KiB copy.
    spill: Option<Box<blake3::Hasher>>,
}

impl KeyHasher {
    pub(crate) fn new(domain: &[u8]) -> Self {
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

    pub(crate) fn part(&mut self, bytes: &[u8]) {
        self.prefix(bytes.len());
        self.write(bytes);
    }

    /// A count (of the parts that follow), as a part of its own.
    pub(crate) fn count(&mut self, n: usize) {
        self.part(&u64::try_from(n).unwrap_or(u64::MAX).to_le_bytes());
    }

    /// A part written in ASCII lowercase, without allocating.
    pub(crate) fn part_lowercase(&mut self, bytes: &[u8]) {
        self.prefix(bytes.len());
        // Hosts usually arrive in lowercase already.
        if !bytes.iter().any(u8::is_ascii_uppercase) {
            self.write(bytes);
            return;
        }
        let mut chunk = [0u8; 64];
        for piece in bytes.chunks(chunk.len()) {
            let out = &mut chunk[..piece.len()];
            out.copy_from_slice(piece);
            out.make_ascii_lowercase();
            self.write(out);
        }
    }

    /// The query with its pairs sorted by name (stably: repeated names keep
    /// their order; not at all when [`names_are_sortable`] says no) and empty
    /// pairs dropped, as one part
    /// (the same bytes `normalize_query` returns), without allocating for the
    /// usual handful of pairs.
    pub(crate) fn part_query(&mut self, query: &str) {
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
        // Stable: `?s=b&s=a` and `?s=a&s=b` may be different lists to the
        // origin, so only the names are ordered.
        if pairs.len() > 1 && names_are_sortable(pairs) {
            pairs.sort_by(|a, b| cmp_query_names(a, b));
        }
        let len = pairs.iter().map(|p| p.len()).sum::<usize>() + pairs.len().saturating_sub(1);
        self.prefix(len);
        for (i, pair) in pairs.iter().enumerate() {
            if i > 0 {
                self.write(b"&");
            }
            self.write(pair.as_bytes());
        }
    }

    /// The key of the parts written, its own group.
    pub(crate) fn finish(&self) -> Key {
        let id = self.digest();
        Key { id, group: id }
    }

    /// The key of the parts written, as a member of `group`.
    pub(crate) fn finish_in(&self, group: &Key) -> Key {
        Key {
            id: self.digest(),
            group: group.id,
        }
    }

    fn digest(&self) -> [u8; 16] {
        let digest = match &self.spill {
            Some(spill) => spill.finalize(),
            None => blake3::hash(&self.buf[..self.len]),
        };
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest.as_bytes()[..16]);
        out
    }
}

/// The name of a query pair: the bytes before its first `=`.
pub(crate) fn query_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name)
}

/// Whether a query's pairs may be sorted by name. Sorting may only ever
/// reorder pairs whose names no origin reads as one name; where the key
/// cannot tell, the query keeps the order it was sent in:
///
/// - a pair with a `;`: some origins (older Python `parse_qs`, Perl's
///   `CGI.pm`) split pairs at `;` too, so the names a sort would order are
///   not the names they read;
/// - a name whose percent-decoded form holds a byte outside printable ASCII
///   (a lossy parser reads each invalid UTF-8 sequence as U+FFFD, so `%FF`
///   and `%FE` are one name to it; other letters may be case-folded in ways
///   this order cannot follow, `%C3%84` and `%C3%A4`, or U+212A, which
///   lowercases to `k`; PHP ends a name at NUL), or a `.`, `[`, `]` or `%`
///   (PHP reads `a.b` and `a[b` as `a_b`, `qs` and Rails read `a.b` and
///   `a[b]` as members of `a`, a second decoding reads `%2561` as `a`).
pub(crate) fn names_are_sortable(pairs: &[&str]) -> bool {
    pairs.iter().all(|pair| {
        !pair.contains(';')
            && decoded(query_name(pair)).all(|b| {
                (b.is_ascii_graphic() || b == b' ') && !matches!(b, b'.' | b'[' | b']' | b'%')
            })
    })
}

/// Orders query pairs by name as an origin might read it: percent-decoded,
/// ASCII case folded, `+`, space and `_` alike (`+` is a space to form
/// decoding, a plus sign to plain percent-decoding; PHP reads a space as
/// `_`), leading spaces, `+` and `_` dropped (PHP drops leading spaces).
/// Names that some origin could take for the same one (`a`, `%61`, `A`;
/// `a+b`, `a%20b`, `a%2Bb`, `a_b`, `%20a_b`) compare equal, so the stable
/// sort keeps their pairs in the order the client sent them.
pub(crate) fn cmp_query_names(a: &str, b: &str) -> std::cmp::Ordering {
    name_skeleton(query_name(a)).cmp(name_skeleton(query_name(b)))
}

fn name_skeleton(name: &str) -> impl Iterator<Item = u8> + '_ {
    decoded(name)
        .map(|byte| match byte {
            b'+' | b' ' => b'_',
            other => other.to_ascii_lowercase(),
        })
        .skip_while(|b| *b == b'_')
}

/// A name's bytes, percent-decoded once (a `%` not followed by two hex
/// digits is itself).
fn decoded(name: &str) -> impl Iterator<Item = u8> + '_ {
    let bytes = name.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let byte = *bytes.get(i)?;
        i += 1;
        let hex = |b: u8| (b as char).to_digit(16);
        Some(match byte {
            b'%' => match (
                bytes.get(i).and_then(|b| hex(*b)),
                bytes.get(i + 1).and_then(|b| hex(*b)),
            ) {
                (Some(hi), Some(lo)) => {
                    i += 2;
                    (hi * 16 + lo) as u8
                }
                _ => b'%',
            },
            other => other,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let k = Key::for_value("ns", b"k");
        assert_eq!(Key::from_hex(&k.to_string()), Some(k));
        assert_eq!(Key::from_hex("zz"), None);
        assert_eq!(Key::from_hex(&"G".repeat(32)), None);
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
        assert_eq!(&spilled.finish().id[..], &whole.finalize().as_bytes()[..16]);
    }

    proptest! {
        #[test]
        fn lowercasing_in_place_matches_to_ascii_lowercase(host in "[A-Za-z0-9.:-]{0,150}") {
            let mut a = KeyHasher::new(b"h");
            a.part_lowercase(host.as_bytes());
            let mut b = KeyHasher::new(b"h");
            b.part(host.to_ascii_lowercase().as_bytes());
            prop_assert_eq!(a.finish(), b.finish());
        }

        #[test]
        fn length_prefixes_keep_parts_apart(a in "[a-z]{0,6}", b in "[a-z]{0,6}") {
            // Moving a byte from the namespace into the key must change the digest.
            let moved = format!("{a}x");
            prop_assert_ne!(Key::for_value(&moved, b.as_bytes()), Key::for_value(&a, format!("x{b}").as_bytes()));
        }
    }
}
