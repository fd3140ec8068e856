//! Benchmarks over HTTP: `POST /v1/bench/boot` boots a kernel of the image store under each
//! engine of this box, interleaved, and answers with the figures (`driverlab bench boot --linux
//! ... --url`). One at a time, at most 30 boots per engine, only where KVM boots Linux; the
//! kernel is named by its image ID, never by a path.

use std::sync::Arc;

use ::bench::linux_boot::{self, LinuxBootConfig, QemuBinary};
use axum::Json;
use axum::extract::State;
use guest_images::kernel_image::KernelManifest;

use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::types::{BenchBoot, BenchBootResult};
use guest_images::store::{ImageId, ImageKind};

/// Most boots per engine one request may ask for.
pub const MAX_RUNS: u32 = 30;
/// Guest memory of each boot, MiB.
const MEMORY_MIB: u64 = 256;

/// `POST /v1/bench/boot`.
#[utoipa::path(post, path = "/v1/bench/boot", tag = "bench", request_body = BenchBoot,
    responses(
        (status = 200, description = "The figures", body = BenchBootResult),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 404, description = "No such kernel image", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "Not a kernel image, runs out of 1..=30, a host whose KVM cannot boot Linux, or no QEMU engine", body = crate::types::ErrorBody),
        (status = 429, description = "Another benchmark is running", body = crate::types::ErrorBody),
        (status = 500, description = "A boot failed", body = crate::types::ErrorBody),
    ))]
pub async fn boot(State(daemon): State<Arc<Daemon>>, payload: Payload) -> Result<Json<BenchBootResult>, Problem> {
    let request: BenchBoot = payload.json()?;
    if ImageId::of_kind(&request.kernel, ImageKind::Kernel).is_none() {
        return Err(Problem::unprocessable(format!("kernel {:?}: give a kernel image's ID", request.kernel)));
    }
    if !(1..=MAX_RUNS).contains(&request.runs) {
        return Err(Problem::unprocessable(format!("runs {}: 1 to {MAX_RUNS}", request.runs)));
    }
    let virt = vm_spec::host::virtualization();
    if !virt.boots_linux() {
        return Err(Problem::unprocessable(format!("this host's KVM cannot boot Linux ({virt:?})")));
    }
    blocking(move || {
        let _only =
            daemon.benches.try_lock().map_err(|_| Problem::busy("another benchmark is running; try again after it"))?;
        let store = daemon.images();
        let kernel: KernelManifest = store.manifest(&request.kernel)?;
        let qemu = match request.qemu {
            true => Some(QemuBinary::Chroot(
                daemon.env.qemu().map_err(|e| Problem::unprocessable(format!("QEMU beside driverlab: {e}")))?.clone(),
            )),
            false => None,
        };
        let scratch = tempfile::tempdir().map_err(|e| Problem::internal(format!("a scratch folder: {e}")))?;
        let initrd = linux_boot::initramfs_in(scratch.path(), None).map_err(|e| Problem::internal(e.to_string()))?;
        let config = LinuxBootConfig {
            vmm: daemon.env.programs.vmm.clone(),
            kernel: kernel.vmlinux_path(store),
            initrd,
            qemu,
            q35: request.q35,
            cloud_hypervisor: None,
            runs: request.runs as usize,
            memory_mib: MEMORY_MIB,
            rerun_failed: vm_spec::host::emulated_by_tcg(),
        };
        let bench = linux_boot::run(&config, &|line| tracing::info!("bench boot: {line}"))
            .map_err(|e| Problem::internal(e.to_string()))?;
        let table = linux_boot::table(&bench);
        let bench = serde_json::to_value(&bench).map_err(|e| Problem::internal(e.to_string()))?;
        Ok(Json(BenchBootResult { bench, table }))
    })
    .await
}
