//! `driverlab doctor`: host preflight.

use clap::Args;
use passthrough::Bdf;
use passthrough::doctor::{self, Check, HostFacts, Status};
use passthrough::sysfs::Sysfs;
use vm_spec::host::Virtualization;

/// Options of `driverlab doctor`.
#[derive(Args)]
pub struct DoctorArgs {
    /// The PCI device to pass through, as `lspci -D` prints it (e.g. 0000:63:00.0).
    #[arg(long, value_name = "BDF")]
    pub device: Option<Bdf>,
    /// Guest memory the checks assume, in MiB (VFIO pins all of it).
    #[arg(long, value_name = "MiB", default_value_t = 1024)]
    pub memory: u64,
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
}

fn kvm_check() -> Check {
    match vm_spec::host::virtualization() {
        v @ Virtualization::Hardware(_) => Check::pass("kvm", v.describe()),
        v @ (Virtualization::Pvm | Virtualization::Unknown) => Check::warn(
            "kvm",
            v.describe(),
            "the probe guest runs here; Linux guests under driverlab's VMM need a host with VT-x or AMD-V \
             (QEMU with TCG still runs them)",
        ),
        v @ Virtualization::Unavailable(_) => Check::fail(
            "kvm",
            v.describe(),
            "sudo modprobe kvm_intel (or kvm_amd), enable virtualization in the firmware, and add yourself to the kvm group",
        ),
    }
}

/// Runs the checks; exit code 1 if any failed.
pub fn run(args: DoctorArgs) -> anyhow::Result<u8> {
    let mut checks = vec![kvm_check()];
    checks.extend(doctor::check(&Sysfs::host(), &HostFacts::read(), args.device, args.memory << 20));
    // The jail: a step the host cannot take is a warning, the VMM still runs (and says so).
    checks.extend(jail::preflight().into_iter().map(|r| match r.result {
        Ok(detail) => Check::pass(r.name, detail),
        Err((detail, fix)) => Check::warn(r.name, detail, fix),
    }));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for check in &checks {
            let status = match check.status {
                Status::Pass => "PASS",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{status} {:<12} {}", check.name, check.detail);
            if let Some(fix) = &check.fix {
                println!("     {:<12} fix: {fix}", "");
            }
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 && !args.json {
        println!(
            "{failed} check(s) failed: passthrough of a real device will not work on this host until they are fixed"
        );
    }
    Ok(u8::from(failed > 0))
}
