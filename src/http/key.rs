//! Request → cache key, and the route's key settings.
//!
//! A request's key is the digest of everything that selects its response:
//! namespace, host, path, the query with its pairs sorted by name, the
//! target's scheme, the values of the route's Vary headers and of the
//! forwarding headers the deployment keys on (HEAD shares GET's entry, and
//! nothing else reaches here, so the method adds nothing). The scheme, the
//! forwarding headers and the Vary values (and `Accept-Encoding`) select a
//! variant within the URL's group ([`RequestKey`]), so that one invalidation
//! drops them all.
//!
//! Headers that frameworks and proxies honour to rewrite the request's URL,
//! path, prefix, host, port or scheme (`X-Original-URL`, `X-Rewrite-URL`,
//! `X-Forwarded-*`, `Forwarded`, `X-Envoy-Original-Path`, …) are a class told
//! by name ([`rewrites`]), not a list: whichever of them a request carries
//! is keyed in its variant, beside the route's own forwarding headers, so
//! the answer one value built is never served for another value or for a
//! request without it. Method overrides (`X-HTTP-Method-Override` and kin)
//! send the request past the cache instead (see `policy::admission`).
//!
//! The key is what the client asked for, exactly as the handler sees it: the
//! URI before any router stripped a prefix (axum's `OriginalUri`), and the
//! host of an absolute-form target, which the service also writes into `Host`
//! (RFC 9112 §3.2.2) so the handler reads the same one.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::header::{ACCEPT_ENCODING, FORWARDED, HOST};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};

use super::passes::Pass;
use super::rfc::headers::{hash_accept_encoding, hash_forwarded};
use crate::key::{Key, KeyHasher};
pub(crate) use rewrites::{rewrite_class, Rewrite};

/// A route's own cache key: receives the request head, returns the key (host,
/// path and query are then left out of it) or `None` to pass the request
/// through uncached. See [`StampedeGuard::key_fn`](crate::StampedeGuard::key_fn)
/// for an example.
pub type KeyFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// The forwarding headers keyed on by default: the ones frameworks read the
/// request's host, scheme, port or path prefix from. Target rewrites of
/// their class, but the route's list of forwarding headers replaces them
/// (every other target rewrite is keyed whatever that list says).
pub(crate) static DEFAULT_FORWARDED: [HeaderName; 5] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    FORWARDED,
];

/// What a route keys on besides the URL, and what it has learned to key on.
#[derive(Clone)]
pub(crate) struct KeySettings {
    pub namespace: Arc<str>,
    /// The guard's ordinal on its backend (the Nth guard built on it):
    /// keys the requests that name no host, so that two services sharing a
    /// backend never share them.
    pub guard: u64,
    pub vary: Arc<[HeaderName]>,
    pub forwarded: Arc<[HeaderName]>,
    /// Set once an origin answer said `Vary: accept-encoding`; from then on
    /// the route keys on the normalised `Accept-Encoding`.
    pub learned_encoding: LearnedEncoding,
    pub key_fn: Option<KeyFn>,
}

impl Default for KeySettings {
    fn default() -> Self {
        KeySettings {
            namespace: Arc::from(""),
            guard: 0,
            vary: Arc::from([]),
            forwarded: Arc::from(DEFAULT_FORWARDED.as_slice()),
            learned_encoding: LearnedEncoding::default(),
            key_fn: None,
        }
    }
}

impl fmt::Debug for KeySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySettings")
            .field("namespace", &self.namespace)
            .field("guard", &self.guard)
            .field("vary", &self.vary)
            .field("forwarded", &self.forwarded)
            .field("learned_encoding", &self.learned_encoding.get())
            .field("key_fn", &self.key_fn.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// Set once the route's origin answered with `Vary: accept-encoding` (or
/// compression sits inside the guard): from then on its keys include the
/// normalised `Accept-Encoding`, so each coding gets its own entry and the
/// route is protected again. Shared by the services one guard builds; a guard
/// derived from it with a builder starts from what this one knew.
#[derive(Default)]
pub(crate) struct LearnedEncoding(AtomicBool);

impl LearnedEncoding {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self) {
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::info!("origin varies on accept-encoding: the route now keys on it");
        }
    }
}

impl Clone for LearnedEncoding {
    fn clone(&self) -> Self {
        LearnedEncoding(AtomicBool::new(self.get()))
    }
}

/// What a request's key was made of, beyond the route's fixed settings: the
/// rebuild judges the origin's `Vary` against the key its waiters share, not
/// against what the route has learned since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keyed {
    pub accept_encoding: bool,
}

impl Keyed {
    /// What keys made now include.
    pub(crate) fn now(keys: &KeySettings) -> Self {
        Keyed {
            accept_encoding: keys.learned_encoding.get() || keys.vary.contains(&ACCEPT_ENCODING),
        }
    }
}

