//! The backends a scenario runs on: the embedded one, and with the `redis`
//! feature a real redis-server's, at a call deadline a loaded machine meets.

use stampede_guard::Backend;

#[cfg(feature = "redis")]
use super::redis::RedisServer;

/// A backend on `redis` whose calls have [`ROOMY_DEADLINE`](super::ROOMY_DEADLINE):
/// for tests that count origin calls and whose subject is not the deadline.
#[cfg(feature = "redis")]
pub async fn redis_backend(redis: &RedisServer) -> Backend {
    Backend::redis_builder(&redis.url())
        .deadline(super::ROOMY_DEADLINE)
        .connect()
        .await
        .expect("redis backend")
}

/// The backends a test runs on, and the server that keeps them alive.
pub struct Backends {
    #[cfg(feature = "redis")]
    pub redis: RedisServer,
}

impl Backends {
    pub fn start() -> Self {
        Backends {
            #[cfg(feature = "redis")]
            redis: RedisServer::start(),
        }
    }

    /// One backend of each kind, by name: `embedded`, and `redis` with the
    /// `redis` feature.
    pub async fn each(&self) -> Vec<(&'static str, Backend)> {
        vec![
            ("embedded", Backend::local()),
            #[cfg(feature = "redis")]
            ("redis", self.instance().await),
        ]
    }

    /// Another instance's backend on the same Redis.
    #[cfg(feature = "redis")]
    pub async fn instance(&self) -> Backend {
        redis_backend(&self.redis).await
    }
}
