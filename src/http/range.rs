//! Range requests answered from a whole cached entry (RFC 9110 §14).
//!
//! The layer fetches and stores the whole representation once; each request
//! with `Range` gets its slice of it (a `Bytes` slice, no copy). Only a single
//! `bytes` range is answered with a `206`: several ranges, another unit or
//! anything that does not parse get the whole `200`, as a server may answer
//! (§14.2). Numbers saturate, so no value a client sends can overflow.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::body::GuardBody as Body;
use super::response::CachedResponse;
use super::rfc::date::http_date;

/// What a `Range` header asks of a representation of a given length.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The whole representation.
    Full,
    /// The bytes `first..=last`.
    Part { first: u64, last: u64 },
    /// Nothing the representation has: `416`.
    Unsatisfiable,
}

/// Turns `response`, presented whole from `cached`, into the answer to its
/// request's `Range` (and `If-Range`), when there is one to give.
pub(crate) fn answer<B: http_body::Body>(
    response: &mut Response<Body<B>>,
    cached: &CachedResponse,
    range: &HeaderValue,
    if_range: Option<&HeaderValue>,
) {
    // Ranges are defined on a whole 200 only; a body still arriving has no
    // known length.
    let Some(bytes) = cached.body.full() else {
        return;
    };
    if cached.status != StatusCode::OK
        || !if_range.is_none_or(|v| if_range_holds(v, &cached.headers))
    {
        return;
    }
    let len = bytes.len() as u64;
    match choose(range.as_bytes(), len) {
        Choice::Full => {}
        Choice::Part { first, last } => {
            // Both are below `len`, which is a `usize`.
            let (first, last) = (first as usize, last as usize);
            *response.body_mut() = Body::full(bytes.slice(first..=last));
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_RANGE,
                value(format!("bytes {first}-{last}/{len}")),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(last - first + 1));
        }
        Choice::Unsatisfiable => {
            *response.body_mut() = Body::empty();
            *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_RANGE, value(format!("bytes */{len}")));
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
    }
}

fn value(text: String) -> HeaderValue {
    // Digits, spaces, '-', '/' and '*' only.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("bytes */0"))
}

/// Reads a `Range` value against a representation of `len` bytes.
pub(crate) fn choose(range: &[u8], len: u64) -> Choice {
    let Ok(range) = std::str::from_utf8(range) else {
        return Choice::Full;
    };
    let Some((unit, set)) = range.split_once('=') else {
        return Choice::Full;
    };
    // One range only: several would need a multipart answer.
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return Choice::Full;
    }
    let Some((first, last)) = set.trim().split_once('-') else {
        return Choice::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // A suffix: the last `n` bytes (§14.1.2), satisfiable when n > 0.
        let Some(suffix) = number(last) else {
            return Choice::Full;
        };
        if suffix == 0 || len == 0 {
            return Choice::Unsatisfiable;
        }
        return Choice::Part {
            first: len.saturating_sub(suffix),
            last: len - 1,
        };
    }
    let Some(first) = number(first) else {
        return Choice::Full;
    };
    let last = if last.is_empty() {
        u64::MAX
    } else {
        match number(last) {
            Some(last) if last >= first => last,
            // `5-3` or garbage: not a valid range, so ignored.
            _ => return Choice::Full,
        }
    };
    if first >= len {
        return Choice::Unsatisfiable;
    }
    Choice::Part {
        first,
        last: last.min(len - 1),
    }
}

