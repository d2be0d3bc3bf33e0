//! Request headers in the form the key uses: `Accept-Encoding` reduced to what
//! can change the coding an origin picks, `Forwarded` without its per-client
//! `for=` parameters.
//!
//! Both forms may only ever merge requests an origin cannot tell apart. When a
//! value is not in the plain shape these rules understand, it is keyed on its
//! raw bytes instead: that splits entries, it never merges them.
//!
//! Also the names of the response fields that belong to one client, which
//! `http::response::take_one_clients` keeps out of what is stored.

use http::header::ACCEPT_ENCODING;
use http::HeaderMap;

use crate::key::KeyHasher;

/// The cookie field of RFC 2965 (obsolete, still sent by some servers).
pub(crate) const SET_COOKIE2: &str = "set-cookie2";
/// RFC 9110 §11.6.3: about the client's credentials, for that client.
pub(crate) const AUTHENTICATION_INFO: &str = "authentication-info";
/// RFC 9110 §11.7.3: about the client's proxy credentials, for that client.
pub(crate) const PROXY_AUTHENTICATION_INFO: &str = "proxy-authentication-info";

/// The content codings an origin is expected to choose from, in name order.
const CODINGS: [&str; 4] = ["br", "deflate", "gzip", "zstd"];

/// Feeds the normalised `Accept-Encoding` of a request to the key: the codings
/// among br, deflate, gzip and zstd the client accepts with q > 0, ordered by
/// q (highest first) and then by name, with ties kept as ties. `gzip, br`,
/// `br,gzip` and `br;q=1, gzip` are one key; `gzip` alone, or `br;q=0.5,
/// gzip`, another. Absent differs from empty (RFC 9110 §12.5.3: no header
/// means any coding). Anything unusual (a wildcard, `x-gzip`, `identity;q=0`,
/// a coding listed twice, a parameter other than a valid `q`) is keyed raw.
pub(crate) fn hash_accept_encoding(h: &mut KeyHasher, headers: &HeaderMap) {
    h.part(ACCEPT_ENCODING.as_str().as_bytes());
    let mut lines = headers.get_all(ACCEPT_ENCODING).iter().peekable();
    if lines.peek().is_none() {
        h.part(b"\x00absent");
        return;
    }
    match accepted_codings(headers) {
        Some(codings) => h.part(codings.as_bytes()),
        None => {
            h.part(b"\x00raw");
            h.count(headers.get_all(ACCEPT_ENCODING).iter().count());
            for line in lines {
                h.part(line.as_bytes());
            }
        }
    }
}

/// The normalised form, e.g. `br,gzip;deflate` (br and gzip at one q, deflate
/// below), or `None` when the header is not in the plain shape.
pub(crate) fn accepted_codings(headers: &HeaderMap) -> Option<String> {
    // q in thousandths per coding; `None` = not listed.
    let mut q: [Option<u16>; 4] = [None; 4];
    let mut identity_seen = false;
    for line in headers.get_all(ACCEPT_ENCODING) {
        let line = line.to_str().ok()?;
        for item in line.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (coding, weight) = match item.split_once(';') {
                Some((coding, param)) => (coding.trim(), qvalue(param.trim())?),
                None => (item, 1000),
            };
            if coding.eq_ignore_ascii_case("identity") {
                if identity_seen || weight == 0 {
                    return None;
                }
                identity_seen = true;
            } else if let Some(i) = CODINGS.iter().position(|c| c.eq_ignore_ascii_case(coding)) {
                if q[i].replace(weight).is_some() {
                    return None;
                }
            } else if coding == "*" || coding.eq_ignore_ascii_case("x-gzip") {
                return None;
            }
            // Any other coding is one no origin here produces.
        }
    }
    let mut accepted: Vec<(u16, &str)> = CODINGS
        .iter()
        .zip(q)
        .filter_map(|(name, q)| q.filter(|q| *q > 0).map(|q| (q, *name)))
        .collect();
    accepted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let mut out = String::with_capacity(24);
    for (i, (weight, name)) in accepted.iter().enumerate() {
        if i > 0 {
            out.push(if accepted[i - 1].0 == *weight {
                ','
            } else {
                ';'
            });
        }
        out.push_str(name);
    }
    Some(out)
}

