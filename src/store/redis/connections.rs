//! The tier's connections, and the one path every call to Redis takes.
//!
//! [`Connections`] owns the link (command and subscriber connections,
//! replaced as a whole when a Sentinel-managed primary moves or a cluster
//! subscription is opened again), the circuit breakers, the scripts, and on
//! a cluster a connection of its own to each primary that serves keys. The
//! supervisor repairs them; requests only call, and signal.
//!
//! A call runs on the node that serves a key: under a time limit, through
//! (or, for what the caller is owed, past) that node's circuit breaker, and
//! tried again while the key's slot is on the move. A slot being migrated
//! answers `TRYAGAIN` to a script whose keys are split between the two
//! nodes for a moment, and a redirection the cluster client gave up
//! following reaches us as `MOVED` or `ASK`: the server is up, so none of
//! these counts as a failure; the call is made again, with the same
//! arguments, after a short pause that grows, while its time lasts. The
//! lock's acquisition loop relies on the same classification
//! ([`migrating`](super::migrating)) for its own retries.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::{RedisError, Value};
use tokio::sync::Notify;

use super::breaker::Breaker;
use super::client::{self, Options};
use super::connection::{self, Conn, Link, Sink, Topology};
use super::error::{may_mend, ErrorMeaning};
use super::health::{Address, Health};
use super::keys::Keys;
use super::nodes::{self, NodeConns};
use super::notify::Notifier;
use super::outage::{Outage, Reading, Sign};
use super::round_trip;
use super::scripts::Scripts;
use super::{TierConfig, TierError, TierStats};
use crate::metrics as m;

/// Why the supervisor should act. The third reason, a lost subscriber
/// connection, is signalled by the notifier, which sees the push.
#[derive(Default)]
pub(crate) struct Signals {
    /// The breaker opened: probe until Redis answers.
    pub circuit_opened: Notify,
    /// A call failed behind Sentinel: ask where the primary is.
    pub call_failed: Notify,
    /// On a cluster, a call met a slot on the move: read the slot map.
    pub slots_moved: Notify,
    /// Behind Sentinel: the node said it is no primary; leave it.
    pub demoted: AtomicBool,
}

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

/// The tier's connections and what every call needs: shared by the tier's
/// components and its supervisor, so they go when all of them have.
pub(crate) struct Connections {
    /// The connections; replaced when a Sentinel-managed primary moves or a
    /// cluster subscription is opened again.
    link: RwLock<Arc<Link>>,
    pub(super) config: TierConfig,
    /// Every key and channel name.
    pub(super) keys: Keys,
    /// The namespace's event channel.
    pub(super) channel: String,
    /// This process's acknowledgement channel.
    pub(super) ack_channel: String,
    /// The circuit breakers (one per cluster primary): requests read their
    /// flags; only the supervisor closes them.
    pub(super) health: Health,
    /// Where the subscriber's pushes go.
    pub(super) notifier: Arc<Notifier>,
    pub(super) scripts: Scripts,
    /// How requests ask the supervisor for help.
    pub(super) signals: Signals,
    /// On a cluster, a connection of its own to each primary that serves
    /// keys (see [`Call`]).
    node_conns: NodeConns,
    /// The tier's counters (calls that failed).
    pub(super) stats: Arc<TierStats>,
    /// The outage running, if any: what is logged while Redis fails.
    pub(super) outage: Outage,
}

/// The longest pause between tries of a call made past the breaker.
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(200);

impl Connections {
    /// Reads the tier's state as a health report does, and has the outage
    /// log follow it (see [`Outage::follow`]): the one place the WARN and
    /// the INFO are decided.
    pub(crate) fn reading(&self, hint: Option<Sign>) -> Reading {
        self.outage
            .follow(self.notifier.liveness.grace(), hint, || {
                let reading = Reading {
                    reachable: self.health.all_closed(),
                    subscription_live: self.notifier.hears_everything(Instant::now()),
                    open_circuits: self.health.open_circuits(),
                };
                let cause = if !reading.reachable {
                    Some(Sign::CircuitOpened)
                } else if !reading.subscription_live {
                    Some(Sign::SubscriptionUnconfirmed)
                } else {
                    None
                };
                (cause, reading)
            })
    }

