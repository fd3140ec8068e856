//! Building a VM from a [`VmSpec`] and running it to its end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

use vm_device::guest_event::GuestEventSink;
use vm_spec::confinement::Confinement;
use vm_spec::control::{LiveCounters, VmState};
use vm_spec::exit::SetupPhases;
use vm_spec::{ExitSummary, Restored, RestoredRam, SnapshotWritten, VmSpec};

use crate::boot::{self, BootRequest};
use crate::config;
use crate::control::{ControlSocket, ControlState, VmObserver};
use crate::exit::{ExitCounters, StopCause, VmStop};
use crate::interrupts::KvmInterrupts;
use crate::layout::ACPI_RSDP_ADDR;
use crate::memory::{GuestRam, MIB, RamLayout};
use crate::memory_slots::KvmSlots;
use crate::opening::{OpenedDevices, OpeningDevices};
use crate::pause::SnapshotPause;
use crate::platform::Platform;
use crate::platform::{self, PlatformConfig};
use crate::snapshot::{PlatformState, SnapshotError, SnapshotTarget, VcpuSaves, VcpuState, VmSnapshot};
use crate::vcpu::{self, Vcpu, VcpuShared};
use crate::x86::boot_cpu;
use crate::{Error, Restore, RunOptions};

/// KVM's TSS for real-mode emulation on Intel: three pages just below the BIOS ROM.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// Threads that copy a snapshot's RAM into a restored VM's memory file, at most (one a core).
const MAX_RAM_COPIERS: usize = 4;
/// How long the main thread waits for vCPU threads to leave KVM_RUN after being kicked.
const VCPU_STOP_GRACE: Duration = Duration::from_secs(2);

fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}

/// Boots `spec` (or restores it from `options.restore`) and runs the VM until it stops. Returns
/// the exit summary; errors before the guest ran are `Err`. The phases follow Firecracker's
/// builder: the process's set-up (checks, jail namespaces, control socket), guest memory with
/// the kernel loaded (or a snapshot's RAM read back), the KVM VM, the platform, the vCPUs, then
/// the jail's rest and the threads; the main thread waits and tears down.
pub fn run(spec: &VmSpec, options: &RunOptions) -> Result<ExitSummary, Error> {
    let mut clock = SetupClock::new();
    let process = Process::set_up(spec, options)?;
    let opening = OpeningDevices::start(&spec.devices);
    let (ram, guest) = load(spec, options, &mut clock)?;
    process.control.set_entry(guest.entry_name());
    let (kvm, vm) = create_vm(&ram)?;
    clock.lap(|p| &mut p.kvm_ms);
    let platform = build_platform(spec, &vm, &ram, &process.stop, &guest, opening.finish())?;
    clock.lap(|p| &mut p.platform_ms);
    let saves = match &process.snapshot_target {
        Some(_) => {
            Some(Arc::new(VcpuSaves::new(VcpuState::saveable_msrs(&kvm).map_err(SnapshotError::Kvm)?, spec.vcpus)))
        }
        None => None,
    };
    let shared = VcpuShared {
        io_bus: platform.io_bus.clone(),
        mmio_bus: platform.mmio_bus.clone(),
        memory: ram.memory.clone(),
        stop: process.stop.clone(),
        counters: Arc::new(ExitCounters::default()),
        final_rips: Arc::new(Mutex::new(vec![None; spec.vcpus as usize])),
        saves,
        pause: process.control.pause.clone(),
    };
    let vcpus = create_vcpus(spec, &kvm, &vm, &guest, &shared)?;
    let restored = guest.finish_restore(&vm, &vcpus)?;
    clock.lap(|p| &mut p.vcpus_ms);
    let mut process = process;
    process.confine();
    clock.lap(|p| &mut p.jail_ms);
    let running = process.start(vcpus, &platform, &shared)?;
    guest.tell_restored(&platform);
    let setup_ms = ms(running.started - clock.start);
    guest.check_restored_ram(&process.stop);
    let taking = match (&process.snapshot_target, &shared.saves) {
        (Some(target), Some(saves)) => {
            Some(SnapshotTaking { target, spec, entry: guest.entry_name(), vm: &vm, ram: &ram, saves })
        }
        _ => None,
    };
    let (mut reason, mut snapshot) = running.wait(spec, &platform, taking.as_ref(), &process.control.pause);
    let stopped = Instant::now();
    process.control.set_state(VmState::Stopping);
    stop_vcpus(running.threads);
    if let (StopCause::Snapshot, Some(taking)) = (&reason, &taking) {
        match taking.write(&platform) {
            Ok(written) => snapshot = Some(written),
            Err(e) => reason = StopCause::VmmError(format!("snapshot: {}", crate::message_chain(&e))),
        }
    }
    let ended = Ended { reason, stopped, setup_ms, clock: clock.phases, snapshot, restored };
    Ok(summarize(spec, &process, &platform, &ram, &shared, &running.started, ended))
}

