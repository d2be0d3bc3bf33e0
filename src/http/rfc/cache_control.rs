//! Reading `Cache-Control` and `Expires` as a shared cache must: failing
//! safe on anything it cannot understand.

use std::time::{Duration, SystemTime};

use http::header::{AGE, CACHE_CONTROL, CONTENT_ENCODING, EXPIRES, VARY};
use http::{HeaderMap, HeaderName};

use super::date::{date_of, http_date};
use super::structured::{dictionary, Value};
use crate::engine::MAX_DELTA;

/// The `Cache-Control` directives a shared cache acts on.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheControl {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    /// Only a cache that understands the status's requirements may store
    /// the response, and such a cache ignores `no-store` (RFC 9111
    /// §5.2.2.3).
    pub must_understand: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
    /// A line is not a list of directives (unbalanced quotes, bytes outside
    /// a token or quoted string, invalid UTF-8): a response a shared cache
    /// cannot understand is not stored.
    pub unparseable: bool,
}

impl CacheControl {
    /// Reads every `Cache-Control` line. Unknown directives are ignored; a
    /// freshness value that is not a number, or given twice with different
    /// values, counts as zero (RFC 9111 §1.2.2, §4.2.1: an invalid lifetime
    /// means stale), a malformed stale window as absent.
    ///
    /// It fails safe: `private`, `no-store` and `no-cache` count wherever
    /// they stand as a word (whatever separates them: `;`, spaces, inside a
    /// quoted string), as nginx and Varnish read them; directives themselves
    /// may be separated by commas, semicolons or whitespace.
    ///
    /// The qualified forms `private="field, …"` and `no-cache="field, …"`
    /// (RFC 9111 §5.2.2.7, §5.2.2.4) do not set `private` or `no-cache`:
    /// the response may be stored without the fields they name (see
    /// [`qualified_fields`]). Only a well-formed one counts as qualified
    /// (see [`field_list`]); any other occurrence of the word, beside it or
    /// inside it, is the plain directive.
    pub(crate) fn parse(headers: &HeaderMap) -> Self {
        let mut cc = CacheControl::default();
        for line in headers.get_all(CACHE_CONTROL) {
            // Words seen, less the well-formed qualified directives among them.
            let (mut private, mut no_cache) = (0usize, 0usize);
            for token in tokens(line.as_bytes()) {
                match token.to_ascii_lowercase().as_slice() {
                    b"no-store" => cc.no_store = true,
                    b"no-cache" => no_cache += 1,
                    b"private" => private += 1,
                    _ => {}
                }
            }
            let plain = |cc: &mut CacheControl, private: usize, no_cache: usize| {
                cc.private |= private > 0;
                cc.no_cache |= no_cache > 0;
            };
            let Ok(line) = std::str::from_utf8(line.as_bytes()) else {
                cc.unparseable = true;
                plain(&mut cc, private, no_cache);
                continue;
            };
            let Some(directives) = split_directives(line) else {
                cc.unparseable = true;
                plain(&mut cc, private, no_cache);
                continue;
            };
            for directive in directives {
                match qualified(directive) {
                    Some(Qualified::Private) => private = private.saturating_sub(1),
                    Some(Qualified::NoCache) => no_cache = no_cache.saturating_sub(1),
                    None => {}
                }
                let Some((name, arg)) = directive_parts(directive) else {
                    cc.unparseable = true;
                    continue;
                };
                let seconds = || arg.and_then(delta_seconds);
                match name.to_ascii_lowercase().as_str() {
                    "must-revalidate" => cc.must_revalidate = true,
                    "proxy-revalidate" => cc.proxy_revalidate = true,
                    "must-understand" => cc.must_understand = true,
                    "max-age" => set_freshness(&mut cc.max_age, seconds()),
                    "s-maxage" => set_freshness(&mut cc.s_maxage, seconds()),
                    "stale-while-revalidate" => cc.stale_while_revalidate = seconds(),
                    "stale-if-error" => cc.stale_if_error = seconds(),
                    _ => {}
                }
            }
            plain(&mut cc, private, no_cache);
        }
        cc
    }
}

