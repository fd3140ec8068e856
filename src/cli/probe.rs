//! `driverlab probe --device ...`: the probe guest's NIC checks on one device.

use anyhow::Context;
use clap::Args;
use vm_spec::{DeviceBackend, DeviceSpec};

/// Options of `driverlab probe`.
#[derive(Args)]
pub struct ProbeArgs {
    /// The device: `vfio=0000:63:00.0` (a host AQC100 bound to vfio-pci) or
    /// `vfio-user=/path/to/socket` (e.g. `driverlab model aqc100 --generate ...`).
    #[arg(long, value_name = "vfio=BDF|vfio-user=SOCKET")]
    pub device: DeviceSpec,
    /// Frames to receive through the vIOMMU [default: 64 for vfio-user, 0 for vfio: a host NIC
    /// may have no peer sending].
    #[arg(long, value_name = "N")]
    pub frames: Option<u32>,
}

/// Prints the one-line verdict, then the JSON; exit code 0 healthy, 1 not.
pub fn run(args: ProbeArgs) -> anyhow::Result<u8> {
    let driverlab = std::env::current_exe().context("locating the driverlab binary")?;
    let frames = args.frames.unwrap_or(match args.device.backend {
        DeviceBackend::Vfio(_) => 0,
        DeviceBackend::VfioUser(_) => 64,
    });
    // The probe's serial log goes into a folder of its own, gone with the check.
    let dir = tempfile::tempdir().context("a folder for the probe's serial log")?;
    let engine = engines::driverlab::DriverlabEngine::new(engines::Programs::beside(&driverlab).vmm);
    let health = engines::health::check(&engine, dir.path(), &args.device, frames);
    println!("{}", health.verdict());
    println!("{}", serde_json::to_string(&health)?);
    Ok(if health.ok { 0 } else { 1 })
}
