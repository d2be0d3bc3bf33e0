//! Sentinel with authentication everywhere: data nodes whose `default`
//! user is off and whose data user has exactly the rules docs/TOPOLOGY.md
//! gives, and sentinels that want a password (`requirepass`) or an ACL user
//! with exactly the documented sentinel rules. The cache's hits, leases,
//! wake-ups and a failover work as these users; a wrong password names
//! where it was refused; nothing the crate sends is denied.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::common::fleet::{fleet, fleet_burst, wait_until_available, wakeups, Instance};
use crate::common::sentinel::{Access, SentinelSetup, SERVICE};
use crate::common::{get as get_req, send, Origin, ROOMY_DEADLINE};
use stampede_guard::{Backend, ErrorKind, RedisConfig};

const DATA_ADMIN: (&str, &str) = ("admin", "admin-secret");

/// The rules of the `ACL SETUSER <user> …` block in docs/TOPOLOGY.md (the
/// user's name, `on` and its password left out).
fn documented_rules(user: &str) -> Vec<String> {
    let doc = include_str!("../../docs/TOPOLOGY.md");
    let start = format!("ACL SETUSER {user} on >secret ");
    let at = doc
        .find(&start)
        .unwrap_or_else(|| panic!("docs/TOPOLOGY.md gives no ACL for {user}"));
    let block = &doc[at + start.len()..];
    let end = block.find("```").expect("the ACL block ends");
    block[..end].split_whitespace().map(str::to_owned).collect()
}

/// Data nodes whose `default` user is off: `admin` for the harness, the
/// replicas and the sentinels, and `app` with exactly the documented rules.
fn data_nodes() -> Vec<String> {
    let mut args: Vec<String> = [
        "--user",
        "default",
        "off",
        "--user",
        DATA_ADMIN.0,
        "on",
        ">admin-secret",
        "~*",
        "&*",
        "+@all",
        "--user",
        "app",
        "on",
        ">app-secret",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(documented_rules("cache"));
    args
}

fn start(access: Access) -> SentinelSetup {
    let access = Access {
        data_admin: Some((DATA_ADMIN.0.into(), DATA_ADMIN.1.into())),
        ..access
    };
    let args = data_nodes();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    SentinelSetup::start_secured(1, &args, &access)
}

async fn connect(config: RedisConfig) -> Result<Backend, stampede_guard::Error> {
    stampede_guard::RedisBackendBuilder::from_config(config)
        .deadline(ROOMY_DEADLINE)
        .probe_interval(Duration::from_millis(100))
        .connect()
        .await
}

fn config(setup: &SentinelSetup, data_password: &str) -> RedisConfig {
    RedisConfig::new(setup.url_as(&format!("app:{data_password}@")))
}

/// What a data node denied (its `ACL LOG`, empty if nothing), read as the
/// harness's admin.
fn denials(node: &crate::common::redis::RedisServer) -> String {
    let url = format!(
        "redis://{}:{}@127.0.0.1:{}/",
        DATA_ADMIN.0,
        DATA_ADMIN.1,
        node.port()
    );
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("the harness's admin");
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut conn)
        .expect("ACL LOG");
    if log.is_empty() {
        String::new()
    } else {
        format!("{log:?}")
    }
}

/// A sentinel's `ACL LOG` (the sentinel runs no scripts): empty or not.
fn sentinel_denials(setup: &SentinelSetup) -> String {
    let log = setup.sentinel().raw(&["ACL", "LOG"]);
    // After the harness's own `+OK`: `*0` when nothing was denied.
    let reply = log.strip_prefix("+OK\r\n").unwrap_or(&log);
    if reply.starts_with("*0\r\n") {
        String::new()
    } else {
        reply.to_owned()
    }
}

/// The sentinel's subscribed clients (the instances' watches): their ids
/// and ages in seconds, from `CLIENT LIST`.
fn watches(setup: &SentinelSetup) -> Vec<(u64, u64)> {
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))?
            .parse()
            .ok()
    };
    setup
        .sentinel()
        .raw(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.split_whitespace().any(|f| f == "sub=1"))
        .filter_map(|line| Some((field(line, "id=")?, field(line, "age=")?)))
        .collect()
}

