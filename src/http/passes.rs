//! Why requests go past the cache: one [`Pass`] per reason, each counted on
//! the bypass counter under its text, and a route whose origin answers keep
//! being passed said once, loudly, per reason.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::metrics::{self, Labels};

/// Why a request or an origin answer passes the cache. Its text
/// ([`as_str`](Self::as_str)) is what users see: the `reason` label of the
/// bypass counter, the `reason` field of the logs and the `detail` of the
/// `Cache-Status` member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    // A request the cache does not take.
    /// A method other than GET and HEAD.
    Method,
    /// `Authorization`, `Cookie` or `Proxy-Authorization`, on a route that
    /// does not allow them.
    Credentials,
    /// A header that frameworks honour to change the method
    /// (`X-HTTP-Method-Override` and kin): what the handler answers may be
    /// another method's answer.
    MethodOverride,
    /// A protocol switch (`Upgrade` with `Connection: upgrade`): a
    /// connection, not a document.
    Upgrade,
    /// A GET or HEAD whose content could not be read to its end (to be
    /// discarded): refused with a `400`.
    RequestBody,
    /// The request's `Cache-Control` says `no-store`, on a route that
    /// follows request directives.
    RequestNoStore,
    /// A `Host` the key cannot be made of: several lines, or a target
    /// authority that is no header value. Such a request is refused (`400`).
    Host,
    /// The route's key function declined the request.
    KeyFn,
    // An origin answer that may not be shared.
    /// It sets a cookie, on a route that does not strip them.
    SetCookie,
    /// Its `Cache-Control` could not be read.
    UnparseableCacheControl,
    /// `private`, `no-store` or `no-cache`, on a route that does not opt in.
    Private,
    /// Its `Vary` names a header the key was not made of.
    Vary,
    /// A `206`: a slice of a representation, never one.
    PartialContent,
    /// The request's `no-cache`, `max-age=0` or `Pragma: no-cache`, on a
    /// route that follows request directives.
    RequestNoCache,
    /// A body larger than the route's `max_body_bytes`: never stored.
    OverCap,
}

impl Pass {
    /// The reason's text, as users see it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Pass::Method => "method",
            Pass::Credentials => "credentials",
            Pass::MethodOverride => "method override",
            Pass::Upgrade => "upgrade",
            Pass::RequestBody => "request body",
            Pass::RequestNoStore => "request no-store",
            Pass::Host => "host",
            Pass::KeyFn => "key_fn",
            Pass::SetCookie => "set-cookie",
            Pass::UnparseableCacheControl => "unparseable cache-control",
            Pass::Private => "private, no-store or no-cache",
            Pass::Vary => "vary",
            Pass::PartialContent => "partial content",
            Pass::RequestNoCache => "request no-cache",
            Pass::OverCap => "body over max_body_bytes",
        }
    }

    /// The reason's bit in [`PassLog`]: one per reason.
    fn bit(self) -> u32 {
        1 << self as u32
    }
}

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
    pub(crate) fn request(&self, pass: Pass, labels: Labels) {
        let reason = pass.as_str();
        metrics::count_bypass(reason, labels);
        tracing::debug!(reason, "request bypasses the cache");
    }

    /// An origin answer that could not be shared: the route is not protected
    /// while its answers look like this, so the first one of each reason is a
    /// warning.
    pub(crate) fn response(&self, pass: Pass, labels: Labels) {
        let reason = pass.as_str();
        metrics::count_bypass(reason, labels);
        if self.first(pass) {
            tracing::warn!(
                reason,
                "response not shared: requests for this route reach the origin one by one \
                 while its answers look like this"
            );
        } else {
            tracing::debug!(reason, "response not shared");
        }
    }

    /// Whether this is the first time this log sees `pass`.
    fn first(&self, pass: Pass) -> bool {
        let mask = pass.bit();
        self.warned.fetch_or(mask, Ordering::Relaxed) & mask == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Pass; 15] = [
        Pass::Method,
        Pass::Credentials,
        Pass::MethodOverride,
        Pass::Upgrade,
        Pass::RequestBody,
        Pass::RequestNoStore,
        Pass::Host,
        Pass::KeyFn,
        Pass::SetCookie,
        Pass::UnparseableCacheControl,
        Pass::Private,
        Pass::Vary,
        Pass::PartialContent,
        Pass::RequestNoCache,
        Pass::OverCap,
    ];

    #[test]
    fn each_reason_is_first_once_per_log() {
        let log = PassLog::default();
        assert!(log.first(Pass::Vary));
        assert!(!log.first(Pass::Vary));
        assert!(log.first(Pass::SetCookie));
        // Every reason has a bit of its own: none is silenced by another.
        for pass in ALL
            .into_iter()
            .filter(|p| ![Pass::Vary, Pass::SetCookie].contains(p))
        {
            assert!(log.first(pass), "{pass:?}");
            assert!(!log.first(pass), "{pass:?}");
        }
        assert!(
            log.clone().first(Pass::Vary),
            "a derived guard warns afresh"
        );
    }

    #[test]
    fn every_reason_has_its_own_text_and_bit() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.as_str(), b.as_str());
                assert_ne!(a.bit(), b.bit());
            }
        }
    }
}