/// How a run ended, for its summary.
struct Ended {
    reason: StopCause,
    stopped: Instant,
    setup_ms: f64,
    clock: SetupPhases,
    snapshot: Option<SnapshotWritten>,
    restored: Option<Restored>,
}

/// The exit line of a VM whose vCPUs have stopped: flushes the serial ports, tears the devices
/// down and gathers the counters.
fn summarize(
    spec: &VmSpec,
    process: &Process,
    platform: &Platform,
    ram: &GuestRam,
    shared: &VcpuShared,
    started: &Instant,
    ended: Ended,
) -> ExitSummary {
    let reason = ended.reason;
    let (detail, vcpu_state_lost) = match &reason {
        StopCause::Timeout | StopCause::Shutdown => {
            let places = shared.final_rips.lock().unwrap_or_else(|p| p.into_inner());
            (Some(describe_rips(&places)), state_lost(&places))
        }
        other => (other.detail(), None),
    };
    lock(&platform.serial).flush();
    if let Some((com2, _)) = &platform.com2 {
        lock(com2).flush();
    }
    let devices = platform.teardown();
    ExitSummary {
        vmm: "exit".into(),
        reason: reason.reason(),
        exit_code: reason.exit_code(),
        detail,
        entry: process.control.entry().unwrap_or_default(),
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
        huge_pages: Some(ram.huge_pages),
        setup_ms: ended.setup_ms,
        setup: Some(ended.clock),
        run_ms: ms(ended.stopped - *started),
        first_serial_ms: platform.serial_stats.first_byte().map(|t| ms(t.saturating_duration_since(*started))),
        serial_bytes: platform.serial_stats.bytes(),
        com2_bytes: platform.com2.as_ref().map(|(_, stats)| stats.bytes()),
        viommu: platform.iommu.as_ref().map(|iommu| iommu.counts()),
        devices,
        exits: shared.counters.counts(),
        confinement: Some(process.confinement.clone()),
        vcpu_state_lost,
        snapshot: ended.snapshot,
        restored: ended.restored,
    }
}

/// How the guest's first state comes: its kernel loaded into RAM, or a snapshot.
enum Guest<'a> {
    Booted(boot::BootEntry),
    Restored {
        restore: &'a Restore,
        started: Instant,
        /// How guest RAM came from the snapshot.
        ram: RestoredRam,
        /// The snapshot's RAM file, checked while the VM runs.
        unchecked: std::fs::File,
    },
}

