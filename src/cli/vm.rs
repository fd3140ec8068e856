//! `driverlab vm ...`

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use vmm::{EntryProtocol, KernelSource, SerialOutput, VmConfig};

use super::CodedError;

/// Micro-VM commands.
#[derive(Subcommand)]
pub enum VmCommand {
    /// Boot a kernel in a fresh micro-VM and run it until it powers off, resets, fails or times
    /// out. Serial output goes to stdout (or --serial); one JSON summary line goes to stderr.
    ///
    /// Exit codes: 0 poweroff, 1 VMM error, 2 bad input, 3 reset or triple fault,
    /// 4 KVM internal error, 5 guest panic, 6 timeout.
    Run(RunArgs),
}

impl VmCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            VmCommand::Run(args) => run(args),
        }
    }
}

/// Boot protocol choice.
#[derive(Clone, Copy, ValueEnum)]
pub enum Entry {
    /// PVH if the ELF has a PVH note, else the 64-bit Linux entry.
    Auto,
    /// PVH (the ELF must have a PVH note).
    Pvh,
    /// The 64-bit Linux boot protocol entry (ELF e_entry, or bzImage + 0x200).
    Linux64,
}

/// Options of `driverlab vm run`.
#[derive(Args)]
pub struct RunArgs {
    /// Kernel: an ELF vmlinux (PVH or 64-bit entry), a bzImage, or `probe` for the embedded
    /// probe guest.
    #[arg(long, value_name = "PATH|probe")]
    pub kernel: String,
    /// Initial ramdisk.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, value_name = "STRING", default_value = "")]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MiB", default_value_t = 256)]
    pub memory: u64,
    /// Number of vCPUs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u32,
    /// Write the guest's serial output to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub serial: Option<PathBuf>,
    /// Stop the VM after this many seconds (exit code 6).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Boot protocol.
    #[arg(long, value_enum, default_value = "auto")]
    pub entry: Entry,
    /// Put a virtio-iommu in front of every PCI endpoint (described to the guest by ACPI VIOT).
    /// Without it, device DMA is identity-mapped.
    #[arg(long)]
    pub iommu: bool,
    /// With --iommu: whether endpoints the guest has not attached to a domain bypass translation
    /// (the virtio-iommu `bypass` field at reset).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub iommu_bypass: bool,
    /// Pass a device through: `vfio=0000:63:00.0` (a host device bound to vfio-pci) or
    /// `vfio-user=/path/to/socket` (a device served over vfio-user, e.g. by `driverlab model`).
    /// Repeatable; devices appear at 00:02.0, 00:03.0, ...
    #[arg(long = "device", value_name = "vfio=BDF|vfio-user=SOCKET")]
    pub devices: Vec<vmm::DeviceSpec>,
    /// Debugging only: run without the seccomp filters.
    #[arg(long)]
    pub no_seccomp: bool,
}

fn bad_input(message: String) -> anyhow::Error {
    CodedError { message, code: vmm::exit::code::BAD_INPUT as u8 }.into()
}

fn run(args: RunArgs) -> anyhow::Result<u8> {
    let kernel = match args.kernel.as_str() {
        "probe" => KernelSource::Embedded { name: "probe", image: guest_images::PROBE_ELF },
        path => KernelSource::File(PathBuf::from(path)),
    };
    let timeout = match args.timeout {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            return Err(bad_input(format!("--timeout {s}: must be a positive number of seconds")));
        }
    };
    let config = VmConfig {
        kernel,
        initrd: args.initrd,
        cmdline: args.cmdline,
        memory_mib: args.memory,
        vcpus: args.vcpus,
        serial: args.serial.map_or(SerialOutput::Stdout, SerialOutput::File),
        timeout,
        seccomp: !args.no_seccomp,
        entry: match args.entry {
            Entry::Auto => EntryProtocol::Auto,
            Entry::Pvh => EntryProtocol::Pvh,
            Entry::Linux64 => EntryProtocol::Linux64,
        },
        iommu: args.iommu.then_some(vmm::platform::IommuConfig { bypass: args.iommu_bypass }),
        devices: args.devices,
    };
    match vmm::run(&config) {
        Ok(summary) => {
            eprintln!("{}", summary.to_json());
            Ok(summary.exit_code as u8)
        }
        Err(e) => Err(CodedError { message: e.to_string(), code: e.exit_code() as u8 }.into()),
    }
}
