//! The probe guest's report: one JSON object per serial line, each with a `"probe"` key naming
//! its section, ending with `{"probe":"done","ok":BOOL,"failures":[...]}` (see docs/probe.md).

use serde::Deserialize;
use serde_json::Value;

/// The sections a probe run reported, in order.
#[derive(Debug, Default, Clone)]
pub struct ProbeReport {
    sections: Vec<Value>,
}

/// The closing `done` section.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Done {
    /// True if no check failed.
    pub ok: bool,
    /// What failed.
    pub failures: Vec<String>,
}

/// One memory-map entry of the `boot` section.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct E820Entry {
    /// First address.
    pub addr: u64,
    /// Its length in bytes.
    pub size: u64,
    /// E820 type (1 = RAM).
    #[serde(rename = "type")]
    pub kind: u32,
}

/// The `boot` section: what the VMM handed over.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Boot {
    /// "pvh" or "linux64".
    pub entry: String,
    /// The command line as the guest saw it.
    pub cmdline: String,
    /// The memory map as the guest saw it.
    pub e820: Vec<E820Entry>,
}

impl Boot {
    /// Total usable RAM in the memory map.
    pub fn usable_ram(&self) -> u64 {
        self.e820.iter().filter(|e| e.kind == 1).map(|e| e.size).sum()
    }
}

/// The `nic` section's figures the lab reads (the section has more; docs/probe.md).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Nic {
    /// Why the NIC test could not run, when it could not.
    #[serde(default)]
    pub error: Option<String>,
    /// Frames received.
    #[serde(default)]
    pub rx_frames: Option<u64>,
    /// Bytes received.
    #[serde(default)]
    pub rx_bytes: Option<u64>,
    /// How long receiving took.
    #[serde(default)]
    pub elapsed_ns: Option<u64>,
    /// Interrupts that announced received frames.
    #[serde(default)]
    pub rx_interrupts: Option<u64>,
    /// The driver's own maps before the first frame (rings, TX buffers, the first RX fill).
    #[serde(default)]
    pub initial_maps: Option<u64>,
}

impl ProbeReport {
    /// Reads the report out of serial output; lines that are not probe sections are skipped.
    pub fn parse(serial: &str) -> ProbeReport {
        let sections = serial
            .lines()
            .filter(|line| line.starts_with('{'))
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|v| v.get("probe").is_some_and(Value::is_string))
            .collect();
        ProbeReport { sections }
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Value> {
        self.sections.iter().find(|s| s["probe"] == name)
    }

    /// All sections, in order.
    pub fn sections(&self) -> &[Value] {
        &self.sections
    }

    /// The `boot` section, typed.
    pub fn boot(&self) -> Option<Boot> {
        serde_json::from_value(self.section("boot")?.clone()).ok()
    }

    /// The `nic` section, typed.
    pub fn nic(&self) -> Option<Nic> {
        serde_json::from_value(self.section("nic")?.clone()).ok()
    }

    /// The `done` section, typed.
    pub fn done(&self) -> Option<Done> {
        serde_json::from_value(self.section("done")?.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sections_and_skips_other_output() {
        let serial = "Linux version 6.12\n\
            {\"probe\":\"boot\",\"entry\":\"pvh\",\"cmdline\":\"probe.echo=1\",\"e820\":[{\"addr\":0,\"size\":654336,\"type\":1},{\"addr\":654336,\"size\":394240,\"type\":2}]}\n\
            {\"not\":\"a section\"}\n\
            {broken json\n\
            {\"probe\":\"done\",\"ok\":false,\"failures\":[\"x\"]}\n";
        let report = ProbeReport::parse(serial);
        assert_eq!(report.sections().len(), 2);
        let boot = report.boot().unwrap();
        assert_eq!((boot.entry.as_str(), boot.usable_ram()), ("pvh", 654336));
        assert_eq!(report.done(), Some(Done { ok: false, failures: vec!["x".into()] }));
        assert!(report.section("viommu").is_none());
    }
}