impl Guest<'_> {
    fn entry_name(&self) -> &str {
        match self {
            Guest::Booted(entry) => entry.name(),
            Guest::Restored { restore, .. } => &restore.snapshot.entry,
        }
    }

    fn saved_platform(&self) -> Option<PlatformState> {
        match self {
            Guest::Booted(_) => None,
            Guest::Restored { restore, .. } => Some(restore.snapshot.platform.clone()),
        }
    }

    /// For a restored guest: the VM's irqchips and clock, then each vCPU's state; how long the
    /// whole restore took.
    fn finish_restore(&self, vm: &VmFd, vcpus: &[Vcpu]) -> Result<Option<Restored>, Error> {
        let Guest::Restored { restore, started, ram, .. } = self else { return Ok(None) };
        let snapshot = &restore.snapshot;
        if snapshot.vcpus.len() != vcpus.len() {
            return Err(Error::Platform(format!(
                "the snapshot has {} vCPUs, the VM {}",
                snapshot.vcpus.len(),
                vcpus.len()
            )));
        }
        let clock = snapshot.vm.restore(vm).map_err(SnapshotError::Kvm)?;
        for (vcpu, state) in vcpus.iter().zip(&snapshot.vcpus) {
            vcpu.restore(state, &clock).map_err(SnapshotError::Kvm)?;
        }
        let ms = ms(restore.read + started.elapsed());
        Ok(Some(Restored { ms, ram_data_bytes: snapshot.ram.data_bytes(), ram: *ram }))
    }

    /// For a restored guest, once its vCPUs run: that its generation ID changed (Linux reseeds
    /// its random numbers), and the text `--com2-input` gave, on COM2.
    fn tell_restored(&self, platform: &Platform) {
        let Guest::Restored { restore, .. } = self else { return };
        if let Err(e) = platform.generation_changed.write(1) {
            tracing::warn!("telling the guest its generation ID changed: {e}");
        }
        if let (Some((com2, _)), false) = (&platform.com2, restore.com2_input.is_empty()) {
            lock(com2).queue_input(&restore.com2_input);
        }
    }

    /// For a restored guest: checks the snapshot's RAM file against its checksum (the main
    /// thread does it while the vCPUs run, which a restore does not wait for); a file that is
    /// not the one written stops the VM, an error.
    fn check_restored_ram(&self, stop: &VmStop) {
        let Guest::Restored { restore, unchecked: file, .. } = self else { return };
        if let Err(e) = crate::snapshot::vm_snapshot::check_ram(&restore.dir, &restore.snapshot.ram, file) {
            stop.request(StopCause::VmmError(format!("snapshot: {}", crate::message_chain(&e))));
        }
    }
}

/// Guest RAM and how the guest starts: the kernel loaded, or the snapshot's RAM read back.
fn load<'a>(spec: &VmSpec, options: &'a RunOptions, clock: &mut SetupClock) -> Result<(GuestRam, Guest<'a>), Error> {
    match &options.restore {
        None => {
            let kernel = config::open_kernel(&spec.kernel, options.probe_image)?;
            clock.lap(|p| &mut p.image_ms);
            let (ram, entry) = load_guest(spec, kernel)?;
            clock.lap(|p| &mut p.load_ms);
            Ok((ram, Guest::Booted(entry)))
        }
        Some(restore) => {
            clock.lap(|p| &mut p.image_ms);
            let started = Instant::now();
            let (ram, how, unchecked) = restored_ram(spec, options, restore)?;
            // A copy of the snapshot is a new generation of the VM: the guest is told once it runs.
            new_generation(&ram)?;
            write_payload(&ram, &restore.payload)?;
            clock.lap(|p| &mut p.load_ms);
            Ok((ram, Guest::Restored { restore, started, ram: how, unchecked }))
        }
    }
}

/// Writes `payload` at the start of the payload window (the window is reserved RAM the guest
/// does not use, so its snapshot's copy is whatever an earlier VM left there).
fn write_payload(ram: &GuestRam, payload: &[u8]) -> Result<(), Error> {
    if payload.is_empty() {
        return Ok(());
    }
    match ram.layout.payload_window {
        Some((addr, size)) if payload.len() as u64 <= size => ram
            .memory
            .write_slice(payload, vm_memory::GuestAddress(addr))
            .map_err(|e| Error::GuestMemory(format!("the payload window: {e}"))),
        _ => Err(Error::GuestMemory(format!("{} bytes of payload do not fit the payload window", payload.len()))),
    }
}

