//! The tier's own connections to a Redis Cluster's primaries, and what is
//! done on them: reading the slot map, probing a node whose circuit is
//! open, pinging the subscription's node, and routing one command to one
//! node.

use std::collections::HashMap;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::{RedisError, Value};
use tokio::sync::OnceCell;

use super::connection::{client, Topology};
use super::health::Address;
use super::{Conn, Shared};

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
        shared: &Shared,
        address: &Address,
    ) -> Result<MultiplexedConnection, RedisError> {
        let cell = self.lock().entry(address.clone()).or_default().clone();
        cell.get_or_try_init(|| shared.own_connection(address))
            .await
            .cloned()
    }

    pub(super) fn forget(&self, address: &Address) {
        self.lock().remove(address);
    }

    /// Keeps the connections of `nodes` only.
    fn retain(&self, nodes: &[Address]) {
        self.lock().retain(|a, _| nodes.contains(a));
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Address, Arc<OnceCell<MultiplexedConnection>>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Shared {
    /// On a cluster, reads the slot map (`CLUSTER SLOTS`) from the first
    /// primary that answers, healthy ones first. True if it was read.
    pub(super) async fn refresh_slots(&self) -> bool {
        if !self.health.is_cluster() {
            return false;
        }
        let open: Vec<Address> = self
            .health
            .open_nodes()
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        let mut nodes: Vec<Option<Address>> = self
            .health
            .nodes()
            .into_iter()
            .filter(|a| !open.contains(a))
            .map(Some)
            .collect();
        if nodes.is_empty() {
            // No map yet: any node, as the client picks it.
            nodes.push(None);
        }
        for node in nodes {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            // A known node is asked on the tier's own connection to it (the
            // one its keys' calls use, not a new one per read: a slot on the
            // move has every redirected call ask for a new map): through the
            // cluster client, asking a node it has no connection to (a dead
            // one) makes it rebuild its slot map, and every call to every
            // node waits meanwhile (longer still with another node frozen).
            let ask = async {
                match &node {
                    Some(address) => {
                        let mut conn = self.node_conns.get(self, address).await?;
                        cmd.query_async::<Value>(&mut conn).await
                    }
                    None => self.on_node(None, cmd.clone()).await,
                }
            };
            // An unknown endpoint in the reply is the node asked.
            let asked = match &node {
                Some((host, _)) => host.clone(),
                None => self.seed_host(),
            };
            let reply = match tokio::time::timeout(self.config.deadline, ask).await {
                Ok(Ok(reply)) => Some(reply),
                Ok(Err(e)) if e.code().is_some() => None,
                _ => {
                    // Silent or gone: the next use connects again.
                    if let Some(address) = &node {
                        self.node_conns.forget(address);
                    }
                    None
                }
            };
            if let Some(reply) = reply
                && self.health.update(&reply, &asked)
            {
                self.node_conns.retain(&self.health.nodes());
                // Open the healthy primaries' connections now, not in the
                // first requests' deadline.
                let open: Vec<Address> = self
                    .health
                    .open_nodes()
                    .into_iter()
                    .map(|(a, _)| a)
                    .collect();
                for node in self
                    .health
                    .nodes()
                    .into_iter()
                    .filter(|a| !open.contains(a))
                {
                    let _ = tokio::time::timeout(
                        self.config.connect_timeout,
                        self.node_conns.get(self, &node),
                    )
                    .await;
                }
                return true;
            }
        }
        false
    }

    /// Runs `call` for `route` (a Redis key) under `limit`, outside a
    /// key's call path (the fleet membership): on a cluster, on the tier's
    /// own connection to the primary the slot map names, not through the
    /// cluster client, whose rebuilds (a call met a dead node while another
    /// is frozen) hold back every call to every node for a connect
    /// timeout. A slot on the move is left to the cluster client, which
    /// follows the redirection; a node that did not answer has its
    /// connection dropped and the map read again.
    pub(super) async fn routed<T, F, Fut>(
        &self,
        route: &str,
        limit: std::time::Duration,
        mut call: F,
    ) -> Result<T, RedisError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let until = tokio::time::Instant::now() + limit;
        let Some(address) = self.health.node(route) else {
            let call = call(self.link().conn.clone());
            return super::connection::with_timeout(limit, "calling redis", call).await;
        };
        let own = async {
            let conn = self.node_conns.get(self, &address).await?;
            call(Conn::Node(conn)).await
        };
        match tokio::time::timeout_at(until, own).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if moving(&e) => {
                self.signals.slots_moved.notify_one();
                let call = call(self.link().conn.clone());
                match tokio::time::timeout_at(until, call).await {
                    Ok(answer) => answer,
                    Err(_) => Err(super::connection::timeout_error("calling redis")),
                }
            }
            Ok(Err(e)) => {
                if e.code().is_none() {
                    self.node_conns.forget(&address);
                    self.signals.slots_moved.notify_one();
                }
                Err(e)
            }
            Err(_) => {
                self.node_conns.forget(&address);
                self.signals.slots_moved.notify_one();
                Err(super::connection::timeout_error("calling redis"))
            }
        }
    }

    /// The first seed's host: the node the cluster client asks first.
    fn seed_host(&self) -> String {
        let Topology::Cluster(seeds) = &self.config.topology else {
            return String::new();
        };
        let Some(seed) = seeds.first() else {
            return String::new();
        };
        let rest = seed.split_once("://").map_or(seed.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = match hostport.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => host,
            _ => hostport,
        };
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    }

    /// One probe on a cluster: true once every circuit is closed. Each
    /// primary whose circuit is open is pinged itself, on a connection of
    /// its own, so that a node still frozen or dead keeps its circuit open
    /// however many others answer. The slot map is read first: a node whose
    /// slots a replica took over has left it, and its circuit with it (the
    /// new owner has its own).
    pub(super) async fn probe_nodes(&self) -> bool {
        self.refresh_slots().await;
        for ((host, port), breaker) in self.health.open_nodes() {
            let address = (host, port);
            if self.node_answers(&address).await {
                let (host, port) = address;
                tracing::info!(
                    %host,
                    port,
                    "redis node answers again; fleet-wide protection restored for its keys"
                );
                breaker.close();
            }
        }
        if !self.health.whole().is_closed() {
            // Slots no map names: any node that answers will do.
            let ping = self.on_node(None, redis::cmd("PING"));
            if let Ok(Ok(_)) = tokio::time::timeout(self.config.deadline, ping).await {
                self.health.whole().close();
            }
        }
        self.health.all_closed()
    }

    /// Pings the subscriber. On a cluster the ping goes to the node that
    /// serves the event channel's slot, where the subscription is (a plain
    /// `PING` would go to every primary, and one bad shard would make the
    /// whole subscription look lost).
    pub(super) async fn ping_subscription(&self) -> Result<(), RedisError> {
        match self.link().subscriber.clone() {
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(mut sub) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let slot = super::health::slot(self.channel.as_bytes());
                let route = Route::new(slot, SlotAddr::Master);
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                sub.route_command(redis::cmd("PING"), to).await.map(drop)
            }
            mut sub => redis::cmd("PING").query_async(&mut sub).await,
        }
    }

    /// Whether the node at `address` answers a ping, asked on a connection
    /// of its own: through the cluster client, a call to a node that is
    /// down makes the client rebuild its connections and holds up the
    /// calls to every other node meanwhile.
    pub(super) async fn node_answers(&self, address: &Address) -> bool {
        let cmd = redis::cmd("PING");
        let ping = self.on_own_connection::<()>(address, &cmd);
        matches!(
            tokio::time::timeout(self.config.deadline, ping).await,
            Ok(Ok(()))
        )
    }

    /// Sends `cmd` to the cluster node at `address` on a new connection of
    /// its own, not through the cluster client.
    async fn on_own_connection<T: redis::FromRedisValue>(
        &self,
        address: &Address,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisError> {
        let mut conn = self.own_connection(address).await?;
        cmd.query_async::<T>(&mut conn).await
    }

    /// A new connection to the cluster node at `address`, reached like the
    /// first seed (scheme, credentials, TLS), with the backend's connect
    /// timeout. Every call on it has the tier's own time limit (the
    /// deadline, or more for a call that waits on Redis's side): the
    /// connection adds none of its own (the client's default would fail a
    /// call after half a second whatever the deadline).
    async fn own_connection(&self, address: &Address) -> Result<MultiplexedConnection, RedisError> {
        let Topology::Cluster(seeds) = &self.config.topology else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "not a cluster",
            )));
        };
        let Some(url) = seeds.first().map(|seed| node_url(seed, address)) else {
            return Err(RedisError::from((redis::ErrorKind::Client, "no seed")));
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.connect_timeout))
            .set_response_timeout(None);
        client(&url, &self.config.tls)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Sends `cmd` to the node at `address` (any node if `None`).
    pub(super) async fn on_node(
        &self,
        address: Option<&Address>,
        cmd: redis::Cmd,
    ) -> Result<Value, RedisError> {
        let conn = self.link().conn.clone();
        match (conn, address) {
            #[cfg(feature = "redis-cluster")]
            (Conn::Cluster(mut conn), Some((host, port))) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let to = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                conn.route_command(cmd, RoutingInfo::SingleNode(to)).await
            }
            (mut conn, _) => cmd.query_async(&mut conn).await,
        }
    }
}

/// Whether `e` says the key's slot is on the move (or moved).
fn moving(e: &RedisError) -> bool {
    matches!(e.code(), Some("TRYAGAIN" | "MOVED" | "ASK"))
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::Moved
                    | redis::ServerErrorKind::Ask
            )
        )
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