/// Which qualified directive a well-formed one is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Qualified {
    Private,
    NoCache,
}

/// `directive`, if it is a well-formed qualified `private` or `no-cache`:
/// its argument a quoted string that [`field_list`] reads.
fn qualified(directive: &str) -> Option<Qualified> {
    let (name, arg) = directive.split_once('=')?;
    let which = match name {
        _ if name.eq_ignore_ascii_case("private") => Qualified::Private,
        _ if name.eq_ignore_ascii_case("no-cache") => Qualified::NoCache,
        _ => return None,
    };
    let inner = arg.strip_prefix('"')?.strip_suffix('"')?;
    field_list(inner).map(|_| which)
}

/// Fields a stored entry cannot be kept without, whatever a qualified
/// directive names: `Vary` selects the entry (without it one request's
/// variant would answer every other), and `Content-Encoding` says how its
/// body is coded (without it the body would be misread).
pub(crate) static KEPT_WHATEVER_NAMED: [HeaderName; 2] = [VARY, CONTENT_ENCODING];

/// The field names of a qualified directive's list (the inside of its
/// quoted string), if it is one this cache can honour: one or more field
/// names separated by commas (empty members ignored, RFC 9110 §5.6.1),
/// none of them in [`KEPT_WHATEVER_NAMED`]. `None` for an empty list, a
/// member that is not a field name (spaces inside, escapes, quotes), or a
/// field the entry cannot do without: such a directive is read as the
/// plain one, which keeps the response out of the cache.
fn field_list(inner: &str) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for member in inner.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        if !member.bytes().all(is_tchar) {
            return None;
        }
        let name = HeaderName::from_bytes(member.as_bytes()).ok()?;
        if KEPT_WHATEVER_NAMED.contains(&name) {
            return None;
        }
        names.push(name);
    }
    (!names.is_empty()).then_some(names)
}

/// The directives of the first targeted field among `targets` that is
/// present and valid (RFC 9213 §2.1), or `None`: then `Cache-Control` (and
/// `Expires`) speak. A targeted field is an RFC 8941 Dictionary (its lines
/// combined); one that is empty, does not parse, or gives a directive this
/// layer reads a value of the wrong type (`max-age="60"`, `max-age=-1`,
/// `no-store=5`) is ignored as if absent, and the next target is tried.
pub(crate) fn targeted(headers: &HeaderMap, targets: &[HeaderName]) -> Option<CacheControl> {
    targets.iter().find_map(|name| {
        let mut lines = headers.get_all(name).iter().peekable();
        lines.peek()?;
        let mut field = Vec::new();
        for line in lines {
            if !field.is_empty() {
                field.extend_from_slice(b", ");
            }
            field.extend_from_slice(line.as_bytes());
        }
        if field.iter().all(|b| *b == b' ' || *b == b'\t') {
            return None;
        }
        let mut cc = from_dictionary(&dictionary(&field)?)?;
        // A dictionary keeps the last of two members of one name: a plain
        // `private` or `no-cache` beside a qualified one still counts.
        let directives = std::str::from_utf8(&field).ok().and_then(split_directives);
        for directive in directives.unwrap_or_default() {
            cc.private |= directive.eq_ignore_ascii_case("private");
            cc.no_cache |= directive.eq_ignore_ascii_case("no-cache");
        }
        Some(cc)
    })
}