    /// A sign of trouble: the outage log follows the tier's state (the
    /// sign names the cause of an outage it begins), and the sign is
    /// counted in the outage running.
    pub(crate) fn sign(&self, sign: Sign) {
        self.reading(Some(sign));
        self.outage.sign(sign);
    }

    /// The link was found dropped and Redis refused a new connection
    /// (`error`), with no request calling: on one server or behind
    /// Sentinel the circuit opens now (counted as a failed call and an
    /// opening, as calls that fail would), so the health, the stats and
    /// the metrics of an idle instance say Redis is gone, and the
    /// supervisor probes until it answers. On a cluster each primary's
    /// circuit is opened by calls to it (or probes of it) only.
    pub(super) fn link_refused(&self, error: &RedisError) {
        if self.health.is_cluster() {
            return;
        }
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::REDIS_ERRORS);
        if self.health.whole().trip() {
            tracing::debug!(error = %error, "redis link dropped and refused; the circuit opened");
            self.circuit_opened();
        }
    }

    /// Counts a circuit that just opened, has the outage log follow, and
    /// wakes the supervisor to probe.
    fn circuit_opened(&self) {
        self.health.openings.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::CIRCUIT_OPENINGS);
        self.sign(Sign::CircuitOpened);
        self.signals.circuit_opened.notify_one();
    }

    /// Opens the connections and subscribes (see [`open`]), then loads the
    /// scripts. On a cluster, the slot map is read later, by
    /// [`refresh_slots`](Self::refresh_slots).
    pub(super) async fn connect(
        config: TierConfig,
        notifier: Arc<Notifier>,
        stats: Arc<TierStats>,
    ) -> Result<Self, RedisError> {
        let keys = Keys::new(&config.prefix);
        let channel = keys.channel();
        let ack_channel = notifier.ack_channel(&channel);
        let scripts = Scripts::new();
        let retired = Arc::default();
        let link = open(&config, &channel, &ack_channel, &notifier, retired).await?;
        // Scripts are not replicated with the data: loading them now spares
        // a request a NOSCRIPT retry inside its deadline, and tells a user
        // the server refuses them at once.
        let cluster = matches!(config.topology, Topology::Cluster(_));
        match load_scripts(&config, &link, &scripts).await {
            // On a cluster the scripts go to every primary, and one frozen
            // or paused must not keep the tier from the others: a node that
            // has not loaded them gets them on its first call (the
            // `NOSCRIPT` retry), as a new primary does.
            Err(e) if cluster && may_mend(&e) => {
                tracing::debug!(error = %e, "a cluster node has not loaded the scripts yet");
            }
            loaded => loaded?,
        }
        let health = Health::new(cluster);
        // The first measure of the link's round trip, so calls made before
        // the first keepalive are judged by it too (see `round_trip`).
        let mut conn = link.conn.clone();
        let sent = Instant::now();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<()>(&mut conn);
        if let Ok(Ok(())) = tokio::time::timeout(config.connect_timeout, ping).await {
            health.round_trip.sample(sent.elapsed(), config.deadline);
        }
        let outage = Outage::at(config.topology.address());
        Ok(Connections {
            link: RwLock::new(Arc::new(link)),
            config,
            keys,
            channel,
            ack_channel,
            health,
            notifier,
            scripts,
            signals: Signals::default(),
            node_conns: NodeConns::default(),
            stats,
            outage,
        })
    }

    /// The command connection (a cheap clone).
    pub(super) fn conn(&self) -> Conn {
        self.link().conn.clone()
    }

    pub(super) fn link(&self) -> Arc<Link> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Drops the connections: every call from now on fails at once, and
    /// the sockets close once the calls still running on them end.
    pub(super) fn close(&self) {
        let old = std::mem::replace(
            &mut *self.link.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(Link::closed()),
        );
        old.retired.store(true, Ordering::Release);
        self.node_conns.clear();
    }

    /// Opens new connections and swaps them in. Waiters are woken: messages
    /// sent while the old ones failed were lost.
    pub(super) async fn reopen(&self) -> Result<(), RedisError> {
        // Messages published before the new subscription are not heard,
        // and a link that fails after subscribing leaves the gap open.
        let retired = Arc::new(AtomicBool::new(false));
        let opening = self.notifier.opening(retired.clone());
        let before = self.link();
        let link = open(
            &self.config,
            &self.channel,
            &self.ack_channel,
            &self.notifier,
            retired,
        )
        .await?;
        let old = {
            let mut current = self.link.write().unwrap_or_else(|p| p.into_inner());
            opening.swapped_in();
            if !Arc::ptr_eq(&current, &before) {
                // Another reopen, begun later (a failover announced while
                // this one waited on the old primary), swapped in first:
                // keep it.
                link.retired.store(true, Ordering::Release);
                return Ok(());
            }
            std::mem::replace(&mut *current, Arc::new(link))
        };
        old.retired.store(true, Ordering::Release);
        self.notifier.wake_all();
        // Only once the new subscription is in use: on a new primary the
        // scripts spare requests a NOSCRIPT retry, but a load that fails or
        // hangs (a node frozen on a cluster, `SCRIPT LOAD` refused to the
        // user) only leaves them to that retry. Had it kept the link from
        // being swapped in, the gap would stay open, and the in-process
        // tier untrusted, for as long as the load failed.
        if let Err(e) = load_scripts(&self.config, &self.link(), &self.scripts).await {
            tracing::debug!(error = %e, "cannot load the scripts on the new connections yet");
        }
        Ok(())
    }

    /// A call on the node that serves `route` (a Redis key): by default
    /// under the deadline and that node's breaker, tried again while the
    /// key's slot is on the move (see [`Call`]).
    pub(crate) fn call<'a>(&'a self, route: &'a str) -> Call<'a> {
        Call {
            conns: self,
            route: Some(route),
            gate: Gate::Breaker,
            retry_moving: true,
            limit: self.config.deadline,
            until: None,
        }
    }

    /// A call on the link's connection (through the cluster client on a
    /// cluster), past the breaker, under the deadline: for calls that name
    /// no key of an entry (the lock's, the membership's) or that the
    /// caller is owed whatever the breaker says (see [`Call`]).
    pub(crate) fn call_past_breaker(&self) -> Call<'_> {
        Call {
            conns: self,
            route: None,
            gate: Gate::Owed,
            retry_moving: false,
            limit: self.config.deadline,
            until: None,
        }
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
    async fn owed_until<T, F, Fut>(
        &self,
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
            let deadline = self.config.deadline;
            let tried = if through_client {
                self.past_breaker(call(self.conn())).await
            } else {
                self.on_route(route, Gate::Background, false, deadline, &mut call)
                    .await
            };
            let error = match tried {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let moving = error.is_moving();
            let permanent = !moving && !error.retry_may_help();
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

    /// Tries on the node that serves `route` until it answers, `limit`
    /// passes, or (with `retry_moving`) the slot stops moving. A failure
    /// signals the supervisor; the call itself never waits for it.
    async fn on_route<T, F, Fut>(
        &self,
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
        let shared = self;
        let breaker = shared.health.breaker(route);
        if gate == Gate::Breaker && !breaker.is_closed() {
            return Err(TierError::Open);
        }
        // A call under the breaker waits for room on the connection (see
        // `Breaker::admit`); its time runs from then. The circuit may have
        // opened meanwhile.
        let _admitted = match gate {
            Gate::Breaker => {
                let permit = breaker.admit().await;
                if !breaker.is_closed() {
                    return Err(TierError::Open);
                }
                permit
            }
            Gate::Owed | Gate::Background => None,
        };
        let until = Instant::now() + limit;
        let mut pause = MIGRATION_PAUSE;
        // On a cluster, the call goes to the key's primary on a connection
        // of its own, not through the cluster client: that client rebuilds
        // its slot map and connections when a node fails, holding back
        // every call to every node meanwhile (for a whole connect timeout
        // while another node is frozen). A slot on the move is left to the
        // cluster client, which follows `ASK` and `MOVED`.
        let mut node = shared.health.node(route);
        let (error, sent) = loop {
            let sent = Instant::now();
            let left = until.saturating_duration_since(sent);
            let attempt = async {
                let conn = match &node {
                    Some(address) => {
                        Conn::Node(shared.node_conns.get(&shared.config, address).await?)
                    }
                    None => self.conn(),
                };
                call(conn).await
            };
            let error = match self.answer(&breaker, left, attempt).await {
                Ok(value) => {
                    breaker.success();
                    return Ok(value);
                }
                Err(error) => error,
            };
            if let Some(address) = &node
                && error.is_fault()
                && !matches!(error, TierError::Busy)
            {
                // Dead, frozen or gone: the next call connects again, to
                // whichever node the slot map names by then (a replica may
                // have taken the slots over).
                shared.node_conns.forget(address);
                shared.signals.slots_moved.notify_one();
            }
            if !retry_moving || !error.is_moving() {
                break (error, sent);
            }
            node = None;
            // The slot moved, or is moving: the map may be out of date.
            shared.signals.slots_moved.notify_one();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break (error, sent);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MIGRATION_PAUSE_MAX);
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call failed");
        if !error.is_fault() {
            // Redis is up and answering (a script refused foreign bytes, a
            // key of the wrong type, a slot still on the move): nothing the
            // circuit could help with.
            return Err(error);
        }
        if shared.config.topology.needs_resolve() {
            shared.signals.call_failed.notify_one();
        }
        if gate != Gate::Background && breaker.failure(sent) {
            tracing::debug!(
                redis_key = route,
                "redis failing; a circuit opened, its keys are served from the in-process tier"
            );
            shared.circuit_opened();
        }
        Err(error)
    }

    /// Tries `call` on the link's connection until Redis answers or `until`
    /// passes, at least once, each try under the deadline and none through
    /// the circuit breaker. Errors that no retry can mend (a refused
    /// script, a permission) end it at once.
    async fn past_breaker_until<T, F, Fut>(
        &self,
        until: Instant,
        mut call: F,
    ) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut pause = Duration::from_millis(5);
        loop {
            let error = match self.past_breaker(call(self.conn())).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let permanent = !error.retry_may_help();
            let left = until.saturating_duration_since(Instant::now());
            if permanent || left.is_zero() {
                return Err(error);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(RETRY_PAUSE_MAX);
        }
    }

    /// One try under the deadline, past the breaker. A
    /// failure is counted, and tells the supervisor (which follows a moved
    /// primary), like any call's.
    async fn past_breaker<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, TierError> {
        let shared = self;
        let error = match self
            .answer(shared.health.whole(), shared.config.deadline, call)
            .await
        {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        m::count_backend(m::REDIS_ERRORS);
        tracing::debug!(error = %error, "redis call past the breaker failed");
        if shared.config.topology.needs_resolve() {
            shared.signals.call_failed.notify_one();
        }
        Err(error)
    }

    /// How long a call under `limit` may go unanswered on this link: more
    /// than `limit` where the link's measured round trip needs it (see
    /// [`super::round_trip`]), at most the connect timeout.
    pub(super) fn patience(&self, limit: Duration) -> Duration {
        let longest = self.config.connect_timeout.max(limit);
        self.health.round_trip.silence(limit, longest)
    }

    /// Waits for `call`, sent now on a connection whose answers `node`
    /// hears, as [`super::round_trip`] says: it fails as
    /// [`TierError::Timeout`] once the connection has answered nothing for
    /// the silence that `limit` and the link's round trip allow, and as
    /// [`TierError::Busy`] once it has waited the longest any call waits
    /// (the connect timeout, or `limit` if longer) while the connection kept
    /// answering the calls sent before it.
    async fn answer<T>(
        &self,
        node: &Breaker,
        limit: Duration,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, TierError> {
        let sent = Instant::now();
        let longest = self.config.connect_timeout.max(limit);
        let silence = self.patience(limit);
        let mut end = sent + longest;
        let mut check = sent + silence;
        // A call given longer than the deadline (a big entry, a `WAIT`) may
        // hold the connection: the calls behind it hear nothing meanwhile.
        let busy = (limit > self.config.deadline).then(|| node.busy_until(sent + silence));
        let _busy = Busy(node, busy);
        tokio::pin!(call);
        loop {
            match tokio::time::timeout_at(check.min(end).into(), &mut call).await {
                Ok(Ok(value)) => {
                    node.heard(Instant::now());
                    return Ok(value);
                }
                Ok(Err(e)) => {
                    if e.is_server_reply() {
                        node.heard(Instant::now());
                    }
                    return Err(TierError::Redis(e));
                }
                Err(_) => {}
            }
            let late = Instant::now().saturating_duration_since(check.min(end));
            let late = match round_trip::look_again(&mut call).await {
                Ok(answer) => {
                    node.heard(Instant::now());
                    return answer.map_err(TierError::Redis);
                }
                Err(lag) => late.max(lag),
            };
            let now = Instant::now();
            let heard = node.last_heard().filter(|&at| at > sent);
            if now >= end {
                return Err(if heard.is_some() {
                    TierError::Busy
                } else {
                    TierError::Timeout
                });
            }
            match heard {
                Some(at) if at + silence > now => check = at + silence,
                _ if round_trip::behind(late, silence) => check = now + silence,
                // Behind a call that holds the connection for longer: not
                // silent, nor queued too long, before that call's time is up.
                _ if node.busy().is_some_and(|until| until > now) => {
                    let until = node.busy().map_or(now, |until| until.max(now));
                    end = end.max(until + silence);
                    check = until.max(now + silence);
                }
                _ => return Err(TierError::Timeout),
            }
        }
    }

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
            // No map yet: each seed on a connection of its own (one that
            // is frozen or paused costs its own turn only; through the
            // cluster client, the node it picks may be that one), then any
            // node, as the client picks it.
            nodes.extend(self.seeds().into_iter().map(Some));
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
                        let mut conn = self.node_conns.get(&self.config, address).await?;
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
            let reply = match tokio::time::timeout(self.patience(self.config.deadline), ask).await {
                Ok(Ok(reply)) => Some(reply),
                Ok(Err(e)) if e.is_server_reply() => None,
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
                        self.node_conns.get(&self.config, &node),
                    )
                    .await;
                }
                return true;
            }
        }
        false
    }

    /// Runs `call` for `route` (a Redis key) under `limit`, outside a
    /// key's call path (the fleet membership): on a cluster, on the tier's
    /// own connection to the primary the slot map names, not through the
    /// cluster client, whose rebuilds (a call met a dead node while another
    /// is frozen) hold back every call to every node for a connect
    /// timeout. A slot on the move is left to the cluster client, which
    /// follows the redirection; a node that did not answer has its
    /// connection dropped and the map read again.
    pub(super) async fn routed<T, F, Fut>(
        &self,
        route: &str,
        limit: std::time::Duration,
        mut call: F,
    ) -> Result<T, RedisError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let limit = self.patience(limit);
        let until = tokio::time::Instant::now() + limit;
        let Some(address) = self.health.node(route) else {
            let call = call(self.link().conn.clone());
            return client::with_timeout(limit, "calling redis", call).await;
        };
        let own = async {
            let conn = self.node_conns.get(&self.config, &address).await?;
            call(Conn::Node(conn)).await
        };
        match tokio::time::timeout_at(until, own).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.is_moving() => {
                self.signals.slots_moved.notify_one();
                let call = call(self.link().conn.clone());
                match tokio::time::timeout_at(until, call).await {
                    Ok(answer) => answer,
                    Err(_) => Err(client::timeout_error("calling redis")),
                }
            }
            Ok(Err(e)) => {
                if !e.is_server_reply() {
                    self.node_conns.forget(&address);
                    self.signals.slots_moved.notify_one();
                }
                Err(e)
            }
            Err(_) => {
                self.node_conns.forget(&address);
                self.signals.slots_moved.notify_one();
                Err(client::timeout_error("calling redis"))
            }
        }
    }

    /// The first seed's host: the node the cluster client asks first.
    fn seed_host(&self) -> String {
        let Topology::Cluster(seeds) = &self.config.topology else {
            return String::new();
        };
        seeds
            .first()
            .map(|seed| seed_address(seed).0)
            .unwrap_or_default()
    }

    /// The cluster's seeds that name a port, as node addresses.
    fn seeds(&self) -> Vec<Address> {
        let Topology::Cluster(seeds) = &self.config.topology else {
            return Vec::new();
        };
        let mut addresses: Vec<Address> = Vec::with_capacity(seeds.len());
        for (host, port) in seeds.iter().map(|seed| seed_address(seed)) {
            if let Some(port) = port
                && !host.is_empty()
                && !addresses.iter().any(|(h, p)| *h == host && *p == port)
            {
                addresses.push((host, port));
            }
        }
        addresses
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
            let limit = self.patience(self.config.deadline);
            if let Ok(Ok(_)) = tokio::time::timeout(limit, ping).await {
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
        let limit = self.patience(self.config.deadline);
        matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(())))
    }

    /// Sends `cmd` to the cluster node at `address` on a new connection of
    /// its own, not through the cluster client.
    async fn on_own_connection<T: redis::FromRedisValue>(
        &self,
        address: &Address,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisError> {
        let mut conn = nodes::own_connection(&self.config, address).await?;
        cmd.query_async::<T>(&mut conn).await
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

/// A seed URL's host (without brackets) and port, if it names one.
fn seed_address(seed: &str) -> (String, Option<u16>) {
    let rest = seed.split_once("://").map_or(seed, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()),
        _ => (hostport, None),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.to_owned(), port)
}

/// Clears a node's busy mark (see [`Breaker::busy_until`]) when the call
/// that set it ends, answered or not.
struct Busy<'a>(&'a Breaker, Option<u64>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(mark) = self.1 {
            self.0.not_busy(mark);
        }
    }
}

