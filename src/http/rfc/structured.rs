//! Structured field values (RFC 8941, with RFC 9651's bare items: dates
//! and display strings): whether an upstream `Cache-Status` line is a list
//! that this layer's member may follow, and the members of a dictionary (a
//! targeted cache-control field, RFC 9213), each with the bare value a
//! cache directive can have.

/// Whether `field` is a non-empty RFC 8941 List (§3.1; the bare items of
/// RFC 9651 too: dates and display strings).
pub(crate) fn is_list(field: &[u8]) -> bool {
    let mut p = Sf { b: field, i: 0 };
    p.sp();
    loop {
        if !p.member() {
            return false;
        }
        p.ows();
        match p.next() {
            None => return true,
            Some(b',') => p.ows(),
            Some(_) => return false,
        }
        if p.peek().is_none() {
            return false;
        }
    }
}

/// The value of a dictionary member, as far as a cache directive reads it
/// (RFC 9213 §2: absent is `true`, a token that is a number an integer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    Boolean(bool),
    Integer(i64),
    String(String),
    /// A token, a decimal, a byte sequence, a date, a display string or an
    /// inner list: nothing a cache directive this layer reads can be.
    Other,
}

/// The members of an RFC 8941 Dictionary (§3.2) in order, a later member
/// of one name replacing an earlier one (§4.2.2); `None` when `field` is
/// not one (a parsing error: the whole field is to be ignored). Keys are
/// lowercase by the grammar; parameters are read and dropped.
pub(crate) fn dictionary(field: &[u8]) -> Option<Vec<(String, Value)>> {
    let mut p = Sf { b: field, i: 0 };
    let mut members: Vec<(String, Value)> = Vec::new();
    p.sp();
    if p.peek().is_none() {
        return Some(members);
    }
    loop {
        let key = p.key()?;
        let value = if p.peek() == Some(b'=') {
            p.i += 1;
            if p.peek() == Some(b'(') {
                if !p.member() {
                    return None;
                }
                Value::Other
            } else {
                let start = p.i;
                if !p.bare_item() {
                    return None;
                }
                let value = bare_value(&field[start..p.i]);
                if !p.parameters() {
                    return None;
                }
                value
            }
        } else {
            if !p.parameters() {
                return None;
            }
            Value::Boolean(true)
        };
        match members.iter_mut().find(|(k, _)| *k == key) {
            Some(member) => member.1 = value,
            None => members.push((key, value)),
        }
        p.ows();
        match p.next() {
            None => return Some(members),
            Some(b',') => p.ows(),
            Some(_) => return None,
        }
        p.peek()?;
    }
}

/// A bare item already checked by the reader, as a [`Value`].
fn bare_value(item: &[u8]) -> Value {
    match item.first() {
        Some(b'?') => Value::Boolean(item.get(1) == Some(&b'1')),
        Some(b'"') => {
            let inner = &item[1..item.len().saturating_sub(1)];
            let mut out = String::with_capacity(inner.len());
            let mut escaped = false;
            for &c in inner {
                if !escaped && c == b'\\' {
                    escaped = true;
                    continue;
                }
                escaped = false;
                out.push(char::from(c));
            }
            Value::String(out)
        }
        Some(c) if c.is_ascii_digit() || *c == b'-' => std::str::from_utf8(item)
            .ok()
            .filter(|n| !n.contains('.'))
            .and_then(|n| n.parse().ok())
            .map_or(Value::Other, Value::Integer),
        _ => Value::Other,
    }
}

/// A structured-field reader over one field value.
struct Sf<'a> {
    b: &'a [u8],
    i: usize,
}