/// A targeted field's members as directives; `None` if one this layer
/// reads has a value of the wrong type.
fn from_dictionary(members: &[(String, Value)]) -> Option<CacheControl> {
    let mut cc = CacheControl::default();
    for (name, value) in members {
        let seconds = || match value {
            Value::Integer(n) if *n >= 0 => {
                Some(u64::try_from(*n).map_or(MAX_DELTA.as_secs(), |n| n.min(MAX_DELTA.as_secs())))
            }
            _ => None,
        };
        // A flag: `true` (no value), `?0`, or a list of field names (a
        // qualified `private` or `no-cache` that `field_list` reads leaves
        // the flag as it was; any other list counts as the plain one).
        let flag = || match value {
            Value::Boolean(on) => Some(*on),
            Value::String(_) => Some(true),
            _ => None,
        };
        let qualified = matches!(value, Value::String(list) if field_list(list).is_some());
        match name.as_str() {
            "max-age" => cc.max_age = Some(seconds()?),
            "s-maxage" => cc.s_maxage = Some(seconds()?),
            "stale-while-revalidate" => cc.stale_while_revalidate = Some(seconds()?),
            "stale-if-error" => cc.stale_if_error = Some(seconds()?),
            "no-store" => cc.no_store = flag()?,
            "no-cache" if qualified => {}
            "private" if qualified => {}
            "no-cache" => cc.no_cache = flag()?,
            "private" => cc.private = flag()?,
            "must-revalidate" => cc.must_revalidate = flag()?,
            "proxy-revalidate" => cc.proxy_revalidate = flag()?,
            "must-understand" => cc.must_understand = flag()?,
            _ => {}
        }
    }
    Some(cc)
}

/// The fields a response names in the qualified forms `private="field, …"`
/// and `no-cache="field, …"` (RFC 9111 §5.2.2.7, §5.2.2.4), in its
/// `Cache-Control` and in each of the `targeted` fields: fields for the one
/// client that asked, which a shared cache never sends to another. Names
/// that are not field names are skipped.
pub(crate) fn qualified_fields(headers: &HeaderMap, targeted: &[HeaderName]) -> Vec<HeaderName> {
    let mut fields = Vec::new();
    let lines = headers
        .get_all(CACHE_CONTROL)
        .iter()
        .chain(targeted.iter().flat_map(|name| headers.get_all(name)));
    for line in lines {
        let Some(directives) = std::str::from_utf8(line.as_bytes())
            .ok()
            .and_then(split_directives)
        else {
            continue;
        };
        for directive in directives {
            let Some((name, Some(arg))) = directive_parts(directive) else {
                continue;
            };
            if !name.eq_ignore_ascii_case("private") && !name.eq_ignore_ascii_case("no-cache") {
                continue;
            }
            fields.extend(
                arg.split(',')
                    .filter_map(|field| HeaderName::from_bytes(field.trim().as_bytes()).ok()),
            );
        }
    }
    fields
}

/// Records a freshness directive: invalid, or conflicting with an earlier
/// one, means zero.
fn set_freshness(slot: &mut Option<u64>, value: Option<u64>) {
    let value = value.unwrap_or(0);
    *slot = Some(match *slot {
        Some(earlier) if earlier != value => 0,
        _ => value,
    });
}

/// Parses delta-seconds; a value too large saturates (RFC 9111 §1.2.2).
fn delta_seconds(arg: &str) -> Option<u64> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let max = MAX_DELTA.as_secs();
    Some(arg.parse::<u64>().map_or(max, |n| n.min(max)))
}

/// `tchar` (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Every run of token characters in a field line, whatever surrounds it.
pub(crate) fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| !is_tchar(*b)).filter(|t| !t.is_empty())
}

/// Splits a header line at commas, semicolons and whitespace that are not
/// inside a quoted string. `None` if a quoted string is left open.
fn split_directives(line: &str) -> Option<Vec<&str>> {
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut cuts = Vec::new();
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' | ';' | ' ' | '\t' if !quoted => {
                cuts.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return None;
    }
    cuts.push(&line[start..]);
    Some(cuts.into_iter().filter(|d| !d.is_empty()).collect())
}

/// A directive's name and argument (its quotes removed), or `None` if it is
/// not `token [ "=" ( token / quoted-string ) ]`.
fn directive_parts(directive: &str) -> Option<(&str, Option<&str>)> {
    let (name, arg) = match directive.split_once('=') {
        Some((name, arg)) => (name, Some(arg)),
        None => (directive, None),
    };
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return None;
    }
    let arg = match arg {
        None => None,
        Some(arg) if !arg.is_empty() && arg.bytes().all(is_tchar) => Some(arg),
        Some(arg) if arg.len() >= 2 && arg.starts_with('"') && arg.ends_with('"') => {
            let inner = &arg[1..arg.len() - 1];
            // One quoted string, not two glued together (`"a"b"c"`).
            let mut escaped = false;
            for c in inner.chars() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => return None,
                    _ => {}
                }
            }
            Some(inner)
        }
        Some(_) => return None,
    };
    Some((name, arg))
}