/// A `q=` parameter (RFC 9110 §12.4.2) in thousandths, or `None` if it is
/// anything else.
fn qvalue(param: &str) -> Option<u16> {
    let value = param
        .strip_prefix("q=")
        .or_else(|| param.strip_prefix("Q="))?;
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u16 = match int {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, digit) in frac.bytes().enumerate() {
        thousandths += u16::from(digit - b'0') * [100, 10, 1][i];
    }
    let weight = whole + thousandths;
    (weight <= 1000).then_some(weight)
}

/// Feeds one `Forwarded` line (RFC 7239) to the key without its `for=`
/// parameters, which name the client and would give every client its own
/// entry. Everything else (`host=`, `proto=`, `by=`, extensions) is kept byte
/// for byte, with the element and pair boundaries. A line whose quoted strings
/// hold a separator, or with a pair that is not `name=value`, is keyed whole:
/// parsers disagree on such input, and the handler's may read it differently.
pub(crate) fn hash_forwarded(h: &mut KeyHasher, line: &[u8]) {
    match std::str::from_utf8(line).ok().filter(|l| plainly_quoted(l)) {
        Some(line) if forwarded_pairs(line).all(|pair| pair.contains('=')) => {
            h.part(b"\x00elements");
            for element in line.split(',') {
                h.part(b"\x00,");
                for pair in element.split(';').filter(|p| !p.trim().is_empty()) {
                    let name = pair.split_once('=').map_or(pair, |(n, _)| n);
                    if !name.trim().eq_ignore_ascii_case("for") {
                        h.part(pair.as_bytes());
                    }
                }
            }
        }
        _ => {
            h.part(b"\x00raw");
            h.part(line);
        }
    }
}

fn forwarded_pairs(line: &str) -> impl Iterator<Item = &str> {
    line.split([',', ';']).filter(|p| !p.trim().is_empty())
}

