//! The crate's error: a message for people, a kind for code, and the cause.
//!
//! A leaf: the tier that fails decides the kind (for Redis, see
//! `store/redis/error.rs`).

use std::fmt;

/// Why a backend could not be set up, or the Redis tier could not answer.
///
/// Match on [`kind`](Error::kind); the cause, when there is one, is the
/// [`source`](std::error::Error::source). The message says this crate's
/// part only (what failed, and what to check), never the cause's text
/// again: a report that prints the chain (`anyhow`'s `{:#}`, `eyre`) shows
/// each part once.
///
/// ```no_run
/// use stampede_guard::{Backend, ErrorKind};
///
/// # async fn run() {
/// match Backend::redis("redis://cache:secret@127.0.0.1:6379").await {
///     Ok(backend) => { /* serve */ }
///     Err(e) if e.kind() == ErrorKind::Auth => eprintln!("fix the credentials: {e}"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    queued: bool,
}

/// What kind of failure an [`Error`] is.
///
/// ```
/// use stampede_guard::{Backend, ErrorKind, StampedeGuard};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = StampedeGuard::new(Backend::local());
/// let e = guard.invalidate_url("not a url").await.unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::InvalidInput);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The settings are wrong: a malformed URL, an unreadable or incomplete
    /// certificate file, a feature that is not compiled in, a Sentinel
    /// service that does not exist.
    InvalidConfig,
    /// Redis could not be reached: connection refused, reset or closed.
    Connect,
    /// The server refused the user name or password.
    Auth,
    /// The user lacks a command, key or channel permission the crate needs
    /// (a Redis ACL).
    Permission,
    /// The TLS handshake failed: an untrusted or unsuitable certificate, a
    /// name mismatch, a client certificate missing or refused.
    Tls,
    /// No answer within the deadline.
    Timeout,
    /// Redis is failing, or the circuit breaker is open after repeated
    /// failures: the layer serves from its in-process tier meanwhile.
    Unavailable,
    /// An argument is malformed: a URL to purge that does not parse, or
    /// names no host.
    InvalidInput,
    /// Anything else.
    Other,
}

impl Error {
    /// What kind of failure this is. See [`ErrorKind`] for an example.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether the invalidation that returned this error is kept by the
    /// backend and made once Redis answers (it did not reach Redis now):
    /// a key's or URL's purge during an outage or before the backend
    /// first connected, a tag's or everything's before it first
    /// connected. False when it is not kept (call it again), and for every
    /// error that is no invalidation's.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = StampedeGuard::new(Backend::local());
    /// if let Err(e) = guard.invalidate_tag("report").await {
    ///     if e.is_queued() {
    ///         println!("kept, and made once Redis answers: {e}");
    ///     }
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn is_queued(&self) -> bool {
        self.queued
    }

    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
            queued: false,
        }
    }

    /// This error, marked as an invalidation kept to be made once Redis
    /// answers (see [`is_queued`](Self::is_queued)).
    #[cfg(feature = "redis")]
    pub(crate) fn queued(mut self) -> Self {
        self.queued = true;
        self
    }

    /// An error of `kind`, caused by `source`.
    #[cfg(feature = "redis")]
    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
            queued: false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}