impl Sf<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += usize::from(c.is_some());
        c
    }

    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> usize {
        let start = self.i;
        while self.peek().is_some_and(&f) {
            self.i += 1;
        }
        self.i - start
    }

    fn sp(&mut self) {
        self.take_while(|c| c == b' ');
    }

    fn ows(&mut self) {
        self.take_while(|c| c == b' ' || c == b'\t');
    }

    /// A dictionary or parameter key (`lcalpha` or `*`, then lowercase
    /// letters, digits and `_-.*`).
    fn key(&mut self) -> Option<String> {
        if !self
            .peek()
            .is_some_and(|c| c.is_ascii_lowercase() || c == b'*')
        {
            return None;
        }
        let start = self.i;
        self.take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c));
        Some(String::from_utf8_lossy(&self.b[start..self.i]).into_owned())
    }

    fn member(&mut self) -> bool {
        if self.peek() == Some(b'(') {
            self.i += 1;
            loop {
                self.sp();
                if self.peek() == Some(b')') {
                    self.i += 1;
                    break;
                }
                if !self.item() || !matches!(self.peek(), Some(b' ' | b')')) {
                    return false;
                }
            }
            return self.parameters();
        }
        self.item()
    }

    fn item(&mut self) -> bool {
        self.bare_item() && self.parameters()
    }

    fn parameters(&mut self) -> bool {
        while self.peek() == Some(b';') {
            self.i += 1;
            self.sp();
            if !self
                .peek()
                .is_some_and(|c| c.is_ascii_lowercase() || c == b'*')
            {
                return false;
            }
            self.take_while(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c)
            });
            if self.peek() == Some(b'=') {
                self.i += 1;
                if !self.bare_item() {
                    return false;
                }
            }
        }
        true
    }

    fn bare_item(&mut self) -> bool {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                self.string()
            }
            Some(b'%') => {
                self.i += 1;
                self.next() == Some(b'"') && self.string()
            }
            Some(b'?') => {
                self.i += 1;
                matches!(self.next(), Some(b'0' | b'1'))
            }
            Some(b':') => {
                self.i += 1;
                self.take_while(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c));
                self.next() == Some(b':')
            }
            Some(b'@') => {
                self.i += 1;
                self.number()
            }
            Some(c) if c.is_ascii_digit() || c == b'-' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                self.take_while(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c));
                true
            }
            _ => false,
        }
    }

    fn number(&mut self) -> bool {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let whole = self.take_while(|c| c.is_ascii_digit());
        if self.peek() != Some(b'.') {
            return (1..=15).contains(&whole);
        }
        self.i += 1;
        let frac = self.take_while(|c| c.is_ascii_digit());
        (1..=12).contains(&whole) && (1..=3).contains(&frac)
    }

    /// The rest of a string whose opening quote was read.
    fn string(&mut self) -> bool {
        loop {
            match self.next() {
                Some(b'"') => return true,
                Some(b'\\') => {
                    if !matches!(self.next(), Some(b'"' | b'\\')) {
                        return false;
                    }
                }
                Some(0x20..=0x7e) => {}
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_told_from_other_bytes() {
        for good in [
            "a",
            "a; hit; ttl=-3, \"b, c\"; detail=\"x\\\"y\"",
            "(a b);q=?0, *c;k=:aGk=:;d=1.5;e=@12;f=%\"x\"",
            "a ,\tb",
        ] {
            assert!(is_list(good.as_bytes()), "{good}");
        }
        for bad in [
            "",
            "\"open, a",
            "a,",
            "a;;b",
            "1a",
            "a; k=",
            "a; K=1",
            "a b",
            "a; ttl=1234567890123456",
            "(a",
            "a\u{7f}",
        ] {
            assert!(!is_list(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn dictionaries_give_their_members() {
        let d = dictionary(b"max-age=3600, private, no-cache=\"a, b\";x=1, s-maxage=?0").unwrap();
        assert_eq!(
            d,
            vec![
                ("max-age".to_owned(), Value::Integer(3600)),
                ("private".to_owned(), Value::Boolean(true)),
                ("no-cache".to_owned(), Value::String("a, b".to_owned())),
                ("s-maxage".to_owned(), Value::Boolean(false)),
            ]
        );
        // The last of one name wins; other types are told apart.
        let d = dictionary(b"a=1, b=x, c=1.5, a=2, d=(1 2)").unwrap();
        assert_eq!(d.len(), 4);
        assert_eq!(d[0], ("a".to_owned(), Value::Integer(2)));
        assert_eq!(d[1], ("b".to_owned(), Value::Other));
        assert_eq!(d[3], ("d".to_owned(), Value::Other));
        assert_eq!(dictionary(b"").unwrap(), vec![]);
        for bad in [
            "max-age=10000, &&&&&",
            "MaX-aGe=3600",
            "max-age =100",
            "max-age= 100",
            "a,",
            "a=\"open",
            "a=1234567890123456",
        ] {
            assert_eq!(dictionary(bad.as_bytes()), None, "{bad}");
        }
    }
}
