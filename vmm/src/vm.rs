//! Building a VM from a [`VmSpec`] and running it to its end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use vm_device::guest_event::GuestEventSink;
use vm_spec::confinement::Confinement;
use vm_spec::control::{LiveCounters, VmState};
use vm_spec::exit::SetupPhases;
use vm_spec::{ExitSummary, VmSpec};

use crate::boot::{self, BootRequest};
use crate::config;
use crate::control::{ControlSocket, ControlState, VmObserver};
use crate::exit::{ExitCounters, StopCause, VmStop};
use crate::interrupts::KvmInterrupts;
use crate::layout::ACPI_RSDP_ADDR;
use crate::memory::{GuestRam, MIB, RamLayout};
use crate::memory_slots::KvmSlots;
use crate::platform::Platform;
use crate::platform::{self, PlatformConfig};
use crate::vcpu::{self, Vcpu, VcpuShared};
use crate::x86::boot_cpu;
use crate::{Error, RunOptions};

/// KVM's TSS for real-mode emulation on Intel: three pages just below the BIOS ROM.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// How long the main thread waits for vCPU threads to leave KVM_RUN after being kicked.
const VCPU_STOP_GRACE: Duration = Duration::from_secs(2);

fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}

/// Boots `spec` and runs the VM until it stops. Returns the exit summary; errors before the guest
/// ran are `Err`.
pub fn run(spec: &VmSpec, options: &RunOptions) -> Result<ExitSummary, Error> {
    let setup_start = Instant::now();
    spec.validate()?;
    config::check_host(spec)?;
    // The jail's first step comes before anything a fork cannot carry (KVM ties a VM to its
    // process): from here on this is the supervisor's child, PID 1 of its own namespace.
    let jail_spec =
        jail::JailSpec::from_env("vm", spec.memory_mib * MIB, spec.vcpus as u64, spec.vcpus).map_err(Error::Jail)?;
    let mut confinement = Confinement { jailed: spec.jail, ..Confinement::default() };
    let socket: Vec<&std::path::Path> = options.control_socket.as_deref().into_iter().collect();
    let namespaces = spec.jail.then(|| jail::enter_namespaces(&mut confinement, &socket, jail::Signals::EndBoth));
    let pid = namespaces.as_ref().map_or(std::process::id(), |n| n.supervisor_pid);
    let stop = Arc::new(VmStop::new());
    let control = Arc::new(ControlState::new(spec.clone(), stop.clone(), pid));
    let filters = if spec.seccomp { Some(crate::seccomp::filters()?) } else { None };
    // Bound now, served once the process is jailed (the thread would escape the jail).
    let control_socket = options.control_socket.as_deref().map(ControlSocket::bind).transpose()?;

    let kernel = config::open_kernel(&spec.kernel, options.probe_image)?;
    let mut phases = SetupPhases { image_ms: ms(setup_start.elapsed()), ..SetupPhases::default() };
    let mut lap = Instant::now();
    let mut next = |phase: &mut f64| {
        let now = Instant::now();
        *phase = ms(now - lap);
        lap = now;
    };
    let com1 = config::open_serial(&spec.serial.com1)?;
    let com2 = spec.serial.com2.as_ref().map(config::open_serial).transpose()?;

    let ram = GuestRam::new(RamLayout::new(spec.memory_mib * MIB))?;
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
    drop(request);
    control.set_entry(entry.name());
    next(&mut phases.load_ms);

    let kvm = Kvm::new().map_err(Error::KvmUnavailable)?;
    let vm = kvm.create_vm().map_err(kvm_error("KVM_CREATE_VM"))?;
    vm.set_tss_address(KVM_TSS_ADDRESS).map_err(kvm_error("KVM_SET_TSS_ADDR"))?;
    register_memory(&vm, &ram)?;
    vm.create_irq_chip().map_err(kvm_error("KVM_CREATE_IRQCHIP"))?;
    next(&mut phases.kvm_ms);

    let vm = Arc::new(vm);
    let interrupts = Arc::new(KvmInterrupts::new(vm.clone())?);
    let events: Arc<dyn GuestEventSink> = stop.clone();
    let platform_config =
        PlatformConfig { vcpus: spec.vcpus, iommu: spec.iommu, devices: spec.devices.clone(), com1, com2 };
    let slots = Arc::new(KvmSlots::new(vm.clone(), ram.memory.num_regions() as u32));
    let platform = Arc::new(platform::build(&vm, &ram, interrupts, slots, events, platform_config)?);
    let tables = crate::acpi::build(&platform.acpi).map_err(|e| Error::Platform(e.to_string()))?;
    crate::acpi::write(&ram.memory, &tables).map_err(|e| Error::Platform(e.to_string()))?;
    next(&mut phases.platform_ms);

    let counters = Arc::new(ExitCounters::default());
    let shared = VcpuShared {
        io_bus: platform.io_bus.clone(),
        mmio_bus: platform.mmio_bus.clone(),
        memory: ram.memory.clone(),
        stop: stop.clone(),
        counters: counters.clone(),
        final_rips: Arc::new(Mutex::new(vec![None; spec.vcpus as usize])),
    };
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_error("KVM_GET_SUPPORTED_CPUID"))?;
    let mut vcpus = Vec::with_capacity(spec.vcpus as usize);
    let mut tsc_khz = None;
    for id in 0..spec.vcpus {
        let fd = vm.create_vcpu(id as u64).map_err(kvm_error("KVM_CREATE_VCPU"))?;
        if id == 0 {
            tsc_khz = fd.get_tsc_khz().ok();
        }
        let boot = (id == 0).then_some(&entry);
        vcpus.push(Vcpu::new(fd, id, spec.vcpus, &supported, tsc_khz, boot, shared.clone())?);
    }

    next(&mut phases.vcpus_ms);

    // Everything is open: the rest of the jail, then the threads, which inherit it.
    if let Some(namespaces) = &namespaces {
        jail::confine(&jail_spec, namespaces, &mut confinement);
        for missed in confinement.missing() {
            tracing::warn!("jail: not taken: {missed}");
        }
    }
    next(&mut phases.jail_ms);
    control.set_confinement(confinement.clone());
    let _control_server = match control_socket {
        Some(socket) => Some(socket.serve(control.clone(), filters.as_ref().map(|f| f.control.clone()))?),
        None => None,
    };
    vcpu::register_kick_handler().map_err(Error::Io)?;
    crate::seccomp::report_violations().map_err(Error::Io)?;
    let started = Instant::now();
    let observer = Arc::new(RunningVm { platform: platform.clone(), counters: counters.clone(), started });
    control.set_observer(observer);
    control.set_state(VmState::Running);
    let setup_ms = ms(started - setup_start);
    let mut threads = Vec::with_capacity(vcpus.len());
    for vcpu in vcpus {
        match vcpu.start(filters.as_ref().map(|f| f.vcpu.clone())) {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                stop.request(StopCause::VmmError(format!("cannot start a vCPU thread: {e}")));
                break;
            }
        }
    }
    if let Some(filters) = &filters
        && let Err(e) = crate::seccomp::apply(&filters.main)
    {
        stop.request(StopCause::VmmError(e.to_string()));
    }

    let timeout = spec.timeout_s.map(Duration::from_secs_f64);
    let reason = stop.wait_with(timeout, || {
        if let Err(e) = platform.power_button.write(1) {
            tracing::warn!("pressing the power button again: {e}");
        }
    });
    let stopped = Instant::now();
    control.set_state(VmState::Stopping);
    stop_vcpus(threads);
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

    Ok(ExitSummary {
        vmm: "exit".into(),
        reason: reason.reason(),
        exit_code: reason.exit_code(),
        detail,
        entry: entry.name().into(),
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
        huge_pages: Some(ram.huge_pages),
        setup_ms,
        setup: Some(phases),
        run_ms: ms(stopped - started),
        first_serial_ms: platform.serial_stats.first_byte().map(|t| ms(t.saturating_duration_since(started))),
        serial_bytes: platform.serial_stats.bytes(),
        com2_bytes: platform.com2.as_ref().map(|(_, stats)| stats.bytes()),
        viommu: platform.iommu.as_ref().map(|iommu| iommu.counts()),
        devices,
        exits: counters.counts(),
        confinement: Some(confinement),
        vcpu_state_lost,
    })
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