/// Whether every quoted string in the line is closed and holds no `,`, `;`,
/// `=` or backslash, so that splitting at those characters is unambiguous.
fn plainly_quoted(line: &str) -> bool {
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' | ';' | '=' | '\\' if quoted => return false,
            _ => {}
        }
    }
    !quoted
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn ae(lines: &[&str]) -> Option<String> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(ACCEPT_ENCODING, HeaderValue::from_str(line).unwrap());
        }
        accepted_codings(&headers)
    }

    fn ae_key(lines: Option<&[&str]>) -> crate::Key {
        let mut headers = HeaderMap::new();
        for line in lines.unwrap_or_default() {
            headers.append(ACCEPT_ENCODING, HeaderValue::from_str(line).unwrap());
        }
        let mut h = KeyHasher::new(b"t");
        hash_accept_encoding(&mut h, &headers);
        h.finish()
    }

    #[test]
    fn accept_encoding_order_and_default_q_do_not_matter() {
        let both = Some("br,gzip".to_owned());
        assert_eq!(ae(&["gzip, br"]), both);
        assert_eq!(ae(&["br,gzip"]), both);
        assert_eq!(ae(&["br;q=1, gzip"]), both);
        assert_eq!(ae(&["gzip", "BR;Q=1.000"]), both);
        assert_eq!(ae(&["gzip"]), Some("gzip".to_owned()));
        assert_eq!(ae(&["br;q=0.5, gzip"]), Some("gzip;br".to_owned()));
        assert_eq!(ae(&["br, gzip;q=0.5"]), Some("br;gzip".to_owned()));
        assert_eq!(ae(&["gzip;q=0, identity"]), Some(String::new()));
        assert_eq!(ae(&["gzip, sdch"]), Some("gzip".to_owned()));
    }

    #[test]
    fn unusual_accept_encoding_is_keyed_raw() {
        for odd in [
            "*",
            "gzip, *;q=0",
            "x-gzip",
            "identity;q=0",
            "gzip, gzip;q=0",
            "gzip;q=2",
            "gzip;q = 1",
            "gzip;level=9",
            "gzip;q=0.5000",
        ] {
            assert_eq!(ae(&[odd]), None, "{odd}");
        }
        // Two raw values stay apart, and apart from every normal form.
        assert_ne!(ae_key(Some(&["*"])), ae_key(Some(&["*;q=0"])));
        assert_ne!(ae_key(Some(&["x-gzip"])), ae_key(Some(&["gzip"])));
    }

    #[test]
    fn absent_accept_encoding_differs_from_empty() {
        assert_ne!(ae_key(None), ae_key(Some(&[""])));
        assert_eq!(ae_key(Some(&[""])), ae_key(Some(&["identity"])));
        assert_eq!(ae_key(Some(&["gzip, br"])), ae_key(Some(&["br", "gzip"])));
    }

    fn fwd(line: &str) -> crate::Key {
        let mut h = KeyHasher::new(b"t");
        hash_forwarded(&mut h, line.as_bytes());
        h.finish()
    }

    #[test]
    fn forwarded_ignores_for_but_keeps_everything_else() {
        assert_eq!(
            fwd("for=192.0.2.1;host=a.example;proto=https"),
            fwd("for=\"[2001:db8::1]:80\";host=a.example;proto=https")
        );
        assert_eq!(fwd("for=1.1.1.1"), fwd("For=2.2.2.2"));
        assert_ne!(fwd("host=a.example"), fwd("host=evil.example"));
        assert_ne!(fwd("proto=https"), fwd("proto=http"));
        assert_ne!(fwd("host=a.example"), fwd("Host=a.example"));
        assert_ne!(fwd("host=a"), fwd("host= a"));
        // Element boundaries matter: the first element is what most read.
        assert_ne!(
            fwd("for=x, host=evil.example"),
            fwd("for=x;host=evil.example")
        );
        assert_ne!(fwd(""), fwd("host=a"));
    }

    #[test]
    fn ambiguous_forwarded_is_keyed_whole() {
        // A quoted comma hides a host from a naive parser but not from a
        // careful one: these must not share a key with each other or with
        // the plain forms.
        let tricky = "for=\"x,host=evil\";host=good";
        assert_ne!(fwd(tricky), fwd("for=y;host=good"));
        assert_ne!(fwd(tricky), fwd("for=\"x,host=evil2\";host=good"));
        assert_ne!(fwd("for=a;junk"), fwd("for=b;junk"));
        assert_ne!(fwd("for=\"a"), fwd("for=\"b"));
    }

    proptest! {
        #[test]
        fn accept_encoding_never_panics(line in "\\PC{0,40}") {
            if let Ok(v) = HeaderValue::from_str(&line) {
                let mut headers = HeaderMap::new();
                headers.insert(ACCEPT_ENCODING, v);
                let _ = accepted_codings(&headers);
            }
        }

        #[test]
        fn forwarded_keys_differ_when_anything_but_for_differs(
            a in proptest::collection::vec(("(for|host|proto|by)", "[a-z0-9]{0,3}"), 0..5),
            b in proptest::collection::vec(("(for|host|proto|by)", "[a-z0-9]{0,3}"), 0..5),
        ) {
            let line = |pairs: &[(String, String)]| pairs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(";");
            let kept = |pairs: &[(String, String)]| pairs.iter().filter(|(n, _)| n != "for").cloned().collect::<Vec<_>>();
            prop_assert_eq!(kept(&a) == kept(&b), fwd(&line(&a)) == fwd(&line(&b)));
        }
    }
}
