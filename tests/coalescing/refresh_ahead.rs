//! Lease-based refresh-ahead: a hot key is refreshed in the background a
//! margin before it expires, by one request in the process and one flight
//! in the fleet, while every request is served the still-fresh entry. Counts
//! origin calls and `x-cache` values; no latency is asserted.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use crate::common::fleet::{fleet, fleet_burst, instance, Instance};
use crate::common::redis::RedisServer;
use crate::common::{get as get_req, tally, Answer, Origin};
use stampede_guard::{Backend, StampedeGuard};

const TTL: Duration = Duration::from_millis(600);
const DELAY: Duration = Duration::from_millis(20);
/// Margin: max(2 x 20 ms, 200 ms) = 200 ms before expiry. The floor is wide
/// so a loaded machine still starts the refresh in time.
const FLOOR: Duration = Duration::from_millis(200);

fn configure(guard: StampedeGuard) -> StampedeGuard {
    guard.ttl(TTL).refresh_ahead(2.0, FLOOR)
}

/// Steady traffic for about two seconds after the first fill: the answers,
/// and how long it lasted.
async fn hot_traffic(instances: &[Instance]) -> (Vec<Answer>, Duration) {
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_secs(2) {
        answers.extend(fleet_burst(instances, 9, || get_req("/report")).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (answers, started.elapsed())
}

/// At most one refresh per refresh period (the ttl less the margin), plus
/// the first fill and one in flight at the end.
fn most_calls(elapsed: Duration) -> usize {
    2 + (elapsed.as_secs_f64() / (TTL - FLOOR).as_secs_f64()).ceil() as usize
}

#[tokio::test]
async fn a_hot_key_is_refreshed_ahead_and_nobody_waits_or_gets_stale() {
    let origin = Origin::default();
    let instances = [instance(Backend::local(), &origin, DELAY, configure)];
    let first = fleet_burst(&instances, 9, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1, "one fill");
    assert_eq!(tally(&first, "MISS"), 1);
    let (answers, elapsed) = hot_traffic(&instances).await;
    // Two seconds with a 600 ms ttl: the key was refreshed, never expired.
    assert!(origin.calls() >= 3, "refreshed: {} calls", origin.calls());
    assert_eq!(origin.peak(), 1, "one refresh at a time");
    assert_eq!(
        tally(&answers, "HIT"),
        answers.len(),
        "every request after the fill was served the fresh entry"
    );
    assert!(answers.iter().all(|a| a.status == 200));
    let most = most_calls(elapsed);
    eprintln!(
        "{} origin calls, {} answers in {elapsed:?}",
        origin.calls(),
        answers.len()
    );
    assert!(
        origin.calls() <= most,
        "{} calls in {elapsed:?}, at most {most}",
        origin.calls()
    );
}

#[tokio::test]
async fn across_three_instances_one_refresh_per_period_for_the_fleet() {
    let redis = RedisServer::start();
    let origin = Origin::default();
    let url = redis.url();
    let instances = fleet(
        3,
        &origin,
        DELAY,
        || async { Backend::redis(&url).await.expect("redis backend") },
        configure,
    )
    .await;
    fleet_burst(&instances, 9, || get_req("/report")).await;
    assert_eq!(origin.calls(), 1, "one fill for the fleet");
    let (answers, elapsed) = hot_traffic(&instances).await;
    assert!(origin.calls() >= 3, "refreshed: {} calls", origin.calls());
    assert_eq!(origin.peak(), 1, "never two refreshes at once in the fleet");
    // Nobody ran the origin in the foreground and nobody was served stale.
    // (A request on an instance whose copy another refreshed may coalesce
    // on the read of the new entry from Redis; it never waits for the
    // origin.)
    assert_eq!(tally(&answers, "MISS"), 0);
    assert_eq!(tally(&answers, "STALE"), 0);
    assert!(answers.iter().all(|a| a.status == 200));
    // K = 3 instances refreshing on their own would make three times as many.
    let most = most_calls(elapsed);
    eprintln!(
        "{} origin calls, {} answers in {elapsed:?}",
        origin.calls(),
        answers.len()
    );
    assert!(
        origin.calls() <= most,
        "{} calls in {elapsed:?}, at most {most} for the fleet",
        origin.calls()
    );
}
