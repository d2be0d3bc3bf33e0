//! A response's `Vary` against the key it would be stored under, and the
//! variants of a URL learned from it (RFC 9111 §4.1).
//!
//! A header the route keys on (its `vary` list, and `Accept-Encoding` once
//! learned: `LearnedEncoding`) selects a variant by the key alone. Any other
//! header a response's `Vary` nominates is learned from the response, per
//! URL: the entry keeps its `Vary` and a digest of the nominated values of
//! the request that made it ([`SELECTED`]), and is served only to a request
//! whose nominated values give the same digest. Both live in the entry, so
//! every instance of a fleet reads them from the shared tier with it.
//!
//! Where a URL's variants are kept: the URL's own key holds one (the last
//! one a request for the URL stored there); a request it does not match
//! goes to one of [`SLOTS`] variant keys of the URL, picked by its digest,
//! whose entry is checked the same way; a request that matches neither (its
//! slot holds another variant) gets its answer from a flight of its own
//! variant, shared with the requests of that variant, and not stored. So a
//! URL holds at most `1 + SLOTS` entries however many values clients send,
//! and each variant costs one origin call per flight, never one per request.

use http::header::{ACCEPT_ENCODING, VARY};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::key::Keyed;
use crate::key::{Key, KeyHasher};

/// The header an entry keeps the digest of its request's nominated values
/// in. Written only by the layer (an origin's own is dropped before it is
/// stored), and never presented.
pub(crate) static SELECTED: HeaderName = HeaderName::from_static("stampede-guard-selected");

/// Variant keys per URL besides the URL's own: the bound on how many
/// variants of one URL are stored.
pub(crate) const SLOTS: u64 = 64;

/// The most headers a learned `Vary` may nominate (beyond those the key
/// covers) for the response to be stored.
pub(crate) const MAX_NOMINATED: usize = 8;

/// What a response's `Vary` asks of the cache beyond the key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Nominated {
    /// Nothing: every header it names is part of the key.
    Covered,
    /// These headers (lowercase, sorted, each once) select the variant:
    /// learned from the response.
    Learned(Vec<HeaderName>),
    /// `*`, a name that is not a header name, or more than
    /// [`MAX_NOMINATED`] headers: never matched, not stored.
    Never,
}

/// The headers `headers`' `Vary` nominates that the key (`vary`, and
/// `Accept-Encoding` as `keyed` says) does not cover.
pub(crate) fn nominated(headers: &HeaderMap, vary: &[HeaderName], keyed: Keyed) -> Nominated {
    let mut learned: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(VARY) {
        let Ok(value) = value.to_str() else {
            return Nominated::Never;
        };
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return Nominated::Never;
            }
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                return Nominated::Never;
            };
            let covered = if name == ACCEPT_ENCODING {
                keyed.accept_encoding
            } else {
                vary.contains(&name)
            };
            if !covered && !learned.contains(&name) {
                learned.push(name);
            }
        }
    }
    if learned.is_empty() {
        return Nominated::Covered;
    }
    if learned.len() > MAX_NOMINATED {
        return Nominated::Never;
    }
    learned.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Nominated::Learned(learned)
}

/// Whether the response's `Vary` names `header`.
pub(crate) fn names_in_vary(headers: &HeaderMap, header: &HeaderName) -> bool {
    headers
        .get_all(VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|name| name.trim().eq_ignore_ascii_case(header.as_str()))
}

/// The digest of a request's values of `names` (sorted): for each, whether
/// it is present, and its lines combined into one list with the whitespace
/// around its members removed (RFC 9111 §4.1: `1, 2`, `1,2` and two lines
/// `1` and `2` are one value). Absent differs from empty.
pub(crate) fn selection(request: &HeaderMap, names: &[HeaderName]) -> Key {
    let mut h = KeyHasher::new(b"sel1");
    for name in names {
        h.part(name.as_str().as_bytes());
        let mut lines = request.get_all(name).iter().peekable();
        if lines.peek().is_none() {
            h.part(b"\x00absent");
            continue;
        }
        let mut combined = Vec::new();
        for line in lines {
            for member in line.as_bytes().split(|b| *b == b',') {
                if !combined.is_empty() {
                    combined.push(b',');
                }
                combined.extend_from_slice(member.trim_ascii());
            }
        }
        h.part(&combined);
    }
    h.finish()
}

/// Whether an entry with `stored` headers may answer a request with
/// `request` headers under a key made with `vary` and `keyed`: it varies on
/// nothing the key does not cover, or it was made by a request with the
/// same nominated values.
pub(crate) fn selects(
    stored: &HeaderMap,
    request: &HeaderMap,
    vary: &[HeaderName],
    keyed: Keyed,
) -> bool {
    // Most entries vary on nothing: one lookup.
    if !stored.contains_key(VARY) {
        return true;
    }
    match nominated(stored, vary, keyed) {
        Nominated::Covered => true,
        Nominated::Never => false,
        Nominated::Learned(names) => stored.get(&SELECTED).is_some_and(|digest| {
            digest.as_bytes() == selection(request, &names).to_string().as_bytes()
        }),
    }
}

