//! Stopping an instance without leaving the fleet anything to wait out.
//!
//! The server stops taking requests on Ctrl-C or SIGTERM (axum's
//! `with_graceful_shutdown`), and then the backend shuts down: rebuilds in
//! flight get a few seconds to commit, the leases still held after that are
//! handed back (another instance takes over their keys at once), the
//! instance leaves the fleet's membership and its Redis connections close.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example graceful_shutdown
//! curl localhost:3000/report
//! ```

use std::time::Duration;

use axum::{routing::get, Router};
use stampede_guard::{Backend, StampedeGuard};

/// How long rebuilds in flight may still take once the server stopped.
const DRAIN: Duration = Duration::from_secs(5);

async fn report() -> String {
    // Think of a slow aggregate over many rows.
    tokio::time::sleep(Duration::from_millis(500)).await;
    "{\"orders\":48213}".to_owned()
}

/// Resolves on Ctrl-C, or on SIGTERM (what an orchestrator sends).
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Starts with in-process protection if Redis cannot be reached yet.
    let backend = Backend::redis(&url).await?;
    let guard = StampedeGuard::new(backend.clone()).ttl(Duration::from_secs(10));
    let app = Router::new().route("/report", get(report).layer(guard));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal())
        .await?;

    // The server answered its last request; now leave the fleet. One call
    // per backend, whatever the number of guards built on it.
    let report = backend.shutdown(DRAIN).await;
    println!(
        "shut down: {} rebuild(s) unfinished, {} lease(s) handed back",
        report.unfinished_rebuilds, report.leases_handed_back
    );
    Ok(())
}
