//! Which circuit breaker guards a call.
//!
//! One server, or a primary behind Sentinel, is one node: one breaker. On
//! Redis Cluster every primary has its own, so one frozen or dead shard
//! costs only the keys whose slots it serves: a key's slot (CRC16 of its
//! hash tag) names its node in the slot map read with `CLUSTER SLOTS`, and
//! that node's breaker counts its failures. The map is read when the tier
//! connects and again by the supervisor when a circuit opens, at each probe,
//! when a call meets a slot on the move, and when a call's node fails. A node that leaves the map (its
//! replica took over its slots) takes its breaker with it: the slots' new
//! owner has a breaker of its own. A key whose slot the map does not name
//! (no map could be read yet) uses the tier's whole breaker.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use redis::Value;

use super::breaker::Breaker;
use super::round_trip::RoundTrip;

/// A node's address as the cluster names it.
pub(crate) type Address = (String, u16);

/// Slots of a cluster.
const SLOTS: u16 = 16384;

pub(crate) struct Health {
    /// One server, Sentinel, or a cluster slot no map names.
    whole: Arc<Breaker>,
    cluster: bool,
    map: RwLock<SlotMap>,
    /// Circuits opened since the tier started.
    pub openings: AtomicU64,
    /// The link's round trip, measured by pings nothing queues behind.
    pub round_trip: RoundTrip,
}

/// One cluster primary's circuit, as [`Health::circuits`] reads it.
pub(crate) struct NodeCircuit {
    pub address: Address,
    pub open: bool,
    pub openings: u64,
}

#[derive(Default)]
struct SlotMap {
    /// (first slot, last slot, primary), sorted by first slot.
    ranges: Vec<(u16, u16, Address)>,
    breakers: HashMap<Address, Arc<Breaker>>,
}

impl SlotMap {
    /// The primary that serves `slot`.
    fn owner(&self, slot: u16) -> Option<&Address> {
        let at = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        at.checked_sub(1)
            .and_then(|i| self.ranges.get(i))
            .filter(|(_, last, _)| slot <= *last)
            .map(|(_, _, node)| node)
    }
}

impl Health {
    pub(crate) fn new(cluster: bool) -> Self {
        Health {
            whole: Arc::default(),
            cluster,
            map: RwLock::default(),
            openings: AtomicU64::new(0),
            round_trip: RoundTrip::default(),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The breaker of the node that serves `route` (a Redis key).
    pub(crate) fn breaker(&self, route: &str) -> Arc<Breaker> {
        if !self.cluster {
            return self.whole.clone();
        }
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let node = map
            .owner(slot(route.as_bytes()))
            .and_then(|node| map.breakers.get(node));
        node.unwrap_or(&self.whole).clone()
    }

    /// The primary the slot map names for `route` (a Redis key), if any.
    pub(crate) fn node(&self, route: &str) -> Option<Address> {
        if !self.cluster {
            return None;
        }
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.owner(slot(route.as_bytes())).cloned()
    }

    /// Whether every circuit is closed.
    pub(crate) fn all_closed(&self) -> bool {
        self.open_circuits() == 0
    }

    /// How many circuits are open now.
    pub(crate) fn open_circuits(&self) -> u64 {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let nodes = map.breakers.values().filter(|b| !b.is_closed()).count() as u64;
        nodes.saturating_add(u64::from(!self.whole.is_closed()))
    }

    /// The nodes whose circuit is open, to probe each on its own.
    pub(crate) fn open_nodes(&self) -> Vec<(Address, Arc<Breaker>)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.breakers
            .iter()
            .filter(|(_, b)| !b.is_closed())
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect()
    }

    /// Each primary of the current map with its circuit: whether it is
    /// open, and how many times it opened (since the node joined the map),
    /// sorted by address.
    pub(crate) fn circuits(&self) -> Vec<NodeCircuit> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut circuits: Vec<NodeCircuit> = map
            .breakers
            .iter()
            .map(|(address, b)| NodeCircuit {
                address: address.clone(),
                open: !b.is_closed(),
                openings: b.openings(),
            })
            .collect();
        circuits.sort_by(|a, b| a.address.cmp(&b.address));
        circuits
    }

    /// The primaries of the current map.
    pub(crate) fn nodes(&self) -> Vec<Address> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.breakers.keys().cloned().collect()
    }

    /// The whole breaker (one server, Sentinel, or slots no map names).
    pub(crate) fn whole(&self) -> &Breaker {
        &self.whole
    }

    /// Takes a new slot map (`CLUSTER SLOTS`'s reply, from a node whose
    /// host is `asked`). Nodes still in it keep their breakers; a reply
    /// that does not parse changes nothing.
    pub(crate) fn update(&self, reply: &Value, asked: &str) -> bool {
        let Some(mut ranges) = parse_slots(reply, asked) else {
            return false;
        };
        ranges.sort_by_key(|(first, _, _)| *first);
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let mut breakers = HashMap::new();
        for (_, _, node) in &ranges {
            let breaker = map.breakers.get(node).cloned().unwrap_or_default();
            breakers.insert(node.clone(), breaker);
        }
        *map = SlotMap { ranges, breakers };
        true
    }
}