/// One call to Redis, with its options; made by [`Connections::call`] or
/// [`Connections::call_past_breaker`], and run by [`Call::run`]. Every call
/// the tier makes for a request, a commit, an invalidation or a lock goes
/// through it:
///
/// - `conns.call(route)`: on the node that serves `route`, under the
///   deadline and its breaker (refused while the circuit is open; a failure
///   counts towards opening it), tried again while the slot is on the move;
///   [`once`](Call::once) not tried again, [`within`](Call::within) under
///   another limit, [`owed`](Call::owed) made whatever the circuit says;
///   [`until`](Call::until) tried again past the breaker until Redis
///   answers or that instant passes (a try that meets a slot on the move is
///   followed by one through the cluster client; its failures do not count
///   towards opening the circuit);
/// - `conns.call_past_breaker()`: on the link's connection, one try under
///   the deadline, past the breaker; [`until`](Call::until) tried again
///   until Redis answers or that instant passes.
///
/// Errors that no retry can mend (a refused script, a permission) end the
/// retries at once. Every failure is counted.
#[must_use]
pub(crate) struct Call<'a> {
    conns: &'a Connections,
    /// The key whose node serves the call; `None`: the link's connection.
    route: Option<&'a str>,
    gate: Gate,
    retry_moving: bool,
    limit: Duration,
    /// Tried again until then.
    until: Option<Instant>,
}

