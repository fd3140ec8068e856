//! `driverlab serve` and `driverlab api`: the lab daemon's HTTP API and a client for it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use api::client::Client;
use api::server::{self, AppState};
use clap::Args;

/// Options of `driverlab serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Unix socket to serve on [default: $XDG_RUNTIME_DIR/driverlab.sock, else /tmp/driverlab-UID.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// Options of `driverlab api`.
#[derive(Args)]
pub struct ApiArgs {
    /// HTTP method.
    #[arg(value_name = "METHOD", value_parser = ["GET", "POST", "PUT", "DELETE", "get", "post", "put", "delete"])]
    pub method: String,
    /// Path, e.g. /v1/host.
    #[arg(value_name = "PATH")]
    pub path: String,
    /// JSON request body.
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// The server's socket [default: as for `serve`].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
    tracing::info!("shutting down");
}

/// Runs the server until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<u8> {
    let socket = args.socket.unwrap_or_else(server::default_socket);
    let driverlab = std::env::current_exe().context("locating the driverlab binary")?;
    let state = AppState { driverlab: Arc::new(driverlab) };
    eprintln!("driverlab API on {}", socket.display());
    runtime()?.block_on(server::serve(&socket, state, shutdown_signal()))?;
    Ok(0)
}

/// Sends one request and prints the response body; exit code 1 for HTTP errors.
pub fn request(args: ApiArgs) -> anyhow::Result<u8> {
    let socket = args.socket.unwrap_or_else(server::default_socket);
    let client = Client::new(&socket);
    let method = args.method.to_uppercase();
    let (status, body) = runtime()?
        .block_on(client.request(&method, &args.path, args.data.map(String::into_bytes)))
        .with_context(|| format!("is `driverlab serve --socket {}` running?", socket.display()))?;
    println!("{}", String::from_utf8_lossy(&body));
    Ok(u8::from(status >= 400))
}
