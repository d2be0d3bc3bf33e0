//! A real Redis Cluster on loopback: `redis-server --cluster-enabled yes`
//! per node, joined with `redis-cli --cluster create`. Every node is killed
//! and its directory removed when the cluster is dropped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::RedisServer;
use super::tls::free_port;

pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// `masters` primaries, each with `replicas` replicas.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_with(masters, replicas, &[])
    }

    /// The same, with extra settings for every node (`--user …`).
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        let count = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count).map(|_| start_node(extra)).collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli is installed");
        // It waits for every node to join, without end: a node that died
        // meanwhile must fail the test, not hang it.
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = create.try_wait().expect("redis-cli runs") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = create.kill();
                let _ = create.wait();
                panic!("redis-cli --cluster create did not finish in 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "redis-cli --cluster create");
        let cluster = Cluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(20));
        cluster.wait_until_replicas_synced(Duration::from_secs(20));
        cluster
    }

    /// Waits until every live node reports the cluster whole: state ok and
    /// all 16384 slots served by a healthy primary.
    pub fn wait_until_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let ok = self.nodes.iter().filter(|n| n.ping()).all(|n| {
                let info = n.raw(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the cluster did not become ok within {limit:?}");
    }

    /// Waits until every replica has finished its first sync.
    pub fn wait_until_replicas_synced(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let synced = self.nodes.iter().filter(|n| n.ping()).all(|n| {
                let info = n.raw(&["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            });
            if synced {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the replicas did not sync within {limit:?}");
    }

    /// Indexes of the live nodes that are primaries.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].ping()
                    && self.nodes[i]
                        .raw(&["INFO", "replication"])
                        .contains("role:master")
            })
            .collect()
    }

    /// Node URLs, for the cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The crate's own URL form for the cluster.
    pub fn url(&self) -> String {
        self.url_as("")
    }

    /// The URL form with credentials (`user:password@`).
    pub fn url_as(&self, userinfo: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis-cluster://{userinfo}{}", hosts.join(","))
    }

    /// Keys held by each live primary (DBSIZE).
    pub fn keys_per_master(&self) -> Vec<u64> {
        self.masters()
            .into_iter()
            .map(|i| {
                self.nodes[i]
                    .raw(&["DBSIZE"])
                    .trim_start_matches(':')
                    .parse()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Calls of a command summed over the live nodes.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.ping())
            .map(|n| n.command_calls().get(command).copied().unwrap_or(0))
            .sum()
    }
}

/// Waits until every replica of `primary` has acknowledged everything the
/// primary had written when this was called (its offsets in `INFO
/// replication`). Replication is asynchronous; this makes a test's
/// failover lose nothing, on purpose.
pub fn wait_replicated(primary: &RedisServer, limit: Duration) {
    let offset = |line: &str, key: &str| -> Option<u64> {
        line.split([',', ':'])
            .find_map(|f| f.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let info = primary.raw(&["INFO", "replication"]);
    let target = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("a primary's offset");
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let info = primary.raw(&["INFO", "replication"]);
        let acked: Vec<u64> = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("offset="))
            .filter_map(|l| offset(l, "offset="))
            .collect();
        if !acked.is_empty() && acked.iter().all(|&o| o >= target) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the replicas did not catch up within {limit:?}");
}

/// Ends the migration of `slot` from `source` to `target`: moves every key
/// the source still counts in the slot (`CLUSTER GETKEYSINSLOT`, which
/// names keys past their TTL that `KEYS` skips but `SETSLOT` still counts,
/// and keys written while the slot was on the move), gives the slot to the
/// target, then to the target on the source too, retried while the
/// source still holds keys of it.
pub fn finish_migration(source: &RedisServer, target: &RedisServer, slot: &str) {
    let dst = target.raw(&["CLUSTER", "MYID"]);
    let port = target.port().to_string();
    let migrate_all = || {
        let out = Command::new("redis-cli")
            .args([
                "-p",
                &source.port().to_string(),
                "CLUSTER",
                "GETKEYSINSLOT",
                slot,
                "1000",
            ])
            .output()
            .expect("redis-cli is installed");
        for key in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|k| !k.is_empty())
        {
            let reply = source.raw(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
            assert!(reply == "+OK" || reply == "+NOKEY", "{reply}");
        }
    };
    migrate_all();
    assert_eq!(
        target.raw(&["CLUSTER", "SETSLOT", slot, "NODE", &dst]),
        "+OK"
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let given = source.raw(&["CLUSTER", "SETSLOT", slot, "NODE", &dst]);
        if given == "+OK" {
            return;
        }
        assert!(given.contains("still hold keys"), "{given}");
        assert!(Instant::now() < give_up, "the slot kept keys on the source");
        migrate_all();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One cluster node. Its cluster bus port is picked again if it was taken
/// meanwhile (by another test's connection, say): with the same bus port,
/// every try on another client port would fail the same way.
fn start_node(extra: &[&str]) -> RedisServer {
    for _ in 0..5 {
        let bus = free_port().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            // Short enough that a lost primary is replaced within a
            // few seconds, long enough not to flap on a busy machine.
            "--cluster-node-timeout",
            "1000",
            // A replica may take over however long ago it last
            // heard from its primary (the test's data is idle).
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-port",
            &bus,
        ];
        args.extend_from_slice(extra);
        let Some(mut node) = RedisServer::try_start_with(&args) else {
            continue;
        };
        // A node answers on its client port before it binds its bus port,
        // and exits if that is taken: it must answer on both, and still be
        // up after, or the cluster would wait for it to join for ever.
        let bus: u16 = bus.parse().expect("a port number");
        if bus_listens(bus) && node.ping() {
            return node;
        }
        node.kill();
    }
    panic!("could not start a cluster node (is redis-server installed? scripts/test installs it)");
}

/// Whether a cluster bus port accepts connections, within two seconds.
fn bus_listens(port: u16) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}
