//! The HTTP server: the routes, the OpenAPI document made from them, and the listeners (the
//! Unix socket, created 0600; TCP only with a token).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use utoipa::OpenApi;

use crate::ApiError;
use crate::daemon::Daemon;
use crate::listeners;
use crate::problem::Problem;
use crate::types::{HostInfo, Version};
use crate::{bench, bisects, devices, fleets, images, results, runs, vms};

/// The API's OpenAPI 3.1 document, made from the handlers and their types.
#[derive(OpenApi)]
#[openapi(
    info(title = "driverlab", description = "The lab over HTTP: devices, images, runs, results, reports and VMs. See docs/api.md."),
    paths(
        version, host, openapi,
        devices::register, devices::list, devices::show, devices::remove, devices::health,
        devices::quarantine, devices::release,
        images::list, images::show, images::build_kernel, images::build_module, images::build_initramfs,
        runs::submit, runs::list, runs::show, runs::cancel, runs::resume, runs::events, runs::report,
        bisects::submit, bisects::show,
        fleets::report,
        results::list, results::database,
        vms::start, vms::list, vms::show, vms::counters, vms::stop, vms::remove, vms::serial,
        bench::boot,
    ),
    components(schemas(results::Format)),
    modifiers(&TokenOverTcp),
    tags(
        (name = "daemon", description = "The daemon and its host"),
        (name = "devices", description = "Registered devices, their leases, quarantines and health"),
        (name = "images", description = "Kernels, driver variants and initramfs in the image store"),
        (name = "runs", description = "Matrix runs, their progress and reports"),
        (name = "results", description = "The records of runs"),
        (name = "vms", description = "One-off VMs"),
        (name = "bench", description = "Benchmarks of this box: one at a time"),
    )
)]
pub struct ApiDoc;

/// The bearer token of the TCP listener: declared for every operation, with its 401. Requests
/// over the Unix socket need none.
struct TokenOverTcp;

impl utoipa::Modify for TokenOverTcp {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "TCP only (`driverlab serve --listen ADDR --token-file FILE`); the Unix socket needs none",
                    ))
                    .build(),
            ),
        );
        doc.security = Some(vec![SecurityRequirement::new("token", Vec::<String>::new())]);
        let unauthorized = ResponseBuilder::new()
            .description("Over TCP, without the token")
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build())
            .build();
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.delete].into_iter().flatten() {
                op.responses.responses.insert("401".into(), unauthorized.clone().into());
            }
        }
    }
}

/// The OpenAPI document as JSON, as `GET /v1/openapi.json` serves it.
pub fn openapi_json() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    doc.to_pretty_json().expect("the document serializes")
}

/// The default socket: `$XDG_RUNTIME_DIR/driverlab.sock`, else `/tmp/driverlab-UID.sock`.
pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("driverlab.sock"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => PathBuf::from(format!("/tmp/driverlab-{}.sock", unsafe { libc::getuid() })),
    }
}

/// The routes, without a listener's middleware.
pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/version", get(version))
        .route("/v1/host", get(host))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/devices", get(devices::list).post(devices::register))
        .route("/v1/devices/{name}", get(devices::show).delete(devices::remove))
        .route("/v1/devices/{name}/health", post(devices::health))
        .route("/v1/devices/{name}/quarantine", post(devices::quarantine))
        .route("/v1/devices/{name}/release", post(devices::release))
        .route("/v1/images", get(images::list))
        .route("/v1/images/kernel", post(images::build_kernel))
        .route("/v1/images/module", post(images::build_module))
        .route("/v1/images/initramfs", post(images::build_initramfs))
        .route("/v1/images/{id}", get(images::show))
        .route("/v1/runs", get(runs::list).post(runs::submit))
        .route("/v1/runs/{id}", get(runs::show))
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/resume", post(runs::resume))
        .route("/v1/runs/{id}/events", get(runs::events))
        .route("/v1/runs/{id}/report", get(runs::report))
        .route("/v1/fleets/{id}/report", get(fleets::report))
        .route("/v1/bisects", post(bisects::submit))
        .route("/v1/bisects/{id}", get(bisects::show))
        .route("/v1/results", get(results::list))
        .route("/v1/database", get(results::database))
        .route("/v1/bench/boot", post(bench::boot))
        .route("/v1/vms", get(vms::list).post(vms::start))
        .route("/v1/vms/{id}", get(vms::show).delete(vms::remove))
        .route("/v1/vms/{id}/counters", get(vms::counters))
        .route("/v1/vms/{id}/stop", post(vms::stop))
        .route("/v1/vms/{id}/serial", get(vms::serial))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(head_limit))
        .with_state(daemon)
}

/// The most bytes a request's head may have: its target and its header fields.
pub const MAX_HEAD: usize = 64 << 10;