/// A restored VM's RAM, and the snapshot's RAM file to check while the VM runs: copied into a
/// new memory file (the file's extents read straight into it), where something shares that file
/// (a device model maps it; `--snapshot-to` reads it) or where the host backs it with
/// transparent huge pages (a private mapping of the snapshot's file would give the guest small
/// pages: each a nested-paging fault on first touch, and small pages after; restored guests in
/// the nested box paid up to 1.9 times the CPU per packet of booted ones, docs/experiments.md);
/// otherwise mapped private from the snapshot's RAM file.
fn restored_ram(
    spec: &VmSpec,
    options: &RunOptions,
    restore: &Restore,
) -> Result<(GuestRam, RestoredRam, std::fs::File), Error> {
    use crate::snapshot::vm_snapshot::{load_ram, open_ram};
    let shared = options.snapshot_to.is_some()
        || spec.devices.iter().any(|d| matches!(d.backend, vm_spec::DeviceBackend::VfioUser(_)));
    let image = &restore.snapshot.ram;
    let file = open_ram(&restore.dir, image)?;
    let copy = GuestRam::new(ram_layout(spec))?;
    if shared || copy.huge_pages {
        let copiers = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_RAM_COPIERS));
        load_ram(&restore.dir, image, &file, copiers, &|file, offset, len| {
            copy.read_at_file_offset(file, offset, len)
        })?;
        return Ok((copy, RestoredRam::Copied, file));
    }
    drop(copy);
    let ram = GuestRam::mapped_from(ram_layout(spec), file.try_clone()?)?;
    Ok((ram, RestoredRam::Mapped, file))
}

/// A snapshot being written: the stopped VM's parts and where they go.
struct SnapshotTaking<'a> {
    target: &'a SnapshotTarget,
    spec: &'a VmSpec,
    entry: &'a str,
    vm: &'a VmFd,
    ram: &'a GuestRam,
    saves: &'a VcpuSaves,
}

impl SnapshotTaking<'_> {
    /// Gathers the vCPUs' states (left by their threads), the VM's and the devices', writes
    /// guest RAM, then the state file.
    fn write(&self, platform: &Platform) -> Result<SnapshotWritten, SnapshotError> {
        if self.ram.private {
            // The file behind private RAM is the snapshot it came from, without the VM's writes.
            let why = "its RAM is mapped private from the snapshot it was restored from";
            return Err(SnapshotError::NotSaveable(why.into()));
        }
        let started = Instant::now();
        let vcpus = self.saves.take()?;
        let vm = crate::snapshot::VmState::capture(self.vm)?;
        let devices = platform.snapshot_state()?;
        let ram = self.target.write_ram(&self.ram.file, self.ram.layout.size())?;
        let ram_data_bytes = ram.data_bytes();
        let snapshot =
            VmSnapshot { spec: self.spec.clone(), entry: self.entry.into(), ram, vm, vcpus, platform: devices };
        let state_bytes = self.target.write_state(&snapshot)?;
        Ok(SnapshotWritten { ms: ms(started.elapsed()), state_bytes, ram_data_bytes })
    }
}

/// The set-up's phases as they go: each lap's time goes to the phase it names.
struct SetupClock {
    start: Instant,
    lap: Instant,
    phases: SetupPhases,
}

impl SetupClock {
    fn new() -> SetupClock {
        let now = Instant::now();
        SetupClock { start: now, lap: now, phases: SetupPhases::default() }
    }

    /// Ends a phase: the time since the last lap goes to the phase `field` picks.
    fn lap(&mut self, field: impl FnOnce(&mut SetupPhases) -> &mut f64) {
        let now = Instant::now();
        *field(&mut self.phases) = ms(now - self.lap);
        self.lap = now;
    }
}

