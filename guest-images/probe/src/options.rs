//! Options read from the command line as `probe.KEY=VALUE`; other words are ignored.

use crate::report;

/// What the command line asked the probe to do.
#[derive(Default)]
pub struct Options {
    /// `probe.echo=1`: report the parsed options in an `options` section.
    pub echo: bool,
    /// `probe.viommu_ops=N`: MAP/UNMAP pairs to time on the virtio-iommu (default 64 when
    /// there is one; giving it makes a missing virtio-iommu a failure).
    pub viommu_ops: Option<u32>,
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
                _ => report::fail_with("unknown option probe.", key),
            }
        }
        options
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
