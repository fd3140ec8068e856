//! driverlab's HTTP API: REST under `/v1`, served on a Unix socket by `driverlab serve`, and the
//! client `driverlab api` uses. The document is `api/openapi.yaml` (also `GET /v1/openapi.yaml`).
//!
//! Requests go one way: API, then the lab, which starts one VMM process per VM. The server never
//! runs guest code itself.

pub mod client;
pub mod server;
pub mod types;

/// The OpenAPI document of this API.
pub const OPENAPI: &str = include_str!("../openapi.yaml");

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
    /// HTTP failed.
    #[error("HTTP: {0}")]
    Http(String),
}
