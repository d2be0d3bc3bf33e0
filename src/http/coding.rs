//! The implied `Vary` of `Content-Encoding`: an entry's content codings,
//! and whether a request accepts each (RFC 9110 §12.5.3).
//!
//! A response coded with `gzip` (or any coding) that does not say
//! `Vary: Accept-Encoding` is still one a client that does not accept the
//! coding cannot read. So an entry is selected by the acceptability of its
//! codings, as if its `Vary` named them (nginx's `gzip_vary` in spirit):
//! it serves a request that accepts, refuses or leaves unstated each of
//! its codings exactly as the request that made it did. Unstated (no
//! `Accept-Encoding` at all) is a value of its own: the RFC reads it as
//! "any coding", but many clients that send none cannot decode one, so a
//! body coded for a client that asked for the coding never reaches them.
//! An entry without a coding (identity) serves every request that does
//! not refuse identity (`identity;q=0`, or `*;q=0` without an `identity`
//! member).

use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING};
use http::HeaderMap;

/// The most codings an entry may be coded with to be selected at all.
pub(crate) const MAX_CODINGS: usize = 4;

/// What a request says of one content coding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acceptance {
    /// Listed (or matched by `*`) with a weight above zero.
    Accepted,
    /// Listed (or matched by `*`) with weight zero, or not listed in a
    /// non-empty `Accept-Encoding`.
    Refused,
    /// No `Accept-Encoding` at all.
    Unstated,
}

impl Acceptance {
    /// One byte for the variant digest.
    pub(crate) fn byte(self) -> u8 {
        match self {
            Acceptance::Accepted => b'a',
            Acceptance::Refused => b'r',
            Acceptance::Unstated => b'u',
        }
    }
}

/// An entry's codings, lowercase, in the order applied (`x-gzip` read as
/// `gzip`); empty for identity. `None` when there are more than
/// [`MAX_CODINGS`] or a line is not text.
pub(crate) fn codings(stored: &HeaderMap) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for line in stored.get_all(CONTENT_ENCODING) {
        let line = line.to_str().ok()?;
        for coding in line.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let coding = canonical(&coding.to_ascii_lowercase());
            if coding == "identity" {
                continue;
            }
            out.push(coding);
        }
    }
    (out.len() <= MAX_CODINGS).then_some(out)
}

/// `x-gzip` and `x-compress` are `gzip` and `compress` (RFC 9110 §8.4.1).
fn canonical(coding: &str) -> String {
    coding.strip_prefix("x-").map_or_else(
        || coding.to_owned(),
        |rest| match rest {
            "gzip" | "compress" => rest.to_owned(),
            _ => coding.to_owned(),
        },
    )
}

/// What `request` says of `coding` (lowercase, canonical; `identity` for
/// an unencoded body).
pub(crate) fn acceptance(request: &HeaderMap, coding: &str) -> Acceptance {
    let mut lines = request.get_all(ACCEPT_ENCODING).iter().peekable();
    if lines.peek().is_none() {
        return match coding {
            "identity" => Acceptance::Accepted,
            _ => Acceptance::Unstated,
        };
    }
    // The lowest weight among the members naming it, and among `*`.
    let (mut named, mut star): (Option<u16>, Option<u16>) = (None, None);
    for line in lines {
        let Ok(line) = line.to_str() else {
            continue;
        };
        for member in line.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let mut parts = member.split(';');
            let name = canonical(&parts.next().unwrap_or_default().trim().to_ascii_lowercase());
            let mut weight = Some(1000);
            for param in parts {
                let param = param.trim();
                if param.len() >= 2 && param[..2].eq_ignore_ascii_case("q=") {
                    weight = qvalue(&param[2..]);
                }
            }
            // A member whose weight is not one is not read.
            let Some(weight) = weight else {
                continue;
            };
            let slot = match name.as_str() {
                "*" => &mut star,
                n if n == coding => &mut named,
                _ => continue,
            };
            *slot = Some(slot.map_or(weight, |w| w.min(weight)));
        }
    }
    match named.or(star) {
        Some(0) => Acceptance::Refused,
        Some(_) => Acceptance::Accepted,
        // Identity is acceptable unless excluded; any other coding only
        // when listed.
        None if coding == "identity" => Acceptance::Accepted,
        None => Acceptance::Refused,
    }
}

/// Whether `request` accepts an unencoded body: true unless it refuses
/// identity. Most requests carry no zero weight at all, which one scan
/// tells.
pub(crate) fn accepts_identity(request: &HeaderMap) -> bool {
    let zero = |line: &http::HeaderValue| {
        line.as_bytes()
            .windows(3)
            .any(|w| w[0].eq_ignore_ascii_case(&b'q') && w[1] == b'=' && w[2] == b'0')
    };
    if !request.get_all(ACCEPT_ENCODING).iter().any(zero) {
        return true;
    }
    acceptance(request, "identity") != Acceptance::Refused
}

/// A `q` value (RFC 9110 §12.4.2) in thousandths, or `None`.
fn qvalue(value: &str) -> Option<u16> {
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |acc, b| acc * 10 + u16::from(b - b'0'));
    match int {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ae(lines: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(ACCEPT_ENCODING, HeaderValue::from_static(l));
        }
        h
    }

    #[test]
    fn weights_stars_and_absence() {
        use Acceptance::*;
        let of = |lines: &[&'static str], c| acceptance(&ae(lines), c);
        assert_eq!(of(&[], "gzip"), Unstated);
        assert_eq!(of(&[], "identity"), Accepted);
        assert_eq!(of(&["gzip, br"], "gzip"), Accepted);
        assert_eq!(of(&["GZIP;Q=0.5"], "gzip"), Accepted);
        assert_eq!(of(&["x-gzip"], "gzip"), Accepted);
        assert_eq!(of(&["br"], "gzip"), Refused);
        assert_eq!(of(&[""], "gzip"), Refused);
        assert_eq!(of(&["gzip;q=0"], "gzip"), Refused);
        assert_eq!(of(&["gzip;q=0.000"], "gzip"), Refused);
        assert_eq!(of(&["*"], "zstd"), Accepted);
        assert_eq!(of(&["*;q=0"], "gzip"), Refused);
        assert_eq!(of(&["gzip, *;q=0"], "gzip"), Accepted);
        assert_eq!(of(&["*, gzip;q=0"], "gzip"), Refused);
        assert_eq!(of(&["gzip;q=2"], "gzip"), Refused);
        assert_eq!(of(&["gzip", "gzip;q=0"], "gzip"), Refused);
        assert_eq!(of(&["identity;q=0, gzip"], "identity"), Refused);
        assert_eq!(of(&["*;q=0"], "identity"), Refused);
        assert_eq!(of(&["*;q=0, identity"], "identity"), Accepted);
        assert_eq!(of(&["gzip"], "identity"), Accepted);
        assert!(accepts_identity(&ae(&["gzip, br;q=0.5"])));
        assert!(!accepts_identity(&ae(&["gzip", "identity;q=0"])));
    }

    #[test]
    fn codings_are_read_in_order_without_identity() {
        let mut h = HeaderMap::new();
        assert_eq!(codings(&h), Some(vec![]));
        h.append(CONTENT_ENCODING, HeaderValue::from_static("identity"));
        assert_eq!(codings(&h), Some(vec![]));
        h.append(CONTENT_ENCODING, HeaderValue::from_static("X-Gzip, br"));
        assert_eq!(codings(&h), Some(vec!["gzip".to_owned(), "br".to_owned()]));
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("a,b,c,d,e"));
        assert_eq!(codings(&h), None);
    }
}
