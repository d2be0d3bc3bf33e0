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
//!
//! An entry's `Content-Encoding` selects the same way, as an implied `Vary`
//! on whether the request accepts each of its codings (coding.rs), even on
//! a route that ignores `Vary`: a coded body reaches only requests that
//! accept, refuse or leave unstated its codings as its maker's did.

use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, VARY};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::coding::{acceptance, accepts_identity, codings};
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

/// What a route's key covers of a response's `Vary`: its `vary` list,
/// `Accept-Encoding` as `keyed` says, or all of it (`ignore_vary`).
#[derive(Clone, Copy)]
pub(crate) struct Covers<'a> {
    pub vary: &'a [HeaderName],
    pub keyed: Keyed,
    pub ignore_vary: bool,
}

/// What selects an entry beyond its key: the headers its `Vary` nominates
/// that the key does not cover, and its content codings (coding.rs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Selector {
    names: Vec<HeaderName>,
    /// Empty for an unencoded body (identity).
    codings: Vec<String>,
}

impl Selector {
    /// Nothing but identity: an entry any request that accepts an
    /// unencoded body may have, with no digest.
    fn plain(&self) -> bool {
        self.names.is_empty() && self.codings.is_empty()
    }
}

/// What selects an entry with `stored` headers, or `None` when nothing
/// can (`Vary: *` and its kin, too many codings).
pub(crate) fn selector(stored: &HeaderMap, covers: Covers<'_>) -> Option<Selector> {
    let names = match covers.ignore_vary {
        true => Vec::new(),
        false => match nominated(stored, covers.vary, covers.keyed) {
            Nominated::Covered => Vec::new(),
            Nominated::Learned(names) => names,
            Nominated::Never => return None,
        },
    };
    let codings = codings(stored)?;
    Some(Selector { names, codings })
}

/// The digest of a request's values of what `selector` names: for each
/// header, whether it is present, and its lines combined into one list
/// with the whitespace around its members removed (RFC 9111 §4.1: `1, 2`,
/// `1,2` and two lines `1` and `2` are one value; absent differs from
/// empty; a comma inside a quoted string or a comment separates nothing,
/// so `"a,b"` and `"a, b"` stay two values); then, for each coding (identity for none), whether the request
/// accepts it, refuses it or says nothing.
pub(crate) fn selection(request: &HeaderMap, selector: &Selector) -> Key {
    let mut h = KeyHasher::new(b"sel2");
    for name in &selector.names {
        h.part(name.as_str().as_bytes());
        let mut lines = request.get_all(name).iter().peekable();
        if lines.peek().is_none() {
            h.part(b"\x00absent");
            continue;
        }
        let mut combined = Vec::new();
        for line in lines {
            for member in list_members(line.as_bytes()) {
                if !combined.is_empty() {
                    combined.push(b',');
                }
                combined.extend_from_slice(member.trim_ascii());
            }
        }
        h.part(&combined);
    }
    h.part(b"\x00codings");
    let identity = ["identity".to_owned()];
    let codings = match selector.codings.is_empty() {
        true => &identity[..],
        false => &selector.codings[..],
    };
    for coding in codings {
        h.part(coding.as_bytes());
        h.part(&[acceptance(request, coding).byte()]);
    }
    h.finish()
}

