//! `driverlab vm ...`

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use vm_spec::{DeviceSpec, Entry as SpecEntry, ErrorKind, ErrorLine, IommuSpec, Kernel, SerialOutput, VmSpec};

/// Micro-VM commands.
#[derive(Subcommand)]
pub enum VmCommand {
    /// Boot a kernel in a fresh micro-VM and run it until it powers off, resets, fails, times out
    /// or is stopped. Serial output goes to stdout (or --serial); one JSON line goes to stderr last:
    /// the exit line (`{"vmm":"exit",...}`) of a VM that ran, or the error line
    /// (`{"vmm":"error","kind":...,"message":...,"exit_code":N}`) of one that could not.
    ///
    /// The VM is described by a JSON spec (--config, see docs/vmm.md) or by flags, which build
    /// the same spec; a flag given with --config replaces that field of the file's spec.
    ///
    /// Exit codes: 0 poweroff, 1 VMM, host or device-peer failure, 2 bad input, 3 reset or triple
    /// fault, 4 KVM internal error, 5 guest panic, 6 timeout, 7 stopped through the control
    /// socket.
    Run(Box<RunArgs>),
    /// Test-only: enters the VMM's jail by the VMM's own code path, then tries what a guest
    /// that broke out would try and prints one JSON line saying how each attempt ended.
    #[command(hide = true)]
    JailBreak(JailBreakArgs),
}

impl VmCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            VmCommand::Run(args) => run(*args),
            VmCommand::JailBreak(args) => Ok(crate::cli::jail_break::run(&args)),
        }
    }
}

/// Options of the hidden `driverlab vm jail-break`.
#[derive(Args)]
pub struct JailBreakArgs {
    /// A Unix socket to try to connect to (the daemon's).
    #[arg(long)]
    pub socket: PathBuf,
    /// A process to try to ptrace and to signal (another VMM).
    #[arg(long)]
    pub pid: i32,
    /// A TCP port on 127.0.0.1 to try to connect to.
    #[arg(long)]
    pub port: u16,
    /// Guest memory the jail is sized for, MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u64,
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
    /// The VM spec as JSON: a file, or `-` for stdin (docs/vmm.md lists its fields).
    #[arg(long, value_name = "FILE|-")]
    pub config: Option<PathBuf>,
    /// Print the spec that the flags and --config give, as JSON, and exit without running it.
    #[arg(long)]
    pub print_spec: bool,
    /// Serve the control socket here: HTTP/JSON on a Unix socket (vm.info, vm.counters,
    /// vm.shutdown; docs/vmm.md).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Kernel: an ELF vmlinux (PVH or 64-bit entry), a bzImage, or `probe` for the embedded
    /// probe guest.
    #[arg(long, value_name = "PATH|probe", required_unless_present = "config")]
    pub kernel: Option<String>,
    /// Initial ramdisk.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, value_name = "STRING")]
    pub cmdline: Option<String>,
    /// Guest memory in MiB [default: 256].
    #[arg(long, value_name = "MiB")]
    pub memory: Option<u64>,
    /// Number of vCPUs [default: 1].
    #[arg(long, value_name = "N")]
    pub vcpus: Option<u32>,
    /// Where COM1 (the console) goes: a file, `unix:PATH` (a listening socket), `stdout` or
    /// `discard` [default: stdout].
    #[arg(long, value_name = "FILE|unix:PATH|stdout|discard")]
    pub serial: Option<String>,
    /// Give the guest COM2 (0x2f8, IRQ 3), for an agent's results apart from the console, and
    /// send it here (same forms as --serial).
    #[arg(long, value_name = "FILE|unix:PATH|stdout|discard")]
    pub com2: Option<String>,
    /// Stop the VM after this many seconds (exit code 6).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Boot protocol [default: auto].
    #[arg(long, value_enum)]
    pub entry: Option<Entry>,
    /// Put a virtio-iommu in front of every PCI endpoint (described to the guest by ACPI VIOT).
    /// Without it, device DMA is identity-mapped.
    #[arg(long)]
    pub iommu: bool,
    /// With --iommu: whether endpoints the guest has not attached to a domain bypass translation
    /// (the virtio-iommu `bypass` field at reset) [default: true].
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub iommu_bypass: Option<bool>,
    /// Pass a device through: `vfio=0000:63:00.0` (a host device bound to vfio-pci) or
    /// `vfio-user=/path/to/socket` (a device served over vfio-user, e.g. by `driverlab model`).
    /// Repeatable; devices appear at 00:02.0, 00:03.0, ...
    #[arg(long = "device", value_name = "vfio=BDF|vfio-user=SOCKET")]
    pub devices: Vec<DeviceSpec>,
    /// Debugging only: run without the seccomp filters.
    #[arg(long)]
    pub no_seccomp: bool,
    /// Run without the jail (namespaces, empty root, own uid and cgroup, Landlock; see
    /// docs/vmm.md): for debugging, or where the jail cannot work.
    #[arg(long)]
    pub no_jail: bool,
}

