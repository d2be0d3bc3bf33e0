//! A route's flight settings: how its misses run in the engine (lease, wait
//! budget and what happens when it runs out, rebuild timeout, early refresh).
//! The engine knows no route; it is handed the [`FlightPolicy`] these make.

use std::time::Duration;

use http::StatusCode;

use crate::engine::{FlightPolicy, RefreshAhead};
use crate::metrics::Labels;
use crate::store::generations::Scope;

/// What a waiter does when the route's wait budget runs out before the
/// rebuild it is waiting on lands. See
/// [`StampedeGuard::on_wait_timeout`](crate::StampedeGuard::on_wait_timeout)
/// for an example.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitTimeout {
    /// Never an error for the client (the default): a request keeps waiting
    /// for its own process's rebuild, which is itself bounded (it waits for
    /// another instance's rebuild as long as that one may run, then rebuilds
    /// here; a rebuild runs at most the rebuild timeout). Waiters are never
    /// sent to the origin one by one when the budget runs out.
    FailOpen,
    /// Answer with this status and an empty body (503 or 504 are usual).
    /// Each waiter's budget is shortened at random by up to a tenth, so that
    /// waiters that came together do not all give up at the same instant;
    /// none of them calls the origin.
    Respond(StatusCode),
}

/// How long a rebuild may run by default before it is abandoned as failed.
pub(crate) const DEFAULT_REBUILD_TIMEOUT: Duration = Duration::from_secs(30);

/// How a route's misses run.
#[derive(Clone, Debug)]
pub(crate) struct FlightSettings {
    pub lease: Duration,
    pub wait_budget: Duration,
    pub on_wait_timeout: WaitTimeout,
    pub rebuild_timeout: Duration,
    pub early_refresh: Option<f64>,
    pub refresh_ahead: Option<RefreshAhead>,
    /// The route's namespace, as the generations name it.
    pub scope: Scope,
}

impl Default for FlightSettings {
    fn default() -> Self {
        FlightSettings {
            lease: Duration::from_secs(5),
            wait_budget: Duration::from_secs(10),
            on_wait_timeout: WaitTimeout::FailOpen,
            rebuild_timeout: DEFAULT_REBUILD_TIMEOUT,
            early_refresh: None,
            refresh_ahead: None,
            scope: Scope::ROOT,
        }
    }
}

impl FlightSettings {
    /// What the engine needs to know to run this route's misses.
    pub(crate) fn policy(&self, labels: Labels) -> FlightPolicy {
        FlightPolicy {
            lease: self.lease,
            wait_budget: self.wait_budget,
            fail_open: self.on_wait_timeout == WaitTimeout::FailOpen,
            rebuild_timeout: self.rebuild_timeout,
            early_refresh: self.early_refresh,
            labels,
            refresh_ahead: self.refresh_ahead,
            scope: self.scope,
        }
    }
}
