//! Devices registered with the daemon: what matrices over HTTP name, with their leases,
//! quarantines and health. A device that names a host resource (a PCI device, a TAP, an SSH
//! peer) is registered only over the Unix socket, by the daemon's owner.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lab::matrix::Device;
use lab::results_db::ResultsDb;

use crate::auth::Transport;
use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::types::{DeviceKind, DeviceState, HealthResult, Lease, Quarantine, QuarantineRequest};

/// Checks a device to register: its name, its fields, and what this transport may register.
fn check(device: &Device, transport: Transport) -> Result<(), Problem> {
    let name_ok = !device.name.is_empty()
        && device.name.len() <= 64
        && device.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !name_ok {
        return Err(Problem::unprocessable(format!(
            "name {:?}: 1 to 64 letters, digits, '.', '-' or '_'",
            device.name
        )));
    }
    if transport == Transport::Tcp && (device.bdf.is_some() || device.tap.is_some() || device.peer.is_some()) {
        return Err(Problem::forbidden(
            "bdf, tap and peer name host resources: register such a device over the daemon's Unix socket",
        ));
    }
    device.check().map_err(|(field, message)| Problem::unprocessable(format!("device{field}: {message}")))
}

fn state(store: &ResultsDb, device: &Device, registered_at: String) -> Result<DeviceState, Problem> {
    let key = device.lease_key();
    let lease = match &key {
        Some(key) => store.leases()?.into_iter().find(|(k, _)| k == key).map(|(_, h)| Lease {
            run: h.run,
            pid: h.pid,
            host: h.host,
        }),
        None => None,
    };
    let quarantine = match &key {
        Some(key) => store
            .quarantine_list()?
            .into_iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, reason, since)| Quarantine { reason, since }),
        None => None,
    };
    let kind = match device.model {
        Some(_) => DeviceKind::Model,
        None => DeviceKind::Host,
    };
    Ok(DeviceState { device: device.clone(), kind, registered_at, lease, quarantine })
}

fn find(store: &ResultsDb, name: &str) -> Result<(Device, String), Problem> {
    store
        .devices()?
        .into_iter()
        .find(|(d, _)| d.name == name)
        .ok_or_else(|| Problem::not_found(format!("no device is registered as {name:?} (GET /v1/devices)")))
}

/// `POST /v1/devices`.
#[utoipa::path(post, path = "/v1/devices", tag = "devices", request_body = Device,
    responses(
        (status = 201, description = "Registered", body = DeviceState),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 403, description = "A host resource, over TCP", body = crate::types::ErrorBody),
        (status = 409, description = "The name is taken", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "The device does not check out", body = crate::types::ErrorBody),
    ))]
pub async fn register(
    State(daemon): State<Arc<Daemon>>,
    transport: Option<Extension<Transport>>,
    payload: Payload,
) -> Response {
    let transport = transport.map_or(Transport::Tcp, |Extension(t)| t);
    let result = async {
        let device: Device = payload.json()?;
        check(&device, transport)?;
        blocking(move || {
            let store = daemon.store()?;
            if !store.register_device(&device)? {
                return Err(Problem::conflict(format!(
                    "a device is registered as {:?} already (DELETE /v1/devices/{} first)",
                    device.name, device.name
                )));
            }
            let (device, at) = find(&store, &device.name)?;
            state(&store, &device, at)
        })
        .await
    }
    .await;
    match result {
        Ok(state) => (StatusCode::CREATED, Json(state)).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `GET /v1/devices`.
#[utoipa::path(get, path = "/v1/devices", tag = "devices",
    responses((status = 200, description = "The registered devices", body = Vec<DeviceState>)))]
pub async fn list(State(daemon): State<Arc<Daemon>>) -> Result<Json<Vec<DeviceState>>, Problem> {
    blocking(move || {
        let store = daemon.store()?;
        let devices = store.devices()?;
        devices.into_iter().map(|(d, at)| state(&store, &d, at)).collect::<Result<Vec<_>, _>>().map(Json)
    })
    .await
}

/// `GET /v1/devices/{name}`.
#[utoipa::path(get, path = "/v1/devices/{name}", tag = "devices",
    params(("name" = String, Path, description = "The device")),
    responses(
        (status = 200, description = "The device and its state", body = DeviceState),
        (status = 404, description = "No such device", body = crate::types::ErrorBody),
    ))]
pub async fn show(State(daemon): State<Arc<Daemon>>, Path(name): Path<String>) -> Result<Json<DeviceState>, Problem> {
    blocking(move || {
        let store = daemon.store()?;
        let (device, at) = find(&store, &name)?;
        state(&store, &device, at).map(Json)
    })
    .await
}

