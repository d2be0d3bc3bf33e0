//! URI references resolved against a base URI (RFC 3986 §5.2), for the
//! `Location` and `Content-Location` an unsafe method's answer names.
//!
//! Written out here rather than taken from a URL crate: the algorithm is
//! short, and the usual crates bring a large internationalised-domain tree.

/// A URI reference split into its components (RFC 3986 Appendix B), its
/// fragment dropped (it never reaches a server). `None` is an undefined
/// component, which differs from an empty one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reference<'a> {
    pub scheme: Option<&'a str>,
    pub authority: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
}

impl<'a> Reference<'a> {
    /// Splits `reference` as the regular expression of RFC 3986 Appendix B
    /// does: `^(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?`.
    pub(crate) fn parse(reference: &'a str) -> Self {
        let mut rest = reference.split('#').next().unwrap_or_default();
        let scheme_end = rest.find([':', '/', '?']);
        let scheme = match scheme_end {
            Some(i) if i > 0 && rest.as_bytes()[i] == b':' => {
                let scheme = &rest[..i];
                rest = &rest[i + 1..];
                Some(scheme)
            }
            _ => None,
        };
        let authority = match rest.strip_prefix("//") {
            Some(after) => {
                let end = after.find(['/', '?']).unwrap_or(after.len());
                rest = &after[end..];
                Some(&after[..end])
            }
            None => None,
        };
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        Reference {
            scheme,
            authority,
            path,
            query,
        }
    }
}

/// A reference resolved against its base: the target URI's components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub scheme: Option<String>,
    pub authority: Option<String>,
    pub path: String,
    pub query: Option<String>,
}

/// Transforms `reference` into a target URI against `base` (RFC 3986
/// §5.2.2, strict: a reference with a scheme is absolute).
pub(crate) fn resolve(base: &Reference<'_>, reference: &Reference<'_>) -> Resolved {
    let owned = |s: Option<&str>| s.map(str::to_owned);
    if reference.scheme.is_some() {
        return Resolved {
            scheme: owned(reference.scheme),
            authority: owned(reference.authority),
            path: remove_dot_segments(reference.path),
            query: owned(reference.query),
        };
    }
    let (authority, path, query) = if reference.authority.is_some() {
        (
            reference.authority,
            remove_dot_segments(reference.path),
            reference.query,
        )
    } else if reference.path.is_empty() {
        (
            base.authority,
            base.path.to_owned(),
            reference.query.or(base.query),
        )
    } else if reference.path.starts_with('/') {
        (
            base.authority,
            remove_dot_segments(reference.path),
            reference.query,
        )
    } else {
        (
            base.authority,
            remove_dot_segments(&merge(base, reference.path)),
            reference.query,
        )
    };
    Resolved {
        scheme: owned(base.scheme),
        authority: owned(authority),
        path,
        query: owned(query),
    }
}

/// A relative path against the base's (RFC 3986 §5.2.3): in place of the
/// base path's last segment.
fn merge(base: &Reference<'_>, path: &str) -> String {
    if base.authority.is_some() && base.path.is_empty() {
        return format!("/{path}");
    }
    match base.path.rfind('/') {
        Some(i) => format!("{}{path}", &base.path[..=i]),
        None => path.to_owned(),
    }
}

