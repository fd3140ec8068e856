//! One-off VMs over HTTP: started at once and run on a thread of their own (which outlives the
//! VMM and its models, so they die with the daemon, never before), watched through the VMM's
//! control socket, their serial output kept in a file the daemon serves.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use engines::device::DeviceSource;
use engines::{ControlClient, ModelProcess, VmProcess};
use vm_spec::{DeviceSpec, IommuSpec, Kernel, SerialOutput, SerialSpec, VmSpec};

use crate::auth::Transport;
use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::query::{Params, SerialParams};
use crate::types::{Created, VmRequest, VmStatus};
use crate::vm_table::{Phase, Vm};
use guest_images::store::{ImageId, ImageKind};

/// The run time of a request that gives none, and the most one may ask (below vm-spec's).
const DEFAULT_TIMEOUT_S: f64 = 60.0;
const MAX_TIMEOUT_S: f64 = 24.0 * 3600.0;

/// The VM spec of a request, its kernel and initrd resolved from the image store and its
/// devices from the registry; models are started by the VM's thread.
struct Prepared {
    spec: VmSpec,
    models: Vec<(vm_spec::NicKind, Vec<String>)>,
}

fn prepare(daemon: &Daemon, request: &VmRequest) -> Result<Prepared, Problem> {
    let images = daemon.images();
    let kernel = match request.kernel.as_str() {
        "probe" => Kernel::Probe,
        id if ImageId::of_kind(id, ImageKind::Kernel).is_some() => {
            let manifest: guest_images::kernel_image::KernelManifest = images.manifest(id)?;
            Kernel::Path(manifest.vmlinux_path(images))
        }
        other => {
            return Err(Problem::unprocessable(format!(
                "kernel {other:?}: give `probe` or a kernel image's ID (GET /v1/images)"
            )));
        }
    };
    let initrd = match &request.initrd {
        None => None,
        Some(id) if ImageId::of_kind(id, ImageKind::Initramfs).is_some() => {
            let manifest: guest_images::initramfs_build::InitramfsManifest = images.manifest(id)?;
            Some(manifest.archive_path(images))
        }
        Some(other) => {
            return Err(Problem::unprocessable(format!("initrd {other:?}: give an initramfs image's ID")));
        }
    };
    let timeout = request.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(timeout > 0.0 && timeout <= MAX_TIMEOUT_S) {
        return Err(Problem::unprocessable(format!("timeout_s: more than 0 and at most {MAX_TIMEOUT_S}")));
    }
    let memory_mib = request.memory_mib.unwrap_or(vm_spec::spec::DEFAULT_MEMORY_MIB);
    // The count before a name is looked up: a registered model becomes a device when it runs.
    if request.devices.len() > vm_spec::spec::MAX_DEVICES {
        return Err(Problem::unprocessable(vm_spec::SpecError::TooManyDevices(request.devices.len()).to_string()));
    }
    let store = daemon.store()?;
    let mut devices = Vec::new();
    let mut models = Vec::new();
    for name in &request.devices {
        let device = store.device(name)?.ok_or_else(|| {
            Problem::unprocessable(format!("devices: no device is registered as {name:?} (GET /v1/devices)"))
        })?;
        match device.source() {
            Ok(DeviceSource::Host { bdf, .. }) => devices.push(DeviceSpec::vfio(bdf)),
            Ok(DeviceSource::Model { nic, wire }) => models.push((nic, wire.model_args())),
            Err((field, message)) => {
                return Err(Problem::unprocessable(format!("devices: {name:?}: device{field}: {message}")));
            }
        }
    }
    let defaults = VmSpec::new(kernel);
    let spec = VmSpec {
        initrd,
        cmdline: request.cmdline.clone(),
        memory_mib,
        vcpus: request.vcpus.unwrap_or(defaults.vcpus),
        iommu: request.iommu.then(IommuSpec::default),
        devices,
        timeout_s: Some(timeout),
        ..defaults
    };
    // Models' sockets are added when they run: checked now as what they will be, a device each.
    let with_models = VmSpec {
        devices: (spec.devices.iter().cloned())
            .chain((0..models.len()).map(|i| DeviceSpec::vfio_user(format!("/model/{i}"))))
            .collect(),
        ..spec.clone()
    };
    with_models.validate_within(&vm_spec::VmLimits::LAB).map_err(|e| Problem::unprocessable(e.to_string()))?;
    Ok(Prepared { spec, models })
}