/// Decimal digits, saturating at `u64::MAX`.
fn number(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.bytes().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// `If-Range` (§13.1.5): the range applies only if the validator is the
/// entry's strong `ETag` (strong comparison), or exactly its
/// `Last-Modified` when that date is strong: at least 60 s before the
/// entry's `Date` (§8.8.2.2; a representation changed twice within a
/// second keeps its date, so a weak one could splice a range of one version
/// onto another). Without a `Date` the date is weak. (`If-Modified-Since`
/// and `If-Unmodified-Since` compare dates as weak validators, and need no
/// such check.)
fn if_range_holds(validator: &HeaderValue, entry: &HeaderMap) -> bool {
    let validator = validator.as_bytes().trim_ascii();
    if validator.starts_with(b"W/") {
        return false;
    }
    let same = |name: header::HeaderName| {
        entry
            .get(name)
            .is_some_and(|v| v.as_bytes().trim_ascii() == validator)
    };
    if validator.starts_with(b"\"") {
        // A weak ETag never matches, since a strong validator cannot equal it.
        same(header::ETAG)
    } else {
        same(header::LAST_MODIFIED) && last_modified_is_strong(entry)
    }
}

/// Whether the entry's `Last-Modified` is at least 60 s before its `Date`
/// (RFC 9110 §8.8.2.2); false when either is missing or unreadable.
fn last_modified_is_strong(entry: &HeaderMap) -> bool {
    let date = |name| entry.get(name).and_then(http_date);
    match (date(header::LAST_MODIFIED), date(header::DATE)) {
        (Some(modified), Some(date)) => date
            .duration_since(modified)
            .is_ok_and(|gap| gap >= Duration::from_secs(60)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn single_ranges_are_read_as_rfc_9110_says() {
        let part = |first, last| Choice::Part { first, last };
        assert_eq!(choose(b"bytes=0-4", 10), part(0, 4));
        assert_eq!(choose(b"bytes=5-", 10), part(5, 9));
        assert_eq!(choose(b"bytes=-5", 10), part(5, 9));
        assert_eq!(choose(b"bytes=-50", 10), part(0, 9));
        assert_eq!(choose(b"bytes=3-100", 10), part(3, 9));
        assert_eq!(choose(b"Bytes=3-3", 10), part(3, 3));
        assert_eq!(choose(b"bytes=10-", 10), Choice::Unsatisfiable);
        assert_eq!(choose(b"bytes=-0", 10), Choice::Unsatisfiable);
        assert_eq!(choose(b"bytes=0-", 0), Choice::Unsatisfiable);
        assert_eq!(choose(b"bytes=0-1,3-4", 10), Choice::Full);
        assert_eq!(choose(b"bytes=5-3", 10), Choice::Full);
        assert_eq!(choose(b"items=0-1", 10), Choice::Full);
        assert_eq!(choose(b"bytes=a-b", 10), Choice::Full);
        assert_eq!(choose(b"bytes=+1-2", 10), Choice::Full);
        assert_eq!(choose(b"bytes=-", 10), Choice::Full);
        assert_eq!(choose(b"bytes 0-1", 10), Choice::Full);
    }

    #[test]
    fn huge_numbers_saturate() {
        let huge = format!("bytes=0-{}", "9".repeat(400));
        assert_eq!(
            choose(huge.as_bytes(), 10),
            Choice::Part { first: 0, last: 9 }
        );
        let huge = format!("bytes={}-", "9".repeat(400));
        assert_eq!(choose(huge.as_bytes(), 10), Choice::Unsatisfiable);
        let huge = format!("bytes=-{}", "9".repeat(400));
        assert_eq!(
            choose(huge.as_bytes(), 10),
            Choice::Part { first: 0, last: 9 }
        );
    }

    #[test]
    fn if_range_needs_the_strong_etag_or_the_exact_date() {
        let mut entry = HeaderMap::new();
        entry.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        entry.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        entry.insert(
            header::DATE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:50:37 GMT"),
        );
        let holds = |v: &'static str, entry: &HeaderMap| {
            if_range_holds(&HeaderValue::from_static(v), entry)
        };
        assert!(holds("\"v1\"", &entry));
        assert!(!holds("W/\"v1\"", &entry));
        assert!(!holds("\"v2\"", &entry));
        assert!(holds("Sun, 06 Nov 1994 08:49:37 GMT", &entry));
        assert!(!holds("Sun, 06 Nov 1994 08:49:38 GMT", &entry));
        // A date less than 60 s before `Date`, or without one, is weak.
        for date in [
            Some("Sun, 06 Nov 1994 08:50:36 GMT"),
            Some("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some("Sun, 06 Nov 1994 08:40:00 GMT"),
            Some("not a date"),
            None,
        ] {
            let mut weak = entry.clone();
            match date {
                Some(d) => weak.insert(header::DATE, HeaderValue::from_static(d)),
                None => weak.remove(header::DATE),
            };
            assert!(!holds("Sun, 06 Nov 1994 08:49:37 GMT", &weak), "{date:?}");
        }
        entry.insert(header::ETAG, HeaderValue::from_static("W/\"v1\""));
        assert!(!holds("W/\"v1\"", &entry));
        assert!(!holds("\"v1\"", &entry));
    }

    proptest! {
        #[test]
        fn any_range_value_never_panics_and_stays_inside(range in proptest::collection::vec(any::<u8>(), 0..64), len in 0u64..1000) {
            if let Choice::Part { first, last } = choose(&range, len) {
                prop_assert!(first <= last && last < len);
            }
        }

        #[test]
        fn any_numbers_never_panic(first in any::<u64>(), last in any::<u64>(), len in any::<u64>()) {
            for spec in [format!("bytes={first}-{last}"), format!("bytes={first}-"), format!("bytes=-{last}")] {
                if let Choice::Part { first, last } = choose(spec.as_bytes(), len) {
                    prop_assert!(first <= last && last < len);
                }
            }
        }
    }
}
