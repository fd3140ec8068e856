//! driverlab's HTTP API: the lab over REST under `/v1`, served by `driverlab serve` on a Unix
//! socket (and on TCP with a token), and the client the CLI uses. The OpenAPI document is made
//! from the handlers (`GET /v1/openapi.json`, checked in as `docs/openapi.json`).
//!
//! Requests go one way: API, then the lab, which starts one VMM process per VM. The daemon
//! never runs guest code itself, and never opens a host path a request names: kernels, initrds
//! and modules are images in its store, devices are registered.

pub mod auth;
pub mod bench;
pub mod bisects;
pub mod client;
pub mod daemon;
pub mod devices;
pub mod fleets;
pub mod images;
pub mod listeners;
pub mod payload;
pub mod problem;
pub mod query;
pub mod results;
pub mod run_queue;
pub mod runs;
pub mod server;
pub mod streamed;
pub mod types;
pub mod vm_table;
pub mod vms;

/// Errors of the API server and client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be bound, connected or used.
    #[error("socket {path}: {source}", path = path.display())]
    Socket {
        /// The socket path.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another server answers on the socket.
    #[error("socket {path}: another driverlab server is listening there", path = .0.display())]
    InUse(std::path::PathBuf),
    /// Something that is no socket is at the socket's path: left as it is.
    #[error(
        "{path} exists and is not a socket (it is left as it is): give --socket a path that is free or a socket",
        path = .0.display()
    )]
    NotASocket(std::path::PathBuf),
    /// HTTP failed.
    #[error("HTTP: {0}")]
    Http(String),
}