impl Call<'_> {
    /// Not tried again when it meets a slot on the move: the caller has
    /// something better to try first (a read that does not name the lease
    /// key).
    pub(crate) fn once(mut self) -> Self {
        self.retry_moving = false;
        self
    }

    /// Under `limit` rather than the deadline (a call that waits on Redis's
    /// side, such as `WAIT`).
    pub(crate) fn within(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Owed to the caller whatever the breaker says (the commit of a
    /// rebuilt value, a lease given back): made even while the node's
    /// circuit is open, and counted like any call.
    pub(crate) fn owed(mut self) -> Self {
        self.gate = Gate::Owed;
        self
    }

    /// Tried again, past the breaker, each try under the deadline, until
    /// Redis answers or `until` passes (an invalidation, a lease or a
    /// lock given back).
    pub(crate) fn until(mut self, until: Instant) -> Self {
        self.until = Some(until);
        self
    }

    /// Runs `call` with a connection as the options say.
    pub(crate) async fn run<T, F, Fut>(self, call: F) -> Result<T, TierError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let Call {
            conns,
            route,
            gate,
            retry_moving,
            limit,
            until,
        } = self;
        match (route, until) {
            (Some(route), None) => conns.on_route(route, gate, retry_moving, limit, call).await,
            (Some(route), Some(until)) => conns.owed_until(route, until, call).await,
            (None, None) => {
                let mut call = call;
                conns.past_breaker(call(conns.conn())).await
            }
            (None, Some(until)) => conns.past_breaker_until(until, call).await,
        }
    }
}

