//! The tier's two connections (commands, and the subscriber) on any of the
//! supported topologies: one server, Redis Cluster, or a primary found
//! through Sentinel.
//!
//! Every topology gives the tier the same thing: a command connection that
//! implements [`ConnectionLike`] (so scripts run on it unchanged) and a RESP3
//! subscriber whose pushes go to the notifier. Reconnection is the client's
//! job on one server and on a cluster (which also follows MOVED and ASK and
//! refreshes its slot map when a node is lost). A Sentinel-managed primary
//! can *move*: after a failover the old address is dead or a read-only
//! replica, so the tier asks the sentinels again and swaps both connections
//! (see [`Topology::needs_resolve`]).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, PushInfo, RedisError, RedisFuture, Value};

pub(crate) use super::client::Options;
use super::client::{client, with_timeout};
use super::error::ErrorMeaning;
use super::sentinel::{primary_error, resolve, resolve_by};
pub(crate) use super::topology::{missing_feature, Topology};

/// A command connection on any topology. Cheap to clone; clones share it.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// A connection of its own to one cluster node (see `calls`).
    Node(redis::aio::MultiplexedConnection),
    /// No connection: the tier was shut down. Every call fails at once.
    Closed,
}

fn closed<'a, T: Send + 'a>() -> RedisFuture<'a, T> {
    Box::pin(std::future::ready(Err(RedisError::from((
        redis::ErrorKind::Io,
        "the redis tier was shut down",
    )))))
}

impl Link {
    /// A link with no connections, swapped in when the tier shuts down.
    pub(crate) fn closed() -> Self {
        Link {
            conn: Conn::Closed,
            subscriber: Conn::Closed,
            primary: None,
            retired: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Closed => closed(),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Closed => closed(),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
            Conn::Node(c) => c.get_db(),
            Conn::Closed => 0,
        }
    }
}

/// The two connections of a tier, and (behind Sentinel) the primary's
/// address they were opened on.
pub(crate) struct Link {
    pub conn: Conn,
    /// Kept so the subscription lives as long as the link.
    pub subscriber: Conn,
    pub primary: Option<(String, u16)>,
    /// Set when the link is replaced: pushes from its subscriber (closing
    /// down) are then ignored.
    pub retired: Arc<std::sync::atomic::AtomicBool>,
}

/// Receives the subscriber's pushes.
pub(crate) type Sink = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// Opens both connections and subscribes to the event channel.
pub(crate) async fn open(
    topology: &Topology,
    options: &Options<'_>,
    sink: Sink,
    retired: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Link, RedisError> {
    let mut link = open_link(topology, options, sink).await?;
    link.retired = retired;
    Ok(link)
}

async fn open_link(
    topology: &Topology,
    options: &Options<'_>,
    sink: Sink,
) -> Result<Link, RedisError> {
    match topology {
        Topology::Single(url) => open_single(url, options, sink, None).await,
        #[cfg(feature = "redis-cluster")]
        Topology::Cluster(nodes) => open_cluster(nodes, options, sink).await,
        #[cfg(not(feature = "redis-cluster"))]
        Topology::Cluster(_) => Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Redis Cluster support is not compiled in (enable the `redis-cluster` feature)",
        ))),
        Topology::Sentinel {
            sentinels,
            service,
            master,
        } => {
            // A sentinel with a stale view may name a node that says it is
            // no primary, or one that refuses connections: ask the next
            // one, and ask it first from now on.
            let mut tries = sentinels.list().len();
            let ((host, port), link) = loop {
                let ((host, port), named_by) = resolve_by(sentinels, service, options).await?;
                let primary = Some((host.clone(), port));
                match open_single(&master.at(&host, port), options, sink.clone(), primary).await {
                    // A node that hangs is not tried past: its time is spent.
                    Err(e) if tries > 1 && e.is_stale_view() => {
                        tracing::debug!(error = %e, "a sentinel named no primary; asking the next");
                        sentinels.demote(&named_by);
                        tries -= 1;
                    }
                    link => {
                        let link = link.map_err(|e| primary_error(e, &host, port))?;
                        break ((host, port), link);
                    }
                }
            };
            // A failover may have happened while the connections opened (an
            // old primary frozen through it answers again, and still says
            // it is one): a primary the sentinels no longer name will not do.
            if resolve(sentinels, service, options).await? != (host, port) {
                return Err(RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                    "the primary moved while connecting to it",
                )));
            }
            Ok(link)
        }
    }
}

