//! The VMM's command line, shared by `driverlab vm run` and the small `driverlab-vmm` binary the
//! lab starts: a VM spec from a JSON file (`--config`, `-` for stdin) and flags that replace its
//! fields, run to its end, the exit or error line last on stderr.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use vm_spec::{DeviceSpec, Entry as SpecEntry, ErrorKind, ErrorLine, IommuSpec, Kernel, SerialOutput, VmSpec};

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
    #[arg(long, value_name = "PATH|probe", required_unless_present_any = ["config", "restore"])]
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
    /// Make DIR (which must not exist yet) for a snapshot of this VM, written when the control
    /// socket's `vm.snapshot` stops it (docs/vmm.md, "Snapshots").
    #[arg(long, value_name = "DIR")]
    pub snapshot_to: Option<PathBuf>,
    /// Start from the snapshot in DIR instead of booting. The VM is the snapshot's (kernel,
    /// command line, memory, vCPUs, IOMMU, slots); --serial, --com2, --timeout, --control,
    /// --snapshot-to, --no-jail and --no-seccomp apply to it, and --device may name other
    /// backends for its devices (the same number, in the same slots).
    #[arg(long, value_name = "DIR", conflicts_with_all = [
        "config", "kernel", "initrd", "cmdline", "memory", "vcpus", "entry", "iommu", "iommu_bypass",
    ])]
    pub restore: Option<PathBuf>,
    /// With --restore: text the restored guest reads on COM2, queued as its vCPUs start (a guest
    /// agent waiting in the snapshot reads its cell's settings so; a newline is added; at most
    /// 4096 bytes).
    #[arg(long, value_name = "TEXT", requires = "restore")]
    pub com2_input: Option<String>,
    /// Set aside MIB of guest RAM as a payload window (reserved in the E820 map, inside RAM, so
    /// the guest reads it through /dev/mem); a snapshot of this VM restored with --payload gets
    /// a file written there. At most a quarter of the memory.
    #[arg(long, value_name = "MIB", conflicts_with = "restore")]
    pub payload_window: Option<u32>,
    /// With --restore: write FILE at the start of the snapshot's payload window before the
    /// vCPUs start (the guest agent reads the variant's modules from there).
    #[arg(long, value_name = "FILE", requires = "restore")]
    pub payload: Option<PathBuf>,
}