/// What, besides the URL, a route keys on.
pub(crate) struct KeyRules<'a> {
    pub namespace: &'a str,
    /// The guard's ordinal on its backend, keyed when the request names no
    /// host (or an empty one).
    pub guard: u64,
    /// The route's Vary headers; `accept-encoding` among them is keyed in its
    /// normalised form.
    pub vary: &'a [HeaderName],
    /// The forwarding headers the deployment keys on.
    pub forwarded: &'a [HeaderName],
    /// Key on the normalised `Accept-Encoding` (listed in `vary`, or learned
    /// from the origin's `Vary`).
    pub accept_encoding: bool,
}

impl<'a> KeyRules<'a> {
    /// What `keys` keys on, with `Accept-Encoding` as `keyed` says.
    pub(crate) fn of(keys: &'a KeySettings, keyed: Keyed) -> Self {
        KeyRules {
            namespace: &keys.namespace,
            guard: keys.guard,
            vary: &keys.vary,
            forwarded: &keys.forwarded,
            accept_encoding: keyed.accept_encoding,
        }
    }
}

/// The URI the client sent: axum's `OriginalUri` when a router has recorded
/// it (a nested router strips its prefix from the URI its routes see).
pub(crate) fn target(parts: &Parts) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}

/// The host the target names, `host[:port]` without any userinfo, when the
/// request target has an authority (absolute form, or HTTP/2 `:authority`).
pub(crate) fn target_host(parts: &Parts) -> Option<&str> {
    let authority = target(parts)
        .authority()
        .or_else(|| parts.uri.authority())?;
    let host = authority.as_str();
    Some(host.rsplit_once('@').map_or(host, |(_, host)| host))
}

/// RFC 9112 §3.2.2: when the target has an authority, `Host` is ignored and
/// replaced by it, so the handler builds its answer from the host the key was
/// made of. `Err` when that cannot be done, or when the request carries
/// several `Host` lines, whatever its target (RFC 9112 §3.2 makes that
/// invalid, and which line a handler reads is anyone's guess): such a
/// request is refused.
pub(crate) fn align_host(parts: &mut Parts) -> Result<(), Pass> {
    // As many lines as names: no name, `Host` neither, has two (a check
    // that costs nothing, before the lookup that hashes).
    if parts.headers.len() != parts.headers.keys_len()
        && parts.headers.get_all(HOST).iter().nth(1).is_some()
    {
        return Err(Pass::Host);
    }
    if let Some(host) = target_host(parts) {
        let value = HeaderValue::from_str(host).map_err(|_| Pass::Host)?;
        parts.headers.insert(HOST, value);
    }
    Ok(())
}

/// A request's key in two parts (RFC 9111 §4.1): the URL's key, which names
/// the group an invalidation drops, and the key of the variant the request
/// selects within it, under which the response is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestKey {
    /// Namespace and the request's host, path and query (or the route's
    /// custom key).
    pub url: Key,
    /// `url`, the target's scheme, the forwarding headers keyed on and the
    /// values of the route's Vary headers (and the normalised
    /// `Accept-Encoding`); a member of `url`'s group (the URL key itself when
    /// none of these is there to split it).
    pub key: Key,
}

/// The key of a request. `custom` replaces host, path and query when the route
/// supplies its own key function.
pub(crate) fn request_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> Key {
    split_key(rules, parts, custom).key
}

/// Both parts of a request's key.
pub(crate) fn split_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> RequestKey {
    let url = url_key(rules, parts, custom);
    RequestKey {
        url,
        key: variant_key(&url, rules, parts),
    }
}

/// The URL part: what names the resource, whatever the variant (namespace,
/// host, path, query), and so what an invalidation reaches.
pub(crate) fn url_key(rules: &KeyRules<'_>, parts: &Parts, custom: Option<&str>) -> Key {
    // "h3": responses, key format 3 (query sorted by name only; scheme and
    // forwarding headers in the variant). HEAD is answered from the GET
    // entry and nothing else reaches here, so the method adds nothing.
    let mut h = KeyHasher::new(b"h3");
    h.part(rules.namespace.as_bytes());
    match custom {
        Some(custom) => {
            h.part(b"custom");
            h.part(custom.as_bytes());
        }
        None => {
            let uri = target(parts);
            let host = target_host(parts)
                .map(str::as_bytes)
                .or_else(|| parts.headers.get(HOST).map(|v| v.as_bytes()));
            // A request that names no host (HTTP/1.0, an in-process call
            // with an origin-form URI) or an empty one is answered by
            // whichever service got it: it is keyed under the guard's
            // ordinal on the backend, so two services sharing a backend
            // never share it, while the instances of a fleet, which build
            // their guards in the same order, do.
            match host {
                Some(host) if !host.is_empty() => h.part_lowercase(host),
                // No host differs from an empty one: a handler may fall back
                // to a default host for the one, not the other.
                Some(_) => {
                    h.part(b"\x00empty");
                    h.part(&rules.guard.to_le_bytes());
                }
                None => {
                    h.part(b"\x00absent");
                    h.part(&rules.guard.to_le_bytes());
                }
            }
            h.part(uri.path().as_bytes());
            h.part_query(uri.query().unwrap_or(""));
        }
    }
    h.finish()
}

