//! The tier's one background task: it repairs the connections so that
//! requests never have to.
//!
//! Three things go wrong with a Redis out of a request's sight, and each
//! needs patience a request cannot afford (a request never waits longer than
//! the deadline, and only reads the breaker's flag):
//!
//! - **The circuit opened.** Redis failed several calls in a row. Probe it
//!   every probe interval (behind Sentinel, ask where the primary is first)
//!   until it answers, then close the circuit. On a cluster, each primary
//!   whose circuit is open is pinged itself, after reading the slot map.
//! - **A call failed behind Sentinel.** The primary may have moved: ask the
//!   sentinels now, rather than only once the circuit has opened, so an
//!   instance that was idle during a failover loses at most the call that
//!   found the old primary gone.
//! - **The subscriber lost its connection.** A subscriber sends no commands,
//!   so nothing would make its client reconnect, and a connection that died
//!   without a word only times out: open new connections (subscriber and
//!   command client; behind Sentinel, to the primary the sentinels name; on
//!   a cluster, once it is whole again) and swap them in.
//!
//! Beside those jobs, and never held up by them, the supervisor:
//!
//! - pings the subscriber every [`KEEPALIVE`]. An answer outside a gap in
//!   the subscription renews the subscription lease (see
//!   [`super::liveness`]); one during a gap renews nothing and asks for a
//!   resubscription; no answer within the
//!   deadline (a frozen link, a dead connection) means invalidations may go
//!   unheard from now on: the in-process tier is dropped at once, and the
//!   subscription opened again (then dropped again, since messages may
//!   have been missed meanwhile; with an outage grace, only once the
//!   grace ran out: see [`super::liveness`]);
//!   An answer also renews this instance's fleet membership (see
//!   [`super::barrier`]), which it leaves when it is stopped (the tier
//!   dropped or shut down, or the backend's last handle dropped);
//! - acknowledges other instances' invalidations (see [`super::barrier`]);
//! - retries, every probe interval, the invalidations that did not reach
//!   Redis, until they do;
//! - behind Sentinel, follows a failover a sentinel announces
//!   (`+switch-master`), and every [`ROLE_CHECK`] asks the sentinels where
//!   the primary is and the primary its role, so an instance whose calls
//!   keep succeeding on a replaced primary leaves it all the same.
//!
//! Requests and the subscriber only *signal* (a [`Notify`](tokio::sync::Notify) keeps one permit,
//! so a signal sent while the supervisor is busy is seen on its next turn,
//! and a burst folds into one). The task is owned: the tier holds its
//! [`SupervisorGuard`], and dropping the tier stops it, whatever it was
//! waiting on, in the manner of mini-redis's `DbDropGuard`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::PushKind;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::barrier::Barrier;
use super::client::Options;
use super::connection::{self, Topology};
use super::connections::Connections;
use super::error::ErrorMeaning;
use super::messages::AckDue;
use super::outage::Sign;
use super::round_trip;
use super::sentinel;

