//! Instances in separate OS processes, as in production: one rebuild for the
//! fleet, and a lease holder killed with SIGKILL mid-rebuild.
//!
//! The child processes are this test binary started again with
//! `processes::child_node --exact --ignored` and a role in the environment.
#![cfg(feature = "redis")]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{send, Origin};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stampede_guard::{Backend, StampedeGuard};

/// A service instance in its own process. Killed when dropped.
struct Node {
    child: Child,
    lines: BufReader<ChildStdout>,
    port: u16,
}

impl Node {
    fn start(redis: &RedisServer, role: &str) -> Node {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                crate::common::child::test_name(module_path!(), "child_node").as_str(),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SG_CHILD_ROLE", role)
            .env("SG_REDIS_URL", redis.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child process");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let port = loop {
            let line = read_line(&mut lines);
            // libtest prints its own text on the same line first.
            if let Some((_, port)) = line.split_once("READY ") {
                break port.trim().parse().expect("port");
            }
        };
        Node { child, lines, port }
    }

    /// Waits for the child to print `word`.
    fn expect(&mut self, word: &str) {
        loop {
            if read_line(&mut self.lines).contains(word) {
                return;
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_line(lines: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    let n = lines.read_line(&mut line).expect("child output");
    assert!(n > 0, "child process exited early");
    line
}

type HttpClient =
    Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Empty<bytes::Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Behind a load balancer every instance sees the same public host name; the
/// host is part of the cache key, so the tests send one too.
const HOST: &str = "report.example";

fn request(url: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(url)
        .header(http::header::HOST, HOST)
        .body(http_body_util::Empty::new())
        .expect("request")
}

async fn get_text(client: &HttpClient, url: String) -> (u16, String) {
    let response = client.request(request(&url)).await.expect("request");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_rebuild() {
    let redis = RedisServer::start();
    let nodes: Vec<Node> = (0..3).map(|_| Node::start(&redis, "server")).collect();
    let client = client();
    let tasks: Vec<_> = (0..600)
        .map(|i| {
            let client = client.clone();
            let url = format!("http://127.0.0.1:{}/report", nodes[i % 3].port);
            tokio::spawn(async move { get_text(&client, url).await })
        })
        .collect();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "built"));
    }
    let mut calls = 0;
    for node in &nodes {
        let (_, n) = get_text(&client, format!("http://127.0.0.1:{}/calls", node.port)).await;
        calls += n.parse::<usize>().unwrap();
    }
    assert_eq!(calls, 1, "one origin call across three processes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_mid_rebuild_is_taken_over_after_its_lease() {
    let redis = RedisServer::start();
    let mut holder = Node::start(&redis, "stuck");
    let client = client();
    let stuck = {
        let client = client.clone();
        let url = format!("http://127.0.0.1:{}/report", holder.port);
        tokio::spawn(async move { client.request(request(&url)).await })
    };
    holder.expect("LEADING");

    // Two instances here wait on the holder's lease...
    let origin = Origin::default();
    let mut apps = Vec::new();
    let mut backends = Vec::new();
    for _ in 0..2 {
        let backend = Backend::redis(&redis.url()).await.unwrap();
        let o = origin.clone();
        apps.push(
            Router::new().route(
                "/report",
                get(move || {
                    let origin = o.clone();
                    async move {
                        origin.enter();
                        "built"
                    }
                })
                .layer(StampedeGuard::new(backend.clone()).lease(Duration::from_millis(800))),
            ),
        );
        backends.push(backend);
    }
    let waiters: Vec<_> = (0..100)
        .map(|i| {
            let app = apps[i % 2].clone();
            let request = http::Request::get("/report")
                .header(http::header::HOST, HOST)
                .body(axum::body::Body::empty())
                .unwrap();
            tokio::spawn(async move { send(&app, request).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...and the holder dies without a word.
    holder.kill();
    assert!(
        stuck.await.unwrap().is_err(),
        "the holder's client lost its connection"
    );

    for w in waiters {
        let answer = tokio::time::timeout(Duration::from_secs(15), w)
            .await
            .expect("no request hangs")
            .unwrap();
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (http::StatusCode::OK, "built")
        );
    }
    assert_eq!(
        origin.calls(),
        1,
        "one instance took over once the lease expired"
    );
    let by_timeout: u64 = backends
        .iter()
        .map(|b| b.stats().redis.unwrap().wakeups_by_timeout)
        .sum();
    assert!(
        by_timeout >= 1,
        "the waiters woke when the dead holder's lease ran out"
    );
}

/// Entry point of the child processes (does nothing when run directly).
#[test]
#[ignore = "started by the multi-process tests"]
fn child_node() {
    let (Ok(role), Ok(url)) = (
        std::env::var("SG_CHILD_ROLE"),
        std::env::var("SG_REDIS_URL"),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let backend = Backend::redis(&url).await.expect("redis");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let stuck = role == "stuck";
        let report = get(move || {
            let calls = c.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if stuck {
                    println!("LEADING");
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                "built"
            }
        })
        .layer(StampedeGuard::new(backend).lease(Duration::from_millis(800)));
        let app = Router::new().route("/report", report).route(
            "/calls",
            get(move || async move { calls.load(Ordering::SeqCst).to_string() }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("READY {}", listener.local_addr().expect("addr").port());
        // Bounded: the parent kills us long before this.
        let _ = tokio::time::timeout(Duration::from_secs(120), axum::serve(listener, app)).await;
    });
}
