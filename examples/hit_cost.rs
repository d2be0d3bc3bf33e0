//! The L1 hit path's cost in instructions, for a profiler that counts them
//! (the same route answered bare, through the guard on an L1 hit, or the
//! guard's service alone). Run it twice under `valgrind --tool=callgrind`
//! with different counts; the difference divided by the difference in
//! requests is the cost of one request, whatever else loads the machine.
//!
//! `http-bare` and `http-guarded` serve the same routes over HTTP/1.1: a
//! hyper server connection and a hyper client on the two ends of an
//! in-memory pipe, one keep-alive connection, so the request is parsed and
//! the response written and read as on a socket (without the system calls).
//! The server runs on a thread of its own: with `--separate-threads=yes`,
//! callgrind writes its instructions to a file of their own (`-02` for the
//! second thread), apart from the client's.
//!
//! `tcp-bare` and `tcp-guarded` do the same on a loopback TCP connection and
//! print the CPU time the server's thread used per request, user and system
//! (`CLOCK_THREAD_CPUTIME_ID`): the socket's system calls included. A
//! clock, not a count: alternate the two modes and compare runs taken side
//! by side on a quiet machine.
//!
//! ```text
//! cargo build --release --example hit_cost
//! valgrind --tool=callgrind target/release/examples/hit_cost guarded 2000
//! valgrind --tool=callgrind target/release/examples/hit_cost guarded 12000
//! target/release/examples/hit_cost tcp-bare 40000
//! target/release/examples/hit_cost tcp-guarded 40000
//! ```

use std::hint::black_box;
use std::time::Duration;

use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

#[path = "../benches/support/hit_route.rs"]
mod hit_route;
use hit_route::{bare_router, call_router, guard_service, guarded_router, plain_request, warm};

/// How the client reaches the server.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    /// An in-memory pipe: no system calls.
    Pipe,
    /// A loopback TCP connection.
    Tcp,
}

/// `count` requests over one HTTP/1.1 connection served by `router`. The
/// server runs on a thread of its own, so that `--separate-threads=yes`
/// gives its instructions apart from the client's; it returns the CPU time
/// its thread used (user and system, `CLOCK_THREAD_CPUTIME_ID`) from the
/// connection's start to its end.
async fn over_http(router: Router, count: u64, transport: Transport) -> Duration {
    let service = hyper_util::service::TowerToHyperService::new(router);
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("loopback listener");
    let address = listener.local_addr().expect("bound address");
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async move {
            let http = hyper::server::conn::http1::Builder::new();
            match transport {
                Transport::Pipe => {
                    let start = thread_cpu();
                    let _ = http
                        .serve_connection(TokioIo::new(server_io), service)
                        .await;
                    thread_cpu().saturating_sub(start)
                }
                Transport::Tcp => {
                    let (stream, _) = listener.accept().expect("one client");
                    stream.set_nodelay(true).expect("nodelay");
                    stream.set_nonblocking(true).expect("non-blocking");
                    let stream = tokio::net::TcpStream::from_std(stream).expect("tokio stream");
                    let start = thread_cpu();
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    thread_cpu().saturating_sub(start)
                }
            }
        })
    });
    match transport {
        Transport::Pipe => client(TokioIo::new(client_io), count).await,
        Transport::Tcp => {
            let stream = tokio::net::TcpStream::connect(address)
                .await
                .expect("loopback connection");
            stream.set_nodelay(true).expect("nodelay");
            client(TokioIo::new(stream), count).await;
        }
    }
    server.join().expect("server thread")
}

/// One warm-up request, then `count` more, one after the other, on `io`.
async fn client<T>(io: T, count: u64)
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    let connection = tokio::spawn(connection);
    let first = sender.send_request(plain_request()).await.expect("served");
    assert_eq!(first.status(), 200);
    black_box(first.into_body().collect().await.expect("body"));
    for _ in 0..count {
        let response = sender.send_request(plain_request()).await.expect("served");
        black_box(
            response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes(),
        );
    }
    drop(sender);
    let _ = connection.await;
}

/// The CPU time this thread has used, user and system.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    let done = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(done, 0, "CLOCK_THREAD_CPUTIME_ID is readable");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Prints the server thread's CPU time per request.
fn report(mode: &str, cpu: Duration, count: u64) {
    let per = cpu.as_nanos() as f64 / count.max(1) as f64;
    println!("{mode}: server thread CPU {per:.0} ns per request ({count} requests)");
}

fn transport_of(mode: &str) -> Transport {
    match mode.starts_with("tcp") {
        true => Transport::Tcp,
        false => Transport::Pipe,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "guarded".into());
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        match mode.as_str() {
            "bare" => {
                let bare = bare_router();
                for _ in 0..count {
                    black_box(call_router(&bare).await);
                }
            }
            "guarded" => {
                let guarded = guarded_router();
                warm(&guarded).await;
                for _ in 0..count {
                    black_box(call_router(&guarded).await);
                }
            }
            "http-bare" | "tcp-bare" => {
                let transport = transport_of(&mode);
                let cpu = over_http(bare_router(), count, transport).await;
                report(&mode, cpu, count);
            }
            "http-guarded" | "tcp-guarded" => {
                let guarded = guarded_router();
                warm(&guarded).await;
                let cpu = over_http(guarded, count, transport_of(&mode)).await;
                report(&mode, cpu, count);
            }
            "service" => {
                let service = guard_service();
                service.clone().oneshot(plain_request()).await.unwrap();
                for _ in 0..count {
                    let response = service.clone().oneshot(plain_request()).await.unwrap();
                    assert_eq!(response.headers()["x-cache"], "HIT");
                    black_box(response.into_body().collect().await.unwrap().to_bytes());
                }
            }
            other => {
                panic!("unknown mode {other}: bare, guarded, service, http-bare, http-guarded, tcp-bare or tcp-guarded")
            }
        }
    });
}
