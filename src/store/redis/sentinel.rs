//! Finding the primary through Sentinel, as the Sentinel client spec asks:
//!
//! - each sentinel gets a short timeout of its own ([`per_sentinel`]); they
//!   are asked side by side and most of them decide, so one hung sentinel
//!   cannot hold back a failover, nor one with a stale view keep an
//!   instance on an old primary;
//! - the sentinel that answered moves to the front of the list, so the next
//!   question goes to one known to answer;
//! - the tier listens on a sentinel for `+switch-master` and asks again at
//!   once when a failover is announced ([`watch_switch`]); it also asks every
//!   second and checks the primary's `ROLE` (see the supervisor), so an
//!   instance whose calls keep succeeding on an old primary still follows;
//! - the sentinels are asked with credentials of their own
//!   ([`SentinelAuth`]), never the data nodes', and a refusal says which
//!   of the two refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{AsyncConnectionConfig, PushInfo, RedisError};
use tokio::sync::mpsc;

use super::client::{client_as, with_timeout, Options};
use super::config::TlsPem;
use super::error::ErrorMeaning;

/// The sentinels' URLs, in the order they are asked, and the credentials
/// they are asked with. Clones share the order.
#[derive(Clone, Default)]
pub(crate) struct Sentinels {
    order: Arc<Mutex<Vec<String>>>,
    auth: Arc<SentinelAuth>,
}

/// The user and password the sentinels are asked with: the sentinels'
/// own, never the data nodes' (a sentinel's `requirepass` or ACL user is
/// not the data user). As redis-rs's own Sentinel client keeps them apart
/// (`set_client_to_sentinel_username`/`_password`), so does the tier.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct SentinelAuth {
    /// `None` with a password: the `default` user (`requirepass`).
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is a secret: say only whether it is set.
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .field("password", &self.password.is_some())
            .finish()
    }
}

impl SentinelAuth {
    pub(crate) fn is_set(&self) -> bool {
        self.user.is_some() || self.password.is_some()
    }
}

impl Sentinels {
    pub(crate) fn new(urls: Vec<String>) -> Self {
        Sentinels {
            order: Arc::new(Mutex::new(urls)),
            auth: Arc::default(),
        }
    }

    /// The same sentinels, asked as `auth`.
    pub(crate) fn with_auth(self, auth: SentinelAuth) -> Self {
        Sentinels {
            auth: Arc::new(auth),
            ..self
        }
    }

    /// The credentials the sentinels are asked with.
    pub(crate) fn auth(&self) -> &SentinelAuth {
        &self.auth
    }

    /// The URLs, in the order they will be asked.
    pub(crate) fn list(&self) -> Vec<String> {
        self.order.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A client for the sentinel at `url`, with the sentinels' credentials.
    fn client(&self, url: &str, tls: &TlsPem) -> Result<redis::Client, RedisError> {
        client_as(
            url,
            tls,
            self.auth.user.as_deref(),
            self.auth.password.as_deref(),
        )
    }

    /// Moves `url` to the front: it answered last.
    fn promote(&self, url: &str) {
        let mut list = self.order.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = list.iter().position(|u| u == url) {
            let answered = list.remove(at);
            list.insert(0, answered);
        }
    }

    /// Moves `url` to the back: it named a node that is no primary (or
    /// refused connections), so its view is stale; the others are asked
    /// first from now on.
    pub(crate) fn demote(&self, url: &str) {
        let mut list = self.order.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = list.iter().position(|u| u == url) {
            let stale = list.remove(at);
            list.push(stale);
        }
    }
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list()).finish()
    }
}

/// How long one sentinel may take to answer: a quarter of the connect
/// timeout, between 100 and 500 ms. Three hung sentinels cost at most
/// 1.5 s, and a slow one is still asked again on the next round.
pub(crate) fn per_sentinel(options: &Options<'_>) -> Duration {
    (options.connect_timeout / 4).clamp(Duration::from_millis(100), Duration::from_millis(500))
}

/// Asks the sentinels, in turn, where the primary of `service` is; the one
/// that answers moves to the front.
pub(crate) async fn resolve(
    sentinels: &Sentinels,
    service: &str,
    options: &Options<'_>,
) -> Result<(String, u16), RedisError> {
    resolve_by(sentinels, service, options)
        .await
        .map(|(address, _)| address)
}

