//! The round-trips probe: Redis calls per request, path by path, on two
//! instances of the fleet mode.

use std::net::SocketAddr;
use std::time::Duration;

use crate::fleet::{Deps, Fleet, Mode, RoutePolicy};
use crate::load::{Conn, Status};
use crate::redis_setup::RedisSetup;
use crate::report::RoundTrips;
use crate::Error;

/// The x-cache values of a batch, as "HIT", or "MISS 1, COALESCED 19".
fn tally(statuses: &[Status]) -> String {
    let mut counts: Vec<(Status, usize)> = Vec::new();
    for s in statuses {
        match counts.iter_mut().find(|(c, _)| c == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((*s, 1)),
        }
    }
    counts.sort();
    if statuses.len() == 1 {
        return statuses[0].name().to_owned();
    }
    counts
        .iter()
        .map(|(s, n)| format!("{} {n}", s.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` GETs of `path` at once on `addr`, each on its own connection.
async fn concurrent(addr: SocketAddr, path: &str, n: usize) -> Result<Vec<Status>, Error> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Conn::connect(addr).await?);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let path = path.to_owned();
            tokio::spawn(async move { c.get(&path).await })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// Redis calls per request, path by path, on two instances of the fleet
/// mode: each step is run alone and the server's EVALSHA count read before
/// and after it, less the membership renewals the instances make in the
/// background meanwhile ([`RedisSetup::request_scripts`]).
pub async fn probe(
    deps: &Deps,
    redis: &mut RedisSetup,
    policy: RoutePolicy,
    delay: Duration,
) -> Result<Vec<RoundTrips>, Error> {
    let tag = format!("rt{}", std::process::id());
    let fleet = Fleet::start(Mode::Fleet, 2, policy, deps, &format!("hk:{tag}")).await?;
    let (a, b) = (fleet.addrs[0], fleet.addrs[1]);
    let mut conn_a = Conn::connect(a).await?;
    let mut conn_b = Conn::connect(b).await?;
    let mut rows = Vec::new();
    let key = format!("/item/{tag}-key");
    // Background work (a refresh, its commit) ends within the origin's delay
    // plus a few Redis calls; this is comfortably more.
    let settle = delay + Duration::from_millis(200);

    macro_rules! step {
        ($path:expr, $requests:expr, $body:expr) => {{
            let before = redis.request_scripts().await.unwrap_or(0);
            let statuses: Vec<Status> = $body;
            tokio::time::sleep(settle).await;
            let after = redis.request_scripts().await.unwrap_or(0);
            rows.push(RoundTrips {
                path: $path,
                requests: $requests,
                evalsha: after.saturating_sub(before),
                x_cache: tally(&statuses),
            });
        }};
    }

    step!("miss: the fleet's one rebuild (leader)", 1, {
        vec![conn_a.get(&key).await?]
    });
    step!("hit in this instance's L1", 1000, {
        let mut s = Vec::new();
        for _ in 0..1000 {
            s.push(conn_a.get(&key).await?);
        }
        s
    });
    step!("hit in Redis (another instance built it)", 1, {
        vec![conn_b.get(&key).await?]
    });
    let burst_key = format!("/item/{tag}-burst");
    step!("miss + 19 local waiters, one instance", 20, {
        concurrent(a, &burst_key, 20).await?
    });
    let waiter_key = format!("/item/{tag}-waiter");
    step!("miss on A + 1 waiter on B (woken, entry in publish)", 2, {
        let leader = {
            let key = waiter_key.clone();
            tokio::spawn(async move {
                let mut c = Conn::connect(a).await?;
                c.get(&key).await
            })
        };
        tokio::time::sleep(delay / 4).await;
        let waiter = conn_b.get(&waiter_key).await?;
        vec![leader.await??, waiter]
    });
    let many_key = format!("/item/{tag}-many");
    step!("miss on A + 10 waiters on B", 11, {
        let leader = {
            let key = many_key.clone();
            tokio::spawn(async move {
                let mut c = Conn::connect(a).await?;
                c.get(&key).await
            })
        };
        tokio::time::sleep(delay / 4).await;
        let mut s = concurrent(b, &many_key, 10).await?;
        s.push(leader.await??);
        s
    });
    // Let the first key go stale (inside its stale-while-revalidate window).
    tokio::time::sleep(policy.ttl + Duration::from_millis(50)).await;
    step!(
        "stale on A: served at once, refreshed in the background",
        1,
        { vec![conn_a.get(&key).await?] }
    );
    step!("stale on B: refresh finds A's new entry in Redis", 1, {
        vec![conn_b.get(&key).await?]
    });
    drop((conn_a, conn_b));
    fleet.stop().await;
    Ok(rows)
}
