//! The tier's own connections to a Redis Cluster's primaries: one per
//! primary that serves keys, opened like the first seed and kept while the
//! slot map names it. What is done on them (reading the slot map, probing a
//! node whose circuit is open, calls on a key's node) is
//! [`Connections`](super::connections::Connections)'s.

use std::collections::HashMap;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::RedisError;
use tokio::sync::OnceCell;

use super::client::client;
use super::connection::Topology;
use super::health::Address;
use super::TierConfig;

/// A connection of its own to each cluster primary, opened once (by the
/// first call that needs it, or when the slot map is read) and dropped
/// when a call on it fails; only the primaries of the current slot map
/// keep theirs.
#[derive(Default)]
pub(crate) struct NodeConns {
    conns: std::sync::Mutex<HashMap<Address, Arc<OnceCell<MultiplexedConnection>>>>,
}

impl NodeConns {
    pub(super) async fn get(
        &self,
        config: &TierConfig,
        address: &Address,
    ) -> Result<MultiplexedConnection, RedisError> {
        let cell = self.lock().entry(address.clone()).or_default().clone();
        cell.get_or_try_init(|| own_connection(config, address))
            .await
            .cloned()
    }

    pub(super) fn forget(&self, address: &Address) {
        self.lock().remove(address);
    }

    /// Drops every node's connection.
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    /// Keeps the connections of `nodes` only.
    pub(super) fn retain(&self, nodes: &[Address]) {
        self.lock().retain(|a, _| nodes.contains(a));
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Address, Arc<OnceCell<MultiplexedConnection>>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A new connection to the cluster node at `address`, reached like the
/// first seed (scheme, credentials, TLS), with the backend's connect
/// timeout. Every call on it has the tier's own time limit (the
/// deadline, or more for a call that waits on Redis's side): the
/// connection adds none of its own (the client's default would fail a
/// call after half a second whatever the deadline).
pub(super) async fn own_connection(
    config: &TierConfig,
    address: &Address,
) -> Result<MultiplexedConnection, RedisError> {
    let Topology::Cluster(seeds) = &config.topology else {
        return Err(RedisError::from((
            redis::ErrorKind::Client,
            "not a cluster",
        )));
    };
    let Some(url) = seeds.first().map(|seed| node_url(seed, address)) else {
        return Err(RedisError::from((redis::ErrorKind::Client, "no seed")));
    };
    let settings = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(None);
    client(&url, &config.tls)?
        .get_multiplexed_async_connection_with_config(&settings)
        .await
}

/// A seed's URL (scheme, credentials, path) for another node.
fn node_url(seed: &str, (host, port): &Address) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    format!("{scheme}://{userinfo}{host}:{port}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_reached_like_the_seed() {
        let node = ("10.0.0.7".to_owned(), 7001);
        assert_eq!(
            node_url("rediss://u:p@seed:7000/", &node),
            "rediss://u:p@10.0.0.7:7001/"
        );
        assert_eq!(node_url("redis://seed:1", &node), "redis://10.0.0.7:7001/");
        let v6 = ("::1".to_owned(), 7002);
        assert_eq!(
            node_url("redis://a@b@seed:1/", &v6),
            "redis://a@b@[::1]:7002/"
        );
    }
}
