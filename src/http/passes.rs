//! Why requests go past the cache: each reason counted on the bypass
//! counter, and a route whose origin answers keep being passed said once,
//! loudly, per reason.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::metrics::{self, Labels};

/// The reasons a request or a response passes, each with its bit in
/// [`PassLog`]; one not listed here shares the last bit.
const REASONS: [&str; 11] = [
    "method",
    "credentials",
    "range or upgrade",
    "request body",
    "host",
    "key_fn",
    "set-cookie",
    "private, no-store or no-cache",
    "vary",
    "body larger than max_body_bytes",
    "body too large or has trailers",
];

/// The pass reasons a guard has already warned about.
#[derive(Default)]
pub(crate) struct PassLog {
    warned: AtomicU32,
}

impl std::fmt::Debug for PassLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassLog")
    }
}

impl Clone for PassLog {
    /// A guard built from another warns afresh: it may be another route.
    fn clone(&self) -> Self {
        PassLog::default()
    }
}

impl PassLog {
    /// A request the client sent in a form the cache does not take (another
    /// method, credentials, a body, …): expected traffic, so only counted.
    pub(crate) fn request(&self, reason: &'static str, labels: Labels) {
        metrics::count_bypass(reason, labels);
        tracing::debug!(reason, "request bypasses the cache");
    }

    /// An origin answer that could not be shared: the route is not protected
    /// while its answers look like this, so the first one of each reason is a
    /// warning.
    pub(crate) fn response(&self, reason: &'static str, labels: Labels) {
        metrics::count_bypass(reason, labels);
        if self.first(reason) {
            tracing::warn!(
                reason,
                "response not shared: requests for this route reach the origin one by one \
                 while its answers look like this"
            );
        } else {
            tracing::debug!(reason, "response not shared");
        }
    }

    /// Whether this is the first time this log sees `reason`.
    fn first(&self, reason: &'static str) -> bool {
        let bit = REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REASONS.len());
        let mask = 1u32 << bit;
        self.warned.fetch_or(mask, Ordering::Relaxed) & mask == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_first_once_per_log() {
        let log = PassLog::default();
        assert!(log.first("vary"));
        assert!(!log.first("vary"));
        assert!(log.first("set-cookie"));
        assert!(log.first("something new"));
        assert!(!log.first("something else new"));
        assert!(log.clone().first("vary"), "a derived guard warns afresh");
    }
}
