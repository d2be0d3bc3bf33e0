//! What the tier's own tests need: a real Redis (the integration tests'
//! server helper, shared rather than copied) and a tier connected to it.

use std::sync::Arc;
use std::time::Duration;

use super::config::TlsPem;
use super::connection::Topology;
use super::{RedisTier, TierConfig};

#[allow(dead_code)]
#[path = "../../../tests/common/redis.rs"]
mod server;

pub(crate) use server::RedisServer;

/// Settings with short times, so faults show fast.
pub(crate) fn config(url: &str) -> TierConfig {
    TierConfig {
        topology: Topology::Single(url.to_owned()),
        tls: TlsPem::default(),
        prefix: "sg".to_owned(),
        deadline: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        probe_interval: Duration::from_millis(20),
        outage_grace: Duration::ZERO,
    }
}

pub(crate) async fn connect(redis: &RedisServer) -> Arc<RedisTier> {
    RedisTier::connect(config(&redis.url()), Arc::new(|_| {}))
        .await
        .expect("tier connects")
}