/// The VMM process around its VM: the jail it enters, how the VM is stopped, the control socket
/// and the seccomp filters.
struct Process {
    jail_spec: jail::JailSpec,
    confinement: Confinement,
    namespaces: Option<jail::Namespaces>,
    stop: Arc<VmStop>,
    control: Arc<ControlState>,
    filters: Option<crate::seccomp::Filters>,
    /// Bound at set-up, served once the process is jailed (the thread would escape the jail).
    control_socket: Option<ControlSocket>,
    /// Where `vm.snapshot` writes, made before the jail.
    snapshot_target: Option<SnapshotTarget>,
}

impl Process {
    /// Checks the spec against the host and enters the jail's namespaces: before anything a
    /// fork cannot carry (KVM ties a VM to its process), so that from here on this is the
    /// supervisor's child, PID 1 of its own namespace.
    fn set_up(spec: &VmSpec, options: &RunOptions) -> Result<Process, Error> {
        if spec.seccomp {
            jail::seccomp::one_malloc_arena();
        }
        spec.validate()?;
        config::check_host(spec)?;
        let snapshot_target = options.snapshot_to.as_deref().map(SnapshotTarget::create).transpose()?;
        let jail_spec = jail::JailSpec::from_env("vm", spec.memory_mib * MIB, spec.vcpus as u64, spec.vcpus)
            .map_err(Error::Jail)?;
        let mut confinement = Confinement { jailed: spec.jail, ..Confinement::default() };
        let socket: Vec<&std::path::Path> = options.control_socket.as_deref().into_iter().collect();
        let namespaces =
            spec.jail.then(|| jail::enter_namespaces(&mut confinement, &socket, jail::Signals::EndBoth, &jail_spec));
        let pid = namespaces.as_ref().map_or(std::process::id(), |n| n.supervisor_pid);
        let stop = Arc::new(VmStop::new());
        let control = Arc::new(ControlState::new(spec.clone(), stop.clone(), pid));
        let hotplug = spec.devices.iter().any(|d| d.slot == vm_spec::Slot::Thunderbolt);
        let snapshot = snapshot_target.is_some();
        let filters = if spec.seccomp { Some(crate::seccomp::filters(hotplug, snapshot)?) } else { None };
        let control_socket = options.control_socket.as_deref().map(ControlSocket::bind).transpose()?;
        if let Some(target) = &snapshot_target {
            control.set_snapshot_dir(target.dir.display().to_string());
        }
        Ok(Process { jail_spec, confinement, namespaces, stop, control, filters, control_socket, snapshot_target })
    }

    /// Everything is open: the rest of the jail, which the threads started after inherit.
    fn confine(&mut self) {
        if let Some(namespaces) = &self.namespaces {
            jail::confine(&self.jail_spec, namespaces, &mut self.confinement);
            for missed in self.confinement.missing() {
                tracing::warn!("jail: not taken: {missed}");
            }
        }
        self.control.set_confinement(self.confinement.clone());
    }

    /// Serves the control socket, starts the vCPU threads under their filters and installs the
    /// main thread's.
    fn start(&mut self, vcpus: Vec<Vcpu>, platform: &Arc<Platform>, shared: &VcpuShared) -> Result<Running, Error> {
        let control_server = match self.control_socket.take() {
            Some(socket) => Some(socket.serve(self.control.clone(), self.filters.as_ref().map(|f| f.control.clone()))?),
            None => None,
        };
        vcpu::register_kick_handler().map_err(Error::Io)?;
        crate::seccomp::report_violations().map_err(Error::Io)?;
        let started = Instant::now();
        let observer = Arc::new(RunningVm { platform: platform.clone(), counters: shared.counters.clone(), started });
        self.control.set_observer(observer);
        self.control.set_state(VmState::Running);
        let mut threads = Vec::with_capacity(vcpus.len());
        for vcpu in vcpus {
            match vcpu.start(self.filters.as_ref().map(|f| f.vcpu.clone())) {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    self.stop.request(StopCause::VmmError(format!("cannot start a vCPU thread: {e}")));
                    break;
                }
            }
        }
        if let Some(filters) = &self.filters
            && let Err(e) = crate::seccomp::apply(&filters.main)
        {
            self.stop.request(StopCause::VmmError(e.to_string()));
        }
        Ok(Running { started, threads, stop: self.stop.clone(), _control_server: control_server })
    }
}

