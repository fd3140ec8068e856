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
    /// `probe.nic=lan743x`: drive the LAN7430 instead.
    pub lan743x: bool,
    /// `probe.dspace=16|32|64|128`: the LAN7430's descriptor spacing (default 16, Linux 6.12's).
    pub dspace: Option<u32>,
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
                    "lan743x" => options.lan743x = true,
                    _ => report::fail_with("probe.nic supports aqc100 and lan743x, not ", value),
                },
                "rx" => match Strategy::parse(value) {
                    Some(strategy) => options.rx = Some(strategy),
                    None => report::fail_with("probe.rx is flip, order3 or pool, not ", value),
                },
                "frames" => options.frames = number(key, value),
                "dspace" => match number(key, value) {
                    Some(n @ (16 | 32 | 64 | 128)) => options.dspace = Some(n),
                    Some(_) => report::fail_with("probe.dspace is 16, 32, 64 or 128, not ", value),
                    None => {}
                },
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
        if !options.nic && !options.lan743x && (options.rx.is_some() || options.frames.is_some()) {
            report::fail("probe.rx and probe.frames need probe.nic=aqc100 or lan743x");
        }
        if !options.lan743x && options.dspace.is_some() {
            report::fail("probe.dspace needs probe.nic=lan743x");
        }
        options
    }

    /// What the LAN7430 section should do, if it should run: the NIC options and the spacing.
    pub fn lan743x(&self) -> Option<(NicOptions, u32)> {
        let nic =
            NicOptions { strategy: self.rx.unwrap_or(Strategy::Flip), frames: self.frames.unwrap_or(DEFAULT_FRAMES) };
        self.lan743x.then_some((nic, self.dspace.unwrap_or(16)))
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