/// Stops the supervisor when dropped. The tier holds it, so the task lives
/// exactly as long as the tier.
pub(crate) struct SupervisorGuard {
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SupervisorGuard {
    /// Stops the supervisor and waits (at most `patience`) for it to end,
    /// having left the fleet's membership. Idempotent.
    pub(crate) async fn stop(&self, patience: Duration) {
        self.stop.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let abort = task.abort_handle();
            if tokio::time::timeout(patience, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Stops the supervisor without waiting for it (it still leaves the
    /// membership, on its own task).
    pub(crate) fn stop_now(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for SupervisorGuard {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Starts the supervisor of `shared` and `barrier` on the current runtime.
pub(crate) fn start(shared: Arc<Connections>, barrier: Arc<Barrier>) -> SupervisorGuard {
    let (stop, mut stopped) = watch::channel(false);
    let acks = shared.notifier.take_ack_queue();
    let task = tokio::spawn(async move {
        let stop = async { stopped.wait_for(|stop| *stop).await.is_ok() };
        let stopped_cleanly = tokio::select! {
            // A closed channel (the guard gone without a word) means the same.
            _ = stop => true,
            () = supervise(&shared) => false,
            () = keepalive(&shared, &barrier) => false,
            () = acknowledge(&barrier, acks) => false,
            () = watch_primary(&shared) => false,
            () = retry_pending(&shared, &barrier) => false,
        };
        // A clean stop leaves the fleet's membership, so invalidations stop
        // waiting for this instance at once.
        if stopped_cleanly {
            barrier.leave().await;
        }
    });
    SupervisorGuard {
        stop,
        task: std::sync::Mutex::new(Some(task)),
    }
}

/// Retries the pending invalidations every probe interval, until they
/// reach Redis.
async fn retry_pending(shared: &Connections, barrier: &Barrier) {
    let every = shared.config.probe_interval.max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        barrier.retry_pending().await;
    }
}

/// How often the supervisor checks that the subscriber still answers.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(1);

/// The subscription lease: how long after sending a ping that was answered
/// an instance trusts its L1, and how long an invalidation waits for an
/// instance that does not acknowledge. It is one constant for the whole
/// fleet, whatever each instance's deadline: an invalidator that waited a
/// lease shorter than a receiver's would return while that receiver still
/// trusts what it read before. A ping goes out every [`KEEPALIVE`], so a
/// live subscription renews it twice over before it runs out.
pub(crate) const SUBSCRIPTION_LEASE: Duration = Duration::from_secs(3);

/// Pings the subscriber every [`KEEPALIVE`]: an answer renews the
/// subscription lease; none means the subscription is lost.
async fn keepalive(shared: &Connections, barrier: &Barrier) {
    let mut tick = tokio::time::interval(KEEPALIVE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let sent = std::time::Instant::now();
        // A subscriber in a gap may answer pings without hearing the event
        // channel: its client reconnected, but could not subscribe again
        // (the channel refused to the user, say). A ping proves the
        // subscription live only if no gap was open when it was sent nor
        // once it was answered (a gap that opened and closed between the
        // two dropped the in-process tier when it closed).
        let subscribed = !shared.notifier.in_gap();
        let answer = ping_subscriber_answer(shared).await;
        if matches!(answer, Some(Ok(()))) {
            // Only a subscription just confirmed live keeps the membership,
            // and the in-process tier is trusted only as long as the
            // membership the invalidations wait for: a keepalive whose
            // renewal failed extends nothing.
            // The renewal runs under the deadline, as a request's call: a
            // link that cannot answer within it keeps no in-process tier
            // trusted, and its requests go to Redis, where the breaker
            // judges the link. (Only the first renewal, part of connecting,
            // has the connect timeout: see `RedisTier::connect`.)
            if !subscribed || shared.notifier.in_gap() {
                // Whatever left the gap open (a reopen that failed, a
                // resubscription the server refused), the supervisor
                // subscribes again, on new connections.
                tracing::debug!(
                    "redis subscriber answers, but its subscription is not back yet; \
                     the subscription lease is not renewed"
                );
                shared.notifier.disconnected.notify_one();
            } else if barrier.renew_membership(shared.config.deadline).await {
                shared.notifier.liveness.confirm(sent);
            }
            // A lease that ran out with no gap (a renewal that failed) is
            // seen here; a confirmation ends the outage.
            shared.reading(None);
        } else {
            tracing::debug!("redis subscriber does not answer; the subscription is opened again");
            shared.notifier.subscription_lost();
            shared.sign(Sign::SubscriberSilent);
            shared.notifier.disconnected.notify_one();
            // A failure, not a silence: the connection dropped.
            if matches!(&answer, Some(Err(e)) if refused(e)) {
                link_dropped(shared).await;
            }
        }
        shared.outage.summarise();
    }
}

/// The most acknowledgements handled in one batch.
const ACKS_PER_BATCH: usize = 4_096;

/// Acknowledges other instances' invalidations, in order, a batch at a
/// time (see [`super::acks`]).
async fn acknowledge(barrier: &Barrier, queue: Option<mpsc::Receiver<AckDue>>) {
    let Some(mut queue) = queue else {
        return std::future::pending().await;
    };
    // Everything queued meanwhile goes in one batch: under a burst of
    // invalidations, a few calls rather than one per invalidation.
    let mut due = Vec::new();
    while queue.recv_many(&mut due, ACKS_PER_BATCH).await > 0 {
        barrier.acknowledge_all(std::mem::take(&mut due)).await;
    }
    std::future::pending().await
}

/// What the supervisor has yet to do.
#[derive(Default)]
struct Work {
    probe: bool,
    follow: bool,
    resubscribe: bool,
    slots: bool,
}

async fn supervise(shared: &Connections) {
    let mut work = Work::default();
    loop {
        // A job that failed is tried again one probe interval later; a lone
        // follow runs at once; with nothing to do, sleep until signalled.
        let pause = if work.probe || work.resubscribe {
            Some(shared.config.probe_interval)
        } else if work.follow || work.slots {
            Some(Duration::ZERO)
        } else {
            None
        };
        let signalled = gather(shared, &mut work, pause).await;
        // A circuit that opened, a link lost: the outage log follows what a
        // health report reads now, however short the episode.
        shared.reading(None);
        if !signalled {
            continue;
        }
        // The probe asks the sentinels itself.
        let follow = std::mem::take(&mut work.follow) && !work.probe;
        let (probe, resubscribe) = (work.probe, work.resubscribe);
        // The probe reads the slot map itself.
        let slots = std::mem::take(&mut work.slots) && !probe;
        // One server, or Sentinel's primary: the probe first. Its ping
        // makes the old subscriber reconnect and subscribe again, which
        // ends the gap, and is usually all there is to do; a reopen running
        // beside it would find the gap still open and replace connections
        // that had just come back, marking a new gap just as requests found
        // fleet protection back (the in-process tier dropped, running
        // rebuilds detached: an origin call again).
        if probe && resubscribe && !shared.health.is_cluster() {
            work.probe &= !probe_once(shared).await;
            work.resubscribe &= !resubscribe_once(shared).await;
            shared.reading(None);
            continue;
        }
        // One task, but the jobs run side by side: a cluster that is not
        // whole yet must not hold back the probe, nor the other way round.
        let ((), probed, resubscribed) = tokio::join!(
            async {
                if follow {
                    follow_primary(shared).await;
                }
                if slots {
                    shared.refresh_slots().await;
                }
            },
            async { probe && probe_once(shared).await },
            async { resubscribe && resubscribe_once(shared).await },
        );
        work.probe &= !probed;
        work.resubscribe &= !resubscribed;
        shared.reading(None);
    }
}

/// Collects signals: until the first one if `pause` is `None` (then false
/// if a whole [`KEEPALIVE`] passed without one), else for the whole pause.
async fn gather(shared: &Connections, work: &mut Work, pause: Option<Duration>) -> bool {
    let until = Instant::now() + pause.unwrap_or(KEEPALIVE);
    loop {
        tokio::select! {
            () = shared.signals.circuit_opened.notified() => work.probe = true,
            () = shared.signals.call_failed.notified() => work.follow = true,
            () = shared.signals.slots_moved.notified() => work.slots = true,
            () = shared.notifier.disconnected.notified() => work.resubscribe = true,
            () = tokio::time::sleep_until(until) => return pause.is_some(),
        }
        if pause.is_none() {
            return true;
        }
    }
}

/// Whether the subscriber answers a ping. On one server or behind
/// Sentinel, a ping on a dropped connection is also what makes its client
/// reconnect and subscribe again.
/// It is given half a keepalive at least: a slow answer is no lost
/// subscription (the lease, not this limit, bounds how long a silent one is
/// trusted), and dropping the in-process tier for one costs the whole
/// fleet's L1 hits here. Its round trip is the link's (see
/// [`super::round_trip`]): nothing queues on the subscriber but the
/// channel's messages, so a link that grew slower is learned here.
async fn ping_subscriber(shared: &Connections) -> bool {
    matches!(ping_subscriber_answer(shared).await, Some(Ok(())))
}

/// The subscriber's answer to a ping ([`ping_subscriber`]): `None` if it
/// stayed silent past the limit, an error if its connection failed.
async fn ping_subscriber_answer(shared: &Connections) -> Option<Result<(), redis::RedisError>> {
    let ping = shared.ping_subscription();
    let limit = shared.patience(shared.config.deadline.max(KEEPALIVE / 2));
    let sent = Instant::now();
    let answer = round_trip::within(limit, shared.config.connect_timeout, ping).await;
    if matches!(answer, Some(Ok(()))) {
        shared
            .health
            .round_trip
            .sample(sent.elapsed(), shared.config.deadline);
    }
    answer
}

/// The subscriber's connection failed (it did not merely go silent): if a
/// new connection to the server is refused too, Redis is gone (killed,
/// restarting, its port closed), and the circuit opens now rather than
/// once requests find it so (see [`Connections::link_refused`]). An idle
/// instance tells the outage within a keepalive. Nothing else opens it
/// here: a silence (a timeout, the client's own response timeout
/// included) or a connection merely reset is left to the calls' deadlines
/// and the breaker, since a busy or slow link shows those too, and one
/// slow answer must not cost the fleet's protection.
async fn link_dropped(shared: &Connections) {
    if shared.health.is_cluster() || !shared.health.whole().is_closed() {
        return;
    }
    let limit = shared.patience(shared.config.deadline);
    // A connection that died answers its next call with the drop, and the
    // client reconnects on the one after: two pings, to reach the refusal.
    for _ in 0..2 {
        let mut conn = shared.conn();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<()>(&mut conn);
        match tokio::time::timeout(limit, ping).await {
            Ok(Err(error)) if error.is_connection_refusal() => {
                shared.link_refused(&error);
                return;
            }
            Ok(Err(error)) if refused(&error) => continue,
            _ => return,
        }
    }
}

/// Whether a connection failed rather than went silent or answered an
/// error: refused, reset, closed. A timeout (the client's own response
/// timeout included) is a silence, which a busy link shows too.
fn refused(error: &redis::RedisError) -> bool {
    !error.is_server_reply() && !error.is_timeout()
}

/// One probe: true once Redis answered and the circuit is closed.
async fn probe_once(shared: &Connections) -> bool {
    if shared.health.is_cluster() {
        return shared.probe_nodes().await;
    }
    if shared.config.topology.needs_resolve() {
        // The sentinels may be unreachable while the primary is fine: the
        // ping below decides either way.
        follow_primary(shared).await;
    }
    let link = shared.link();
    // Each ping has the silence a call has on this link (the keepalive,
    // which waits longer, is what teaches the tier a link that grew
    // slower); they go one after the other.
    let limit = shared.patience(shared.config.deadline);
    let ping = |mut conn: connection::Conn| async move {
        let cmd = redis::cmd("PING");
        let sent = Instant::now();
        match tokio::time::timeout(limit, cmd.query_async::<()>(&mut conn)).await {
            Ok(Ok(())) => Some(sent.elapsed()),
            _ => None,
        }
    };
    let command = ping(link.conn.clone()).await;
    if let Some(rtt) = command {
        shared.health.round_trip.sample(rtt, shared.config.deadline);
    }
    // The subscriber reconnects (and resubscribes) when used.
    if command.is_some() && ping(link.subscriber.clone()).await.is_some() {
        tracing::debug!("redis answers again; its circuit is closed");
        shared.health.whole().close();
        return true;
    }
    // The old connections may be dead without knowing it (a timeout does not
    // make the client reconnect): the next probe tries new ones.
    let reopen = tokio::time::timeout(shared.config.connect_timeout, shared.reopen());
    if let Ok(Ok(())) = reopen.await {
        tracing::debug!("redis connections opened again");
    }
    false
}

/// One attempt to subscribe again: true once done. A subscriber whose
/// client reconnected and subscribed again, or a link swapped in since the
/// request (either way the event channel's subscription ended the gap),
/// that answers a ping needs nothing more: a request made while a reopen
/// was under way (a keepalive answered during its gap) must not reopen
/// again once it is done, dropping the in-process tier a second time.
/// Otherwise new connections, at once: a connection that died without a
/// word (a dropped NAT entry, a half-open socket) only times out, and a
/// timeout does not make the client reconnect.
async fn resubscribe_once(shared: &Connections) -> bool {
    if !shared.notifier.in_gap() && ping_subscriber(shared).await {
        tracing::debug!("redis subscription re-established on its own connection");
        return true;
    }
    match tokio::time::timeout(shared.config.connect_timeout, shared.reopen()).await {
        Ok(Ok(())) => {
            tracing::debug!("redis subscription re-established");
            true
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot re-subscribe yet");
            if refused(&e) {
                link_dropped(shared).await;
            }
            false
        }
        Err(_) => false,
    }
}

/// Behind Sentinel: asks where the primary is now and, if it moved, opens
/// new connections to it and swaps them in. Waiters are woken, since
/// messages published on the new primary before the swap were not heard.
/// A node that said it is no primary (demoted, or a replica the client
/// reconnected to) is left as well, even while the sentinels still name it.
/// The sentinels are asked outside the reopen's time limit: each has its
/// own short one, so a hung sentinel costs only its own turn.
async fn follow_primary(shared: &Connections) {
    let Topology::Sentinel {
        sentinels, service, ..
    } = &shared.config.topology
    else {
        return;
    };
    let address = match sentinel::resolve(sentinels, service, &options(shared)).await {
        Ok(address) => address,
        Err(e) => {
            tracing::debug!(error = %e, "cannot ask the sentinels where the primary is");
            return;
        }
    };
    let demoted = shared.signals.demoted.swap(false, Ordering::AcqRel);
    if !demoted && shared.link().primary.as_ref() == Some(&address) {
        return;
    }
    match tokio::time::timeout(shared.config.connect_timeout, shared.reopen()).await {
        Ok(Ok(())) => {
            tracing::info!(host = %address.0, port = address.1, "redis primary moved; following it")
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot follow the redis primary yet"),
        Err(_) => tracing::debug!("cannot follow the redis primary yet"),
    }
}

fn options(shared: &Connections) -> Options<'_> {
    Options {
        connect_timeout: shared.config.connect_timeout,
        deadline: shared.config.deadline,
        tls: &shared.config.tls,
        channel: &shared.channel,
        ack_channel: &shared.ack_channel,
    }
}

/// Behind Sentinel: how often the supervisor asks the primary its role and
/// the sentinels where the primary is, whatever the calls say. Calls that
/// keep succeeding on a primary the sentinels have replaced (frozen through
/// the failover, then resumed) are no sign that it still is one.
pub(crate) const ROLE_CHECK: Duration = Duration::from_secs(1);

/// Behind Sentinel: the least time between two follows of announced
/// failovers.
const SWITCH_PACE: Duration = Duration::from_millis(100);

/// Behind Sentinel: follows a failover as soon as a sentinel announces it
/// (`+switch-master`), and checks the role every [`ROLE_CHECK`] in case the
/// announcement was missed (the sentinel watched is hung or gone).
async fn watch_primary(shared: &Connections) {
    let Topology::Sentinel { sentinels, .. } = &shared.config.topology else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(ROLE_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = None;
    // A watch is (re)opened at most once per check: a sentinel that
    // confirms the subscription and hangs up at once, every time, would
    // otherwise be asked again as fast as it answers.
    let mut may_watch = true;
    loop {
        if watching.is_none() && std::mem::take(&mut may_watch) {
            watching = sentinel::watch_switch(sentinels, &options(shared)).await;
        }
        enum Heard {
            Tick,
            Switch,
            Lost,
            Other,
        }
        let heard = {
            let announced = async {
                match watching.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => Heard::Tick,
                push = announced => match push.map(|p| p.kind) {
                    Some(PushKind::Message) => Heard::Switch,
                    Some(PushKind::Disconnection) | None => Heard::Lost,
                    Some(_) => Heard::Other,
                },
            }
        };
        match heard {
            Heard::Tick => {
                may_watch = true;
                // A hung sentinel keeps its connection open and announces
                // nothing: watch another one.
                if let Some((conn, _)) = watching.as_mut() {
                    let limit = sentinel::per_sentinel(&options(shared));
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<()>(conn);
                    if !matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(()))) {
                        watching = None;
                    }
                }
                let conn = shared.link().conn.clone();
                let limit = shared.config.deadline.max(KEEPALIVE / 4);
                let role = tokio::time::timeout(limit, connection::is_primary(&conn)).await;
                if let Ok(Ok(false)) = role {
                    tracing::warn!("the redis node is no primary any more; leaving it");
                    shared.signals.demoted.store(true, Ordering::Release);
                }
                shared.signals.call_failed.notify_one();
            }
            Heard::Switch => {
                tracing::info!("a sentinel announced a failover");
                shared.signals.call_failed.notify_one();
                // Announcements without end (a faulty sentinel, a primary
                // flapping) are followed at a pace: each follow asks every
                // sentinel on a new connection. What came meanwhile folds
                // into one more follow.
                tokio::time::sleep(SWITCH_PACE).await;
                if let Some((_, rx)) = watching.as_mut() {
                    let mut again = false;
                    while let Ok(push) = rx.try_recv() {
                        match push.kind {
                            PushKind::Message => again = true,
                            PushKind::Disconnection => {
                                watching = None;
                                break;
                            }
                            _ => {}
                        }
                    }
                    if again {
                        shared.signals.call_failed.notify_one();
                    }
                }
            }
            Heard::Lost => watching = None,
            Heard::Other => {}
        }
    }
}

#[cfg(test)]
mod tests;
