//! The fleet mode's Redis: a URL, a temporary server or cluster this bench
//! starts, and the connections that read its command counters.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::{procs, Error};

/// Where the fleet mode's Redis is, and how to read its counters.
pub struct RedisSetup {
    pub url: String,
    /// One connection per node: a cluster counts its commands node by node.
    stats: Vec<MultiplexedConnection>,
    /// The temporary server, when we started one; stopped when dropped.
    _server: Option<procs::RedisServer>,
    /// The temporary cluster, when we started one; stopped when dropped.
    _cluster: Option<procs::RedisCluster>,
}

impl RedisSetup {
    /// EVALSHA calls so far, from `INFO commandstats`, summed over the
    /// nodes; every script call of the layer is one EVALSHA, so this counts
    /// its round trips.
    pub async fn evalsha(&mut self) -> Option<u64> {
        self.calls("evalsha").await
    }

    /// EVALSHA calls so far made for requests: less the fleet membership's
    /// renewals, which each instance makes every second in the background
    /// (`member_renew.lua`, one `ZSCORE` each: of the scripts requests run
    /// without invalidations or locks, no other reads a sorted set).
    pub async fn request_scripts(&mut self) -> Option<u64> {
        let evalsha = self.calls("evalsha").await?;
        Some(evalsha.saturating_sub(self.calls("zscore").await?))
    }

    /// Calls of `command` so far, from `INFO commandstats` (commands run
    /// by scripts included), summed over the nodes.
    async fn calls(&mut self, command: &str) -> Option<u64> {
        let prefix = format!("cmdstat_{command}:");
        let mut total = 0;
        for conn in &mut self.stats {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(conn)
                .await
                .ok()?;
            let calls: Option<u64> = info
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
                .and_then(|n| n.trim().parse().ok());
            // No line yet: no such call on this node since the last reset.
            total += calls.unwrap_or(0);
        }
        Some(total)
    }
}

pub async fn setup_redis(choice: &str, start_cluster: bool) -> Result<Option<RedisSetup>, Error> {
    let (url, server, cluster) = match choice {
        _ if start_cluster => {
            let server = procs::find_on_path("redis-server")
                .ok_or("--redis-cluster needs redis-server on PATH")?;
            let cli = procs::find_on_path("redis-cli")
                .ok_or("--redis-cluster needs redis-cli on PATH")?;
            let started = tokio::task::spawn_blocking(move || {
                procs::RedisCluster::start(&server, &cli, CLUSTER_MASTERS)
            });
            let cluster = started
                .await?
                .map_err(|e| format!("starting a Redis Cluster: {e}"))?;
            eprintln!(
                "redis: started a temporary {CLUSTER_MASTERS}-master Redis Cluster at {} \
                 (loopback, temp dirs; killed and removed at exit)",
                cluster.url()
            );
            (cluster.url(), None, Some(cluster))
        }
        "none" => return Ok(None),
        "auto" => {
            let Some(binary) = procs::find_on_path("redis-server") else {
                return Ok(None);
            };
            let started = tokio::task::spawn_blocking(move || procs::RedisServer::start(&binary));
            let server = match started.await? {
                Ok(server) => server,
                Err(e) => {
                    eprintln!("redis: redis-server is installed but did not start: {e}");
                    return Ok(None);
                }
            };
            eprintln!(
                "redis: started a temporary redis-server at {} (stopped at exit)",
                server.url()
            );
            (server.url(), Some(server), None)
        }
        url => (url.to_owned(), None, None),
    };
    let stats = match cluster_seeds(&url) {
        Some(seeds) => cluster_stats(&url, &seeds).await?,
        None => vec![connect_stats(&url).await?],
    };
    Ok(Some(RedisSetup {
        url,
        stats,
        _server: server,
        _cluster: cluster,
    }))
}

/// Primaries of the cluster `--redis-cluster` starts: the fewest Redis
/// Cluster accepts.
const CLUSTER_MASTERS: usize = 3;

async fn connect_stats(url: &str) -> Result<MultiplexedConnection, Error> {
    let client = redis::Client::open(url)?;
    let conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| format!("no answer from Redis at {url}"))??;
    Ok(conn)
}

/// For `redis[s]-cluster://[userinfo@]host:port,...`: one plain URL per
/// seed node, with the same scheme and credentials.
fn cluster_seeds(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.strip_suffix("-cluster")?;
    let rest = rest.trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    };
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{userinfo}{h}/"))
            .collect(),
    )
}

/// A stats connection to every primary of a cluster. The seeds in a URL
/// need not be all the nodes, so the list comes from `CLUSTER NODES` on the
/// first seed that answers. Replicas are left out: scripts run on primaries.
async fn cluster_stats(url: &str, seeds: &[String]) -> Result<Vec<MultiplexedConnection>, Error> {
    let mut last_error: Error = format!("no seed nodes in {url}").into();
    for seed in seeds {
        let mut conn = match connect_stats(seed).await {
            Ok(conn) => conn,
            Err(e) => {
                last_error = e;
                continue;
            }
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await?;
        // The seed's scheme and credentials, with each primary's address.
        let prefix = match seed.rsplit_once('@') {
            Some((prefix, _)) => format!("{prefix}@"),
            None => format!("{}://", seed.split_once("://").map_or("redis", |(s, _)| s)),
        };
        let mut conns = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.contains("master") || flags.contains("fail") || flags.contains("noaddr") {
                continue;
            }
            // `ip:port@bus-port[,hostname]`
            let host = addr.split(['@', ',']).next().unwrap_or(addr);
            conns.push(connect_stats(&format!("{prefix}{host}/")).await?);
        }
        if conns.is_empty() {
            return Err(format!("CLUSTER NODES at {seed} lists no primaries").into());
        }
        return Ok(conns);
    }
    Err(last_error)
}
