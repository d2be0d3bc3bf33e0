//! Revalidation with the origin (RFC 9111 §4.3).
//!
//! When the entry a rebuild replaces is a `200` with a validator (`ETag`,
//! `Last-Modified`), the rebuild asks the origin conditionally
//! (`If-None-Match`, `If-Modified-Since`). A `304 Not Modified` renews the
//! stored response (§4.3.4): its header fields are replaced by those of the
//! 304 (§3.2), and it gets a fresh lifetime; no body crosses the wire. It is
//! then committed like any rebuild.
//!
//! A 304 whose validators (`ETag`, `Last-Modified`) name another
//! representation than the stored one, or one the stored response lacks,
//! does not renew it (§4.3.4): the rebuild fails (stale-if-error, or the
//! route's error answer), and the next one asks again.

use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body as HttpBody;

use super::admit::{connection_named, Admitted, Private, ResponseDelay};
use super::body::GuardBody as Body;
use super::cache_status::{CacheStatus, CACHE_STATUS};
use super::key::Keyed;
use super::policy::{classify, Policy, Verdict};
use super::respond::tag;
use super::response::{take_one_clients, CachedBody, CachedResponse};
use super::revalidation_window::with_revalidation;
use super::rfc::cache_control::initial_age;
use super::rfc::date::http_date;
use crate::engine::{Built, TagSet, Waiters};

/// Header fields a 304 never changes in the stored response: the body's
/// framing, coding and digests (the stored body was not resent: RFC 9111
/// §3.2 lets a cache keep the fields the stored response depends on), and
/// fields that describe one connection (§3.1). `Age` is the 304's own,
/// read apart.
const KEPT: [HeaderName; 13] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    HeaderName::from_static("content-md5"),
    HeaderName::from_static("content-digest"),
    header::CONTENT_RANGE,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::AGE,
];