/// A field line's list members: split at the commas outside quoted strings
/// and comments (RFC 9110 §5.6: `"a,b"` and `(a, b)` are one member, their
/// bytes kept whole, `\` escaping the next byte in either), so only the
/// whitespace around list commas is ever dropped. An unclosed quote or
/// comment runs to the end of the line.
fn list_members(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let line = rest?;
        let (mut quoted, mut depth, mut escaped) = (false, 0usize, false);
        for (i, &b) in line.iter().enumerate() {
            if escaped {
                escaped = false;
                continue;
            }
            match b {
                b'\\' if quoted || depth > 0 => escaped = true,
                b'"' if depth == 0 => quoted = !quoted,
                b'(' if !quoted => depth = depth.saturating_add(1),
                b')' if !quoted => depth = depth.saturating_sub(1),
                b',' if !quoted && depth == 0 => {
                    rest = Some(&line[i + 1..]);
                    return Some(&line[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(line)
    })
}

/// Whether an entry with `stored` headers may answer a request with
/// `request` headers under a key that `covers` what it covers: it varies
/// on nothing the key does not cover and is unencoded, and the request
/// accepts an unencoded body; or it carries the digest of a request that
/// is the same as this one in everything its selector names.
pub(crate) fn selects(stored: &HeaderMap, request: &HeaderMap, covers: Covers<'_>) -> bool {
    let digest = stored.get(&SELECTED);
    // Most entries vary on nothing and are unencoded: three lookups.
    if digest.is_none() && !stored.contains_key(VARY) && !stored.contains_key(CONTENT_ENCODING) {
        return accepts_identity(request);
    }
    let Some(selector) = selector(stored, covers) else {
        return false;
    };
    match digest {
        Some(digest) => digest.as_bytes() == selection(request, &selector).to_string().as_bytes(),
        // Without a stamp (an origin's own is dropped), only a plain one.
        None => selector.plain() && accepts_identity(request),
    }
}

/// Stamps an entry about to be stored with the digest of its request's
/// values of what selects it (and drops any the origin sent); an entry a
/// plain request made (nothing learned, unencoded) needs none. `false`
/// when nothing can select it.
pub(crate) fn stamp(stored: &mut HeaderMap, request: &HeaderMap, covers: Covers<'_>) -> bool {
    stored.remove(&SELECTED);
    let Some(selector) = selector(stored, covers) else {
        return false;
    };
    if selector.plain() && accepts_identity(request) {
        return true;
    }
    let digest = selection(request, &selector).to_string();
    match HeaderValue::from_str(&digest) {
        Ok(value) => {
            stored.insert(SELECTED.clone(), value);
            true
        }
        Err(_) => false,
    }
}

/// Where a request that the URL's own entry does not select looks next:
/// the slot of its variant among the URL's [`SLOTS`] (`exact` false), or
/// its variant's own key (`exact`), whose answers are never stored.
pub(crate) fn variant_slot(primary: &Key, selector: &Selector, digest: &Key, exact: bool) -> Key {
    let mut h = KeyHasher::new(b"h3slot");
    h.part(primary.as_bytes());
    h.count(selector.names.len());
    for name in &selector.names {
        h.part(name.as_str().as_bytes());
    }
    h.count(selector.codings.len());
    for coding in &selector.codings {
        h.part(coding.as_bytes());
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

    const COVERS: Covers<'static> = Covers {
        vary: &[],
        keyed: PLAIN,
        ignore_vary: false,
    };

    fn foo_selector() -> Selector {
        Selector {
            names: vec![HeaderName::from_static("foo")],
            codings: Vec::new(),
        }
    }

    #[test]
    fn values_match_across_lines_and_whitespace() {
        let names = foo_selector();
        let one = selection(&map(&[("foo", "1, 2")]), &names);
        assert_eq!(one, selection(&map(&[("foo", "1"), ("foo", "2")]), &names));
        assert_eq!(one, selection(&map(&[("foo", " 1,2 ")]), &names));
        assert_ne!(one, selection(&map(&[("foo", "2, 1")]), &names));
        // Inside a quoted string or a comment, every byte counts.
        for (a, b) in [
            ("\"a,b\"", "\"a, b\""),
            ("\"a,b\"", "\"a\",\"b\""),
            ("\"a\\\",b\"", "\"a\\\", b\""),
            ("(a,b)", "(a, b)"),
            ("x (a (b,c))", "x (a (b, c))"),
            ("\"a,b", "\"a, b"),
        ] {
            assert_ne!(
                selection(&map(&[("foo", a)]), &names),
                selection(&map(&[("foo", b)]), &names),
                "{a} / {b}"
            );
        }
        assert_eq!(
            selection(&map(&[("foo", "\"a, b\" , c")]), &names),
            selection(&map(&[("foo", "\"a, b\""), ("foo", "c")]), &names)
        );
        assert_ne!(
            selection(&map(&[]), &names),
            selection(&map(&[("foo", "")]), &names)
        );
    }

    #[test]
    fn a_stamped_entry_selects_only_its_own_values() {
        let mut stored = map(&[("vary", "Foo")]);
        assert!(stamp(&mut stored, &map(&[("foo", "1")]), COVERS));
        assert!(selects(&stored, &map(&[("foo", "1")]), COVERS));
        assert!(!selects(&stored, &map(&[("foo", "2")]), COVERS));
        assert!(!selects(&stored, &map(&[]), COVERS));
        // Without a stamp (an origin's own, dropped), nothing.
        let mut forged = map(&[("vary", "Foo")]);
        forged.insert(SELECTED.clone(), HeaderValue::from_static("x"));
        assert!(!selects(&forged, &map(&[("foo", "1")]), COVERS));
        let mut star = map(&[("vary", "*")]);
        assert!(!stamp(&mut star, &map(&[]), COVERS));
        assert!(!selects(&star, &map(&[]), COVERS));
        assert!(selects(&map(&[]), &map(&[("foo", "1")]), COVERS));
    }

    #[test]
    fn a_coded_entry_selects_requests_that_take_its_coding_alike() {
        let gzip = map(&[("content-encoding", "gzip")]);
        let ae = |v: &'static str| map(&[("accept-encoding", v)]);
        let mut stored = gzip.clone();
        assert!(stamp(&mut stored, &ae("gzip, br"), COVERS));
        assert!(selects(&stored, &ae("br, gzip;q=0.5, zstd"), COVERS));
        for other in ["br", "identity", "gzip;q=0", "*;q=0", ""] {
            assert!(!selects(&stored, &ae(other), COVERS), "{other}");
        }
        assert!(!selects(&stored, &map(&[]), COVERS), "no Accept-Encoding");
        // Unstamped, a coded entry selects nobody; ignoring `Vary` does
        // not change that.
        assert!(!selects(&gzip, &ae("gzip"), COVERS));
        let ignoring = Covers {
            ignore_vary: true,
            ..COVERS
        };
        assert!(!selects(&stored, &ae("br"), ignoring));
        // What the origin coded for a client that sent nothing serves
        // such clients.
        let mut for_none = gzip.clone();
        assert!(stamp(&mut for_none, &map(&[]), COVERS));
        assert!(selects(&for_none, &map(&[]), COVERS));
        // An unencoded entry serves all but a request refusing identity.
        let mut plain = map(&[]);
        assert!(stamp(&mut plain, &ae("gzip"), COVERS));
        assert!(!plain.contains_key(&SELECTED));
        assert!(selects(&plain, &map(&[]), COVERS));
        assert!(!selects(&plain, &ae("identity;q=0, gzip"), COVERS));
        let mut refused = map(&[]);
        assert!(stamp(&mut refused, &ae("identity;q=0, gzip"), COVERS));
        assert!(selects(&refused, &ae("gzip, *;q=0"), COVERS));
        assert!(!selects(&refused, &ae("gzip"), COVERS));
    }
}