/// The most text `--com2-input` takes.
pub const COM2_INPUT_MAX: usize = 4096;

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
    if let Some(window) = args.payload_window {
        spec.payload_window_mib = window;
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

/// The spec of a VM restored from `snapshot`: the snapshot's, with this run's serial outputs (COM1
/// to stdout unless given; a COM2 the snapshot's VM had is discarded unless given), timeout and
/// jail and seccomp settings.
fn restored_spec(args: &RunArgs, snapshot: &crate::snapshot::VmSnapshot) -> Result<VmSpec, Refused> {
    let usage = |e: vm_spec::SpecError| refused(ErrorKind::Usage, e.to_string());
    let mut spec = snapshot.spec.clone();
    spec.serial.com1 = args.serial.as_deref().map(str::parse).transpose().map_err(usage)?.unwrap_or_default();
    spec.serial.com2 = match (&args.com2, &snapshot.spec.serial.com2) {
        (Some(com2), Some(_)) => Some(com2.parse::<SerialOutput>().map_err(usage)?),
        (Some(_), None) => return Err(refused(ErrorKind::Usage, "--com2: the snapshot's VM has no COM2")),
        (None, Some(_)) => Some(SerialOutput::Discard),
        (None, None) => None,
    };
    spec.timeout_s = args.timeout;
    spec.seccomp = !args.no_seccomp;
    spec.jail = !args.no_jail;
    if !args.devices.is_empty() {
        spec.devices = same_shape(&snapshot.spec.devices, &args.devices)?;
    }
    spec.validate().map_err(|e| refused(ErrorKind::Spec, e.to_string()))?;
    Ok(spec)
}

/// `--device` of a restore: other backends for the snapshot's devices, each in the slot (and
/// the slot's state) the snapshot has it in.
fn same_shape(saved: &[DeviceSpec], given: &[DeviceSpec]) -> Result<Vec<DeviceSpec>, Refused> {
    let shape = |d: &DeviceSpec| format!("slot={},plugged={}", d.slot, d.plugged);
    let differs = saved.len() != given.len() || saved.iter().zip(given).any(|(s, g)| shape(s) != shape(g));
    if differs {
        let list = |devices: &[DeviceSpec]| devices.iter().map(shape).collect::<Vec<_>>().join("; ");
        let message = format!(
            "--device with --restore: the snapshot's VM has {} device(s) ({}), given {} ({})",
            saved.len(),
            list(saved),
            given.len(),
            list(given)
        );
        return Err(refused(ErrorKind::Usage, message));
    }
    Ok(given.to_vec())
}

/// Reads and checks the snapshot `--restore` names, and what goes into the restored guest.
fn read_restore(args: &RunArgs, dir: &std::path::Path) -> Result<crate::Restore, Refused> {
    let started = std::time::Instant::now();
    let snapshot = crate::snapshot::vm_snapshot::load(dir).map_err(|e| Refused(crate::Error::Snapshot(e).to_line()))?;
    let com2_input = match args.com2_input.as_deref() {
        None => Vec::new(),
        Some(_) if snapshot.spec.serial.com2.is_none() => {
            return Err(refused(ErrorKind::Usage, "--com2-input: the snapshot's VM has no COM2"));
        }
        Some(text) if text.len() >= COM2_INPUT_MAX => {
            let message = format!("--com2-input: {} bytes, at most {} are taken", text.len() + 1, COM2_INPUT_MAX);
            return Err(refused(ErrorKind::Usage, message));
        }
        Some(text) => format!("{text}\n").into_bytes(),
    };
    let payload = match &args.payload {
        None => Vec::new(),
        Some(path) => read_payload(path, u64::from(snapshot.spec.payload_window_mib) << 20)?,
    };
    let snapshot = std::sync::Arc::new(snapshot);
    Ok(crate::Restore { dir: dir.to_path_buf(), snapshot, read: started.elapsed(), com2_input, payload })
}

/// The file `--payload` names, if it fits the snapshot's payload window of `window` bytes.
fn read_payload(path: &std::path::Path, window: u64) -> Result<Vec<u8>, Refused> {
    let fail = |why: String| refused(ErrorKind::Usage, format!("--payload {}: {why}", path.display()));
    if window == 0 {
        return Err(fail("the snapshot's VM has no payload window (boot it with --payload-window)".into()));
    }
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut payload = Vec::new();
    file.take(window + 1).read_to_end(&mut payload).map_err(|e| fail(e.to_string()))?;
    if payload.len() as u64 > window {
        return Err(fail(format!("larger than the snapshot's payload window of {} MiB", window >> 20)));
    }
    Ok(payload)
}

/// Prints the error line (after a human-readable line) and returns its exit code.
pub fn report_error(line: &ErrorLine) -> u8 {
    eprintln!("error: {}", line.message);
    eprintln!("{}", line.to_json());
    line.exit_code as u8
}

/// Runs `vm run`: builds the spec, runs the VM (`probe_image` is what `--kernel probe` boots),
/// prints the exit or error line last on stderr; returns the process's exit code.
pub fn run(args: RunArgs, probe_image: &'static [u8]) -> u8 {
    let restore = match args.restore.as_deref().map(|dir| read_restore(&args, dir)).transpose() {
        Ok(restore) => restore,
        Err(Refused(line)) => return report_error(&line),
    };
    let spec = match &restore {
        Some(restore) => restored_spec(&args, &restore.snapshot),
        None => spec_of(&args),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(Refused(line)) => return report_error(&line),
    };
    if args.print_spec {
        println!("{}", serde_json::to_string_pretty(&spec).unwrap_or_default());
        return 0;
    }
    let options =
        crate::RunOptions { probe_image, control_socket: args.control, snapshot_to: args.snapshot_to, restore };
    match crate::run(&spec, &options) {
        Ok(summary) => {
            eprintln!("{}", summary.to_json());
            summary.exit_code as u8
        }
        Err(e) => report_error(&e.to_line()),
    }
}

/// What a `vm run` whose flags do not parse prints and returns: clap's message, then the error
/// line, so that even then its last line is JSON; exit code 2.
pub fn usage_error(error: &clap::Error) -> u8 {
    let _ = error.print();
    let message = error.render().to_string();
    let first = message.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
    eprintln!("{}", ErrorLine::new(ErrorKind::Usage, first).to_json());
    vm_spec::exit::code::BAD_INPUT as u8
}
