//! What a Redis error means: whether a call may have run, whether trying
//! again may help, and which [`ErrorKind`] a user sees.
//!
//! The kind is decided from what the Redis client knows about its error (its
//! kind, the server's error code, the I/O error kind, the TLS error type),
//! never by searching the message text, which the client and the server are
//! free to reword.

use redis::{ErrorKind as Client, RedisError, RetryMethod, ServerErrorKind as Server};

use crate::error::{Error, ErrorKind};

/// Why a call to Redis gave no answer.
#[derive(Debug)]
pub(crate) enum TierError {
    /// The circuit is open: Redis was not asked.
    Open,
    /// No answer, and the connection silent, for the deadline (see
    /// [`super::round_trip`]).
    Timeout,
    /// Queued: the connection kept answering the calls sent before this
    /// one, but its turn did not come within the longest wait (the connect
    /// timeout). Redis is up, but too far behind to serve requests: the
    /// breaker counts it like a silence.
    Busy,
    /// Redis answered with an error, or the connection failed.
    Redis(RedisError),
}

impl TierError {
    /// Whether the command may have run on the server although the caller
    /// has no answer: it was sent, and the deadline passed or the
    /// connection failed before the reply came.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            TierError::Open => false,
            TierError::Timeout | TierError::Busy => true,
            TierError::Redis(e) => e.may_have_run(),
        }
    }

    /// Whether trying again may help: Redis was not asked, gave no answer,
    /// or is between states (see [`ErrorMeaning::retry_may_help`]). False
    /// for errors no retry can mend (a refused script, a permission).
    pub(crate) fn retry_may_help(&self) -> bool {
        match self {
            TierError::Open | TierError::Timeout | TierError::Busy => true,
            TierError::Redis(e) => e.retry_may_help(),
        }
    }

    /// Whether the call met a cluster slot being migrated (`TRYAGAIN`, or a
    /// redirection the client did not follow): trying again shortly, with
    /// the same arguments, will do.
    pub(crate) fn is_moving(&self) -> bool {
        matches!(self, TierError::Redis(e) if e.is_moving())
    }

    /// Whether Redis answered the call with an error of the call's own (a
    /// script error, a wrong type) or of a slot on the move: the server is
    /// up, and the breaker, which guards against a server that is not,
    /// does not count it.
    pub(crate) fn is_answer(&self) -> bool {
        matches!(self, TierError::Redis(e) if e.is_call_error()) || self.is_moving()
    }

    /// Whether the failure says the node is failing (gone, silent, too far
    /// behind, or its connection broken): what the breaker counts. An error
    /// answer or a slot on the move does not.
    pub(crate) fn is_fault(&self) -> bool {
        !self.is_answer() && !matches!(self, TierError::Open)
    }
}

impl std::fmt::Display for TierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierError::Open => f.write_str("circuit open"),
            TierError::Timeout => f.write_str("deadline passed"),
            TierError::Busy => f.write_str("queued past the longest wait"),
            TierError::Redis(e) => write!(f, "{e}"),
        }
    }
}

/// Whether the call met a cluster slot on the move: the lock's acquisition
/// loop retries on it (see [`TierError::is_moving`]).
pub(crate) fn migrating(error: &TierError) -> bool {
    error.is_moving()
}

/// What a Redis client error means to the tier. Every question the tier
/// asks of a [`RedisError`] is one of these.
pub(crate) trait ErrorMeaning {
    /// Whether the command may have run although no reply came: a timeout,
    /// or the connection failed after it was sent.
    fn may_have_run(&self) -> bool;
    /// Whether trying again may help: the call may not have run, or the
    /// server is between states (loading, failing over, a moved slot).
    fn retry_may_help(&self) -> bool;
    /// Whether the key's slot is on the move, or moved (`TRYAGAIN`,
    /// `MOVED`, `ASK`).
    fn is_moving(&self) -> bool;
    /// Whether the server refused the call itself (`ERR`, `WRONGTYPE`): it
    /// is up and answering.
    fn is_call_error(&self) -> bool;
    /// Whether the server answered with an error reply (it has a code), as
    /// opposed to a connection that failed or went silent.
    fn is_server_reply(&self) -> bool;
    /// Whether a node a sentinel named is no primary or refuses
    /// connections: that sentinel's view is stale.
    fn is_stale_view(&self) -> bool;
    /// Whether the server refused the credentials, or their permissions.
    fn refuses_credentials(&self) -> bool;
    /// The kind a user sees.
    fn error_kind(&self) -> ErrorKind;
}

impl ErrorMeaning for RedisError {
    fn may_have_run(&self) -> bool {
        self.is_timeout() || self.is_io_error() || self.is_connection_dropped()
    }

    fn retry_may_help(&self) -> bool {
        self.may_have_run()
            || self.is_connection_refusal()
            // Loading, failing over, a slot on the move, a cluster down:
            // the client's own retry method says so.
            || !matches!(self.retry_method(), RetryMethod::NoRetry)
            // Busy running a slow script: it will take the call soon.
            // (`BUSY` has no kind of its own in the client.)
            || self.code() == Some("BUSY")
    }

    fn is_moving(&self) -> bool {
        matches!(
            self.kind(),
            Client::Server(Server::TryAgain | Server::Moved | Server::Ask)
        )
    }

    fn is_call_error(&self) -> bool {
        // `WRONGTYPE` has no kind of its own in the client.
        self.kind() == Client::Server(Server::ResponseError) || self.code() == Some("WRONGTYPE")
    }

    fn is_server_reply(&self) -> bool {
        self.code().is_some()
    }

    fn is_stale_view(&self) -> bool {
        self.is_connection_refusal() || self.kind() == Client::Server(Server::ReadOnly)
    }

