//! The HTTP server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lab::{ProbeReport, VmProcess};

use crate::ApiError;
use crate::types::{ErrorBody, HostInfo, Version, VmResult};
use vm_spec::{ErrorKind, VmSpec};

/// The routes, as the OpenAPI document lists them (checked by a test).
pub const ROUTES: &[(&str, &str)] =
    &[("get", "/v1/version"), ("get", "/v1/host"), ("get", "/v1/openapi.yaml"), ("post", "/v1/vms")];

/// Most guest memory one request may ask for.
const MAX_MEMORY_MIB: u64 = 64 * 1024;
/// Longest run one request may ask for.
const MAX_TIMEOUT_S: f64 = 24.0 * 3600.0;
/// The run time of a request that gives none.
const DEFAULT_TIMEOUT_S: f64 = 60.0;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The `driverlab` binary that runs VMs (`driverlab vm run`).
    pub driverlab: Arc<PathBuf>,
}

/// The default socket: `$XDG_RUNTIME_DIR/driverlab.sock`, else `/tmp/driverlab-UID.sock`.
pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("driverlab.sock"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => PathBuf::from(format!("/tmp/driverlab-{}.sock", unsafe { libc::getuid() })),
    }
}

/// The API's router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/version", get(version))
        .route("/v1/host", get(host))
        .route("/v1/openapi.yaml", get(openapi))
        .route("/v1/vms", post(run_vm))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the API on `socket` until `shutdown` completes.
pub async fn serve(
    socket: &Path,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    if socket.exists() {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return Err(ApiError::InUse(socket.to_path_buf()));
        }
        // A stale socket from a server that is gone.
        let _ = std::fs::remove_file(socket);
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(|source| ApiError::Socket { path: socket.to_path_buf(), source })?;
    tracing::info!("serving the driverlab API on {}", socket.display());
    let result = axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await;
    let _ = std::fs::remove_file(socket);
    result.map_err(|source| ApiError::Socket { path: socket.to_path_buf(), source })
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: message.into() })).into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint; GET /v1/openapi.yaml lists them")
}

async fn version() -> Json<Version> {
    Json(Version { name: "driverlab".into(), version: env!("CARGO_PKG_VERSION").into() })
}

async fn host() -> Json<HostInfo> {
    let virt = vm_spec::host::virtualization();
    Json(HostInfo { virtualization: virt.describe(), boots_linux: virt.boots_linux() })
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], crate::OPENAPI).into_response()
}

fn check_request(spec: &mut VmSpec) -> Result<(), String> {
    spec.validate().map_err(|e| e.to_string())?;
    let timeout = *spec.timeout_s.get_or_insert(DEFAULT_TIMEOUT_S);
    if timeout > MAX_TIMEOUT_S {
        return Err(format!("timeout_s: at most {MAX_TIMEOUT_S} per request"));
    }
    if spec.memory_mib > MAX_MEMORY_MIB {
        return Err(format!("memory_mib: at most {MAX_MEMORY_MIB} per VM"));
    }
    Ok(())
}

async fn run_vm(State(state): State<AppState>, body: Bytes) -> Response {
    let mut spec: VmSpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, format!("invalid request body: {e}"));
        }
    };
    if let Err(message) = check_request(&mut spec) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, message);
    }
    // A backstop beyond the VMM's own timeout, in case the VMM itself hangs.
    let process = VmProcess::new(state.driverlab.as_path(), spec, Duration::from_secs(30));
    let outcome = match tokio::task::spawn_blocking(move || process.run()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, format!("VM task failed: {e}"));
        }
    };
    if let Some(line) = &outcome.error
        && line.exit_code == vm_spec::exit::code::BAD_INPUT
        && line.kind != ErrorKind::Usage
    {
        return error(StatusCode::UNPROCESSABLE_ENTITY, line.message.clone());
    }
    let probe = ProbeReport::parse(&outcome.serial).sections().to_vec();
    Json(VmResult {
        exit_code: outcome.code(),
        signal: outcome.signal(),
        probe,
        wall_ms: outcome.wall.as_secs_f64() * 1e3,
        exit: outcome.exit,
        error: outcome.error,
        serial: outcome.serial,
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Client;

    async fn start(dir: &Path) -> (PathBuf, tokio::sync::oneshot::Sender<()>) {
        let socket = dir.join("api.sock");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = AppState { driverlab: Arc::new(PathBuf::from("/nonexistent/driverlab")) };
        let path = socket.clone();
        tokio::spawn(async move {
            serve(&path, state, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap()
        });
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (socket, stop)
    }

    #[tokio::test]
    async fn answers_json_and_json_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, stop) = start(dir.path()).await;
        let client = Client::new(&socket);
        let (status, body) = client.request("GET", "/v1/version", None).await.unwrap();
        assert_eq!(status, 200);
        let version: Version = serde_json::from_slice(&body).unwrap();
        assert_eq!(version.name, "driverlab");

        let (status, body) = client.request("POST", "/v1/vms", Some(b"{not json".to_vec())).await.unwrap();
        assert_eq!(status, 400);
        let err: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert!(err.error.starts_with("invalid request body"), "{}", err.error);

        let (status, body) =
            client.request("POST", "/v1/vms", Some(br#"{"kernel":"probe","colour":"red"}"#.to_vec())).await.unwrap();
        assert_eq!(status, 400, "unknown fields are refused");
        assert!(String::from_utf8_lossy(&body).contains("colour"));

        let (status, _) =
            client.request("POST", "/v1/vms", Some(br#"{"kernel":"probe","timeout_s":0}"#.to_vec())).await.unwrap();
        assert_eq!(status, 422);

        let (status, body) = client.request("POST", "/v1/vms", Some(br#"{"kernel":"probe"}"#.to_vec())).await.unwrap();
        assert_eq!(status, 500, "the configured binary does not exist");
        assert!(String::from_utf8_lossy(&body).contains("/nonexistent/driverlab"));

        let (status, _) = client.request("GET", "/v2/nothing", None).await.unwrap();
        assert_eq!(status, 404);
        let (status, body) = client.request("GET", "/v1/openapi.yaml", None).await.unwrap();
        assert_eq!((status, body.as_slice()), (200, crate::OPENAPI.as_bytes()));

        // A second server on the same socket is refused while the first runs.
        let second = serve(&socket, AppState { driverlab: Arc::new(PathBuf::new()) }, async {}).await;
        assert!(matches!(second, Err(ApiError::InUse(_))));
        stop.send(()).unwrap();
    }

    #[test]
    fn openapi_document_lists_exactly_the_routes() {
        let doc = crate::OPENAPI;
        let paths_section = doc.split("\npaths:\n").nth(1).expect("a paths section");
        let mut documented = Vec::new();
        let mut current = "";
        for line in paths_section.lines() {
            if let Some(path) = line.strip_prefix("  ").filter(|l| l.starts_with('/')).and_then(|l| l.strip_suffix(':'))
            {
                current = path;
            } else if let Some(method) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':'))
                && ["get", "post", "put", "delete", "patch"].contains(&method)
            {
                documented.push((method.to_string(), current.to_string()));
            } else if !line.starts_with(' ') && !line.is_empty() {
                break;
            }
        }
        let mut routes: Vec<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        documented.sort();
        routes.sort();
        assert_eq!(documented, routes);
    }
}
