//! An instance in its own process stopped with SIGSTOP through a tag
//! purge: a request queued on its socket while it is stopped, and one sent
//! after it has run again for a while, never get what it held before the
//! purge.
//!
//! The child process is this test binary started again with
//! `stopped_process::child_tagged_node --exact --ignored`.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::fleet::backend_at;
use crate::common::redis::RedisServer;
use crate::common::ROOMY_DEADLINE;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use stampede_guard::{Backend, StampedeGuard};

/// An instance in its own process, killed when dropped.
struct Process {
    child: Child,
    port: u16,
}

impl Process {
    fn start(redis: &RedisServer) -> Process {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                crate::common::child::test_name(module_path!(), "child_tagged_node").as_str(),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SG_CHILD_REDIS_URL", redis.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child process");
        let mut lines: BufReader<ChildStdout> =
            BufReader::new(child.stdout.take().expect("stdout"));
        let port = loop {
            let mut line = String::new();
            let n = lines.read_line(&mut line).expect("child output");
            assert!(n > 0, "child process exited early");
            if let Some((_, port)) = line.split_once("READY ") {
                break port.trim().parse().expect("port");
            }
        };
        // Its output is no longer read: keep the pipe drained.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while lines.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        Process { child, port }
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET http://127.0.0.1:<port><path>` on a fresh connection: its body.
async fn http_get(port: u16, path: &str) -> String {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let request = http::Request::get(format!("http://127.0.0.1:{port}{path}"))
        .header(http::header::HOST, "shop.example")
        .body(http_body_util::Empty::new())
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .expect("the child answers")
        .expect("response");
    let body = response.into_body().collect().await.expect("body");
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

/// The child is a fleet member; it is stopped (SIGSTOP) after it cached
/// two products tagged `catalog`, and another instance purges `catalog`.
/// The purge cannot be acknowledged by the stopped child; it returns `Ok`
/// after a subscription lease. Then: a request queued on the child's
/// socket while it was stopped is answered as soon as it runs again (with
/// the purge message unread in its subscriber's socket), and another is
/// sent once it has run for a while (its keepalive answered again). Neither
/// may be the copy built before the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_serves_nothing_old_once_it_runs_again() {
    let redis = RedisServer::start();
    let node = Process::start(&redis);
    for path in ["/products/1", "/products/2"] {
        assert_eq!(http_get(node.port, path).await, format!("{path}:c1"));
        assert_eq!(http_get(node.port, path).await, format!("{path}:c1"));
    }
    let purger = StampedeGuard::new(backend_at(&redis.url(), ROOMY_DEADLINE).await);
    node.signal(libc::SIGSTOP);
    let purged = purger.invalidate_tag("catalog").await;
    purged.expect("the purge returns Ok after one subscription lease");
    // Queued while the child is stopped: the kernel accepts the connection.
    let port = node.port;
    let queued = tokio::spawn(async move { http_get(port, "/products/1").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.signal(libc::SIGCONT);
    let first = queued.await.expect("request");
    assert_ne!(
        first, "/products/1:c1",
        "a request queued while the instance was stopped got the copy from before the purge"
    );
    // Long enough for a keepalive to be sent and answered again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = http_get(node.port, "/products/2").await;
    assert_ne!(
        later, "/products/2:c1",
        "once it ran again, the instance served the copy from before the purge"
    );
}

/// Entry point of the child process (does nothing when run directly):
/// `/products/{id}` answers `<path>:c<calls of this path>`, tagged
/// `product:<id>` and `catalog`, cached for a minute.
#[test]
#[ignore = "started by a_stopped_instance_serves_nothing_old_once_it_runs_again"]
fn child_tagged_node() {
    let Ok(url) = std::env::var("SG_CHILD_REDIS_URL") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let backend = Backend::redis(&url).await.expect("redis");
        let guard = StampedeGuard::new(backend).ttl(Duration::from_secs(60));
        let calls: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
        let handler = move |Path(id): Path<u32>| {
            let calls = calls.clone();
            async move {
                let n = {
                    let mut calls = calls.lock().unwrap();
                    let n = calls.entry(id).or_default();
                    *n += 1;
                    *n
                };
                (
                    [("surrogate-key", format!("product:{id} catalog"))],
                    format!("/products/{id}:c{n}"),
                )
            }
        };
        let app = Router::new().route("/products/{id}", get(handler).layer(guard));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("READY {}", listener.local_addr().expect("addr").port());
        let _ = tokio::time::timeout(Duration::from_secs(60), axum::serve(listener, app)).await;
    });
}