/// `CLUSTER SLOTS`: `[[first, last, [host, port, …], replicas…], …]`. A
/// host that is unknown (`NULL` with `cluster-preferred-endpoint-type
/// unknown-endpoint`, or `?`) or empty is the host of the node asked, as
/// the Cluster specification says.
fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<(u16, u16, Address)>> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok().filter(|n| *n < SLOTS),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let (first, last) = (int(fields.first()?)?, int(fields.get(1)?)?);
        let Value::Array(primary) = fields.get(2)? else {
            return None;
        };
        let host = match primary.first()? {
            Value::Nil => asked.to_owned(),
            v => text(v)?,
        };
        let host = if host.is_empty() || host == "?" {
            asked.to_owned()
        } else {
            host
        };
        let port = match primary.get(1)? {
            Value::Int(p) => u16::try_from(*p).ok()?,
            _ => return None,
        };
        if first > last || host.is_empty() {
            return None;
        }
        ranges.push((first, last, (host, port)));
    }
    Some(ranges)
}

/// A key's cluster slot: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, if not empty), or of the whole key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Redis Cluster's specification: CRC16("123456789") = 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"sg:{foo}:v"), slot(b"foo"));
        assert_eq!(slot(b"{}foo"), slot(b"{}foo"), "an empty tag hashes it all");
        assert_ne!(slot(b"{}foo"), slot(b""));
    }

    fn node(first: i64, last: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn each_primary_has_its_own_breaker_kept_across_maps() {
        let health = Health::new(true);
        let on_a = "{foo}"; // slot 12182
        let on_b = "{a}"; // slot 15495
        assert!(Arc::ptr_eq(&health.breaker(on_a), &health.breaker(on_b)));
        assert!(health.update(
            &Value::Array(vec![node(0, 13000, 7000), node(13001, 16383, 7001)]),
            "127.0.0.1"
        ));
        let a = health.breaker(on_a);
        assert!(!Arc::ptr_eq(&a, &health.breaker(on_b)));
        for _ in 0..3 {
            a.failure(std::time::Instant::now());
        }
        assert!(!health.breaker(on_a).is_closed());
        assert!(health.breaker(on_b).is_closed());
        assert_eq!(health.open_circuits(), 1);
        assert_eq!(health.open_nodes()[0].0 .1, 7000);
        let circuits = health.circuits();
        let seen: Vec<(u16, bool, u64)> = circuits
            .iter()
            .map(|c| (c.address.1, c.open, c.openings))
            .collect();
        assert_eq!(seen, [(7000, true, 1), (7001, false, 0)]);
        // The same map again keeps the open breaker; a failover that moves
        // the slots to another node leaves them with that node's.
        assert!(health.update(
            &Value::Array(vec![node(0, 13000, 7000), node(13001, 16383, 7001)]),
            "127.0.0.1"
        ));
        assert!(!health.breaker(on_a).is_closed());
        assert!(health.update(
            &Value::Array(vec![node(0, 13000, 7002), node(13001, 16383, 7001)]),
            "127.0.0.1"
        ));
        assert!(health.breaker(on_a).is_closed());
        assert!(health.all_closed());
        // Nonsense from the network changes nothing and panics nowhere.
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(5)]),
            Value::Array(vec![node(9, 3, 7000)]),
            Value::Array(vec![node(0, 99999, 7000)]),
            Value::Array(vec![node(0, 1, -1)]),
        ] {
            assert!(!health.update(&bad, "10.0.0.1"));
        }
        assert!(!Arc::ptr_eq(&health.breaker(on_a), &health.breaker(on_b)));
    }

    #[test]
    fn an_unknown_endpoint_is_the_node_asked_and_churn_keeps_no_breaker() {
        let health = Health::new(true);
        let unknown = |first: i64, last: i64, host: Value, port: i64| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![host, Value::Int(port)]),
            ])
        };
        // `cluster-preferred-endpoint-type unknown-endpoint` answers NULL;
        // a node without a hostname `?`. Slots 100-199 are nobody's.
        let reply = Value::Array(vec![
            unknown(0, 99, Value::Nil, 7000),
            unknown(200, 16383, Value::BulkString(b"?".to_vec()), 7001),
        ]);
        assert!(health.update(&reply, "10.0.0.9"));
        let mut nodes = health.nodes();
        nodes.sort();
        assert_eq!(
            nodes,
            [("10.0.0.9".to_owned(), 7000), ("10.0.0.9".to_owned(), 7001)]
        );
        let nobodys = (0..u32::MAX)
            .map(|n| format!("{{k{n}}}"))
            .find(|k| (100..200).contains(&slot(k.as_bytes())))
            .unwrap();
        assert_eq!(health.node(&nobodys), None);
        assert!(Arc::ptr_eq(
            &health.breaker(&nobodys),
            &health.breaker(&nobodys)
        ));
        // Failover after failover, each to a new address: only the current
        // primaries keep a breaker.
        for port in 8000..9000 {
            assert!(health.update(&Value::Array(vec![node(0, 16383, port)]), "x"));
        }
        assert_eq!(health.nodes().len(), 1);
    }

    #[test]
    fn one_server_has_one_breaker() {
        let health = Health::new(false);
        assert!(Arc::ptr_eq(&health.breaker("{a}"), &health.breaker("{b}")));
    }
}