/// The VM's thread: models, the VMM, its end.
fn run(daemon: Arc<Daemon>, vm: Arc<Vm>, prepared: Prepared) {
    let Prepared { mut spec, models } = prepared;
    let mut running_models = Vec::new();
    for (nic, args) in &models {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match ModelProcess::start(&daemon.env.programs.model, nic.name(), &args) {
            Ok(model) => {
                spec.devices.push(model.device_spec());
                running_models.push(model);
            }
            Err(e) => {
                *vm.phase() = Phase::Failed(format!("starting the {nic} model: {e}"));
                return;
            }
        }
    }
    spec.serial = SerialSpec { com1: SerialOutput::File(vm.serial()), com2: None };
    let process = VmProcess::new(&daemon.env.programs.vmm, spec, Duration::from_secs(30)).with_control(vm.control());
    let running = match process.start() {
        Ok(running) => running,
        Err(e) => {
            *vm.phase() = Phase::Failed(e.to_string());
            return;
        }
    };
    *vm.phase() = Phase::Running;
    let phase = match running.wait() {
        Ok(out) => Phase::Exited {
            code: out.code(),
            exit: out.exit.as_ref().map(|e| serde_json::to_value(e).expect("exit lines serialize")),
            error: out.error.as_ref().map(|e| serde_json::to_value(e).expect("error lines serialize")),
        },
        Err(e) => Phase::Failed(e.to_string()),
    };
    drop(running_models);
    *vm.phase() = phase;
}

/// `POST /v1/vms`: starts a VM; it runs to its end (or its timeout) on its own.
#[utoipa::path(post, path = "/v1/vms", tag = "vms", request_body = VmRequest,
    responses(
        (status = 201, description = "Started", body = Created),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 404, description = "No such image", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "The VM does not check out: not an image, no such device, limits", body = crate::types::ErrorBody),
        (status = 429, description = "As many VMs run as the daemon takes", body = crate::types::ErrorBody),
    ))]
pub async fn start(State(daemon): State<Arc<Daemon>>, payload: Payload) -> Response {
    let result = async {
        let request: VmRequest = payload.json()?;
        let daemon = daemon.clone();
        blocking(move || {
            let prepared = prepare(&daemon, &request)?;
            let vm = daemon.vms.admit()?;
            let id = vm.id.clone();
            let thread_daemon = daemon.clone();
            std::thread::Builder::new()
                .name(format!("vm-{id}"))
                .spawn(move || run(thread_daemon, vm, prepared))
                .map_err(|e| Problem::internal(format!("a thread for the VM: {e}")))?;
            Ok(id)
        })
        .await
    }
    .await;
    match result {
        Ok(id) => {
            let location = format!("/v1/vms/{id}");
            (StatusCode::CREATED, [(header::LOCATION, location)], Json(Created { id })).into_response()
        }
        Err(p) => p.into_response(),
    }
}

/// `GET /v1/vms`.
#[utoipa::path(get, path = "/v1/vms", tag = "vms",
    responses((status = 200, description = "The VMs the daemon started, oldest first", body = Vec<VmStatus>)))]
pub async fn list(State(daemon): State<Arc<Daemon>>) -> Json<Vec<VmStatus>> {
    Json(daemon.vms.all().iter().map(|vm| vm.status()).collect())
}

/// `GET /v1/vms/{id}`.
#[utoipa::path(get, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "The VM")),
    responses(
        (status = 200, description = "Its state, and how it ended", body = VmStatus),
        (status = 404, description = "No such VM", body = crate::types::ErrorBody),
    ))]
pub async fn show(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Result<Json<VmStatus>, Problem> {
    Ok(Json(daemon.vms.get(&id)?.status()))
}

fn running(vm: &Vm) -> Result<(), Problem> {
    match *vm.phase() {
        Phase::Running => Ok(()),
        Phase::Starting => Err(Problem::conflict(format!("{} is starting; ask again in a moment", vm.id))),
        _ => Err(Problem::conflict(format!("{} has ended (GET /v1/vms/{})", vm.id, vm.id))),
    }
}

/// `GET /v1/vms/{id}/counters`: the VMM's live counters (vIOMMU, devices, exits).
#[utoipa::path(get, path = "/v1/vms/{id}/counters", tag = "vms",
    params(("id" = String, Path, description = "The VM")),
    responses(
        (status = 200, description = "The live counters, the keys of the exit line (docs/vmm.md)", body = Object),
        (status = 404, description = "No such VM", body = crate::types::ErrorBody),
        (status = 409, description = "It is not running", body = crate::types::ErrorBody),
    ))]
