//! The probe guest's end-to-end receive rate per RX buffer strategy against the AQC100 model (the
//! model's receive path alone is `device_models::aqc100::rx_bench`).

use std::time::Duration;

use vm_spec::{IommuSpec, Kernel, VmSpec};

use super::BenchError;
use engines::model_process::ModelProcess;
use engines::probe_report::ProbeReport;
use engines::vm_process::VmProcess;

/// The probe's end-to-end receive figures for one strategy.
#[derive(Debug, Clone)]
pub struct NicRun {
    /// The strategy.
    pub strategy: String,
    /// The probe's `nic` section.
    pub nic: serde_json::Value,
}

impl NicRun {
    /// Frames per second the probe received.
    pub fn pps(&self) -> f64 {
        let frames = self.nic["rx_frames"].as_f64().unwrap_or(0.0);
        let ns = self.nic["elapsed_ns"].as_f64().unwrap_or(f64::INFINITY);
        frames * 1e9 / ns
    }
}

/// Boots the probe against a fresh `driverlab model aqc100 --generate` for each strategy and
/// collects what it reports.
pub fn nic(programs: &engines::Programs, strategies: &[&str], frames: u32) -> Result<Vec<NicRun>, BenchError> {
    let mut runs = Vec::new();
    for (run, strategy) in strategies.iter().enumerate() {
        let model =
            ModelProcess::start(&programs.model, vm_spec::NicKind::Aqc100.name(), &["--generate", "size=1514"])?;
        let spec = VmSpec {
            cmdline: format!("probe.nic=aqc100 probe.rx={strategy} probe.frames={frames} probe.viommu_ops=0"),
            iommu: Some(IommuSpec::default()),
            devices: vec![model.device_spec()],
            timeout_s: Some(600.0),
            ..VmSpec::new(Kernel::Probe)
        };
        let out = VmProcess::new(&programs.vmm, spec, Duration::from_secs(60)).run()?;
        let report = ProbeReport::parse(&out.serial);
        match (out.code(), report.done(), report.section("nic")) {
            (Some(0), Some(done), Some(nic)) if done.ok => {
                runs.push(NicRun { strategy: strategy.to_string(), nic: nic.clone() })
            }
            (code, done, _) => {
                return Err(BenchError::BadRun {
                    engine: "driverlab",
                    run,
                    detail: format!("{strategy}: exit code {code:?}, probe {done:?}, stderr: {}", out.stderr.trim()),
                });
            }
        }
    }
    Ok(runs)
}
