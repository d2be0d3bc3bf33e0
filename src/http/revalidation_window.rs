//! How long an entry is kept past its freshness as the base of a
//! conditional request (RFC 9111 §4.3.1): its revalidation window.

use std::time::Duration;

use http::header::{self, HeaderMap};
use http::StatusCode;

use crate::engine::Lifetime;

/// The shortest revalidation window: how long at least an entry with a
/// validator is kept past its freshness, as the base of a conditional
/// request. Short lifetimes are where revalidation saves most: a one-second
/// entry renewed by a 304 every second never sends its body again.
pub(crate) const REVALIDATION_FLOOR: Duration = Duration::from_secs(60);

/// The longest revalidation window: the longer a validator goes unasked,
/// the likelier the representation changed, and the entry holds memory
/// (in-process and in Redis) all the while.
pub(crate) const REVALIDATION_CAP: Duration = Duration::from_secs(24 * 60 * 60);

/// `lifetime` with its revalidation window: for a `200` with a validator
/// (`ETag`, `Last-Modified`), as long again as its freshness lifetime,
/// within [`REVALIDATION_FLOOR`] and [`REVALIDATION_CAP`]; none otherwise,
/// since nothing could be asked conditionally. The entry is never served in
/// that window, only renewed by the origin's 304 (or replaced by its 200):
/// `must-revalidate` and its kin keep it as any other.
pub(crate) fn with_revalidation(
    mut lifetime: Lifetime,
    status: StatusCode,
    headers: &HeaderMap,
) -> Lifetime {
    let validated =
        headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED);
    lifetime.revalidation = match status == StatusCode::OK && validated {
        true => lifetime.ttl.clamp(REVALIDATION_FLOOR, REVALIDATION_CAP),
        false => Duration::ZERO,
    };
    lifetime
}
