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
//!   instance whose calls keep succeeding on an old primary still follows.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{AsyncConnectionConfig, PushInfo, RedisError};
use tokio::sync::mpsc;

use super::client::{client, with_timeout, Options};
use super::error::ErrorMeaning;

/// The sentinels' URLs, in the order they are asked. Clones share the order.
#[derive(Clone, Default)]
pub(crate) struct Sentinels(Arc<Mutex<Vec<String>>>);

impl Sentinels {
    pub(crate) fn new(urls: Vec<String>) -> Self {
        Sentinels(Arc::new(Mutex::new(urls)))
    }

    /// The URLs, in the order they will be asked.
    pub(crate) fn list(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Moves `url` to the front: it answered last.
    fn promote(&self, url: &str) {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = list.iter().position(|u| u == url) {
            let answered = list.remove(at);
            list.insert(0, answered);
        }
    }

    /// Moves `url` to the back: it named a node that is no primary (or
    /// refused connections), so its view is stale; the others are asked
    /// first from now on.
    pub(crate) fn demote(&self, url: &str) {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
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
        let client = match client(sentinel, options.tls) {
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
            Err(e) => last = Some(sentinel_error(e)),
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

/// A sentinel that wants a password is no wrong password of the data
/// nodes': say which is which, so the hint does not send a person to check
/// the URL's credentials.
fn sentinel_error(e: RedisError) -> RedisError {
    if !e.refuses_credentials() {
        return e;
    }
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "a sentinel refused the connection: sentinels are asked without credentials \
         (the URL's user and password are the data nodes'), so the sentinels must not \
         require a password",
        e.to_string(),
    ))
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
            let client = client(&sentinel, options.tls)?;
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
    fn a_sentinel_wanting_a_password_is_not_blamed_on_the_data_nodes() {
        let refused = RedisError::from((redis::ErrorKind::AuthenticationFailed, "NOAUTH"));
        let e = sentinel_error(refused);
        assert_eq!(e.kind(), redis::ErrorKind::InvalidClientConfig);
        assert!(e.to_string().contains("asked without credentials"), "{e}");
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(
            sentinel_error(io).is_timeout(),
            "other errors pass unchanged"
        );
    }
}
