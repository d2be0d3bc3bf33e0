//! A check of structured field values (RFC 8941, with RFC 9651's bare
//! items: dates and display strings): whether an upstream `Cache-Status`
//! line is a list that this layer's member may follow. Only the syntax is
//! read; nothing is built.

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
}
