//! An exhaustive model check of the fleet protocol (see docs/MODEL.md): the
//! Redis scripts as atomic actions, the clients' steps, pub/sub with its
//! losses, and Redis's faults, for small fleets. The same checks on the
//! protocol as it was before the fleet-fault fixes find each old bug.

#[path = "model/cache.rs"]
mod cache;
#[path = "model/client.rs"]
mod client;
#[path = "model/flight.rs"]
mod flight;
#[path = "model/lock.rs"]
mod lock;
#[path = "model/lock_redis.rs"]
mod lock_redis;
#[path = "model/redis.rs"]
mod redis;
#[path = "model/scripts.rs"]
mod scripts;

/// Which protocol the model runs.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Protocol {
    /// The scripts and client steps as they are now.
    Current,
    /// As they were before the fleet-fault fixes.
    Old,
}

use std::collections::BTreeSet;

use cache::{Fault, Fleet};
use lock::Locks;
use stateright::{Checker, HasDiscoveries, Model};

/// Checks `model` exhaustively (BFS: the shortest counterexamples), or until
/// one of `wanted` is found.
fn check<M>(model: M, wanted: &[&'static str]) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + Send + Sync + PartialEq,
    M::Action: std::fmt::Debug + Clone + Send + Sync + PartialEq,
{
    let mut builder = model.checker().threads(2);
    if !wanted.is_empty() {
        builder = builder.finish_when(HasDiscoveries::AnyOf(
            wanted.iter().copied().collect::<BTreeSet<_>>(),
        ));
    }
    let checker = builder.spawn_bfs().join();
    eprintln!(
        "{} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker
}

/// Prints the counterexample for `name`, action by action.
fn found<M>(checker: &impl Checker<M>, name: &'static str)
where
    M: Model,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let path = checker.assert_any_discovery(name);
    eprintln!("counterexample for \"{name}\":");
    for (i, action) in path.into_actions().iter().enumerate() {
        eprintln!("  {:>2}. {action:?}", i + 1);
    }
}

fn fleet(protocol: Protocol) -> Fleet {
    let mut fleet = Fleet::new(protocol);
    fleet.max_tick = 2;
    fleet
}

/// The barrier: two instances, an invalidation, the subscription lease with
/// pings, pub/sub messages that may be lost.
#[test]
fn current_invalidation_is_a_barrier_under_lost_messages() {
    // One instance serving two requests, and the invalidator.
    let mut fleet = fleet(Protocol::Current);
    fleet.instances = 1;
    fleet.requests = 2;
    fleet.pings = true;
    fleet.lossy = true;
    fleet.max_tick = 3;
    check(fleet, &[]).assert_properties();
}

/// Fences: a restart or an eviction of any one key.
#[test]
fn current_fences_hold_under_restarts_and_evictions() {
    let mut fleet = fleet(Protocol::Current);
    fleet.invalidations = 0;
    fleet.faults = vec![Fault::Restart, Fault::Evict, Fault::Foreign];
    fleet.max_faults = 1;
    check(fleet, &[]).assert_properties();
}

/// Fences across a restart when the key was leased before the run (a
/// second lease before the restart): the same bounds as the old protocol's
/// counterexample below.
#[test]
fn current_fences_never_decrease_after_a_restart() {
    let mut fleet = fleet_restart(Protocol::Current);
    fleet.history = true;
    check(fleet, &[]).assert_properties();
}

#[test]
fn old_fences_go_backwards_after_a_restart() {
    let mut fleet = fleet_restart(Protocol::Old);
    fleet.history = true;
    let c = check(fleet, &["fences never decrease"]);
    found(&c, "fences never decrease");
}

/// Failed rebuilds leave the failure marker: the backoff doubles within an
/// episode and blocks the lease for at most the cap.
#[test]
fn current_failure_marker_backs_off_at_most_the_cap() {
    let mut fleet = fleet(Protocol::Current);
    fleet.failures = true;
    fleet.invalidations = 0;
    fleet.max_tick = 3;
    check(fleet, &[]).assert_properties();
}

/// No invalidation leaves a failure marker that still counts (one tick:
/// with an invalidation and its acknowledgements, each further tick
/// multiplies the space; the clock still runs past it while waiters sleep).
#[test]
fn current_failure_marker_never_outlives_an_invalidation() {
    let mut fleet = fleet(Protocol::Current);
    fleet.failures = true;
    fleet.max_tick = 1;
    check(fleet, &[]).assert_properties();
}

/// The failure marker under a restart or an eviction of any one key (the
/// marker's, the generation's included).
#[test]
fn current_failure_marker_holds_under_restarts_and_evictions() {
    let mut fleet = fleet(Protocol::Current);
    fleet.failures = true;
    fleet.invalidations = 0;
    fleet.faults = vec![Fault::Restart, Fault::Evict];
    fleet.max_faults = 1;
    check(fleet, &[]).assert_properties();
}

/// Leases: calls unanswered within their deadline, the watchdog.
#[test]
fn current_deadlines_leave_no_orphaned_lease() {
    let mut fleet = fleet(Protocol::Current);
    fleet.invalidations = 0;
    fleet.deadlines = true;
    fleet.watchdog = true;
    check(fleet, &[]).assert_properties();
}

/// A process dies holding the lease, or while waiting.
#[test]
fn current_holds_when_a_process_dies() {
    let mut fleet = fleet(Protocol::Current);
    fleet.deaths = true;
    fleet.deadlines = true;
    fleet.watchdog = true;
    fleet.invalidations = 0;
    fleet.max_tick = 3;
    check(fleet, &[]).assert_properties();
}

/// Failover to a replica that missed the last write breaks fencing on the
/// current protocol: replication is asynchronous, not consensus. This test
/// asserts the counterexample exists (docs/MODEL.md, "Known limits").
#[test]
fn current_failover_to_a_stale_replica_reuses_a_fence() {
    let mut fleet = fleet(Protocol::Current);
    fleet.invalidations = 0;
    fleet.faults = vec![Fault::Failover];
    fleet.max_faults = 1;
    fleet.history = true;
    fleet.max_tick = 1;
    let c = check(fleet, &["one rebuild per fence"]);
    found(&c, "one rebuild per fence");
}

#[test]
fn old_commit_after_a_restart_overwrites_a_newer_value() {
    let c = check(
        fleet_restart(Protocol::Old),
        &["no overwrite by an older lease"],
    );
    found(&c, "no overwrite by an older lease");
}

#[test]
fn old_restart_gives_two_rebuilds_one_fence() {
    let c = check(fleet_restart(Protocol::Old), &["one rebuild per fence"]);
    found(&c, "one rebuild per fence");
}

fn fleet_restart(protocol: Protocol) -> Fleet {
    let mut fleet = fleet(protocol);
    fleet.invalidations = 0;
    fleet.faults = vec![Fault::Restart];
    fleet.max_faults = 1;
    fleet
}

#[test]
fn old_invalidation_races_an_in_process_read() {
    let mut fleet = fleet(Protocol::Old);
    fleet.instances = 1;
    fleet.requests = 2;
    let c = check(fleet, &["invalidate is a barrier"]);
    found(&c, "invalidate is a barrier");
}

#[test]
fn old_deadline_leaves_an_orphaned_lease() {
    let mut fleet = fleet(Protocol::Old);
    fleet.invalidations = 0;
    fleet.deadlines = true;
    let c = check(fleet, &["orphan lease released by its holder"]);
    found(&c, "orphan lease released by its holder");
}

fn locks(protocol: Protocol) -> Locks {
    Locks {
        protocol,
        tasks: vec![1, 2],
        max_tick: 3,
        deaths: false,
        restarts: false,
        deadlines: true,
    }
}

/// Two tasks of one owner (one token): a lapsed guard against a newer hold.
fn locks_one_owner(protocol: Protocol) -> Locks {
    let mut model = locks(protocol);
    model.tasks = vec![1, 1];
    model
}

/// Three owners and one death: the queue behind a dead waiter.
fn locks_queue_death(protocol: Protocol) -> Locks {
    let mut model = locks(protocol);
    model.tasks = vec![1, 2, 3];
    model.deaths = true;
    model.deadlines = false;
    model.max_tick = 2;
    model
}

/// Three owners (two holds before a restart, one after) and one restart of
/// Redis with empty memory.
fn locks_restart(protocol: Protocol) -> Locks {
    let mut model = locks(protocol);
    model.tasks = vec![1, 2, 3];
    model.max_tick = 2;
    model.restarts = true;
    model.deadlines = false;
    model
}

/// Two owners, deadlines (abandoned attempts, lapsed guards, the watchdog).
#[test]
fn current_lock_holds_under_deadlines() {
    check(locks(Protocol::Current), &[]).assert_properties();
}

#[test]
fn old_abandoned_lock_attempt_is_waited_out() {
    let c = check(
        locks(Protocol::Old),
        &["abandoned hold released by its holder"],
    );
    found(&c, "abandoned hold released by its holder");
}

#[test]
fn current_lock_lapsed_guard_touches_no_newer_hold() {
    check(locks_one_owner(Protocol::Current), &[]).assert_properties();
}

#[test]
fn old_lapsed_guard_releases_a_newer_hold() {
    let c = check(
        locks_one_owner(Protocol::Old),
        &["lapsed guard touches no newer hold"],
    );
    found(&c, "lapsed guard touches no newer hold");
}

#[test]
fn current_lock_queue_survives_a_death() {
    check(locks_queue_death(Protocol::Current), &[]).assert_properties();
}

#[test]
fn old_lock_queue_stalls_on_a_free_lock() {
    let c = check(
        locks_queue_death(Protocol::Old),
        &["free lock taken within a heartbeat"],
    );
    found(&c, "free lock taken within a heartbeat");
}

#[test]
fn current_lock_fences_hold_across_a_restart() {
    check(locks_restart(Protocol::Current), &[]).assert_properties();
}

#[test]
fn old_lock_fences_go_backwards_after_a_restart() {
    let c = check(
        locks_restart(Protocol::Old),
        &["lock fences never decrease"],
    );
    found(&c, "lock fences never decrease");
}

#[test]
fn flight_map_hands_over_and_strands_nobody() {
    check(
        flight::Flights {
            tasks: 3,
            failures: 2,
        },
        &[],
    )
    .assert_properties();
}