/// A VM whose vCPUs run.
struct Running {
    started: Instant,
    threads: Vec<vcpu::VcpuThread>,
    stop: Arc<VmStop>,
    _control_server: Option<crate::control::ControlServer>,
}

impl Running {
    /// Waits for the first stop request or the spec's timeout, pressing the power button again
    /// while a requested shutdown's grace runs, and taking a snapshot the VM goes on from when
    /// `pause` is asked for one; why the VM stops, and the snapshot written on the way.
    fn wait(
        &self,
        spec: &VmSpec,
        platform: &Platform,
        taking: Option<&SnapshotTaking>,
        pause: &SnapshotPause,
    ) -> (StopCause, Option<SnapshotWritten>) {
        let press_again = || {
            if let Err(e) = platform.power_button.write(1) {
                tracing::warn!("pressing the power button again: {e}");
            }
        };
        let mut written = None;
        loop {
            // The timeout runs from the vCPUs' start, whatever the main thread did since.
            let timeout = spec.timeout_s.map(|t| Duration::from_secs_f64(t).saturating_sub(self.started.elapsed()));
            if let Some(reason) = self.stop.wait_or(timeout, || pause.is_asked(), press_again) {
                return (reason, written);
            }
            if pause.take_request() {
                let outcome = match taking {
                    Some(taking) => self.snapshot_on_hold(taking, platform),
                    None => Err("this VM has nowhere to write a snapshot".into()),
                };
                written = outcome.as_ref().ok().cloned();
                pause.finish(outcome);
            }
        }
    }