/// Until `check` holds, for at most `limit`.
async fn wait_for(what: &str, limit: Duration, check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !check() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Subscribers of the event channel, from `raw` on a data node.
fn subscribers(raw: impl Fn(&[&str]) -> String) -> u64 {
    let reply = raw(&[
        "EVAL",
        "return redis.call('PUBSUB', 'NUMSUB', 'sg:events')[2]",
        "0",
    ]);
    reply.trim_start_matches(':').parse().unwrap_or(0)
}

/// Three instances through the sentinels as `config`: one origin call for a
/// burst, the other instances woken by the channel, hits after; the watch
/// on the sentinel stays up (its keepalive is allowed); a failover is
/// followed and the fleet shares one origin call again on the new primary;
/// no node and no sentinel denied anything.
async fn the_fleet_works_as_these_users(setup: &SentinelSetup, config: RedisConfig) {
    // The refusals asked for before (wrong passwords) are forgotten.
    for node in [&setup.primary, &setup.replica] {
        assert_eq!(node.raw(&["ACL", "LOG", "RESET"]), "+OK");
    }
    assert!(setup
        .sentinel()
        .raw(&["ACL", "LOG", "RESET"])
        .ends_with("+OK\r\n"));
    let origin = Origin::default();
    let instances: Vec<Instance> = fleet(
        3,
        &origin,
        Duration::from_millis(100),
        || async { connect(config.clone()).await.expect("the documented users") },
        |g| g.ttl(Duration::from_secs(60)),
    )
    .await;
    let answers = fleet_burst(&instances, 60, || get_req("/report")).await;
    assert!(answers.iter().all(|a| a.text() == "v1"));
    assert_eq!(origin.calls(), 1, "one origin call for the fleet");
    let (by_message, by_timeout) = wakeups(&instances);
    assert!(
        by_message >= 1,
        "the other instances were woken by the channel"
    );
    assert_eq!(by_timeout, 0);
    let hits = fleet_burst(&instances, 30, || get_req("/report")).await;
    assert!(hits.iter().all(|a| a.x_cache() == "HIT"), "cache hits");
    assert_eq!(origin.calls(), 1);

    // Each instance watches the sentinel, and keeps its watch: its
    // keepalive (a ping every second) passes, so the watches that were
    // opened first live on, for three seconds at least, and none is
    // opened again.
    let opened: Vec<u64> = watches(setup).iter().map(|(id, _)| *id).collect();
    assert_eq!(opened.len(), 3, "one watch per instance");
    wait_for("the watches live on", Duration::from_secs(20), || {
        watches(setup).iter().all(|(_, age)| *age >= 3)
    })
    .await;
    let kept: Vec<u64> = watches(setup).iter().map(|(id, _)| *id).collect();
    assert_eq!(kept, opened, "no watch was lost or opened again");

    // A failover, asked of the sentinel: every instance follows (its
    // subscription moves to the new primary), and the fleet shares one
    // origin call for a new key there.
    assert!(
        setup
            .sentinel()
            .raw(&["SENTINEL", "FAILOVER", SERVICE])
            .contains("+OK"),
        "the sentinel starts a failover"
    );
    setup.wait_for_promotion(Duration::from_secs(30));
    wait_for(
        "every instance subscribes on the new primary",
        Duration::from_secs(30),
        || subscribers(|a| setup.replica.raw(a)) == 3,
    )
    .await;
    wait_until_available(&instances, Duration::from_secs(30)).await;
    // Each instance's next calls find the old primary demoted and make it
    // follow, if the announcement had not already: ask until a call on a
    // new key goes through with no error.
    for (n, instance) in instances.iter().enumerate() {
        let mut healthy = false;
        for i in 0..200 {
            let errors = instance.backend.stats().redis.unwrap().errors;
            send(&instance.app, get_req(&format!("/report/probe-{n}-{i}"))).await;
            let stats = instance.backend.stats().redis.unwrap();
            if stats.available && stats.errors == errors {
                healthy = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(healthy, "instance {n} follows the new primary");
    }
    let before = origin.calls();
    let after = fleet_burst(&instances, 60, || get_req("/report/after")).await;
    assert!(after.iter().all(|a| a.status == 200));
    assert_eq!(
        origin.calls() - before,
        1,
        "one origin call on the new primary"
    );
    let again = fleet_burst(&instances, 30, || get_req("/report/after")).await;
    assert!(again.iter().all(|a| a.x_cache() == "HIT"));

    // Nothing the crate sent was denied, on either data node or the
    // sentinel.
    assert_eq!(denials(&setup.primary), "", "old primary");
    assert_eq!(denials(&setup.replica), "", "new primary");
    assert_eq!(sentinel_denials(setup), "", "sentinel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_requirepass() {
    let setup = start(Access {
        sentinel_conf: vec!["requirepass s-secret".into()],
        sentinel_admin: Some(("default".into(), "s-secret".into())),
        ..Access::default()
    });

    // Asked without a password, the sentinel refuses: the error says so,
    // and does not blame the data nodes' credentials.
    let error = connect(config(&setup, "app-secret"))
        .await
        .expect_err("the sentinel wants a password");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(message.contains("at the sentinel"), "{message}");
    assert!(message.contains("asked without one"), "{message}");
    assert!(!message.contains("at the data node"), "{message}");

    // A wrong sentinel password.
    let mut wrong = config(&setup, "app-secret");
    wrong.sentinel_password = Some("not-it".into());
    let error = connect(wrong).await.expect_err("a wrong sentinel password");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(
        message.contains("refused the sentinel credentials"),
        "{message}"
    );
    assert!(!message.contains("s-secret") && !message.contains("not-it"));

    // The right sentinel password and a wrong data password: the data
    // node is named.
    let mut data_wrong = config(&setup, "not-it");
    data_wrong.sentinel_password = Some("s-secret".into());
    let error = connect(data_wrong)
        .await
        .expect_err("a wrong data password");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(message.contains("at the data node"), "{message}");
    assert!(!message.contains("at the sentinel"), "{message}");

    // The same in the URL's query: never printed.
    let in_url = |password: &str| {
        RedisConfig::new(format!(
            "{}?sentinel_password={password}",
            setup.url_as("app:app-secret@")
        ))
    };
    let error = connect(in_url("not-it"))
        .await
        .expect_err("a wrong sentinel password in the URL");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(
        message.contains("refused the sentinel credentials"),
        "{message}"
    );
    assert!(!message.contains("not-it"), "{message}");

    // Both right, in the URL: the password alone, as `requirepass` wants.
    the_fleet_works_as_these_users(&setup, in_url("s-secret")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_an_acl_user() {
    let mut watcher = "user watcher on >w-secret".to_owned();
    for rule in documented_rules("sentinel-watch") {
        watcher.push(' ');
        watcher.push_str(&rule);
    }
    let setup = start(Access {
        sentinel_conf: vec![
            "user default off".into(),
            "user admin on >s-admin ~* &* +@all".into(),
            watcher,
        ],
        sentinel_admin: Some(("admin".into(), "s-admin".into())),
        ..Access::default()
    });

    let as_watcher = |password: &str| {
        stampede_guard::RedisBackendBuilder::from_config(config(&setup, "app-secret"))
            .sentinel_auth("watcher", password)
    };
    let error = as_watcher("not-it")
        .connect()
        .await
        .expect_err("a wrong sentinel password");
    let message = crate::common::error_chain(&error).join(": ");
    assert_eq!(error.kind(), ErrorKind::Auth, "{message}");
    assert!(
        message.contains("refused the sentinel credentials"),
        "{message}"
    );

    let mut right = config(&setup, "app-secret");
    right.sentinel_user = Some("watcher".into());
    right.sentinel_password = Some("w-secret".into());
    the_fleet_works_as_these_users(&setup, right).await;
}

#[tokio::test]
async fn sentinel_credentials_without_sentinels_are_a_settings_error() {
    let error = Backend::redis_builder("redis://127.0.0.1:1/")
        .sentinel_auth("watcher", "w-secret")
        .connect()
        .await
        .expect_err("nothing to use them on");
    assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{error}");
    assert!(error.to_string().contains("names no sentinels"), "{error}");
}
