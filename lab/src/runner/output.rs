//! What the guest left in the repetition's folder, read and parsed once: its console, and the
//! probe's report on it or the guest agent's frames on its own port.

use std::path::Path;

use engines::agent::Frames;
use engines::probe_report::ProbeReport;

/// COM1, in the repetition's folder.
pub(super) const SERIAL_LOG: &str = "serial.log";
/// COM2, the guest agent's port (Linux images).
pub(super) const AGENT_LOG: &str = "agent.log";

/// What the guest reported.
pub(super) enum Report {
    /// The probe guest's JSON lines on COM1.
    Probe(ProbeReport),
    /// The guest agent's frames on COM2.
    Linux(Frames),
}

/// The guest's console and its report.
pub(super) struct GuestOutput {
    /// COM1, as text.
    pub(super) serial: String,
    /// Its report.
    pub(super) report: Report,
}

impl GuestOutput {
    /// Reads what the guest left in `dir`; a Linux guest's report is its agent's frames.
    pub(super) fn read(dir: &Path, linux: bool) -> GuestOutput {
        let serial = std::fs::read_to_string(dir.join(SERIAL_LOG)).unwrap_or_default();
        let report = if linux {
            Report::Linux(engines::agent::parse(&std::fs::read(dir.join(AGENT_LOG)).unwrap_or_default()))
        } else {
            Report::Probe(ProbeReport::parse(&serial))
        };
        GuestOutput { serial, report }
    }

    /// The first crash the console shows (for the probe, its report's panic or fault first).
    pub(super) fn crash(&self) -> Option<crate::record::Crash> {
        let probe = match &self.report {
            Report::Probe(report) => engines::crash::in_probe_report(report),
            Report::Linux(_) => None,
        };
        probe.or_else(|| engines::crash::in_kernel_log(&self.serial))
    }
}