/// The variant part: the URL key, the target's scheme, the forwarding
/// headers keyed on and the values of the Vary headers.
///
/// The scheme (`http://h/x` and `https://h/x` are two URIs, RFC 9111 §4;
/// an origin-form target names none, which differs from both) and the
/// forwarding headers (the scheme, host or prefix a proxy says the client
/// used) select what the handler builds, but an invalidation of the URL, or
/// an unsafe method's, made without them must still reach every entry they
/// split: so they select a variant within the URL's group.
pub(crate) fn variant_key(url: &Key, rules: &KeyRules<'_>, parts: &Parts) -> Key {
    let scheme = target(parts).scheme().or_else(|| parts.uri.scheme());
    // One pass over the names present (usually a handful, none of them
    // forwarding headers) rather than a lookup per forwarding header.
    let forwarded = keyed_rewrites(rules, parts);
    let others = rules.vary.iter().any(|name| name != ACCEPT_ENCODING);
    if scheme.is_none() && forwarded.is_empty() && !others && !rules.accept_encoding {
        return *url;
    }
    // "h3v": a variant of a response's URL.
    let mut h = KeyHasher::new(b"h3v");
    h.part(url.as_bytes());
    match scheme {
        Some(scheme) => h.part_lowercase(scheme.as_str().as_bytes()),
        None => h.part(b"\x00absent"),
    }
    // Forwarding headers are usually absent: only the present ones are
    // written (name, count, values), in the order of their names, so a
    // typical key stays short and the order they came in changes nothing.
    h.part(b"\x00forwarded");
    for name in forwarded {
        hash_values(&mut h, parts, name);
    }
    h.part(b"\x00vary");
    for name in rules.vary {
        if name != ACCEPT_ENCODING {
            hash_values(&mut h, parts, name);
        }
    }
    if rules.accept_encoding {
        hash_accept_encoding(&mut h, &parts.headers);
    }
    h.finish_in(url)
}

/// The forwarding headers and target rewrites (see [`rewrites`]) present on
/// the request, each once, sorted by name: what the variant is keyed on
/// besides the scheme and the Vary headers. The route's list of forwarding
/// headers replaces the default five (a deployment whose edge strips or
/// sets them says which it keys on); every other header of the class is
/// keyed whatever the list says.
fn keyed_rewrites<'p>(rules: &KeyRules<'_>, parts: &'p Parts) -> Vec<&'p HeaderName> {
    let mut names: Vec<&HeaderName> = parts
        .headers
        .keys()
        .filter(|name| {
            rules.forwarded.contains(name)
                || (rewrite_class(name) == Some(Rewrite::Target)
                    && !DEFAULT_FORWARDED.contains(name))
        })
        .collect();
    if names.len() > 1 {
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    }
    names
}

/// A header's name, how many lines it has (none: absent, which differs from
/// one empty line), and each line. The count keeps a value from passing for
/// the next header's name.
fn hash_values(h: &mut KeyHasher, parts: &Parts, name: &HeaderName) {
    h.part(name.as_str().as_bytes());
    let values = parts.headers.get_all(name);
    h.count(values.iter().count());
    for value in values {
        if name == FORWARDED {
            hash_forwarded(h, value.as_bytes());
        } else {
            h.part(value.as_bytes());
        }
    }
}

/// Sorts the query's pairs by name, stably, so that `?b=2&a=1` and `?a=1&b=2`
/// share an entry while `?s=1&s=2` and `?s=2&s=1` (a list whose order the
/// origin may use) do not, nor `?%73=1&s=2` and `?s=2&%73=1`, nor
/// `?a_b=1&%20a+b=2` and its reverse (names are compared as an origin may
/// fold them: decoded, case-folded, space, `+` and `_` alike), and drops
/// empty pairs (`?a=1&&`). A query with a `;`, or a name that decodes to
/// something outside printable ASCII or holds `.`, `[`, `]` or `%`, keeps
/// its order (`?%FF=1&%FE=2`: one name to a lossy parser; `a.b` is `a_b`
/// to PHP; `?x=1;a=2`: two pairs to an origin that splits at `;`).
/// Values keep their bytes: `%41` and `A` stay different, as an origin may
/// treat them differently. (The key hashes these bytes without building the string; this
/// is its reference form.)
#[cfg(test)]
pub(crate) fn normalize_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if crate::key::names_are_sortable(&pairs) {
        pairs.sort_by(|a, b| crate::key::cmp_query_names(a, b));
    }
    pairs.join("&")
}

mod rewrites;

#[cfg(test)]
mod tests;
