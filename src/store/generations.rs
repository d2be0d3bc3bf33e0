//! Names of the fleet's invalidation generations: one for everything, and
//! one per tag bucket.
//!
//! A tag is hashed (FNV-1a, fixed for every process and version) into one
//! of [`BUCKETS`] buckets, and each bucket has one generation. Invalidating
//! a tag moves its bucket's generation; an entry that recorded an older one
//! is a miss. Two tags that share a bucket invalidate each other's entries
//! too: more misses, never a stale answer. Bounding the table this way keeps
//! it the same small size however many distinct tags a service invents, so
//! an instance reloads all of it in one read.

/// Tag buckets. Every instance of a fleet must agree on it.
pub(crate) const BUCKETS: u16 = 4096;

/// One generation of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    /// Moved by an invalidation of everything.
    All,
    /// Moved by an invalidation of any tag of the bucket.
    Bucket(u16),
}

impl Field {
    /// The bucket of `tag`.
    pub(crate) fn of_tag(tag: &str) -> Field {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in tag.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        Field::Bucket((hash % u64::from(BUCKETS)) as u16)
    }

    /// Its name in the shared tier's hash and messages.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn name(self) -> String {
        match self {
            Field::All => "all".to_owned(),
            Field::Bucket(b) => format!("b{b}"),
        }
    }

    /// The field a name written by [`name`](Self::name) stands for; `None`
    /// for anything else (a foreign field is ignored).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parse(name: &[u8]) -> Option<Field> {
        if name == b"all" {
            return Some(Field::All);
        }
        let digits = name.strip_prefix(b"b")?;
        if digits.is_empty() || digits.len() > 4 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let bucket: u16 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        (bucket < BUCKETS).then_some(Field::Bucket(bucket))
    }
}

/// A generation as the shared tier's scripts write it: plain decimal
/// digits below 2^53. Anything else is foreign (`None`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn parse_generation(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 16 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    (n < 1 << 53).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_foreign_ones_are_refused() {
        for field in [Field::All, Field::Bucket(0), Field::Bucket(BUCKETS - 1)] {
            assert_eq!(Field::parse(field.name().as_bytes()), Some(field));
        }
        for foreign in [&b"b"[..], b"b4096", b"b-1", b"b00001", b"x1", b"", b"ball"] {
            assert_eq!(Field::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn a_tag_always_lands_in_the_same_bucket() {
        // Fixed across processes and versions: instances compare buckets.
        assert_eq!(Field::of_tag("product:42"), Field::of_tag("product:42"));
        assert_eq!(
            Field::of_tag(""),
            Field::Bucket((0xcbf2_9ce4_8422_2325u64 % 4096) as u16)
        );
    }

    #[test]
    fn generations_are_plain_numbers_below_2_53() {
        assert_eq!(
            parse_generation(b"1732270000000000"),
            Some(1_732_270_000_000_000)
        );
        for foreign in [
            &b""[..],
            b"-1",
            b"1e9",
            b"12345678901234567",
            b"9007199254740992",
            b" 1",
        ] {
            assert_eq!(parse_generation(foreign), None);
        }
    }
}
