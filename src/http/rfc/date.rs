//! HTTP dates (RFC 9110 §5.6.7) and the `Date` field (§6.6.1).
//!
//! A response the layer forwards or stores always carries one valid `Date`:
//! the origin's when it sent one, else the time this layer received the
//! response ([`stamp`]). The stamp is made once, where the origin's answer
//! arrives; a stored entry keeps it, so every hit, on any instance, shows
//! the first receiver's date, never the time of the hit.

use std::time::SystemTime;

use http::header::DATE;
use http::{HeaderMap, HeaderValue};

/// An HTTP-date (RFC 9110 §5.6.7, all three forms), or `None`.
///
/// The two-digit year of the obsolete RFC 850 form is the year within fifty
/// years of now that ends in those digits, past rather than future when
/// both are (§5.6.7: a timestamp that appears more than 50 years in the
/// future is the most recent such year in the past).
pub(crate) fn http_date(value: &HeaderValue) -> Option<SystemTime> {
    let text = value.to_str().ok()?.trim();
    match rfc850_as_imf(text, SystemTime::now()) {
        Some(imf) => httpdate::parse_http_date(&imf).ok(),
        None => httpdate::parse_http_date(text).ok(),
    }
}

/// An RFC 850 date (`Sunday, 06-Nov-94 08:49:37 GMT`) rewritten in the
/// IMF-fixdate form with its four-digit year as of `now`; `None` for any
/// other text (the other forms are parsed as they are, and anything that
/// does not parse afterwards, a weekday that is not the date's included,
/// is not a date).
fn rfc850_as_imf(text: &str, now: SystemTime) -> Option<String> {
    let (weekday, rest) = text.split_once(", ")?;
    // The RFC 850 form alone spells the weekday out and dashes the date.
    if weekday.len() <= 3 || !weekday.bytes().all(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    // `06-Nov-94 08:49:37 GMT`
    let b = rest.as_bytes();
    if b.len() != 22 || b[2] != b'-' || b[6] != b'-' || b[9] != b' ' || !rest.is_ascii() {
        return None;
    }
    let (day, month, two, time) = (&rest[..2], &rest[3..6], &rest[7..9], &rest[9..]);
    if !two.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let yy: u16 = two.parse().ok()?;
    let mut fields = fields_of(&format!("Mon, {day} {month} 2000{time}"))?;
    let now_fields = fields_of(&httpdate::fmt_http_date(now))?;
    // The year ending in `yy` at most fifty years ahead of now, to the
    // second: the latest such year not more than fifty years in the future.
    let this = now_fields.0;
    fields.0 = this - this % 100 + yy + 100;
    let limit = (this + 50, now_fields.1, now_fields.2, now_fields.3);
    while fields > limit {
        fields.0 = fields.0.checked_sub(100)?;
    }
    let short: String = weekday.chars().take(3).collect();
    Some(format!("{short}, {day} {month} {}{time}", fields.0))
}

/// The year, month (1 to 12), day and `hh:mm:ss GMT` of an IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), compared in that order.
fn fields_of(imf: &str) -> Option<(u16, u8, u8, String)> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mut words = imf.splitn(5, ' ').skip(1);
    let day = words.next()?.parse().ok()?;
    let month = words.next()?;
    let month = MONTHS.iter().position(|m| *m == month)?;
    let year = words.next()?.parse().ok()?;
    let time = words.next()?.to_owned();
    Some((year, u8::try_from(month + 1).ok()?, day, time))
}

/// The response's `Date`: one line holding one valid HTTP-date, else
/// `None` (absent, repeated or invalid: RFC 9111 §4.2.3 counts such a
/// response from when it was received).
pub(crate) fn date_of(headers: &HeaderMap) -> Option<SystemTime> {
    let mut lines = headers.get_all(DATE).iter();
    match (lines.next(), lines.next()) {
        (Some(one), None) => http_date(one),
        _ => None,
    }
}