/// [`resolve`], and which sentinel answered.
///
/// The sentinels are asked side by side, each under its own short timeout,
/// and the address named by most of them wins (a tie goes to the one listed
/// first): one sentinel with a stale view (cut off through a failover)
/// cannot keep an instance on an old primary that still says it is one. It
/// returns as soon as a majority of the sentinels agree, so a hung one
/// costs nothing then.
pub(crate) async fn resolve_by(
    sentinels: &Sentinels,
    service: &str,
    options: &Options<'_>,
) -> Result<((String, u16), String), RedisError> {
    let list = sentinels.list();
    let limit = per_sentinel(options);
    let mut last = None;
    let mut asks = tokio::task::JoinSet::new();
    for (order, sentinel) in list.iter().enumerate() {
        let client = match sentinels.client(sentinel, options.tls) {
            Ok(client) => client,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let service = service.to_owned();
        asks.spawn(async move {
            let ask = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&service)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            (order, with_timeout(limit, "asking a sentinel", ask).await)
        });
    }
    let majority = list.len() / 2 + 1;
    let mut named: Vec<(usize, (String, u16))> = Vec::new();
    let votes = |named: &[(usize, (String, u16))], address: &(String, u16)| {
        named.iter().filter(|(_, a)| a == address).count()
    };
    while let Some(joined) = asks.join_next().await {
        let Ok((order, answer)) = joined else {
            continue;
        };
        match answer {
            Ok(Some(address)) => {
                named.push((order, address));
                let address = &named[named.len() - 1].1;
                if votes(&named, address) >= majority {
                    break;
                }
            }
            Ok(None) => {
                last = Some(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "the sentinels know no primary of this name",
                    service.to_owned(),
                )))
            }
            Err(e) => last = Some(sentinel_error(e, &list[order], &sentinels.auth)),
        }
    }
    // Most votes; among equals, the sentinel listed first.
    let best = named.iter().max_by(|(order_a, a), (order_b, b)| {
        votes(&named, a)
            .cmp(&votes(&named, b))
            .then(order_b.cmp(order_a))
    });
    if let Some((_, address)) = best {
        // The first sentinel (in the list) that named it answered for all.
        let order = named
            .iter()
            .filter(|(_, a)| a == address)
            .map(|(order, _)| *order)
            .min()
            .unwrap_or(0);
        let sentinel = list[order].clone();
        sentinels.promote(&sentinel);
        return Ok((address.clone(), sentinel));
    }
    Err(last.unwrap_or_else(|| {
        RedisError::from((redis::ErrorKind::InvalidClientConfig, "no sentinel given"))
    }))
}

/// A sentinel that refuses the tier is no wrong password of the data
/// nodes': the error says that the sentinel (which one) refused, and
/// whether it was asked with no credentials, refused the sentinel
/// credentials, or lacks a permission, so the hint does not send a person
/// to the URL's credentials.
fn sentinel_error(e: RedisError, url: &str, auth: &SentinelAuth) -> RedisError {
    if !e.refuses_credentials() {
        return e;
    }
    let at = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    let (kind, what) = if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        (
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "the sentinel user lacks a permission at the sentinel",
        )
    } else if auth.is_set() {
        (
            redis::ErrorKind::AuthenticationFailed,
            "authentication at the sentinel failed: it refused the sentinel \
             credentials (sentinel_user/sentinel_password; the URL's user and \
             password are the data nodes')",
        )
    } else {
        (
            redis::ErrorKind::AuthenticationFailed,
            "authentication at the sentinel failed: it requires a password and \
             the sentinels were asked without one (set sentinel_user/sentinel_password; \
             the URL's user and password are the data nodes')",
        )
    };
    RedisError::from((kind, what, format!("sentinel {at}: {e}")))
}