    fn refuses_credentials(&self) -> bool {
        self.kind() == Client::AuthenticationFailed
            || self.kind() == Client::Server(Server::NoPerm)
            // Codes the client has no kind for.
            || matches!(self.code(), Some("NOAUTH" | "WRONGPASS"))
    }

    fn error_kind(&self) -> ErrorKind {
        if is_tls(self) {
            return ErrorKind::Tls;
        }
        match self.kind() {
            Client::AuthenticationFailed => ErrorKind::Auth,
            Client::Server(Server::NoPerm) => ErrorKind::Permission,
            Client::InvalidClientConfig
            | Client::EmptySentinelList
            | Client::MasterNameNotFoundBySentinel
            | Client::RESP3NotSupported => ErrorKind::InvalidConfig,
            Client::Server(
                Server::BusyLoading
                | Server::TryAgain
                | Server::ClusterDown
                | Server::MasterDown
                | Server::ReadOnly,
            )
            | Client::ClusterConnectionNotFound
            | Client::NoValidReplicasFoundBySentinel => ErrorKind::Unavailable,
            Client::Io if self.is_timeout() => ErrorKind::Timeout,
            Client::Io => ErrorKind::Connect,
            // Codes the client has no kind for: the server's own words for
            // "who are you" and "not allowed".
            _ => match self.code() {
                Some("WRONGPASS" | "NOAUTH") => ErrorKind::Auth,
                Some("NOPERM") => ErrorKind::Permission,
                // A command a script runs that the user may not: Redis 7.0
                // says so with a plain `ERR` ("The user executing the script
                // can't run this command or subcommand"), later ones `NOPERM`.
                Some("ERR") if self.to_string().contains("can't run this command") => {
                    ErrorKind::Permission
                }
                _ => ErrorKind::Other,
            },
        }
    }
}

/// Whether a failure to connect may be mended by trying again later (Redis
/// refused the connection, did not answer in time, was loading or failing
/// over): not bad credentials, a permission, TLS or the settings.
pub(crate) fn may_mend(e: &RedisError) -> bool {
    matches!(
        e.error_kind(),
        ErrorKind::Connect | ErrorKind::Timeout | ErrorKind::Unavailable
    )
}

/// A failure to set up the Redis tier at `shown` (a URL without its
/// password). The message says what this layer knows (where, what kind of
/// failure, what to check); the client's error is the
/// [`source`](std::error::Error::source), never repeated in the message,
/// so a report that prints the chain (`anyhow`, `eyre`) shows each once.
pub(crate) fn setup_error(shown: &str, e: RedisError) -> Error {
    let kind = e.error_kind();
    let message = format!("could not set up Redis at {shown}: {}", what(kind));
    Error::with_source(kind, message, e)
}

impl From<TierError> for Error {
    fn from(e: TierError) -> Self {
        match e {
            TierError::Open => Error::new(
                ErrorKind::Unavailable,
                "redis not asked: its circuit is open after repeated failures",
            ),
            TierError::Timeout => Error::new(
                ErrorKind::Timeout,
                "redis gave no answer within the deadline",
            ),
            TierError::Busy => Error::new(
                ErrorKind::Timeout,
                "redis call queued past the longest wait",
            ),
            TierError::Redis(e) => {
                let kind = match e.error_kind() {
                    // Past start-up, a server that cannot be reached is one
                    // that is failing: the tier runs without it.
                    ErrorKind::Connect => ErrorKind::Unavailable,
                    kind => kind,
                };
                let message = match kind {
                    ErrorKind::Unavailable => "redis call failed: redis is failing or unreachable",
                    ErrorKind::Timeout => "redis call failed: no answer in time",
                    ErrorKind::Auth => "redis call refused: authentication failed",
                    ErrorKind::Permission => {
                        "redis call refused: the user lacks a permission this crate needs"
                    }
                    _ => "redis call failed",
                };
                Error::with_source(kind, message, e)
            }
        }
    }
}

/// What a person is told of a start-up failure of this kind: what failed,
/// and what to check. The client's own words are the error's source.
fn what(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Auth => "authentication failed (check the user name and password)",
        ErrorKind::Permission => {
            "the user lacks a command, key or channel permission this crate needs \
             (see the crate's guide, stampede_guard::guide::topology)"
        }
        ErrorKind::Tls => "TLS failed (check the CA, the server name and the client certificate)",
        ErrorKind::Connect => "cannot connect",
        ErrorKind::Timeout => "no answer in time",
        ErrorKind::Unavailable => "redis is not serving (loading, failing over or down)",
        ErrorKind::InvalidConfig => "the settings are invalid",
        _ => "redis refused",
    }
}

/// Whether a TLS error (rustls's own type) is somewhere in the causes.
///
/// Two wrappers hide it from a plain walk of `source()`: an I/O error skips
/// the error it wraps (tokio-rustls wraps its error in one), and the client
/// keeps that I/O error behind an `Arc`, which is what its `source()` returns.
/// Both are looked through.
fn is_tls(e: &RedisError) -> bool {
    #[cfg(feature = "redis-tls")]
    {
        type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;

        fn tls(e: &(dyn std::error::Error + 'static)) -> bool {
            if e.is::<rustls::Error>() || e.is::<rustls::pki_types::InvalidDnsNameError>() {
                return true;
            }
            if let Some(inner) = e.downcast_ref::<Shared>() {
                return tls(&**inner);
            }
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                return tls(inner);
            }
            e.source().is_some_and(tls)
        }
        tls(e)
    }
    #[cfg(not(feature = "redis-tls"))]
    {
        let _ = e;
        false
    }
}

#[cfg(test)]
mod tests;
