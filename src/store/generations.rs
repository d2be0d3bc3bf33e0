//! Names of the fleet's invalidation generations: one for everything, and,
//! for each namespace, one for the whole namespace and one per tag bucket.
//!
//! A namespace is a service's whole cache world: its tags and its
//! "everything" are its own ([`Scope`]), so a purge made through one
//! namespace's guard or cache never moves a generation another namespace's
//! entries recorded. The one generation above them all, [`Field::All`], is
//! moved only when Redis went back in time (a restore older than a purge)
//! and by instances of versions that knew no namespaces.
//!
//! A tag is hashed (FNV-1a, fixed for every process and version) into one
//! of [`BUCKETS`] buckets of its namespace, and each bucket has one
//! generation. Invalidating a tag moves its bucket's generation; an entry
//! that recorded an older one is a miss. Two tags of one namespace that
//! share a bucket invalidate each other's entries too: more misses, never a
//! stale answer. Bounding the table this way keeps it the same small size
//! however many distinct tags a service invents, so an instance reloads all
//! of it in one read.

/// Tag buckets of one namespace. Every instance of a fleet must agree on it.
pub(crate) const BUCKETS: u16 = 4096;

/// A namespace, as the generations name it: a digest of its name (FNV-1a,
/// fixed for every process and version), never 0, which stands for the
/// empty namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Scope(u64);

impl Scope {
    /// The empty namespace (a guard or cache given none).
    pub(crate) const ROOT: Scope = Scope(0);

    /// The scope of `namespace`.
    pub(crate) fn of(namespace: &str) -> Scope {
        if namespace.is_empty() {
            return Scope::ROOT;
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in namespace.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        Scope(hash.max(1))
    }

    /// Its digest, as entries record it.
    pub(crate) fn id(self) -> u64 {
        self.0
    }

    /// The scope an entry recorded (any number: one no namespace of this
    /// process has is served by none).
    pub(crate) fn from_id(id: u64) -> Scope {
        Scope(id)
    }

    /// The prefix of its fields' names: none for the empty namespace (its
    /// buckets keep the names every version knows), `s<16 hex digits>.`
    /// for any other.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn prefix(self) -> String {
        match self {
            Scope::ROOT => String::new(),
            Scope(id) => format!("s{id:016x}."),
        }
    }
}

/// One generation of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    /// Moved when every entry of every namespace is void (see the module).
    All,
    /// Moved by an invalidation of a whole namespace.
    Own(Scope),
    /// Moved by an invalidation of any tag of the namespace's bucket.
    Bucket(Scope, u16),
}

impl Field {
    /// The bucket of `tag` in `scope`.
    pub(crate) fn of_tag(scope: Scope, tag: &str) -> Field {
        Field::Bucket(scope, bucket_of(tag))
    }

    /// Its name in the shared tier's hash and messages: `all`; `n.all` and
    /// `b<n>` for the empty namespace; `s<hex>.all` and `s<hex>.b<n>` for
    /// another. Versions that knew no namespaces read only `all` and
    /// `b<n>`, and ignore the others.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn name(self) -> String {
        match self {
            Field::All => "all".to_owned(),
            Field::Own(Scope::ROOT) => "n.all".to_owned(),
            Field::Own(scope) => format!("{}all", scope.prefix()),
            Field::Bucket(scope, b) => format!("{}b{b}", scope.prefix()),
        }
    }

    /// The field a name written by [`name`](Self::name) stands for; `None`
    /// for anything else (a foreign field is ignored).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parse(name: &[u8]) -> Option<Field> {
        match name {
            b"all" => return Some(Field::All),
            b"n.all" => return Some(Field::Own(Scope::ROOT)),
            _ => {}
        }
        let (scope, rest) = match name.strip_prefix(b"s") {
            Some(rest) => {
                let (hex, rest) = (rest.get(..16)?, rest.get(16..)?);
                let rest = rest.strip_prefix(b".")?;
                if !hex.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                    return None;
                }
                let id = u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                if id == 0 {
                    return None;
                }
                if rest == b"all" {
                    return Some(Field::Own(Scope(id)));
                }
                (Scope(id), rest)
            }
            None => (Scope::ROOT, name),
        };
        let digits = rest.strip_prefix(b"b")?;
        if digits.is_empty() || digits.len() > 4 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let bucket: u16 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        (bucket < BUCKETS).then_some(Field::Bucket(scope, bucket))
    }
}

/// The bucket of `tag`, the same in every namespace.
pub(crate) fn bucket_of(tag: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in tag.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(BUCKETS)) as u16
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
        let shop = Scope::of("shop");
        for field in [
            Field::All,
            Field::Own(Scope::ROOT),
            Field::Own(shop),
            Field::Bucket(Scope::ROOT, 0),
            Field::Bucket(Scope::ROOT, BUCKETS - 1),
            Field::Bucket(shop, 17),
        ] {
            assert_eq!(Field::parse(field.name().as_bytes()), Some(field));
        }
        assert_eq!(
            Field::Bucket(Scope::ROOT, 17).name(),
            "b17",
            "the names every version knows"
        );
        for foreign in [
            &b"b"[..],
            b"b4096",
            b"b-1",
            b"b00001",
            b"x1",
            b"",
            b"ball",
            b"s0000000000000000.all",
            b"s00000000000000ab",
            b"s00000000000000ab.",
            b"s00000000000000AB.b1",
            b"s00000000000000ab.b4096",
            b"s00000000000000ab:b1",
            b"s00000000000000ab.s00000000000000ab.b1",
        ] {
            assert_eq!(Field::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn a_tag_always_lands_in_the_same_bucket() {
        // Fixed across processes and versions: instances compare buckets.
        let root = Scope::ROOT;
        assert_eq!(
            Field::of_tag(root, "product:42"),
            Field::of_tag(root, "product:42")
        );
        assert_eq!(
            Field::of_tag(root, ""),
            Field::Bucket(root, (0xcbf2_9ce4_8422_2325u64 % 4096) as u16)
        );
        assert_eq!(Scope::of(""), Scope::ROOT);
        assert_ne!(Scope::of("shop"), Scope::of("blog"));
        assert_ne!(Scope::of("shop"), Scope::ROOT);
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