/// Adds the stored response's validators to a rebuild's request. Returns
/// false (and adds nothing) when it has none, or is not a `200`.
pub(crate) fn ask_conditionally(stored: &CachedResponse, request: &mut HeaderMap) -> bool {
    if stored.status != StatusCode::OK {
        return false;
    }
    let etag = stored.headers.get(header::ETAG).cloned();
    let modified = stored.headers.get(header::LAST_MODIFIED).cloned();
    if let Some(etag) = &etag {
        request.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(modified) = &modified {
        request.insert(header::IF_MODIFIED_SINCE, modified.clone());
    }
    etag.is_some() || modified.is_some()
}

/// The stored response, renewed by the origin's `304`.
pub(crate) fn renew<B, E>(
    policy: &Policy,
    stored: CachedResponse,
    not_modified: Response<B>,
    keyed: Keyed,
) -> Admitted<B, E>
where
    B: HttpBody,
{
    let (mut parts, _no_body) = not_modified.into_parts();
    let delay = parts
        .extensions
        .remove::<ResponseDelay>()
        .unwrap_or_default();
    let update = parts.headers;
    if !selects(&update, &stored.headers) {
        tracing::warn!("a 304 named another representation; the entry is not renewed");
        return Built::Failed {
            shared: None,
            private: None,
            answer: None,
        };
    }
    // The 304's own age: its `Age` and `Date`, not the stored response's.
    let initial_age = initial_age(&update, SystemTime::now(), delay.0);
    let CachedResponse {
        status,
        mut headers,
        body,
    } = stored;
    merge(
        &mut headers,
        &update,
        policy.presentation.status_header.as_ref(),
    );
    let cookies = take_one_clients(
        &mut headers,
        policy.store.strip_set_cookie,
        &policy.store.cache_control_targets,
    );
    let (lifetime, store) = match classify(policy, status, &headers, keyed) {
        Verdict::Share { lifetime, store } => (lifetime, store),
        Verdict::Pass(reason) => {
            // The origin now says the response may not be shared: its
            // starter alone gets it, as any unshared answer.
            tracing::debug!(reason = reason.as_str(), "renewed response not shared");
            let mut response = Response::new(match body {
                CachedBody::Full(bytes) => Body::full(bytes),
                CachedBody::Spooled(hold) => Body::spooled(hold.spool().clone(), None),
            });
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            return Built::Unshared {
                private: Private::Response(tag(policy, response, CacheStatus::Miss)),
                waiters: Waiters::HitForMiss(policy.store.hit_for_miss),
            };
        }
    };
    let lifetime = with_revalidation(lifetime, status, &headers);
    Built::Value {
        value: CachedResponse {
            status,
            headers,
            body,
        },
        lifetime,
        initial_age,
        store,
        failure: false,
        private: (!cookies.is_empty()).then_some(Private::Headers(cookies)),
        // The rebuild adds the stored entry's tags and the 304's.
        tags: TagSet::default(),
        hit_for_miss: None,
    }
}

/// Replaces each field of `stored` that `update` carries with `update`'s
/// values (RFC 9111 §3.2), except those in [`KEPT`], those the 304's
/// `Connection` names, and the layer's own status header.
fn merge(stored: &mut HeaderMap, update: &HeaderMap, status_header: Option<&HeaderName>) {
    let named = connection_named(update);
    for name in update.keys() {
        if KEPT.contains(name)
            || named.contains(name)
            || name.as_str() == "keep-alive"
            || Some(name) == status_header
            || name == CACHE_STATUS
        {
            continue;
        }
        stored.remove(name);
        for value in update.get_all(name) {
            stored.append(name.clone(), value.clone());
        }
    }
}

/// Whether a 304 with `update`'s header fields selects the stored response
/// (RFC 9111 §4.3.4). A validator the 304 carries must be the stored one's:
/// a strong `ETag` must be the stored `ETag` exactly (a stored weak tag, or
/// none, is another representation as far as anyone can tell); a weak one
/// must match it weakly; a `Last-Modified` must be the stored date when
/// there is one. A 304 carrying no validator renews the one stored response,
/// as it asked.
fn selects(update: &HeaderMap, stored: &HeaderMap) -> bool {
    if let Some(theirs) = update.get(header::ETAG) {
        let Some(ours) = stored.get(header::ETAG) else {
            return false;
        };
        let strong = !theirs.as_bytes().starts_with(b"W/");
        if (strong && theirs != ours) || !same_tag(theirs, ours) {
            return false;
        }
    }
    // A date is a strong validator only under conditions (RFC 9110
    // §8.8.2.2): one the stored response lacks selects nothing, but does not
    // refuse the match its other validators made.
    if let (Some(theirs), Some(ours)) = (
        update.get(header::LAST_MODIFIED),
        stored.get(header::LAST_MODIFIED),
    ) {
        let same = match (http_date(theirs), http_date(ours)) {
            (Some(a), Some(b)) => a == b,
            _ => theirs == ours,
        };
        if !same {
            return false;
        }
    }
    true
}

/// Weak comparison of two entity tags (RFC 9110 §8.8.3.2).
fn same_tag(a: &HeaderValue, b: &HeaderValue) -> bool {
    let strip = |v: &HeaderValue| {
        let v = v.as_bytes();
        v.strip_prefix(b"W/").unwrap_or(v).to_vec()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Lifetime;
    use crate::http::revalidation_window::{REVALIDATION_CAP, REVALIDATION_FLOOR};
    use bytes::Bytes;
    use std::time::Duration;

    fn stored(headers: &[(&str, &str)]) -> CachedResponse {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        CachedResponse {
            status: StatusCode::OK,
            headers: map,
            body: Bytes::from_static(b"body").into(),
        }
    }

    fn not_modified(headers: &[(&str, &str)]) -> Response<String> {
        let mut b = Response::builder().status(StatusCode::NOT_MODIFIED);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(String::new()).unwrap()
    }

    fn renewed(stored_h: &[(&str, &str)], update: &[(&str, &str)]) -> Option<CachedResponse> {
        match renew::<_, ()>(
            &Policy::default(),
            stored(stored_h),
            not_modified(update),
            Keyed::now(&Policy::default().keys),
        ) {
            Built::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    #[test]
    fn only_a_200_with_a_validator_gets_a_revalidation_window() {
        let ttl = |secs| Lifetime {
            ttl: Duration::from_secs(secs),
            ..Lifetime::default()
        };
        let window = |status, h: &[(&str, &str)], secs| {
            with_revalidation(ttl(secs), status, &stored(h).headers).revalidation
        };
        let etag = [("etag", "\"a\"")];
        let modified = [("last-modified", "Sun, 01 Nov 2026 00:00:00 GMT")];
        assert_eq!(window(StatusCode::OK, &etag, 1), REVALIDATION_FLOOR);
        assert_eq!(
            window(StatusCode::OK, &modified, 600),
            Duration::from_secs(600)
        );
        assert_eq!(window(StatusCode::OK, &etag, 1 << 31), REVALIDATION_CAP);
        assert_eq!(window(StatusCode::OK, &[], 600), Duration::ZERO);
        assert_eq!(window(StatusCode::NOT_FOUND, &etag, 600), Duration::ZERO);
    }

    #[test]
    fn validators_make_the_request_conditional() {
        let mut req = HeaderMap::new();
        assert!(!ask_conditionally(&stored(&[]), &mut req));
        assert!(req.is_empty());
        let s = stored(&[
            ("etag", "\"a\""),
            ("last-modified", "Sun, 01 Nov 2026 00:00:00 GMT"),
        ]);
        assert!(ask_conditionally(&s, &mut req));
        assert_eq!(req[header::IF_NONE_MATCH], "\"a\"");
        assert_eq!(
            req[header::IF_MODIFIED_SINCE],
            "Sun, 01 Nov 2026 00:00:00 GMT"
        );
        let mut not_ok = stored(&[("etag", "\"a\"")]);
        not_ok.status = StatusCode::NOT_FOUND;
        assert!(!ask_conditionally(&not_ok, &mut HeaderMap::new()));
    }

    #[test]
    fn a_304_replaces_header_fields_but_not_the_bodys_framing() {
        let value = renewed(
            &[
                ("etag", "\"a\""),
                ("x-version", "1"),
                ("x-multi", "a"),
                ("x-multi", "b"),
                ("content-length", "4"),
                ("content-encoding", "identity"),
                ("content-md5", "rL0Y20zC+Fzt72VPzMSk2A=="),
                ("x-kept", "yes"),
            ],
            &[
                ("etag", "W/\"a\""),
                ("x-version", "2"),
                ("x-multi", "c"),
                ("content-length", "0"),
                ("content-encoding", "gzip"),
                ("content-md5", "N7UdGUp1E+RbVvZSTy1R8g=="),
                ("connection", "x-hop"),
                ("x-hop", "1"),
                ("transfer-encoding", "chunked"),
                ("x-cache", "MISS"),
            ],
        )
        .expect("renewed");
        let h = &value.headers;
        assert_eq!(h["x-version"], "2");
        assert_eq!(h.get_all("x-multi").iter().collect::<Vec<_>>(), ["c"]);
        assert_eq!(h["content-length"], "4");
        assert_eq!(h["content-encoding"], "identity");
        assert_eq!(
            h["content-md5"], "rL0Y20zC+Fzt72VPzMSk2A==",
            "a digest of the stored body"
        );
        assert_eq!(h["x-kept"], "yes");
        assert!(!h.contains_key("x-hop"));
        assert!(!h.contains_key("connection"));
        assert!(!h.contains_key("transfer-encoding"));
        assert!(!h.contains_key("x-cache"));
        assert_eq!(value.body.full().unwrap(), "body");
    }

    #[test]
    fn a_304_for_another_representation_renews_nothing() {
        let lm = |d: &'static str| ("last-modified", d);
        let (nov1, nov2) = (
            "Sun, 01 Nov 2026 00:00:00 GMT",
            "Mon, 02 Nov 2026 00:00:00 GMT",
        );
        assert!(renewed(&[("etag", "\"a\"")], &[("etag", "\"b\"")]).is_none());
        // A strong validator the stored response lacks, or has only weakly.
        assert!(renewed(&[lm(nov1)], &[("etag", "\"v2\"")]).is_none());
        assert!(renewed(&[("etag", "W/\"a\"")], &[("etag", "\"a\"")]).is_none());
        assert!(renewed(&[lm(nov1)], &[lm(nov2)]).is_none());
        // The same validators renew; a 304 without any renews what it asked.
        assert!(renewed(&[("etag", "\"a\"")], &[("etag", "\"a\"")]).is_some());
        assert!(renewed(&[("etag", "\"a\"")], &[("etag", "W/\"a\"")]).is_some());
        assert!(renewed(&[lm(nov1)], &[lm(nov1)]).is_some());
        assert!(renewed(&[("etag", "\"a\""), lm(nov1)], &[]).is_some());
        assert!(renewed(&[("etag", "\"a\"")], &[("etag", "\"a\""), lm(nov1)]).is_some());
    }

    #[test]
    fn a_304_that_forbids_sharing_is_not_stored() {
        let built = renew::<_, ()>(
            &Policy::default(),
            stored(&[("etag", "\"a\"")]),
            not_modified(&[("cache-control", "no-store")]),
            Keyed::now(&Policy::default().keys),
        );
        assert!(matches!(built, Built::Unshared { .. }));
        let built = renew::<_, ()>(
            &Policy::default(),
            stored(&[("etag", "\"a\"")]),
            not_modified(&[("set-cookie", "s=1")]),
            Keyed::now(&Policy::default().keys),
        );
        assert!(matches!(built, Built::Unshared { .. }));
    }
}