pub async fn counters(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let result = blocking(move || {
        let vm = daemon.vms.get(&id)?;
        running(&vm)?;
        let counters = ControlClient::new(vm.control(), Duration::from_secs(2)).counters().map_err(|e| {
            Problem::conflict(format!("{id}: its control socket does not answer ({e}); it may be ending"))
        })?;
        Ok(serde_json::to_value(counters).expect("counters serialize"))
    })
    .await;
    match result {
        Ok(value) => Json(value).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `POST /v1/vms/{id}/stop`: the power button, then a forced stop after the grace time.
#[utoipa::path(post, path = "/v1/vms/{id}/stop", tag = "vms",
    params(("id" = String, Path, description = "The VM")),
    responses(
        (status = 202, description = "Stopping", body = VmStatus),
        (status = 404, description = "No such VM", body = crate::types::ErrorBody),
        (status = 409, description = "It is not running", body = crate::types::ErrorBody),
    ))]
pub async fn stop(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let result = blocking(move || {
        let vm = daemon.vms.get(&id)?;
        running(&vm)?;
        ControlClient::new(vm.control(), Duration::from_secs(2))
            .shutdown(vm_spec::control::ShutdownRequest::default())
            .map_err(|e| {
                Problem::conflict(format!("{id}: its control socket does not answer ({e}); it may be ending"))
            })?;
        Ok(vm.status())
    })
    .await;
    match result {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `DELETE /v1/vms/{id}`: forgets an ended VM and its serial log.
#[utoipa::path(delete, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "The VM")),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 404, description = "No such VM", body = crate::types::ErrorBody),
        (status = 409, description = "It is still running: stop it first", body = crate::types::ErrorBody),
    ))]
pub async fn remove(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let result = (|| {
        let vm = daemon.vms.get(&id)?;
        if !vm.finished() {
            return Err(Problem::conflict(format!("{id} is running: POST /v1/vms/{id}/stop first")));
        }
        daemon.vms.all().retain(|v| v.id != id);
        let _ = std::fs::remove_dir_all(&vm.dir);
        Ok(())
    })();
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(p) => p.into_response(),
    }
}

/// `GET /v1/vms/{id}/serial`: the guest's serial output; with `follow=true` the response
/// streams until the VM ends.
#[utoipa::path(get, path = "/v1/vms/{id}/serial", tag = "vms",
    params(("id" = String, Path, description = "The VM"),
        SerialParams),
    responses(
        (status = 200, description = "The serial output", content_type = "text/plain", body = String),
        (status = 400, description = "A bad query", body = crate::types::ErrorBody),
        (status = 404, description = "No such VM", body = crate::types::ErrorBody),
        (status = 429, description = "As many streams are open as the daemon takes", body = crate::types::ErrorBody),
    ))]
pub async fn serial(
    State(daemon): State<Arc<Daemon>>,
    transport: Option<Extension<Transport>>,
    Path(id): Path<String>,
    Params(SerialParams { follow }): Params<SerialParams>,
) -> Response {
    let vm = match daemon.vms.get(&id) {
        Ok(vm) => vm,
        Err(p) => return p.into_response(),
    };
    let transport = transport.map_or(Transport::Tcp, |Extension(t)| t);
    let slot = match daemon.open_stream(transport) {
        Ok(slot) => slot,
        Err(p) => return p.into_response(),
    };
    // Chunks of the log from an offset, polling while the VM runs.
    let stream = futures_util::stream::unfold((vm, 0u64, false), move |(vm, offset, done)| async move {
        if done {
            return None;
        }
        loop {
            let finished = vm.finished();
            let path = vm.serial();
            let chunk = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                let mut file = match std::fs::File::open(path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(e),
                };
                file.seek(SeekFrom::Start(offset))?;
                let mut buf = Vec::new();
                file.take(1 << 16).read_to_end(&mut buf)?;
                Ok(buf)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match chunk {
                Ok(bytes) if !bytes.is_empty() => {
                    let next = offset + bytes.len() as u64;
                    return Some((Ok::<_, std::io::Error>(bytes), (vm, next, false)));
                }
                Ok(_) if !follow || finished => return None,
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Some((Err(e), (vm, offset, true))),
            }
        }
    });
    // The slot goes when the stream does.
    let stream = futures_util::StreamExt::map(stream, move |chunk| {
        let _open = &slot;
        chunk
    });
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], Body::from_stream(stream)).into_response()
}