/// Gives a response received at `received` the `Date` RFC 9110 §6.6.1 asks
/// of a recipient with a clock that forwards or stores it: the time it was
/// received, when it has no valid `Date` of its own (an invalid one is
/// replaced, as §6.6.1 allows, so that no cache downstream reads it either).
/// A valid `Date` is left as the origin sent it.
pub(crate) fn stamp(headers: &mut HeaderMap, received: SystemTime) {
    if date_of(headers).is_some() {
        return;
    }
    let value = HeaderValue::from_str(&httpdate::fmt_http_date(received))
        .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"));
    headers.insert(DATE, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        httpdate::parse_http_date(text).unwrap()
    }

    #[test]
    fn a_missing_or_invalid_date_is_stamped_and_a_valid_one_kept() {
        let received = at("Sat, 28 Nov 2026 13:00:00 GMT");
        let stamped = |lines: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append(DATE, HeaderValue::from_static(line));
            }
            stamp(&mut headers, received);
            let all: Vec<_> = headers.get_all(DATE).iter().cloned().collect();
            assert_eq!(all.len(), 1, "{lines:?}");
            all[0].to_str().unwrap().to_owned()
        };
        let now = "Sat, 28 Nov 2026 13:00:00 GMT";
        assert_eq!(stamped(&[]), now);
        assert_eq!(stamped(&["yesterday"]), now);
        assert_eq!(stamped(&[""]), now);
        assert_eq!(
            stamped(&[
                "Sun, 06 Nov 1994 08:49:37 GMT",
                "Mon, 07 Nov 1994 08:49:37 GMT"
            ]),
            now
        );
        assert_eq!(
            stamped(&["Sun, 06 Nov 1994 08:49:37 GMT"]),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        // The obsolete forms are dates too: kept as sent.
        assert_eq!(
            stamped(&["Sunday, 06-Nov-94 08:49:37 GMT"]),
            "Sunday, 06-Nov-94 08:49:37 GMT"
        );
        assert_eq!(
            stamped(&["Sun Nov  6 08:49:37 1994"]),
            "Sun Nov  6 08:49:37 1994"
        );
    }

    #[test]
    fn a_two_digit_year_is_the_one_within_fifty_years() {
        let now = at("Sat, 28 Nov 2026 13:00:00 GMT");
        let read = |text| httpdate::parse_http_date(&rfc850_as_imf(text, now)?).ok();
        // Within fifty years ahead: the coming year.
        assert_eq!(
            read("Wednesday, 01-Jan-70 00:00:00 GMT"),
            Some(at("Wed, 01 Jan 2070 00:00:00 GMT"))
        );
        assert_eq!(
            read("Friday, 01-Jan-27 00:00:00 GMT"),
            Some(at("Fri, 01 Jan 2027 00:00:00 GMT"))
        );
        // More than fifty years ahead: the past one.
        assert_eq!(
            read("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(at("Sun, 06 Nov 1994 08:49:37 GMT"))
        );
        // Fifty years to the second is not more than fifty years ahead; a
        // second later is.
        assert_eq!(
            read("Saturday, 28-Nov-76 13:00:00 GMT"),
            Some(at("Sat, 28 Nov 2076 13:00:00 GMT"))
        );
        assert_eq!(
            read("Sunday, 28-Nov-76 13:00:01 GMT"),
            Some(at("Sun, 28 Nov 1976 13:00:01 GMT"))
        );
        // The weekday must be the date's, in the year the rule picks.
        assert_eq!(read("Thursday, 01-Jan-70 00:00:00 GMT"), None);
        // Other forms are not rewritten.
        assert_eq!(rfc850_as_imf("Sun, 06 Nov 1994 08:49:37 GMT", now), None);
        assert_eq!(rfc850_as_imf("Sun Nov  6 08:49:37 1994", now), None);
        assert_eq!(rfc850_as_imf("Sunday, 06-Nov-9x 08:49:37 GMT", now), None);
    }
}