/// Stamps an entry about to be stored with the digest of its request's
/// values of the headers it nominates (and drops any the origin sent);
/// `false` when it nominates headers it cannot be selected by.
pub(crate) fn stamp(
    stored: &mut HeaderMap,
    request: &HeaderMap,
    vary: &[HeaderName],
    keyed: Keyed,
) -> bool {
    stored.remove(&SELECTED);
    match nominated(stored, vary, keyed) {
        Nominated::Covered => true,
        Nominated::Never => false,
        Nominated::Learned(names) => {
            let digest = selection(request, &names).to_string();
            match HeaderValue::from_str(&digest) {
                Ok(value) => {
                    stored.insert(SELECTED.clone(), value);
                    true
                }
                Err(_) => false,
            }
        }
    }
}

/// Where a request that the URL's own entry does not select looks next:
/// the slot of its variant among the URL's [`SLOTS`] (`exact` false), or
/// its variant's own key (`exact`), whose answers are never stored.
pub(crate) fn variant_slot(primary: &Key, names: &[HeaderName], digest: &Key, exact: bool) -> Key {
    let mut h = KeyHasher::new(b"h3slot");
    h.part(primary.as_bytes());
    h.count(names.len());
    for name in names {
        h.part(name.as_str().as_bytes());
    }
    if exact {
        h.part(b"\x00exact");
        h.part(digest.as_bytes());
    } else {
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.as_bytes()[..8]);
        h.count((u64::from_le_bytes(first) % SLOTS) as usize);
    }
    h.finish_in(&primary.group())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    const PLAIN: Keyed = Keyed {
        accept_encoding: false,
    };

    #[test]
    fn nominated_headers_are_learned_sorted_and_once() {
        let n = nominated(&map(&[("vary", "Foo, bar"), ("vary", "FOO")]), &[], PLAIN);
        assert_eq!(
            n,
            Nominated::Learned(vec![
                HeaderName::from_static("bar"),
                HeaderName::from_static("foo")
            ])
        );
        let listed = [HeaderName::from_static("foo")];
        let n = nominated(&map(&[("vary", "foo")]), &listed, PLAIN);
        assert_eq!(n, Nominated::Covered);
        for never in ["*", "foo, *", "*, *", "foo, b@d"] {
            assert_eq!(
                nominated(&map(&[("vary", never)]), &[], PLAIN),
                Nominated::Never,
                "{never}"
            );
        }
        let n = nominated(&map(&[("vary", ""), ("vary", "*")]), &[], PLAIN);
        assert_eq!(n, Nominated::Never);
        let many = "a, b, c, d, e, f, g, h, i";
        assert_eq!(
            nominated(&map(&[("vary", many)]), &[], PLAIN),
            Nominated::Never
        );
        assert_eq!(
            nominated(&map(&[("vary", "")]), &[], PLAIN),
            Nominated::Covered
        );
    }

    #[test]
    fn values_match_across_lines_and_whitespace() {
        let names = [HeaderName::from_static("foo")];
        let one = selection(&map(&[("foo", "1, 2")]), &names);
        assert_eq!(one, selection(&map(&[("foo", "1"), ("foo", "2")]), &names));
        assert_eq!(one, selection(&map(&[("foo", " 1,2 ")]), &names));
        assert_ne!(one, selection(&map(&[("foo", "2, 1")]), &names));
        assert_ne!(
            selection(&map(&[]), &names),
            selection(&map(&[("foo", "")]), &names)
        );
    }

    #[test]
    fn a_stamped_entry_selects_only_its_own_values() {
        let mut stored = map(&[("vary", "Foo")]);
        assert!(stamp(&mut stored, &map(&[("foo", "1")]), &[], PLAIN));
        assert!(selects(&stored, &map(&[("foo", "1")]), &[], PLAIN));
        assert!(!selects(&stored, &map(&[("foo", "2")]), &[], PLAIN));
        assert!(!selects(&stored, &map(&[]), &[], PLAIN));
        // Without a stamp (an origin's own, dropped), nothing.
        let mut forged = map(&[("vary", "Foo")]);
        forged.insert(SELECTED.clone(), HeaderValue::from_static("x"));
        assert!(!selects(&forged, &map(&[("foo", "1")]), &[], PLAIN));
        let mut star = map(&[("vary", "*")]);
        assert!(!stamp(&mut star, &map(&[]), &[], PLAIN));
        assert!(!selects(&star, &map(&[]), &[], PLAIN));
        assert!(selects(&map(&[]), &map(&[("foo", "1")]), &[], PLAIN));
    }
}
