//! The matrix `lab try` writes for a patch or a series: what a user would have written for
//! the common case. One patch: the stock driver (the kernel's own) against the patched one.
//! Several (an mbox of a series, several files, a folder): every prefix of the series. On a
//! model of the driver's device, under a workload with the lab's defaults, with repetitions
//! enough for the lab's verdict. The text is a matrix like any other, to keep and edit.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::matrix::EngineKind;

/// The workloads `lab try` offers, each with the lab's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::Display, strum::EnumString, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum TrialWorkload {
    /// iperf3 from the peer to the guest for 8 s: throughput and maps per packet.
    #[default]
    Iperf3,
    /// 64-byte UDP frames from the peer as fast as it sends: packets per second.
    PacketRate,
    /// sockperf ping-pong over UDP: round trips.
    Latency,
    /// xdp-bench drop under 64-byte frames from the peer.
    Xdp,
    /// The kernel's NIC selftests `ping.py` and `stats.py`.
    Kselftest,
}

impl TrialWorkload {
    /// Its `[[workload]]` table.
    fn table(self) -> &'static str {
        match self {
            TrialWorkload::Iperf3 => "name = \"rx\"\nkind = \"iperf3\"\ndirection = \"rx\"\nduration_s = 8\n",
            TrialWorkload::PacketRate => {
                "name = \"pps\"\nkind = \"packet-rate\"\ndirection = \"rx\"\nframe_bytes = 64\n"
            }
            TrialWorkload::Latency => "name = \"rtt\"\nkind = \"latency\"\nprotocol = \"udp\"\n",
            TrialWorkload::Xdp => "name = \"xdp\"\nkind = \"xdp\"\naction = \"drop\"\n",
            TrialWorkload::Kselftest => {
                "name = \"selftests\"\nkind = \"kselftest\"\ntests = [\"ping.py\", \"stats.py\"]\n"
            }
        }
    }
}

/// What `lab try` is asked for.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The patch files (or one folder of them), as the user named them.
    pub patches: Vec<PathBuf>,
    /// How many patches they hold.
    pub count: usize,
    /// The device model: `aqc100` or `lan743x`.
    pub nic: vm_spec::NicKind,
    /// The workload.
    pub workload: TrialWorkload,
    /// Repetitions of each cell.
    pub repetitions: u32,
    /// What runs the guests.
    pub engine: EngineKind,
}

impl Trial {
    /// The matrix, as TOML with comments that say what it is.
    pub fn matrix(&self) -> String {
        let files: Vec<String> =
            self.patches.iter().map(|p| format!("{:?}", absolute(p).display().to_string())).collect();
        let name = self.patches.first().and_then(|p| p.file_stem()).map_or("patch".into(), |s| s.to_string_lossy());
        let name: String =
            name.chars().map(|c| if c.is_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
        let driver = match self.nic {
            vm_spec::NicKind::Aqc100 => "drivers/net/ethernet/aquantia/atlantic",
            vm_spec::NicKind::Lan743x => "drivers/net/ethernet/microchip",
        };
        let series = self.count > 1;
        let mut out = String::new();
        let what = if series { "every prefix of the series" } else { "the stock driver against the patched one" };
        let _ = writeln!(out, "# Written by `driverlab lab try`: {what}, on the {} model,", self.nic.name());
        let _ = writeln!(
            out,
            "# {} workload, {} repetitions, {} engine. Keep it, edit it, run it",
            self.workload, self.repetitions, self.engine
        );
        let _ = writeln!(out, "# again with `driverlab lab run FILE`.");
        let _ = writeln!(out, "name = \"try-{name}\"");
        let _ = writeln!(out, "repetitions = {}", self.repetitions);
        let _ = writeln!(out, "timeout_s = 300\nsilence_s = 120");
        if !series {
            let _ = writeln!(out, "baseline = \"stock\"");
        }
        let _ = writeln!(out, "\n[[device]]\nname = \"{0}\"\nmodel = \"{0}\"", self.nic.name());
        let image = |name: &str| {
            format!(
                "\n[[image]]\nname = \"{name}\"\nengine = \"{}\"\nkernel = \"debian\"\ninitrd = \"agent\"\ndriver = \"{driver}\"\nmemory_mib = 512\n",
                self.engine
            )
        };
        if series {
            let _ = writeln!(out, "{}series = [{}]", image("driver"), files.join(", "));
            let _ = writeln!(out, "\n[[variant]]\nname = \"{}\"\nimage = \"driver\"", self.nic.linux_driver());
        } else {
            let _ = write!(out, "{}", image("stock"));
            let _ = writeln!(out, "{}patches = [{}]", image("patched"), files.join(", "));
            let _ = writeln!(out, "\n[[variant]]\nname = \"stock\"\nimage = \"stock\"");
            let _ = writeln!(out, "\n[[variant]]\nname = \"patched\"\nimage = \"patched\"");
        }
        let _ = write!(out, "\n[[workload]]\n{}", self.workload.table());
        out
    }
}

/// `path` from the root, so that the matrix finds it wherever the matrix is kept.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Plan;

    #[test]
    fn one_patch_is_stock_against_patched_and_a_series_every_prefix() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let one = Trial {
            patches: vec![examples.join("patches/000-atlantic-rxpageorder.patch")],
            count: 1,
            nic: vm_spec::NicKind::Aqc100,
            workload: TrialWorkload::Iperf3,
            repetitions: 3,
            engine: EngineKind::Qemu,
        };
        let file = examples.join("try.toml");
        let plan = Plan::parse(&file, &one.matrix()).unwrap();
        let variants: Vec<&str> = plan.cells.iter().map(|c| c.variant.as_str()).collect();
        assert_eq!((variants, plan.baseline()), (vec!["stock", "patched"], Some("stock")));
        assert_eq!(plan.matrix.name, "try-000-atlantic-rxpageorder");
        let series = Trial {
            patches: vec![examples.join("patches/series-synthetic")],
            count: 3,
            nic: vm_spec::NicKind::Aqc100,
            workload: TrialWorkload::Latency,
            ..one.clone()
        };
        let text = crate::recipe::inline_series(&file, &series.matrix()).unwrap();
        let plan = Plan::parse(&file, &text).unwrap();
        assert_eq!(plan.cells.len(), 4, "the base and three prefixes");
        assert_eq!(plan.baseline(), Some("atlantic@0"));
        assert_eq!(plan.matrix.workloads[0].get_ref().name(), "rtt");
        for workload in <TrialWorkload as strum::VariantArray>::VARIANTS {
            let lan = Trial { nic: vm_spec::NicKind::Lan743x, workload: *workload, ..one.clone() };
            let text = lan.matrix().replace("000-atlantic-rxpageorder", "004-lan743x-revert-dma-descriptor-spacing");
            match (workload, Plan::parse(&file, &text)) {
                // The LAN7430's driver has no XDP: the matrix's own check says so.
                (TrialWorkload::Xdp, Err(e)) => assert!(e.to_string().contains("no XDP"), "{e}"),
                (_, plan) => assert_eq!(plan.unwrap().cells.len(), 2, "{workload}"),
            }
        }
    }
}