/// Whether the node behind `conn` says it is a primary (`ROLE`). A reply
/// of any other shape is no primary's; a refusal is an error.
pub(crate) async fn is_primary(conn: &Conn) -> Result<bool, RedisError> {
    let mut conn = conn.clone();
    let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
    Ok(match role {
        Value::Array(role) => matches!(role.first(), Some(Value::BulkString(r)) if r == b"master"),
        _ => false,
    })
}

async fn open_single(
    url: &str,
    options: &Options<'_>,
    sink: Sink,
    primary: Option<(String, u16)>,
) -> Result<Link, RedisError> {
    let client = client(url, options.tls)?;
    let base = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.deadline))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    // Every command call has the tier's own time limit (the deadline, or
    // more for a call that waits on Redis's side, such as a synced lock's
    // `WAIT`): the connection adds none of its own.
    let commands = base.clone().set_response_timeout(None);
    let conn = with_timeout(
        options.connect_timeout,
        "connecting to Redis",
        ConnectionManager::new_with_config(client.clone(), commands),
    )
    .await?;
    if primary.is_some() {
        // The sentinels may lag behind a failover: only a node that says
        // it is the primary will do.
        let node = Conn::Single(conn.clone());
        let check = with_timeout(
            options.connect_timeout,
            "asking the primary its role",
            is_primary(&node),
        );
        if !check.await? {
            return Err(RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "the node the sentinels named is not a primary (yet)",
            )));
        }
    }
    // The subscriber's commands (subscribing, the keepalive's ping) wait on
    // a link that may be a network hop away: the connect timeout bounds
    // them, not the deadline of a request's call.
    let sub_config = base
        .set_response_timeout(Some(options.connect_timeout))
        .set_push_sender(move |push| -> Result<(), redis::aio::SendError> {
            sink(push);
            Ok(())
        })
        .set_automatic_resubscription();
    let mut subscriber = with_timeout(
        options.connect_timeout,
        "connecting to Redis",
        ConnectionManager::new_with_config(client, sub_config),
    )
    .await?;
    with_timeout(options.connect_timeout, "subscribing", async {
        subscriber.subscribe(options.ack_channel).await?;
        subscriber.subscribe(options.channel).await
    })
    .await?;
    Ok(Link {
        conn: Conn::Single(conn),
        subscriber: Conn::Single(subscriber),
        primary,
        retired: Arc::default(),
    })
}

