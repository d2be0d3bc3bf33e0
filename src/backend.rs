//! Where cached values live.
//!
//! A [`Backend`] owns the tiers every guard built on it shares: the byte-bounded
//! L1 and the in-process flights. Clone it freely; clones share everything, so
//! one backend serves every route of a service (and the generic
//! [`Cache`](crate::Cache) too), under one memory bound.

use std::fmt;
use std::sync::Arc;

use crate::engine::Engine;

/// Default L1 bound: 64 MiB of cached values.
pub const DEFAULT_L1_MAX_BYTES: u64 = 64 << 20;

/// The storage a [`StampedeGuard`](crate::StampedeGuard) runs on.
///
/// ```
/// use stampede_guard::Backend;
///
/// let embedded = Backend::local();
/// let small = Backend::builder().l1_max_bytes(8 << 20).build();
/// assert_eq!(small.l1_max_bytes(), 8 << 20);
/// # let _ = embedded;
/// ```
#[derive(Clone)]
pub struct Backend {
    pub(crate) engine: Arc<Engine>,
}

impl Backend {
    /// The embedded backend: an in-process L1 with in-process coalescing. It
    /// needs no server and protects one process.
    pub fn local() -> Self {
        Self::builder().build()
    }

    /// Settings for a backend.
    pub fn builder() -> BackendBuilder {
        BackendBuilder {
            l1_max_bytes: DEFAULT_L1_MAX_BYTES,
        }
    }

    /// Bytes the L1 holds now (entries are weighed by body, headers and a fixed
    /// overhead). Applies pending evictions first, so it is exact but not free:
    /// meant for diagnostics and tests, not the request path.
    pub fn l1_weighted_size(&self) -> u64 {
        self.engine.l1().weighted_size()
    }

    /// The L1's bound in bytes.
    pub fn l1_max_bytes(&self) -> u64 {
        self.engine.l1().max_bytes()
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("l1_max_bytes", &self.l1_max_bytes())
            .finish()
    }
}

/// Builds a [`Backend`].
#[derive(Clone, Debug)]
pub struct BackendBuilder {
    l1_max_bytes: u64,
}

impl BackendBuilder {
    /// Bound of the in-process tier, in bytes (default 64 MiB). A value larger
    /// than the whole bound is never kept in L1.
    pub fn l1_max_bytes(mut self, bytes: u64) -> Self {
        self.l1_max_bytes = bytes;
        self
    }

    /// Builds the backend.
    pub fn build(self) -> Backend {
        Backend {
            engine: Arc::new(Engine::new(self.l1_max_bytes)),
        }
    }
}