/// Removes the `.` and `..` segments of a path (RFC 3986 §5.2.4).
pub(crate) fn remove_dot_segments(path: &str) -> String {
    let mut input = path;
    let mut output = String::with_capacity(path.len());
    let pop = |output: &mut String| output.truncate(output.rfind('/').unwrap_or(0));
    while !input.is_empty() {
        if let Some(rest) = input.strip_prefix("../") {
            input = rest;
        } else if let Some(rest) = input.strip_prefix("./") {
            input = rest;
        } else if input.starts_with("/./") {
            input = &input[2..];
        } else if input == "/." {
            input = "/";
        } else if input.starts_with("/../") {
            input = &input[3..];
            pop(&mut output);
        } else if input == "/.." {
            input = "/";
            pop(&mut output);
        } else if input == "." || input == ".." {
            input = "";
        } else {
            let start = usize::from(input.starts_with('/'));
            let end = input[start..].find('/').map_or(input.len(), |i| i + start);
            output.push_str(&input[..end]);
            input = &input[end..];
        }
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(reference: &str) -> String {
        let base = Reference::parse("http://a/b/c/d;p?q");
        let t = resolve(&base, &Reference::parse(reference));
        let mut out = String::new();
        if let Some(scheme) = &t.scheme {
            out.push_str(scheme);
            out.push(':');
        }
        if let Some(authority) = &t.authority {
            out.push_str("//");
            out.push_str(authority);
        }
        out.push_str(&t.path);
        if let Some(query) = &t.query {
            out.push('?');
            out.push_str(query);
        }
        out
    }

    /// RFC 3986 §5.4.1, fragments dropped.
    #[test]
    fn normal_examples() {
        for (reference, target) in [
            ("g:h", "g:h"),
            ("g", "http://a/b/c/g"),
            ("./g", "http://a/b/c/g"),
            ("g/", "http://a/b/c/g/"),
            ("/g", "http://a/g"),
            ("//g", "http://g"),
            ("?y", "http://a/b/c/d;p?y"),
            ("g?y", "http://a/b/c/g?y"),
            ("#s", "http://a/b/c/d;p?q"),
            ("g#s", "http://a/b/c/g"),
            ("g?y#s", "http://a/b/c/g?y"),
            (";x", "http://a/b/c/;x"),
            ("g;x", "http://a/b/c/g;x"),
            ("g;x?y#s", "http://a/b/c/g;x?y"),
            ("", "http://a/b/c/d;p?q"),
            (".", "http://a/b/c/"),
            ("./", "http://a/b/c/"),
            ("..", "http://a/b/"),
            ("../", "http://a/b/"),
            ("../g", "http://a/b/g"),
            ("../..", "http://a/"),
            ("../../", "http://a/"),
            ("../../g", "http://a/g"),
        ] {
            assert_eq!(resolved(reference), target, "{reference:?}");
        }
    }

    /// RFC 3986 §5.4.2, fragments dropped.
    #[test]
    fn abnormal_examples() {
        for (reference, target) in [
            ("../../../g", "http://a/g"),
            ("../../../../g", "http://a/g"),
            ("/./g", "http://a/g"),
            ("/../g", "http://a/g"),
            ("g.", "http://a/b/c/g."),
            (".g", "http://a/b/c/.g"),
            ("g..", "http://a/b/c/g.."),
            ("..g", "http://a/b/c/..g"),
            ("./../g", "http://a/b/g"),
            ("./g/.", "http://a/b/c/g/"),
            ("g/./h", "http://a/b/c/g/h"),
            ("g/../h", "http://a/b/c/h"),
            ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
            ("g;x=1/../y", "http://a/b/c/y"),
            ("g?y/./x", "http://a/b/c/g?y/./x"),
            ("g?y/../x", "http://a/b/c/g?y/../x"),
            ("g#s/./x", "http://a/b/c/g"),
            ("g#s/../x", "http://a/b/c/g"),
            ("http:g", "http:g"),
        ] {
            assert_eq!(resolved(reference), target, "{reference:?}");
        }
    }

    #[test]
    fn dot_segments_go_as_section_5_2_4_says() {
        assert_eq!(remove_dot_segments("/a/b/c/./../../g"), "/a/g");
        assert_eq!(remove_dot_segments("mid/content=5/../6"), "mid/6");
        assert_eq!(remove_dot_segments("/.."), "/");
        assert_eq!(remove_dot_segments(""), "");
    }

    #[test]
    fn an_origin_form_base_keeps_its_path_and_query() {
        let base = Reference::parse("/items/5?x=1");
        let t = resolve(&base, &Reference::parse("?v=full"));
        assert_eq!(
            (t.path.as_str(), t.query.as_deref()),
            ("/items/5", Some("v=full"))
        );
        let t = resolve(&base, &Reference::parse(""));
        assert_eq!(
            (t.path.as_str(), t.query.as_deref()),
            ("/items/5", Some("x=1"))
        );
        assert_eq!((t.scheme, t.authority), (None, None));
    }
}