#[cfg(feature = "redis-cluster")]
async fn open_cluster(
    nodes: &[String],
    options: &Options<'_>,
    sink: Sink,
) -> Result<Link, RedisError> {
    use redis::cluster::ClusterClientBuilder;

    if nodes.iter().any(|n| n.starts_with("rediss:")) {
        super::client::require_crypto_provider()?;
    }
    let builder = |push: Option<Sink>| -> Result<redis::cluster::ClusterClient, RedisError> {
        // The subscriber's commands wait on a link that may be a network
        // hop away: the connect timeout bounds them, not a call's deadline.
        let response_timeout = match push {
            Some(_) => options.connect_timeout,
            None => options.deadline,
        };
        let mut b = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .use_protocol(redis::ProtocolVersion::RESP3)
            .connection_timeout(node_connect_timeout(options.connect_timeout))
            .response_timeout(response_timeout)
            .retries(2)
            // The client's own waits between tries must fit in the
            // deadline: a slot on the move (`TRYAGAIN`) is then reported to
            // the tier, which knows what to do with it, instead of every
            // such call timing out while the client sleeps.
            .min_retry_wait(1)
            .max_retry_wait(millis_of(options.deadline / 8).clamp(2, 200));
        if options.tls.ca.is_some() || options.tls.client.is_some() {
            #[cfg(feature = "redis-tls")]
            {
                b = b.certs(super::client::certificates(options.tls));
            }
            #[cfg(not(feature = "redis-tls"))]
            return Err(super::client::no_tls());
        }
        if let Some(sink) = push {
            b = b.push_sender(move |push| -> Result<(), redis::aio::SendError> {
                sink(push);
                Ok(())
            });
        }
        b.build()
    };
    let conn = match with_timeout(
        options.connect_timeout,
        "connecting to the Redis cluster",
        builder(None)?.get_async_connection(),
    )
    .await
    {
        Ok(conn) => conn,
        Err(e) if e.kind() == redis::ErrorKind::Io => {
            return Err(seed_error(nodes, options, e).await)
        }
        Err(e) => return Err(e),
    };
    let mut subscriber = with_timeout(
        options.connect_timeout,
        "connecting to the Redis cluster",
        builder(Some(sink))?.get_async_connection(),
    )
    .await?;
    // Classic pub/sub: a PUBLISH on any node reaches subscribers on every
    // node, so one subscription anywhere hears the whole fleet.
    with_timeout(options.connect_timeout, "subscribing", async {
        subscriber.subscribe(options.ack_channel).await?;
        subscriber.subscribe(options.channel).await
    })
    .await?;
    Ok(Link {
        conn: Conn::Cluster(conn),
        subscriber: Conn::Cluster(subscriber),
        primary: None,
        retired: Arc::default(),
    })
}

/// How long the cluster client waits for one node's connection. Opening
/// the client connects to the seeds, then to every primary of the slot
/// map, each round waiting for its slowest node: a node that accepts
/// connections but answers nothing (frozen, paused) must cost each round
/// less than a third of the connect timeout, so the client comes up with
/// the nodes that answer and the tier's connect does not fail for one bad
/// shard. The tier reaches that node later on a connection of its own
/// (see `nodes.rs`).
#[cfg(feature = "redis-cluster")]
fn node_connect_timeout(connect_timeout: Duration) -> Duration {
    (connect_timeout / 3).max(Duration::from_millis(1))
}

#[cfg(feature = "redis-cluster")]
fn millis_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The cluster client reports that no seed could be reached as an I/O error
/// that carries the last node's error as text only: a refused password and
/// a failed TLS handshake lose their kind. Asking one seed directly gets its
/// error whole; if the seed answers, the cluster's own error stands.
#[cfg(feature = "redis-cluster")]
async fn seed_error(nodes: &[String], options: &Options<'_>, cluster: RedisError) -> RedisError {
    let Some(seed) = nodes.first() else {
        return cluster;
    };
    let ask = async {
        let mut conn = client(seed, options.tls)?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await
    };
    match with_timeout(options.connect_timeout, "connecting to a cluster seed", ask).await {
        Err(seed) => seed,
        Ok(()) => cluster,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_topology_forms() {
        assert!(matches!(
            Topology::parse("redis://127.0.0.1:6379/").unwrap(),
            Topology::Single(u) if u == "redis://127.0.0.1:6379/"
        ));
        let Topology::Cluster(nodes) = Topology::parse("rediss-cluster://u:p@a:1,b:2").unwrap()
        else {
            panic!("cluster")
        };
        assert_eq!(nodes, ["rediss://u:p@a:1/", "rediss://u:p@b:2/"]);
        let Topology::Sentinel {
            sentinels,
            service,
            master,
        } = Topology::parse("redis-sentinel://:pw@s1:26379,s2:26379/cache/2").unwrap()
        else {
            panic!("sentinel")
        };
        assert_eq!(sentinels.list(), ["redis://s1:26379/", "redis://s2:26379/"]);
        assert_eq!(service, "cache");
        assert_eq!(master.at("10.0.0.5", 6380), "redis://:pw@10.0.0.5:6380/2");
        assert!(Topology::parse("redis-sentinel://s1:1").is_err());
        assert!(Topology::parse("redis-cluster://").is_err());
        assert!(Topology::parse("localhost:6379").is_err());
    }
}