/// The lifetime `Expires` gives (RFC 9111 §4.2.1): `Expires` minus `Date`
/// (`now` when `Date` is missing or invalid), clamped. `Some(ZERO)` for an
/// `Expires` that is invalid, repeated, or not after `now` (already past
/// whatever `Date` says); `None` without one.
pub(crate) fn expires_lifetime(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut all = headers.get_all(EXPIRES).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some(Duration::ZERO);
    }
    let Some(expires) = http_date(first) else {
        return Some(Duration::ZERO);
    };
    if expires <= now {
        return Some(Duration::ZERO);
    }
    let date = date_of(headers).unwrap_or(now);
    Some(
        expires
            .duration_since(date)
            .map_or(Duration::ZERO, |d| d.min(MAX_DELTA)),
    )
}

/// How old a response was when it arrived (RFC 9111 §4.2.3): the larger of
/// its corrected `Age` and its apparent age, `now` minus its `Date` in whole
/// seconds (none when `Date` is missing, invalid or in the future), at most
/// [`MAX_DELTA`]. The `Age` counts from when the request was sent, not from
/// when the answer arrived (§4.2.3): `response_delay`, the time between
/// the two, is added to it (in whole seconds, as `Age` is; an absent `Age`
/// is 0).
///
/// `Age` is delta-seconds; a list (several members, or several lines) is
/// read by its first member, without any parameters (`7200;foo=bar` is
/// 7200). One too large to represent is 2^31 s, never zero. A first member
/// that is not delta-seconds (negative, decimal, not a number, empty) is
/// ignored, as RFC 9111 §5.1 says: the apparent age still counts.
pub(crate) fn initial_age(
    headers: &HeaderMap,
    now: SystemTime,
    response_delay: Duration,
) -> Duration {
    let age = headers
        .get(AGE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let first = value.split(',').next().unwrap_or_default();
            delta_seconds(first.split(';').next().unwrap_or_default().trim())
        })
        .map_or(Duration::ZERO, Duration::from_secs)
        .saturating_add(Duration::from_secs(response_delay.as_secs()));
    let apparent = date_of(headers)
        .and_then(|date| now.duration_since(date).ok())
        .map_or(Duration::ZERO, |d| Duration::from_secs(d.as_secs()));
    age.max(apparent).min(MAX_DELTA)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::DATE;
    use http::{HeaderName, HeaderValue};
    use proptest::prelude::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn qualified_private_and_no_cache_name_their_fields() {
        let cdn = HeaderName::from_static("cdn-cache-control");
        let h = headers(&[
            ("cache-control", "max-age=60, PRIVATE=\"X-User, x-token\""),
            ("cache-control", "no-cache=x-a, private, no-cache"),
            ("cdn-cache-control", "private=\"x-edge\", max-age=5"),
            ("cache-control", "no-store=\"x-b\", private=\"not a name\""),
        ]);
        let names = |targets: &[HeaderName]| -> Vec<String> {
            qualified_fields(&h, targets)
                .iter()
                .map(|n| n.as_str().to_owned())
                .collect()
        };
        assert_eq!(names(&[]), ["x-user", "x-token", "x-a"]);
        assert_eq!(names(&[cdn]), ["x-user", "x-token", "x-a", "x-edge"]);
        // An open quote: no list to read, nothing named.
        let open = headers(&[("cache-control", "private=\"x-a, max-age=5")]);
        assert!(qualified_fields(&open, &[]).is_empty());
    }

    #[test]
    fn only_a_well_formed_qualified_form_leaves_the_response_storable() {
        for line in [
            "no-cache=\"a\"",
            "no-cache=\"a, b\", max-age=3600",
            "PRIVATE=\"X-User\"",
            "private=\" x-a ,, x-b \"",
            "private=\"x-a\", no-cache=\"x-b\"",
        ] {
            let cc = CacheControl::parse(&headers(&[("cache-control", line)]));
            assert!(!cc.private && !cc.no_cache && !cc.unparseable, "{line}");
        }
        for line in [
            // Unquoted, empty, not field names, escaped.
            "private=x-a",
            "no-cache=x-a",
            "private=\"\"",
            "no-cache=\" , \"",
            "private=\"x a\"",
            "private=\"x-a\\\"\"",
            "private=\"x-a;y\"",
            // A field the entry cannot be stored without.
            "no-cache=\"vary\"",
            "private=\"x-a, Content-Encoding\"",
            // The plain form beside the qualified one wins.
            "private=\"x-a\", private",
            "no-cache, no-cache=\"x-a\"",
            // The word inside another directive's list.
            "no-cache=\"private\"",
            "private=\"no-cache\"",
            "x=\"private\", no-cache=\"x-a\"",
        ] {
            let cc = CacheControl::parse(&headers(&[("cache-control", line)]));
            assert!(cc.private || cc.no_cache, "{line}");
        }
        // Across lines: a plain form on any line wins.
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "private=\"x-a\""),
            ("cache-control", "private"),
        ]));
        assert!(cc.private);
    }

    #[test]
    fn parses_directives_across_lines_and_quotes() {
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "public, max-age=60, private=\"a, b\""),
            (
                "cache-control",
                "Stale-While-Revalidate=30, stale-if-error=600",
            ),
        ]));
        assert_eq!(cc.max_age, Some(60));
        // Qualified: the response is stored without `a` and `b`.
        assert!(!cc.private);
        assert_eq!(cc.stale_while_revalidate, Some(30));
        assert_eq!(cc.stale_if_error, Some(600));
        assert!(!cc.no_store);
    }

    #[test]
    fn invalid_max_age_means_stale_and_huge_saturates() {
        let cc = CacheControl::parse(&headers(&[("cache-control", "max-age=abc")]));
        assert_eq!(cc.max_age, Some(0));
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=99999999999999999999999",
        )]));
        assert_eq!(cc.max_age, Some(1 << 31));
        // A number that fits a u64 but not RFC 9111's bound is clamped too.
        let cc = CacheControl::parse(&headers(&[(
            "cache-control",
            "max-age=16871334070874663069",
        )]));
        assert_eq!(cc.max_age, Some(1 << 31));
    }

    proptest! {
        #[test]
        fn parsing_any_header_never_panics(line in "\\PC{0,64}") {
            if let Ok(v) = HeaderValue::from_str(&line) {
                let mut h = HeaderMap::new();
                h.insert(CACHE_CONTROL, v);
                let _ = CacheControl::parse(&h);
            }
        }
    }

    #[test]
    fn forbidding_words_count_whatever_separates_them() {
        for line in [
            "private; max-age=600",
            "max-age=600 private",
            "max-age=600\tno-store",
            "public;no-cache",
            "PRIVATE",
            "max-age=60, community=\"private\"",
        ] {
            let cc = CacheControl::parse(&headers(&[("cache-control", line)]));
            assert!(cc.private || cc.no_store || cc.no_cache, "{line}");
        }
        let cc = CacheControl::parse(&headers(&[("cache-control", "max-age=600; public")]));
        assert_eq!(cc.max_age, Some(600));
        assert!(!cc.unparseable);
        let cc = CacheControl::parse(&headers(&[("cache-control", "x-private, no-storey")]));
        assert!(!cc.private && !cc.no_store && !cc.no_cache);
    }

    #[test]
    fn a_field_that_is_not_a_directive_list_is_unparseable() {
        for line in [
            "max-age=60, private=\"open",
            "max-age=60, @@",
            "max-age=60, max-age = 60",
            "max-age=\"6\"0\"",
            "=60",
            "max-age=60, {}",
        ] {
            let cc = CacheControl::parse(&headers(&[("cache-control", line)]));
            assert!(cc.unparseable, "{line}");
        }
        let mut h = HeaderMap::new();
        h.insert(
            CACHE_CONTROL,
            HeaderValue::from_bytes(b"max-age=60, \xff").unwrap(),
        );
        assert!(CacheControl::parse(&h).unparseable);
        let cc = CacheControl::parse(&headers(&[("cache-control", "max-age=\"60\", ,")]));
        assert!(!cc.unparseable);
        assert_eq!(cc.max_age, Some(60));
    }

    #[test]
    fn the_first_valid_targeted_field_speaks() {
        let acme = HeaderName::from_static("acme-cache-control");
        let cdn = HeaderName::from_static("cdn-cache-control");
        let targets = [acme.clone(), cdn.clone()];
        let h = headers(&[
            ("cdn-cache-control", "max-age=60"),
            ("acme-cache-control", "max-age=600, stale-if-error=30"),
        ]);
        let cc = targeted(&h, &targets).unwrap();
        assert_eq!((cc.max_age, cc.stale_if_error), (Some(600), Some(30)));
        // An invalid first target gives way to the next one.
        for acme in [
            "max-age=\"600\"",
            "max-age=-1",
            "&&",
            "",
            "no-store=5",
            "MAX-AGE=1",
        ] {
            let h = headers(&[
                ("acme-cache-control", acme),
                ("cdn-cache-control", "max-age=60"),
            ]);
            assert_eq!(
                targeted(&h, &targets).unwrap().max_age,
                Some(60),
                "{acme:?}"
            );
        }
        // Lines combine; a huge value saturates; flags and their lists.
        let h = headers(&[
            ("cdn-cache-control", "max-age=99999999999"),
            ("cdn-cache-control", "private=\"x-a\", no-store=?0"),
        ]);
        let cc = targeted(&h, &targets).unwrap();
        assert_eq!(cc.max_age, Some(1 << 31));
        assert!(!cc.private && !cc.no_store);
        // A list this cache cannot honour, or a plain member beside a
        // qualified one (the dictionary keeps the last): the plain directive.
        for field in [
            "private=\"\"",
            "private=\"x a\"",
            "no-cache=\"vary\"",
            "private, private=\"x-a\"",
            "no-cache=\"x-a\", no-cache",
        ] {
            let cc = targeted(&headers(&[("cdn-cache-control", field)]), &targets).unwrap();
            assert!(cc.private || cc.no_cache, "{field}");
        }
        // None present or none valid: Cache-Control speaks.
        assert_eq!(
            targeted(&headers(&[("cache-control", "max-age=1")]), &targets),
            None
        );
        let h = headers(&[("cdn-cache-control", "max-age =100")]);
        assert_eq!(targeted(&h, &targets), None);
        assert_eq!(targeted(&h, &[]), None);
    }

    #[test]
    fn conflicting_freshness_means_stale() {
        let cc = CacheControl::parse(&headers(&[
            ("cache-control", "max-age=60"),
            ("cache-control", "max-age=0"),
        ]));
        assert_eq!(cc.max_age, Some(0));
        let cc = CacheControl::parse(&headers(&[("cache-control", "max-age=60, max-age=60")]));
        assert_eq!(cc.max_age, Some(60));
    }

    #[test]
    fn expires_minus_date_is_the_lifetime() {
        // Whole seconds, as HTTP-dates are.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |t: SystemTime| HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap();
        let date = now - Duration::from_secs(1000);
        let mut h = HeaderMap::new();
        h.insert(DATE, at(date));
        h.insert(EXPIRES, at(date + Duration::from_secs(1060)));
        // Relative to the origin's Date, not to this clock...
        assert_eq!(expires_lifetime(&h, now), Some(Duration::from_secs(1060)));
        // ...but one already past is past, whatever Date says.
        h.insert(EXPIRES, at(date + Duration::from_secs(60)));
        assert_eq!(expires_lifetime(&h, now), Some(Duration::ZERO));
        h.insert(DATE, HeaderValue::from_static("yesterday"));
        assert_eq!(expires_lifetime(&h, now), Some(Duration::ZERO));
        h.remove(DATE);
        h.insert(EXPIRES, at(now + Duration::from_secs(120)));
        assert_eq!(expires_lifetime(&h, now), Some(Duration::from_secs(120)));
        for invalid in ["0", "-1", "Thu, 01 Jan 1970 00:00:00 GMT", "soon"] {
            h.insert(EXPIRES, HeaderValue::from_static(invalid));
            assert_eq!(expires_lifetime(&h, now), Some(Duration::ZERO), "{invalid}");
        }
        h.insert(EXPIRES, at(now + Duration::from_secs(120)));
        h.append(EXPIRES, at(now + Duration::from_secs(120)));
        assert_eq!(expires_lifetime(&h, now), Some(Duration::ZERO));
        assert_eq!(expires_lifetime(&HeaderMap::new(), now), None);
        // Far future: clamped like any delta.
        let mut h = HeaderMap::new();
        h.insert(
            EXPIRES,
            HeaderValue::from_static("Fri, 31 Dec 9999 23:59:59 GMT"),
        );
        assert_eq!(expires_lifetime(&h, now), Some(MAX_DELTA));
    }

    #[test]
    fn the_initial_age_is_the_larger_of_age_and_apparent_age() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |t: SystemTime| HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap();
        let age = |pairs: &[(HeaderName, HeaderValue)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(k.clone(), v.clone());
            }
            initial_age(&h, now, Duration::ZERO)
        };
        let secs = Duration::from_secs;
        let value = HeaderValue::from_static;
        assert_eq!(age(&[]), Duration::ZERO);
        assert_eq!(age(&[(AGE, value("100"))]), secs(100));
        // Counted from the request: the time the answer took is added.
        let delayed = |pairs: &[(HeaderName, HeaderValue)], delay| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(k.clone(), v.clone());
            }
            initial_age(&h, now, delay)
        };
        assert_eq!(delayed(&[(AGE, value("100"))], secs(3)), secs(103));
        assert_eq!(delayed(&[], Duration::from_millis(2500)), secs(2));
        assert_eq!(
            delayed(&[(AGE, value("9"))], Duration::from_millis(900)),
            secs(9)
        );
        assert_eq!(delayed(&[(AGE, value("1"))], Duration::MAX), MAX_DELTA);
        assert_eq!(age(&[(AGE, value(" 7 , 9"))]), secs(7));
        // Too large to represent: 2^31, never zero.
        for huge in ["18446744073709551616", "99999999999999999999999999"] {
            assert_eq!(age(&[(AGE, value(huge))]), MAX_DELTA, "{huge}");
        }
        // Not delta-seconds: ignored (RFC 9111 §5.1).
        for invalid in ["-1", "-7200", "1.5", "7200.0", "soon", "abc", ""] {
            assert_eq!(age(&[(AGE, value(invalid))]), Duration::ZERO, "{invalid:?}");
        }
        // A parameter does not hide the number before it.
        assert_eq!(age(&[(AGE, value("7200;foo=bar"))]), secs(7200));
        // Several lines: the first member of the first.
        assert_eq!(age(&[(AGE, value("7200")), (AGE, value("0"))]), secs(7200));
        assert_eq!(
            age(&[(AGE, value("0")), (AGE, value("7200"))]),
            Duration::ZERO
        );
        // An ignored Age leaves the apparent age.
        let old = at(now - secs(60));
        assert_eq!(age(&[(DATE, old), (AGE, value("-5"))]), secs(60));
        // Apparent age: now minus Date, when Date is in the past.
        let old = at(now - secs(3600));
        assert_eq!(age(&[(DATE, old.clone())]), secs(3600));
        assert_eq!(age(&[(DATE, old.clone()), (AGE, value("10"))]), secs(3600));
        assert_eq!(age(&[(DATE, old), (AGE, value("5000"))]), secs(5000));
        assert_eq!(age(&[(DATE, at(now + secs(60)))]), Duration::ZERO);
        assert_eq!(age(&[(DATE, value("yesterday"))]), Duration::ZERO);
    }
}