    /// Once every vCPU holds with its state saved (they are kicked out of the guest until
    /// then), writes the snapshot; the vCPUs go on when the caller finishes the pause.
    fn snapshot_on_hold(&self, taking: &SnapshotTaking, platform: &Platform) -> Result<SnapshotWritten, String> {
        let deadline = Instant::now() + VCPU_STOP_GRACE;
        while !taking.saves.all_put() {
            if Instant::now() >= deadline {
                return Err("a vCPU did not stop for the snapshot".into());
            }
            for thread in &self.threads {
                thread.kick();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        taking.write(platform).map_err(|e| crate::message_chain(&e))
    }
}

/// Writes a fresh VM generation ID (16 random bytes from the host) where ACPI's `VGEN` says it is.
fn new_generation(ram: &GuestRam) -> Result<(), Error> {
    let mut id = [0u8; 16];
    rustix::rand::getrandom(&mut id, rustix::rand::GetRandomFlags::empty()).map_err(std::io::Error::from)?;
    ram.memory
        .write_slice(&id, vm_memory::GuestAddress(crate::layout::VMGENID_ADDR))
        .map_err(|e| Error::GuestMemory(e.to_string()))
}

/// Where guest RAM goes: below 4 GiB, or (for a VM with a Thunderbolt slot, whose guest must
/// bounce DMA) mostly above it; with the spec's payload window.
fn ram_layout(spec: &VmSpec) -> RamLayout {
    let size = spec.memory_mib * MIB;
    let untrusted = spec.devices.iter().any(|d| d.slot == vm_spec::Slot::Thunderbolt);
    let layout = if untrusted { RamLayout::with_ram_above_4gib(size) } else { RamLayout::new(size) };
    layout.with_payload_window(u64::from(spec.payload_window_mib) * MIB)
}

/// Guest RAM with the kernel, initrd, command line and boot tables loaded; the entry.
fn load_guest(spec: &VmSpec, kernel: boot::KernelSource<'static>) -> Result<(GuestRam, boot::BootEntry), Error> {
    let ram = GuestRam::new(ram_layout(spec))?;
    let e820 = ram.layout.e820();
    let kernel_name = spec.kernel.name();
    let request = BootRequest {
        kernel_name: &kernel_name,
        kernel,
        initrd: spec.initrd.as_deref(),
        cmdline: &spec.cmdline,
        protocol: spec.entry,
        rsdp: Some(ACPI_RSDP_ADDR),
    };
    let entry = boot::load(&request, &ram.memory, &ram.layout, &e820)?;
    boot_cpu::write_tables(&ram.memory, &entry).map_err(|e| Error::GuestMemory(e.to_string()))?;
    new_generation(&ram)?;
    Ok((ram, entry))
}

/// The KVM VM with guest RAM's slots and the in-kernel irqchip (registered in that order: on
/// PVM hosts a slot registered after the irqchip exists costs 30 times as much).
fn create_vm(ram: &GuestRam) -> Result<(Kvm, Arc<VmFd>), Error> {
    let kvm = Kvm::new().map_err(Error::KvmUnavailable)?;
    let vm = kvm.create_vm().map_err(kvm_error("KVM_CREATE_VM"))?;
    vm.set_tss_address(KVM_TSS_ADDRESS).map_err(kvm_error("KVM_SET_TSS_ADDR"))?;
    register_memory(&vm, ram)?;
    vm.create_irq_chip().map_err(kvm_error("KVM_CREATE_IRQCHIP"))?;
    Ok((kvm, Arc::new(vm)))
}

/// The platform (devices, buses, PCI, the virtio-iommu, the passed-through devices) and the ACPI
/// tables that describe it, written into guest RAM.
fn build_platform(
    spec: &VmSpec,
    vm: &Arc<VmFd>,
    ram: &GuestRam,
    stop: &Arc<VmStop>,
    guest: &Guest,
    opened: OpenedDevices,
) -> Result<Arc<Platform>, Error> {
    let com1 = config::open_serial(&spec.serial.com1)?;
    let com2 = spec.serial.com2.as_ref().map(config::open_serial).transpose()?;
    let interrupts = Arc::new(KvmInterrupts::new(vm.clone())?);
    let events: Arc<dyn GuestEventSink> = stop.clone();
    let saved = guest.saved_platform();
    let devices = spec.devices.clone();
    let platform_config = PlatformConfig { vcpus: spec.vcpus, iommu: spec.iommu, devices, opened, com1, com2, saved };
    let slots = Arc::new(KvmSlots::new(vm.clone(), ram.memory.num_regions() as u32));
    let platform = Arc::new(platform::build(vm, ram, interrupts, slots, events, platform_config)?);
    if matches!(guest, Guest::Restored { .. }) {
        // The tables are in the restored RAM already, where the guest may have read them.
        return Ok(platform);
    }
    let tables = crate::acpi::build(&platform.acpi).map_err(|e| Error::Platform(e.to_string()))?;
    crate::acpi::write(&ram.memory, &tables).map_err(|e| Error::Platform(e.to_string()))?;
    Ok(platform)
}

/// The vCPUs: CPUID with this VM's topology and TSC rate, MSRs, registers; the boot vCPU gets
/// the entry state.
fn create_vcpus(spec: &VmSpec, kvm: &Kvm, vm: &VmFd, guest: &Guest, shared: &VcpuShared) -> Result<Vec<Vcpu>, Error> {
    let entry = match guest {
        Guest::Booted(entry) => Some(entry),
        Guest::Restored { .. } => None,
    };
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_error("KVM_GET_SUPPORTED_CPUID"))?;
    let mut vcpus = Vec::with_capacity(spec.vcpus as usize);
    let mut tsc_khz = None;
    for id in 0..spec.vcpus {
        let fd = vm.create_vcpu(id as u64).map_err(kvm_error("KVM_CREATE_VCPU"))?;
        if id == 0 {
            tsc_khz = fd.get_tsc_khz().ok();
        }
        let boot = entry.filter(|_| id == 0);
        vcpus.push(Vcpu::new(fd, id, spec.vcpus, &supported, tsc_khz, boot, shared.clone())?);
    }
    Ok(vcpus)
}

/// What the control socket reads of a running VM.
struct RunningVm {
    platform: Arc<Platform>,
    counters: Arc<ExitCounters>,
    started: Instant,
}

impl VmObserver for RunningVm {
    fn counters(&self) -> LiveCounters {
        LiveCounters {
            state: VmState::Running,
            run_ms: ms(self.started.elapsed()),
            serial_bytes: self.platform.serial_stats.bytes(),
            com2_bytes: self.platform.com2.as_ref().map(|(_, stats)| stats.bytes()),
            exits: self.counters.counts(),
            viommu: self.platform.iommu.as_ref().map(|iommu| iommu.counts()),
            devices: self.platform.passthrough.iter().map(|p| p.counters()).collect(),
        }
    }