/// Refuses a request whose head is over [`MAX_HEAD`] with 431: hyper's read buffer bounds a head
/// only loosely (one that arrives in a single read passes whole), and a request target over its
/// own limit is hyper's 414.
async fn head_limit(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let fields: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    let size = request.uri().to_string().len() + fields;
    if size > MAX_HEAD {
        return Problem::head_too_large(format!("the request's head is {size} bytes; at most {MAX_HEAD}"))
            .into_response();
    }
    next.run(request).await
}

async fn not_found() -> Response {
    Problem::not_found("no such endpoint; GET /v1/openapi.json lists them").into_response()
}

async fn method_not_allowed() -> Response {
    Problem::method_not_allowed("the path has no such method; GET /v1/openapi.json lists them").into_response()
}

/// `GET /v1/version`.
#[utoipa::path(get, path = "/v1/version", tag = "daemon",
    responses((status = 200, description = "The daemon's name and version", body = Version)))]
async fn version() -> Json<Version> {
    Json(Version { name: "driverlab".into(), version: env!("CARGO_PKG_VERSION").into() })
}

/// `GET /v1/host`.
#[utoipa::path(get, path = "/v1/host", tag = "daemon",
    responses((status = 200, description = "What the host's KVM can run", body = HostInfo)))]
async fn host() -> Json<HostInfo> {
    let virt = vm_spec::host::virtualization();
    Json(HostInfo { virtualization: virt.describe(), boots_linux: virt.boots_linux() })
}

/// `GET /v1/openapi.json`.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "daemon",
    responses((status = 200, description = "This document", body = Object)))]
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

/// Binds the Unix socket `socket`, private to its owner (0600); refused if a server answers
/// there or if something that is no socket is there (a file is never deleted), a stale socket
/// replaced.
pub async fn bind_unix(socket: &Path) -> Result<tokio::net::UnixListener, ApiError> {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(socket).is_ok_and(|m| !m.file_type().is_socket()) {
        return Err(ApiError::NotASocket(socket.to_path_buf()));
    }
    if socket.exists() {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return Err(ApiError::InUse(socket.to_path_buf()));
        }
        let _ = std::fs::remove_file(socket);
    }
    let io = |source| ApiError::Socket { path: socket.to_path_buf(), source };
    // Bound in a folder only the owner can enter, made 0600 there, then moved into place: no one
    // else can connect at any moment.
    let parent = socket.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let private = parent.join(format!(".driverlab-bind-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private).map_err(io)?;
    let staged = private.join("s");
    let bound = tokio::net::UnixListener::bind(&staged)
        .and_then(|l| std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600)).map(|_| l))
        .and_then(|l| std::fs::rename(&staged, socket).map(|_| l));
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    let listener = bound.map_err(io)?;
    Ok(listener)
}

/// Serves `daemon` on the Unix socket `socket` and, given one, on TCP at `tcp` with the bearer
/// token `token`, until `shutdown` completes.
pub async fn serve(
    daemon: Arc<Daemon>,
    socket: &Path,
    tcp: Option<(tokio::net::TcpListener, String)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let unix = Arc::new(bind_unix(socket).await?);
    tracing::info!("serving the driverlab API on {}", socket.display());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let unix_app = router(daemon.clone()).layer(axum::middleware::from_fn(crate::auth::unix));
    let accept_unix = move || {
        let unix = unix.clone();
        async move { unix.accept().await.map(|(stream, _)| stream) }
    };
    let unix_server = listeners::serve(accept_unix, unix_app, listeners::UNIX, stopped.clone());
    let tcp_server = tcp.map(|(listener, token)| {
        let token = Arc::new(token);
        let app = router(daemon.clone())
            .layer(axum::middleware::from_fn(move |request, next| crate::auth::tcp(token.clone(), request, next)));
        let listener = Arc::new(listener);
        let accept_tcp = move || {
            let listener = listener.clone();
            async move { listener.accept().await.map(|(stream, _)| stream) }
        };
        listeners::serve(accept_tcp, app, listeners::TCP, stopped.clone())
    });
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    match tcp_server {
        Some(tcp_server) => {
            tokio::join!(unix_server, tcp_server);
        }
        None => unix_server.await,
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_openapi_document_is_the_served_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in.trim_end() == openapi_json().trim_end(),
            "docs/openapi.json has drifted from the API: `driverlab serve --openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_route_is_in_the_document_and_every_answer_has_a_schema() {
        let doc: serde_json::Value = serde_json::from_str(&openapi_json()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for reference in text.split("\"#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "{name} is referred to but not defined");
        }
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/v1/runs",
            "/v1/runs/{id}/events",
            "/v1/runs/{id}/report",
            "/v1/devices/{name}/health",
            "/v1/vms/{id}/serial",
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
        for (path, methods) in paths {
            for (method, op) in methods.as_object().unwrap() {
                for (status, response) in op["responses"].as_object().unwrap() {
                    if status != "204" {
                        assert!(response.get("content").is_some(), "{method} {path} {status} has no content");
                    }
                }
            }
        }
    }
}
