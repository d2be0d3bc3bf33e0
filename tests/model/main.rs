//! An exhaustive model check of the fleet protocol (see docs/MODEL.md): the
//! Redis scripts as atomic actions, the clients' steps, pub/sub with its
//! losses, and Redis's faults, for small fleets. The same checks run on an
//! earlier, flawed form of the protocol (`Protocol::Old`) find each of its
//! bugs, which shows they guard against them.

mod cache;
mod client;
mod flight;
mod lock;
mod lock_redis;
mod members;
mod redis;
mod scripts;
mod tags;

/// Which protocol the model runs.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Protocol {
    /// The scripts and client steps as they are now.
    Current,
    /// An earlier form, without the fixes for Redis's faults.
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
    // The first failure of an episode starts no backoff: a request meets
    // one only after a second failure, so a third instance asks.
    fleet.instances = 3;
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
    assert_safe_with_failures(&check(fleet, &[]));
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
    assert_safe_with_failures(&check(fleet, &[]));
}

/// Every property but "a request shares a failure": with two instances of
/// one request each, no request is left to meet a backoff, which starts at
/// an episode's second failure (the three-instance check above finds one).
/// The markers those two failures leave are checked all the same.
fn assert_safe_with_failures(checker: &impl Checker<Fleet>) {
    for property in Fleet::new(Protocol::Current).properties() {
        match property.name {
            "a request shares a failure" => {}
            "an episode's backoff doubles" => {
                checker.assert_any_discovery(property.name);
            }
            name => checker.assert_no_discovery(name),
        }
    }
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

fn tags(mutation: Option<tags::Mutation>) -> tags::Tags {
    tags::Tags {
        instances: 2,
        requests: 1,
        keys: 1,
        invalidations: 1,
        lossy: true,
        faults: vec![tags::TagFault::Restart, tags::TagFault::Evict],
        max_faults: 1,
        mutation,
        initial: Some(60),
    }
}

/// Tag invalidation: two instances, one request each, one key, lost
/// messages, one restart or eviction of any one key (the table included).
#[test]
fn current_tag_invalidation_is_a_barrier_under_faults() {
    check(tags(None), &[]).assert_properties();
}

/// One instance serving two requests on two keys (its L1 across the
/// invalidation), the same faults.
#[test]
fn current_tag_invalidation_is_a_barrier_for_the_l1() {
    let mut model = tags(None);
    model.instances = 1;
    model.requests = 2;
    model.keys = 2;
    check(model, &[]).assert_properties();
}

/// Before the fix: a new epoch was not counted as a move, and a rebuild
/// that read its data before a purge landed on a lost table was stored
/// under the epoch begun after the purge (tests/tags/epoch_race.rs).
#[test]
fn old_tag_epoch_revives_a_rebuild_read_before_a_purge() {
    let c = check(
        tags(Some(tags::Mutation::EpochNotAMove)),
        &["tag invalidation is a barrier"],
    );
    found(&c, "tag invalidation is a barrier");
}

/// Each mutation of the mirrored scripts or of the engine's checks
/// (docs/MODEL.md, "What the checks catch") is caught.
#[test]
fn tag_mutations_are_caught() {
    use tags::Mutation::*;
    for mutation in [
        AdmitsIgnoresEpoch,
        BumpWithoutClock,
        StampIgnoresMoves,
        LostEpochKept,
        RemoteTrustsALapsedTable,
        NoReloadAfterAGap,
    ] {
        eprintln!("{mutation:?}:");
        let c = check(tags(Some(mutation)), &["tag invalidation is a barrier"]);
        found(&c, "tag invalidation is a barrier");
    }
}

/// Redis restarts empty on a host whose clock is behind the epoch the
/// instances knew: the next table read starts an epoch at `floor + 1`,
/// ahead of the clock. A purge moves its tag above that epoch (it moved it
/// to the clock alone before: `BumpBelowEpoch`, tests/tags/epoch_ahead.rs).
/// The tag was never purged before, so no instance remembers a generation
/// above the new epoch (see the next test).
#[test]
fn current_tag_purge_moves_above_an_epoch_ahead_of_the_clock() {
    let mut model = tags(None);
    model.faults = vec![tags::TagFault::RestartBehind];
    model.initial = None;
    check(model.clone(), &[]).assert_properties();
    model.mutation = Some(tags::Mutation::BumpBelowEpoch);
    let c = check(model, &["tag invalidation is a barrier"]);
    found(&c, "tag invalidation is a barrier");
}

/// The same restart when the instances remember a generation of the lost
/// table above the new epoch (a purge less than the clock's lag before the
/// restart): entries stamped under the new epoch record that generation,
/// and the next purge, from the slower clock, stays below it
/// (docs/MODEL.md, "Known limits").
#[test]
fn current_restart_on_a_slower_clock_loses_a_purge_below_a_remembered_generation() {
    let mut model = tags(None);
    model.faults = vec![tags::TagFault::RestartBehind];
    let c = check(model, &["tag invalidation is a barrier"]);
    found(&c, "tag invalidation is a barrier");
}

/// Failover to a replica that missed the purge's bump loses it: as for
/// `invalidate`, asynchronous replication is outside what the protocol
/// guarantees (docs/MODEL.md, "Known limits").
#[test]
fn current_failover_to_a_stale_replica_loses_a_tag_purge() {
    let mut model = tags(None);
    model.faults = vec![tags::TagFault::Failover];
    let c = check(model, &["tag invalidation is a barrier"]);
    found(&c, "tag invalidation is a barrier");
}

fn membership(mutation: Option<members::Mutation>) -> members::Members {
    members::Members {
        instances: 2,
        max_tick: 3,
        drops: 1,
        losses: 1,
        renew_failures: true,
        young_waits_a_lease: true,
        clock_jumps: false,
        mutation,
    }
}

/// The barrier with the membership on: two instances, keepalives and
/// renewals (which may fail), one subscription Redis drops unannounced, 3
/// ticks (one and a half leases).
#[test]
fn current_invalidation_is_a_barrier_with_membership() {
    let mut model = membership(None);
    model.losses = 0;
    check(model, &[]).assert_properties();
}

/// With the set lost too, a renewal still on its way when the barrier reads
/// a young set: the barrier waits a whole lease from the read, which covers
/// it; waiting only until the set is a lease old (the protocol before) did
/// not (docs/MODEL.md, "Known limits" of the old protocol).
#[test]
fn current_a_renewal_in_flight_after_a_set_loss_is_waited_for() {
    check(membership(None), &[]).assert_properties();
    let mut old = membership(None);
    old.young_waits_a_lease = false;
    let c = check(old, &["invalidate is a barrier with membership"]);
    found(&c, "invalidate is a barrier with membership");
}

/// A jump of Redis's clock by more than a lease removes every member as
/// expired while the set, read before the removal, counts as a lease old:
/// an instance whose subscription dropped unannounced is not waited for
/// (docs/MODEL.md, "Known limits").
#[test]
fn current_a_forward_jump_of_redis_clock_escapes_the_barrier() {
    let mut model = membership(None);
    model.losses = 0;
    model.clock_jumps = true;
    let c = check(model, &["invalidate is a barrier with membership"]);
    found(&c, "invalidate is a barrier with membership");
}

/// Each mutation of the barrier's wait or of members.lua is caught.
#[test]
fn membership_mutations_are_caught() {
    use members::Mutation::*;
    for mutation in [
        NoMembers,
        NoYoungWait,
        NoBornIsOld,
        ScoreShort,
        LeaseFromRenewal,
    ] {
        eprintln!("{mutation:?}:");
        let c = check(
            membership(Some(mutation)),
            &["invalidate is a barrier with membership"],
        );
        found(&c, "invalidate is a barrier with membership");
    }
}

/// Before the fix, a keepalive extended the subscription lease before its
/// membership renewal succeeded: with a renewal that fails (or lands after
/// the barrier read the members), the instance trusted its L1 past its
/// membership, and an invalidation in that window, with its subscription
/// dropped unannounced, did not wait for it (tests/invalidation/membership_renewal.rs).
#[test]
fn old_keepalive_trusts_the_l1_past_the_membership() {
    let mut model = membership(Some(members::Mutation::ConfirmBeforeRenew));
    model.renew_failures = true;
    let c = check(model, &["invalidate is a barrier with membership"]);
    found(&c, "invalidate is a barrier with membership");
}
