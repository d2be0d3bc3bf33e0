//! Calls on the node that serves a key: under a time limit, through (or,
//! for what the caller is owed, past) that node's circuit breaker, and
//! tried again while the key's slot is on the move.
//!
//! A slot being migrated answers `TRYAGAIN` to a script whose keys are
//! split between the two nodes for a moment, and a redirection the cluster
//! client gave up following reaches us as `MOVED` or `ASK`: the server is
//! up, so none of these counts as a failure; the call is made again, with
//! the same arguments, after a short pause that grows, while its time
//! lasts. The lock's acquisition loop relies on the same classification
//! ([`migrating`]) for its own retries.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;
use redis::{RedisError, Value};
use tokio::sync::OnceCell;

use super::breaker::answered;
use super::breaker::migrating;
use super::connection::{client, Topology};
use super::health::Address;
use super::{Conn, RedisTier, Shared, TierError};
use crate::metrics as m;

/// The first pause before a call that met a slot on the move is tried
/// again; it doubles up to [`MIGRATION_PAUSE_MAX`].
const MIGRATION_PAUSE: Duration = Duration::from_millis(5);
const MIGRATION_PAUSE_MAX: Duration = Duration::from_millis(50);

impl RedisTier {
    /// Runs one call on the node that serves `route` (a Redis key) under
    /// the deadline and that node's breaker. A failure signals the
    /// supervisor; the call itself never waits for it.
    pub(crate) async fn call<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.run(route, true, true, self.shared.config.deadline, call)
            .await
    }

    /// [`call`](Self::call) that is not tried again when it meets a slot on
    /// the move: the caller has something better to try first (a read that
    /// does not name the lease key).
    pub(crate) async fn call_once<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.run(route, true, false, self.shared.config.deadline, call)
            .await
    }

    /// [`call`](Self::call) with a limit other than the deadline (a call
    /// that waits on Redis's side, such as `WAIT`).
    pub(crate) async fn call_within<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        limit: Duration,
        call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.run(route, true, true, limit, call).await
    }

    /// A call the caller is owed whatever the breaker says (the commit of a
    /// rebuilt value, a lease given back): made even while the node's
    /// circuit is open, under the deadline, and counted like any call.
    pub(crate) async fn call_owed<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.run(route, false, true, self.shared.config.deadline, call)
            .await
    }

    async fn run<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        gated: bool,
        retry_moving: bool,
        limit: Duration,
        mut call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let shared = &self.shared;
        let breaker = shared.health.breaker(route);
        if gated && !breaker.is_closed() {
            return Err(TierError::Open);
        }
        let until = Instant::now() + limit;
        let mut pause = MIGRATION_PAUSE;
        // On a cluster, the call goes to the key's primary on a connection
        // of its own, not through the cluster client: that client rebuilds
        // its slot map and connections when a node fails, holding back
        // every call to every node meanwhile (for a whole connect timeout
        // while another node is frozen). A slot on the move is left to the
        // cluster client, which follows `ASK` and `MOVED`.
        let mut node = shared.health.node(route);
        let error = loop {
            let left = until.saturating_duration_since(Instant::now());
            let attempt = async {
                let conn = match &node {
                    Some(address) => Conn::Node(shared.node_conns.get(shared, address).await?),
                    None => self.conn(),
                };
                call(conn).await
            };
            let error = match tokio::time::timeout(left, attempt).await {
                Ok(Ok(value)) => {
                    breaker.success();
                    return Ok(value);
                }
                Ok(Err(e)) => TierError::Redis(e),
                Err(_) => TierError::Timeout,
            };
            if let Some(address) = &node
                && !answered(&error)
            {
                // Dead, frozen or gone: the next call connects again, to
                // whichever node the slot map names by then (a replica may
                // have taken the slots over).
                shared.node_conns.forget(address);
                shared.signals.slots_moved.notify_one();
            }
            if !retry_moving || !migrating(&error) {
                break error;
            }
            node = None;
            // The slot moved, or is moving: the map may be out of date.
            shared.signals.slots_moved.notify_one();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break error;
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MIGRATION_PAUSE_MAX);
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call failed");
        if answered(&error) {
            // Redis is up and answering (a script refused foreign bytes, a
            // key of the wrong type, a slot still on the move): nothing the
            // circuit could help with.
            return Err(error);
        }
        if shared.config.topology.needs_resolve() {
            shared.signals.call_failed.notify_one();
        }
        if breaker.failure() {
            shared.health.openings.fetch_add(1, Ordering::Relaxed);
            m::count_backend(m::CIRCUIT_OPENINGS);
            tracing::warn!(
                route,
                "redis failing; its keys are served from the in-process tier until it answers again"
            );
            shared.signals.circuit_opened.notify_one();
        }
        Err(error)
    }
}

/// A connection of its own to each cluster primary, opened once (by the
/// first call that needs it, or when the slot map is read) and dropped
/// when a call on it fails; only the primaries of the current slot map
/// keep theirs.
#[derive(Default)]
pub(crate) struct NodeConns {
    conns: std::sync::Mutex<HashMap<Address, Arc<OnceCell<MultiplexedConnection>>>>,
}

impl NodeConns {
    async fn get(
        &self,
        shared: &Shared,
        address: &Address,
    ) -> Result<MultiplexedConnection, RedisError> {
        let cell = self.lock().entry(address.clone()).or_default().clone();
        cell.get_or_try_init(|| shared.own_connection(address))
            .await
            .cloned()
    }

    fn forget(&self, address: &Address) {
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
    use bytes::Bytes;

    use super::super::testing::{connect, RedisServer};
    use super::super::{route, Fetched};
    use super::*;
    use crate::key::Key;

    const LONG: Duration = Duration::from_secs(60);

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

    /// Takes the lease of `key`, then opens its circuit (without asking the
    /// supervisor to probe, so it stays open).
    async fn leased_then_open(tier: &Arc<RedisTier>, key: &Key) -> Box<super::super::Lease> {
        let Ok(Fetched::Leased { lease, .. }) = tier.fetch_or_lease(key, LONG, None).await else {
            panic!("the lease of a new key");
        };
        let breaker = tier.shared.health.breaker(&route(key));
        for _ in 0..3 {
            let _ = breaker.failure();
        }
        assert!(!tier.is_available_for(key));
        assert!(matches!(
            tier.fetch_or_lease(key, LONG, None).await,
            Err(TierError::Open)
        ));
        lease
    }

    #[tokio::test]
    async fn a_commit_and_a_release_are_made_while_the_circuit_is_open() {
        let redis = RedisServer::start();
        let tier = connect(&redis).await;
        let key = Key::for_value("t", b"committed");
        let mut lease = leased_then_open(&tier, &key).await;
        let stored = tier.commit(
            &mut lease,
            Bytes::from_static(b"v1"),
            LONG,
            LONG,
            crate::metrics::Labels::of("test", "test"),
        );
        assert!(stored.await.expect("the commit reached Redis"));
        tier.shared.health.breaker(&route(&key)).close();
        match tier.fetch_or_lease(&key, LONG, None).await {
            Ok(Fetched::Fresh(remote)) => assert_eq!(&remote.bytes[..], b"v1"),
            _ => panic!("the committed entry is in Redis"),
        }

        let key = Key::for_value("t", b"released");
        let mut lease = leased_then_open(&tier, &key).await;
        assert!(tier.release(&mut lease, None).await.expect("released"));
        tier.shared.health.breaker(&route(&key)).close();
        assert!(
            matches!(
                tier.fetch_or_lease(&key, LONG, None).await,
                Ok(Fetched::Leased { .. })
            ),
            "the lease was given back"
        );
    }
}
