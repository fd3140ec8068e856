//! Options read from the command line as `probe.KEY=VALUE`; other words are ignored.

use crate::nic::NicOptions;
use crate::report;
use crate::rx_buffers::Strategy;

/// Frames the NIC section receives when `probe.frames` is not given.
const DEFAULT_FRAMES: u32 = 1000;

/// What the command line asked the probe to do.
#[derive(Default)]
pub struct Options {
    /// `probe.echo=1`: report the parsed options in an `options` section.
    pub echo: bool,
    /// `probe.viommu_ops=N`: MAP/UNMAP pairs to time on the virtio-iommu (default 64 when
    /// there is one; giving it makes a missing virtio-iommu a failure).
    pub viommu_ops: Option<u32>,
    /// `probe.nic=aqc100`: drive the AQC100 (a missing one is then a failure).
    pub nic: bool,
    /// `probe.rx=flip|order3|pool`: the RX buffer strategy (default flip).
    pub rx: Option<Strategy>,
    /// `probe.frames=N`: frames to receive (default 1000).
    pub frames: Option<u32>,
    /// `probe.out=com1|com2`: the port the report goes to (default com1).
    pub out_com2: bool,
    /// `probe.hold=MS`: after the checks, wait this long for the ACPI power button before
    /// powering off (powering off at once when it is pressed).
    pub hold_ms: Option<u32>,
    /// `probe.panic=1`: panic after the boot report, as a crashing guest would (for the lab's
    /// crash detection).
    pub panic: bool,
}

impl Options {
    /// Parses the probe's options; an unknown key or a bad value is recorded as a failure.
    pub fn parse(cmdline: &str) -> Options {
        let mut options = Options::default();
        for word in cmdline.split_ascii_whitespace() {
            let Some(option) = word.strip_prefix("probe.") else {
                continue;
            };
            let (key, value) = option.split_once('=').unwrap_or((option, "1"));
            match key {
                "echo" => options.echo = flag(key, value),
                "viommu_ops" => options.viommu_ops = number(key, value),
                "nic" => match value {
                    "aqc100" => options.nic = true,
                    _ => report::fail_with("probe.nic supports aqc100, not ", value),
                },
                "rx" => match Strategy::parse(value) {
                    Some(strategy) => options.rx = Some(strategy),
                    None => report::fail_with("probe.rx is flip, order3 or pool, not ", value),
                },
                "frames" => options.frames = number(key, value),
                "out" => match value {
                    "com1" => options.out_com2 = false,
                    "com2" => options.out_com2 = true,
                    _ => report::fail_with("probe.out is com1 or com2, not ", value),
                },
                "hold" => options.hold_ms = number(key, value),
                "panic" => options.panic = flag(key, value),
                _ => report::fail_with("unknown option probe.", key),
            }
        }
        if !options.nic && (options.rx.is_some() || options.frames.is_some()) {
            report::fail("probe.rx and probe.frames need probe.nic=aqc100");
        }
        options
    }

    /// What the NIC section should do, if it should run.
    pub fn nic(&self) -> Option<NicOptions> {
        self.nic.then(|| NicOptions {
            strategy: self.rx.unwrap_or(Strategy::Flip),
            frames: self.frames.unwrap_or(DEFAULT_FRAMES),
        })
    }
}

fn flag(key: &str, value: &str) -> bool {
    match value {
        "1" | "true" | "yes" | "on" => true,
        "0" | "false" | "no" | "off" => false,
        _ => {
            report::fail_with("option needs 0 or 1: probe.", key);
            false
        }
    }
}

fn number(key: &str, value: &str) -> Option<u32> {
    match value.parse() {
        Ok(n) => Some(n),
        Err(_) => {
            report::fail_with("option needs a number: probe.", key);
            None
        }
    }
}