/// A failure before the VM ran, as the error line reports it.
struct Refused(ErrorLine);

fn refused(kind: ErrorKind, message: impl Into<String>) -> Refused {
    Refused(ErrorLine::new(kind, message))
}

/// The spec the config file and the flags give.
fn spec_of(args: &RunArgs) -> Result<VmSpec, Refused> {
    let mut spec = match &args.config {
        Some(path) => {
            let mut json = String::new();
            let read = if path.as_os_str() == "-" {
                std::io::stdin().read_to_string(&mut json).map(|_| ())
            } else {
                std::fs::read_to_string(path).map(|text| json = text)
            };
            read.map_err(|e| refused(ErrorKind::Spec, format!("--config {}: {e}", path.display())))?;
            let name = if path.as_os_str() == "-" { "stdin".into() } else { path.display().to_string() };
            VmSpec::parse(&json).map_err(|e| refused(ErrorKind::Spec, format!("--config {name}: {e}")))?
        }
        None => VmSpec::new(Kernel::Probe),
    };
    let usage = |e: vm_spec::SpecError| refused(ErrorKind::Usage, e.to_string());
    if let Some(kernel) = &args.kernel {
        spec.kernel = kernel.parse().map_err(usage)?;
    }
    if let Some(initrd) = &args.initrd {
        spec.initrd = Some(initrd.clone());
    }
    if let Some(cmdline) = &args.cmdline {
        spec.cmdline = cmdline.clone();
    }
    if let Some(memory) = args.memory {
        spec.memory_mib = memory;
    }
    if let Some(vcpus) = args.vcpus {
        spec.vcpus = vcpus;
    }
    if let Some(serial) = &args.serial {
        spec.serial.com1 = serial.parse::<SerialOutput>().map_err(usage)?;
    }
    if let Some(com2) = &args.com2 {
        spec.serial.com2 = Some(com2.parse::<SerialOutput>().map_err(usage)?);
    }
    if args.timeout.is_some() {
        spec.timeout_s = args.timeout;
    }
    if let Some(entry) = args.entry {
        spec.entry = match entry {
            Entry::Auto => SpecEntry::Auto,
            Entry::Pvh => SpecEntry::Pvh,
            Entry::Linux64 => SpecEntry::Linux64,
        };
    }
    if args.iommu {
        spec.iommu.get_or_insert_with(IommuSpec::default);
    }
    if let Some(bypass) = args.iommu_bypass {
        match &mut spec.iommu {
            Some(iommu) => iommu.bypass = bypass,
            None => return Err(refused(ErrorKind::Usage, "--iommu-bypass needs --iommu")),
        }
    }
    if !args.devices.is_empty() {
        spec.devices = args.devices.clone();
    }
    if args.no_seccomp {
        spec.seccomp = false;
    }
    if args.no_jail {
        spec.jail = false;
    }
    spec.validate().map_err(|e| refused(ErrorKind::Spec, e.to_string()))?;
    Ok(spec)
}

/// Prints the error line (after a human-readable line) and returns its exit code.
pub fn report_error(line: &ErrorLine) -> u8 {
    eprintln!("error: {}", line.message);
    eprintln!("{}", line.to_json());
    line.exit_code as u8
}

fn run(args: RunArgs) -> anyhow::Result<u8> {
    let spec = match spec_of(&args) {
        Ok(spec) => spec,
        Err(Refused(line)) => return Ok(report_error(&line)),
    };
    if args.print_spec {
        println!("{}", serde_json::to_string_pretty(&spec)?);
        return Ok(0);
    }
    let options = vmm::RunOptions { probe_image: guest_images::PROBE_ELF, control_socket: args.control };
    match vmm::run(&spec, &options) {
        Ok(summary) => {
            eprintln!("{}", summary.to_json());
            Ok(summary.exit_code as u8)
        }
        Err(e) => Ok(report_error(&e.to_line())),
    }
}