/// Opens both connections and subscribes. The scripts are loaded after
/// (see [`load_scripts`]).
async fn open(
    config: &TierConfig,
    channel: &str,
    ack_channel: &str,
    notifier: &Arc<Notifier>,
    retired: Arc<AtomicBool>,
) -> Result<Link, RedisError> {
    let options = Options {
        connect_timeout: config.connect_timeout,
        deadline: config.deadline,
        tls: &config.tls,
        channel,
        ack_channel,
    };
    // Pushes from a link that has been replaced (closing down), or that
    // failed to open, are ignored.
    let sink = notifier.clone();
    let gone = retired.clone();
    let sink: Sink = Arc::new(move |push| {
        if !gone.load(Ordering::Acquire) {
            sink.on_push(push);
        }
    });
    connection::open(&config.topology, &options, sink, retired).await
}

/// Loads every script on `link`'s primaries (on a cluster, each of them).
async fn load_scripts(
    config: &TierConfig,
    link: &Link,
    scripts: &Scripts,
) -> Result<(), RedisError> {
    // All at once: on a connection that pipelines them they cost one round
    // trip, not one each (a Redis a network hop away would otherwise spend
    // the connect timeout on them).
    let mut loads = tokio::task::JoinSet::new();
    for script in scripts.all() {
        let (script, mut loader) = (script.clone(), link.conn.clone());
        loads.spawn(async move { script.load_async(&mut loader).await.map(drop) });
    }
    let load = async {
        while let Some(loaded) = loads.join_next().await {
            match loaded {
                Ok(loaded) => loaded?,
                Err(_) => return Err(client::timeout_error("loading the scripts")),
            }
        }
        Ok(())
    };
    client::with_timeout(config.connect_timeout, "loading the scripts", load).await
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::keys::route;
    use super::super::testing::{connect, RedisServer};
    use super::super::{Fetched, RedisTier};
    use super::*;
    use crate::key::Key;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_seed_names_its_node() {
        let at = |host: &str, port: Option<u16>| (host.to_owned(), port);
        assert_eq!(
            seed_address("rediss://u:p@10.0.0.7:7001/0"),
            at("10.0.0.7", Some(7001))
        );
        assert_eq!(seed_address("redis://[::1]:7002"), at("::1", Some(7002)));
        assert_eq!(seed_address("redis://[::1]"), at("::1", None));
        assert_eq!(seed_address("redis://a@b@seed"), at("seed", None));
        assert_eq!(seed_address("redis://seed:port"), at("seed", None));
    }

    /// Takes the lease of `key`, then opens its circuit (without asking the
    /// supervisor to probe, so it stays open).
    async fn leased_then_open(tier: &Arc<RedisTier>, key: &Key) -> Box<super::super::Lease> {
        let Ok(Fetched::Leased { lease, .. }) = tier.fetch_or_lease(key, LONG, None).await else {
            panic!("the lease of a new key");
        };
        let breaker = tier.conns.health.breaker(&route(key));
        for _ in 0..3 {
            let _ = breaker.failure(Instant::now());
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
        tier.conns.health.breaker(&route(&key)).close();
        match tier.fetch_or_lease(&key, LONG, None).await {
            Ok(Fetched::Fresh(remote)) => assert_eq!(&remote.bytes[..], b"v1"),
            _ => panic!("the committed entry is in Redis"),
        }

        let key = Key::for_value("t", b"released");
        let mut lease = leased_then_open(&tier, &key).await;
        assert!(tier
            .release(&mut lease, None, None)
            .await
            .expect("released"));
        tier.conns.health.breaker(&route(&key)).close();
        assert!(
            matches!(
                tier.fetch_or_lease(&key, LONG, None).await,
                Ok(Fetched::Leased { .. })
            ),
            "the lease was given back"
        );
    }
}