    fn press_power_button(&self) -> std::io::Result<()> {
        self.platform.power_button.write(1)
    }

    fn slots(&self) -> Vec<vm_spec::control::SlotInfo> {
        self.platform.slots()
    }

    fn plug(&self, request: vm_spec::control::PlugRequest) -> Result<vm_spec::control::SlotInfo, (u16, String)> {
        self.platform.plug(&request.device).map_err(|e| (e.status(), e.to_string()))
    }

    fn unplug(&self, request: vm_spec::control::UnplugRequest) -> Result<vm_spec::control::SlotInfo, (u16, String)> {
        self.platform.unplug(&request.device, request.surprise).map_err(|e| (e.status(), e.to_string()))
    }

    fn snapshot_refusal(&self) -> Option<String> {
        self.platform.snapshot_refusal()
    }

    fn set_bounce_pool(&self, pool: vm_spec::control::BouncePool) -> Result<(), String> {
        let iommu = self.platform.iommu.as_ref().ok_or("the VM has no virtio-iommu to count bounced maps")?;
        iommu.set_bounce_pool(pool.start, pool.end.saturating_add(1));
        Ok(())
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// "vCPU 0 at rip 0x... (gpa 0x..., code ...); vCPU 1 at rip 0x... (...)": where a hung guest
/// was, and what code was there.
fn describe_rips(rips: &[Option<crate::vcpu::FinalPlace>]) -> String {
    let parts: Vec<String> = rips
        .iter()
        .enumerate()
        .map(|(id, place)| match place {
            Some(place) => format!("vCPU {id} at {place}"),
            None => format!("vCPU {id} did not stop"),
        })
        .collect();
    parts.join("; ")
}

/// "vCPU 0: its page tables (...) are outside guest memory": the first vCPU found in a state no
/// guest can reach.
fn state_lost(places: &[Option<crate::vcpu::FinalPlace>]) -> Option<String> {
    places.iter().enumerate().find_map(|(id, place)| Some(format!("vCPU {id}: {}", place.as_ref()?.impossible()?)))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn register_memory(vm: &VmFd, ram: &GuestRam) -> Result<(), Error> {
    for (slot, region) in ram.memory.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        let mapping = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is mapped for as long as `ram` lives, which is longer than the VM's
        // vCPUs run (they are joined before `run` returns).
        unsafe { vm.set_user_memory_region(mapping) }.map_err(kvm_error("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// Kicks every vCPU thread out of KVM_RUN until it is done, then joins it.
fn stop_vcpus(threads: Vec<vcpu::VcpuThread>) {
    let deadline = Instant::now() + VCPU_STOP_GRACE;
    for thread in threads {
        while !thread.is_done() && Instant::now() < deadline {
            thread.kick();
            std::thread::sleep(Duration::from_micros(200));
        }
        if thread.is_done() {
            thread.join();
        } else {
            tracing::warn!("a vCPU thread did not stop; leaving it behind");
        }
    }
}
