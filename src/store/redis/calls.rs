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

use redis::RedisError;

use super::breaker::answered;
use super::breaker::migrating;
use super::{Conn, RedisTier, Retryable, TierError};
use crate::metrics as m;

/// How a call treats the node's circuit breaker.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Refused while the circuit is open; its failures count.
    Breaker,
    /// Made whatever the circuit says (the caller is owed it); its
    /// failures count like any call's.
    Owed,
    /// Made whatever the circuit says, again and again in the background
    /// until it lands: its failures do not count (a retry against a slot
    /// still on the move would open the circuit of a node that answers).
    Background,
}

/// The first pause before a call that met a slot on the move is tried
/// again; it doubles up to [`MIGRATION_PAUSE_MAX`].
const MIGRATION_PAUSE: Duration = Duration::from_millis(5);
const MIGRATION_PAUSE_MAX: Duration = Duration::from_millis(50);

/// The longest pause between two tries of an owed call that failed.
const OWED_PAUSE_MAX: Duration = Duration::from_millis(200);

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
        self.run(
            route,
            Gate::Breaker,
            true,
            self.shared.config.deadline,
            call,
        )
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
        self.run(
            route,
            Gate::Breaker,
            false,
            self.shared.config.deadline,
            call,
        )
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
        self.run(route, Gate::Breaker, true, limit, call).await
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
        self.run(route, Gate::Owed, true, self.shared.config.deadline, call)
            .await
    }

    /// An owed call tried again until Redis answers or `until` passes (an
    /// invalidation, a lease given back in the background): each try on
    /// the node that serves `route` (on a cluster, the tier's own
    /// connection to it), under the deadline and past the breaker, its
    /// failures not counted towards opening it. A try that meets a slot on
    /// the move is followed by one through the cluster client, which
    /// follows `ASK` and `MOVED`; each try is one call, paced like a
    /// failed one (a slot on the move for long must not have every pending
    /// call ask again and again within its deadline). Errors that no retry
    /// can mend (a refused script, a permission) end it at once.
    pub(crate) async fn call_owed_until<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        until: Instant,
        mut call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut pause = MIGRATION_PAUSE;
        let mut through_client = false;
        loop {
            let deadline = self.shared.config.deadline;
            let tried = if through_client {
                self.call_past_breaker(call(self.conn())).await
            } else {
                self.run(route, Gate::Background, false, deadline, &mut call)
                    .await
            };
            let error = match tried {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let moving = migrating(&error);
            let permanent =
                !moving && matches!(&error, TierError::Redis(e) if !e.may_have_run_or_transient());
            let left = until.saturating_duration_since(Instant::now());
            if permanent || left.is_zero() {
                return Err(error);
            }
            if moving {
                // The cluster client follows the redirection (the calls in
                // the requests' path have the map read again).
                through_client = !through_client;
                if through_client {
                    continue;
                }
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(OWED_PAUSE_MAX);
        }
    }

    async fn run<T, F, Fut>(
        self: &Arc<Self>,
        route: &str,
        gate: Gate,
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
        if gate == Gate::Breaker && !breaker.is_closed() {
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
        if gate != Gate::Background && breaker.failure() {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::testing::{connect, RedisServer};
    use super::super::{route, Fetched};
    use super::*;
    use crate::key::Key;

    const LONG: Duration = Duration::from_secs(60);

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