/// A primary the sentinels named that refuses the URL's credentials or a
/// permission: the error says it was the data node, not a sentinel.
pub(crate) fn primary_error(e: RedisError, host: &str, port: u16) -> RedisError {
    if !e.refuses_credentials() {
        return e;
    }
    let no_perm = redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm);
    let (kind, what) = if e.kind() == no_perm {
        (
            no_perm,
            "the data user lacks a permission at the primary the sentinels named",
        )
    } else {
        (
            redis::ErrorKind::AuthenticationFailed,
            "authentication at the data node failed: the primary the sentinels named \
             refused the URL's user and password",
        )
    };
    RedisError::from((kind, what, format!("primary {host}:{port}: {e}")))
}

/// Subscribes to `+switch-master` on the first sentinel that answers (each
/// under its own short timeout); the announcements, and a notice when that
/// connection drops, arrive on the receiver. The subscription lives as
/// long as the returned connection.
pub(crate) async fn watch_switch(
    sentinels: &Sentinels,
    options: &Options<'_>,
) -> Option<(
    redis::aio::MultiplexedConnection,
    mpsc::UnboundedReceiver<PushInfo>,
)> {
    for sentinel in sentinels.list() {
        let (tx, rx) = mpsc::unbounded_channel();
        let subscribe = async {
            let client = sentinels.client(&sentinel, options.tls)?;
            let config = AsyncConnectionConfig::new().set_push_sender(tx);
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            conn.subscribe("+switch-master").await?;
            Ok(conn)
        };
        match with_timeout(
            per_sentinel(options),
            "subscribing on a sentinel",
            subscribe,
        )
        .await
        {
            Ok(conn) => return Some((conn, rx)),
            Err(e) => tracing::debug!(error = %e, "cannot watch this sentinel"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::config::TlsPem;

    fn options(tls: &TlsPem, connect_timeout: Duration) -> Options<'_> {
        Options {
            connect_timeout,
            deadline: Duration::from_millis(50),
            tls,
            channel: "sg:events",
            ack_channel: "sg:events:ack:x",
        }
    }

    #[test]
    fn the_sentinel_that_answered_is_asked_first() {
        let sentinels = Sentinels::new(vec!["a".into(), "b".into(), "c".into()]);
        sentinels.promote("c");
        assert_eq!(sentinels.list(), ["c", "a", "b"]);
        sentinels.promote("nobody");
        assert_eq!(sentinels.list(), ["c", "a", "b"]);
        let shared = sentinels.clone();
        shared.promote("b");
        assert_eq!(sentinels.list(), ["b", "c", "a"], "clones share the order");
        sentinels.demote("b");
        assert_eq!(sentinels.list(), ["c", "a", "b"], "a stale one goes last");
    }

    #[test]
    fn each_sentinel_gets_a_short_timeout_of_its_own() {
        let tls = TlsPem::default();
        let each = |t| per_sentinel(&options(&tls, t));
        assert_eq!(each(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(each(Duration::from_secs(60)), Duration::from_millis(500));
        assert_eq!(each(Duration::from_millis(10)), Duration::from_millis(100));
    }

    #[test]
    fn a_sentinel_refusing_the_tier_is_not_blamed_on_the_data_nodes() {
        let url = "redis://127.0.0.1:26379/";
        let none = SentinelAuth::default();
        let set = SentinelAuth {
            user: Some("watcher".into()),
            password: Some("pw".into()),
        };
        let refused = || RedisError::from((redis::ErrorKind::AuthenticationFailed, "NOAUTH"));
        let asked_bare = sentinel_error(refused(), url, &none);
        assert_eq!(asked_bare.kind(), redis::ErrorKind::AuthenticationFailed);
        let message = asked_bare.to_string();
        assert!(message.contains("at the sentinel"), "{message}");
        assert!(message.contains("asked without one"), "{message}");
        assert!(message.contains("127.0.0.1:26379"), "{message}");
        let wrong = sentinel_error(refused(), url, &set).to_string();
        assert!(
            wrong.contains("refused the sentinel credentials"),
            "{wrong}"
        );
        let denied = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NOPERM",
        ));
        let denied = sentinel_error(denied, url, &set);
        assert_eq!(
            denied.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        );
        assert!(
            denied.to_string().contains("sentinel user lacks"),
            "{denied}"
        );
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(
            sentinel_error(io, url, &set).is_timeout(),
            "other errors pass unchanged"
        );
    }
}