/// `DELETE /v1/devices/{name}`.
#[utoipa::path(delete, path = "/v1/devices/{name}", tag = "devices",
    params(("name" = String, Path, description = "The device")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such device", body = crate::types::ErrorBody),
        (status = 409, description = "A run holds it", body = crate::types::ErrorBody),
    ))]
pub async fn remove(State(daemon): State<Arc<Daemon>>, Path(name): Path<String>) -> Response {
    let result = blocking(move || {
        let store = daemon.store()?;
        let (device, at) = find(&store, &name)?;
        if let Some(lease) = state(&store, &device, at)?.lease {
            return Err(Problem::conflict(format!("run {} holds {name}", lease.run)));
        }
        store.remove_device(&name)?;
        Ok(())
    })
    .await;
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(p) => p.into_response(),
    }
}

/// `POST /v1/devices/{name}/health`: the probe's NIC checks in a fresh micro-VM.
#[utoipa::path(post, path = "/v1/devices/{name}/health", tag = "devices",
    params(("name" = String, Path, description = "The device")),
    responses(
        (status = 200, description = "The check ran; `ok` says whether it passed", body = HealthResult),
        (status = 404, description = "No such device", body = crate::types::ErrorBody),
        (status = 409, description = "A run holds the device", body = crate::types::ErrorBody),
        (status = 429, description = "Another health check is running", body = crate::types::ErrorBody),
        (status = 500, description = "The check could not run (the host, KVM)", body = crate::types::ErrorBody),
    ))]
pub async fn health(
    State(daemon): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<HealthResult>, Problem> {
    blocking(move || {
        let store = daemon.store()?;
        let (device, at) = find(&store, &name)?;
        if let Some(lease) = state(&store, &device, at)?.lease {
            return Err(Problem::conflict(format!("run {} holds {name}; check it when the run is done", lease.run)));
        }
        // One check at a time, and the others answered at once rather than queued on the
        // daemon's blocking threads.
        let _one_at_a_time = match daemon.checks.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(Problem::busy("another health check is running; try again after it"));
            }
        };
        let source =
            device.source().map_err(|(field, message)| Problem::internal(format!("device{field}: {message}")))?;
        let engine = daemon.env.engine(lab::matrix::EngineKind::Driverlab).map_err(Problem::internal)?;
        let dir = daemon.config.vm_dir.join("health").join(&name);
        let mut health = engines::health::check_device(engine, &daemon.env.programs.model, &dir, &source, device.nic())
            .map_err(Problem::internal)?;
        health.device = name.clone();
        Ok(Json(HealthResult {
            ok: health.ok,
            verdict: health.verdict(),
            report: serde_json::to_value(&health).expect("a health report serializes"),
        }))
    })
    .await
}

/// `POST /v1/devices/{name}/quarantine`.
#[utoipa::path(post, path = "/v1/devices/{name}/quarantine", tag = "devices",
    params(("name" = String, Path, description = "The device")), request_body = QuarantineRequest,
    responses(
        (status = 200, description = "Quarantined: no run uses it until it is released", body = DeviceState),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 404, description = "No such device", body = crate::types::ErrorBody),
        (status = 409, description = "A model: each VM gets a fresh one, there is nothing to quarantine", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
    ))]
pub async fn quarantine(State(daemon): State<Arc<Daemon>>, Path(name): Path<String>, payload: Payload) -> Response {
    let result = async {
        let request: QuarantineRequest = payload.json()?;
        blocking(move || {
            let store = daemon.store()?;
            let (device, at) = find(&store, &name)?;
            let key = device.lease_key().ok_or_else(|| {
                Problem::conflict(format!(
                    "{name} is a model: each VM gets a fresh one, there is nothing to quarantine"
                ))
            })?;
            store.quarantine(&key, &request.reason)?;
            state(&store, &device, at)
        })
        .await
    }
    .await;
    match result {
        Ok(s) => Json(s).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `POST /v1/devices/{name}/release`: lifts a quarantine.
#[utoipa::path(post, path = "/v1/devices/{name}/release", tag = "devices",
    params(("name" = String, Path, description = "The device")),
    responses(
        (status = 200, description = "Released (or it was not quarantined)", body = DeviceState),
        (status = 404, description = "No such device", body = crate::types::ErrorBody),
    ))]
pub async fn release(
    State(daemon): State<Arc<Daemon>>,
    Path(name): Path<String>,
) -> Result<Json<DeviceState>, Problem> {
    blocking(move || {
        let store = daemon.store()?;
        let (device, at) = find(&store, &name)?;
        if let Some(key) = device.lease_key() {
            store.unquarantine(&key)?;
        }
        state(&store, &device, at).map(Json)
    })
    .await
}
