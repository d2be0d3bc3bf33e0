//! Reading this layer's `Cache-Status` member, and requests with raw
//! header bytes, for the HTTP attack tests.

use axum::body::Body;
use http::{HeaderValue, Request};

use super::Answer;

/// Every `Cache-Status` line of an answer.
pub fn cache_status(answer: &Answer) -> Vec<String> {
    answer
        .headers
        .get_all("cache-status")
        .iter()
        .map(|v| v.to_str().expect("visible ASCII").to_owned())
        .collect()
}

/// This layer's `Cache-Status` member (the last one), with its `ttl`
/// taken out and returned apart.
pub fn ours(answer: &Answer) -> (String, Option<i64>) {
    let all: Vec<&str> = answer
        .headers
        .get_all("cache-status")
        .iter()
        .map(|v| v.to_str().expect("visible ASCII"))
        .collect();
    let last = all
        .join(", ")
        .rsplit(", ")
        .next()
        .expect("a member")
        .to_owned();
    split_ttl(&last)
}

/// A `Cache-Status` member with its `ttl` parameter taken out (it depends on
/// the clock) and returned apart.
pub fn split_ttl(member: &str) -> (String, Option<i64>) {
    let mut ttl = None;
    let rest: Vec<&str> = member
        .split("; ")
        .filter(|p| match p.strip_prefix("ttl=") {
            Some(n) => {
                ttl = Some(n.parse().expect("an integer ttl"));
                false
            }
            None => true,
        })
        .collect();
    (rest.join("; "), ttl)
}

pub fn with(uri: &str, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut request = Request::get(uri).body(Body::empty()).unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    request
}

pub fn no_tag_headers(answer: &Answer, what: &str) {
    for name in ["surrogate-key", "cache-tag"] {
        assert!(
            answer.headers.get(name).is_none(),
            "{what}: a {name} header reached the client"
        );
    }
}
