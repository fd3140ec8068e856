//! The device health check (`driverlab probe --device ...`): the probe guest's NIC checks on one
//! device in a fresh micro-VM behind the virtio-iommu: firmware, MAC, link, DMA through the
//! vIOMMU, MSI-X delivery of received frames, transmit completion. The lab runs it before a
//! matrix touches a device and after a repetition on it failed, so a dead NIC costs seconds.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use vm_spec::{DeviceSpec, ExitReason, IommuSpec, Kernel, NicKind, SerialOutput, VmSpec};

use crate::device::DeviceSource;
use crate::model_process::ModelProcess;
use crate::probe_report::ProbeReport;
use crate::program::Program;
use crate::{BootRequest, Booted, Ending, Engine, Watch};

/// How long one check may take.
const CHECK_TIMEOUT_S: f64 = 30.0;
/// Frames a model's generator sends during its check.
pub const FRAMES_MODEL: u32 = 64;

/// What the check found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Health {
    /// The device as given.
    pub device: String,
    /// Every check passed.
    pub ok: bool,
    /// Firmware version.
    pub fw: Option<String>,
    /// Permanent MAC address.
    pub mac: Option<String>,
    /// Link speed.
    pub link_mbps: Option<u64>,
    /// The device sat behind the virtio-iommu and its DMA went through the guest's mappings.
    pub iommu: Option<bool>,
    /// Frames received (through the vIOMMU, announced by MSI-X).
    pub rx_frames: Option<u64>,
    /// Received frames were announced by MSI-X.
    pub msix: Option<bool>,
    /// Frames sent and counted by the NIC.
    pub tx_frames: Option<u64>,
    /// The device was reset and healthy at teardown.
    pub reset_ok: Option<bool>,
    /// What failed.
    pub failures: Vec<String>,
    /// Wall time of the check.
    pub ms: f64,
}

impl Health {
    /// The one-line verdict: `PASS device: ...` or `FAIL device: ...`.
    pub fn verdict(&self) -> String {
        let mut facts = Vec::new();
        if let (Some(fw), Some(mac)) = (&self.fw, &self.mac) {
            facts.push(format!("AQC100 fw {fw}, MAC {mac}"));
        }
        if let Some(link) = self.link_mbps {
            facts.push(format!("link {link} Mb/s"));
        }
        if let Some(frames) = self.rx_frames.filter(|&n| n > 0) {
            let msix = if self.msix == Some(true) { "MSI-X" } else { "no MSI-X" };
            facts.push(format!("{frames} frames through the vIOMMU by {msix}"));
        }
        if let Some(tx) = self.tx_frames {
            facts.push(format!("{tx} sent"));
        }
        let what = if self.ok { facts.join(", ") } else { self.failures.join("; ") };
        format!("{} {}: {what} ({:.0} ms)", if self.ok { "PASS" } else { "FAIL" }, self.device, self.ms)
    }
}

/// Checks `device` on an AQC100 under `engine`, its serial log in `dir`; `frames` is how many
/// frames to receive (0 when no traffic can arrive, e.g. a host NIC without a peer sending).
pub fn check(engine: &dyn Engine, dir: &Path, device: &DeviceSpec, frames: u32) -> Health {
    check_nic(engine, dir, device, frames, Some(NicKind::Aqc100))
}

/// The same for a NIC the probe drives, or, with `None`, a device the probe only finds and
/// passes through (its platform checks, the virtio-iommu, the reset).
pub fn check_nic(engine: &dyn Engine, dir: &Path, device: &DeviceSpec, frames: u32, nic: Option<NicKind>) -> Health {
    let nic_words = nic.map(|n| format!(" probe.nic={n} probe.frames={frames}")).unwrap_or_default();
    let serial = dir.join("health.log");
    let spec = VmSpec {
        cmdline: format!("probe.viommu_ops=0{nic_words}"),
        iommu: Some(IommuSpec::default()),
        devices: vec![device.clone()],
        serial: vm_spec::SerialSpec { com1: SerialOutput::File(serial.clone()), com2: None },
        timeout_s: Some(CHECK_TIMEOUT_S),
        ..VmSpec::new(Kernel::Probe)
    };
    let start = Instant::now();
    let booted = engine.boot(BootRequest {
        spec,
        watch: Watch { silence: Duration::from_secs_f64(CHECK_TIMEOUT_S), agent_log: None, unplug: None },
        model: None,
        counters: None,
        dir,
        bzimage: None,
        accel: Default::default(),
        start: crate::Start::Boot,
    });
    let report = ProbeReport::parse(&std::fs::read_to_string(&serial).unwrap_or_default());
    let nic = report.section("nic");
    let field = |key: &str| nic.and_then(|n| n.get(key));
    let reset_ok = booted.exit.as_ref().and_then(|e| e.devices.first()).map(|d| d.reset_ok);
    let mut failures: Vec<String> = report.done().map(|d| d.failures).unwrap_or_default();
    failures.extend(ending_failure(&booted, &report));
    if reset_ok == Some(false) {
        failures.push("the device was not healthy after its reset".into());
    }
    Health {
        device: device.to_string(),
        ok: failures.is_empty(),
        fw: field("fw").and_then(|v| v.as_str()).map(String::from),
        mac: field("mac").and_then(|v| v.as_str()).map(String::from),
        link_mbps: field("link_mbps").and_then(|v| v.as_u64()),
        iommu: field("iommu").and_then(|v| v.as_bool()),
        rx_frames: field("rx_frames").and_then(|v| v.as_u64()),
        msix: field("msix").and_then(|v| v.as_bool()),
        tx_frames: field("tx_counted").and_then(|v| v.as_u64()),
        reset_ok,
        failures,
        ms: start.elapsed().as_secs_f64() * 1e3,
    }
}

/// What the VM's end says is wrong, if anything: the VMM's error, an end other than power-off,
/// a report the probe did not finish.
fn ending_failure(booted: &Booted, report: &ProbeReport) -> Option<String> {
    if let Some(error) = &booted.error {
        return Some(error.message.clone());
    }
    match &booted.ending {
        Ending::Stopped { reason: ExitReason::Poweroff, .. } if report.done().is_none() => {
            Some("the probe did not finish its report".into())
        }
        Ending::Stopped { reason: ExitReason::Poweroff, .. } => None,
        Ending::Stopped { reason, .. } => {
            Some(format!("the VM ended with {reason} (exit code {})", reason.exit_code()))
        }
        Ending::Refused(why) | Ending::Unexplained(why) => Some(why.clone()),
        Ending::Killed => Some("the VMM did not end at its timeout and was killed".into()),
    }
}

/// Checks a device of a matrix as `source` says it is (`nic`: its NIC, where the lab knows it):
/// a fresh model process for a model (on its generator), the host device itself otherwise.
/// The error is why the check could not run at all.
pub fn check_device(
    engine: &dyn Engine,
    models: &Program,
    dir: &Path,
    source: &DeviceSource,
    nic: Option<NicKind>,
) -> Result<Health, String> {
    let (spec, frames, _model) = match source {
        DeviceSource::Host { bdf, .. } => (DeviceSpec::vfio(*bdf), 0, None),
        DeviceSource::Model { nic, wire } => {
            let args = wire.model_args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let model = ModelProcess::start(models, nic.name(), &args).map_err(|e| e.to_string())?;
            (model.device_spec(), FRAMES_MODEL, Some(model))
        }
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The probe drives the NICs driverlab knows; other NICs it only finds.
    Ok(check_nic(engine, dir, &spec, frames, nic))
}
