//! Building a VM from a [`VmConfig`] and running it to its end.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use devices::power::GuestEventSink;
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY, kvm_pit_config, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::signal::Killable;

use crate::Error;
use crate::boot::{self, BootRequest};
use crate::config::VmConfig;
use crate::exit::{ExitCounters, ExitReason, ExitSummary, VmStop};
use crate::interrupts::KvmInterrupts;
use crate::layout::ACPI_RSDP_ADDR;
use crate::memory::{GuestRam, MIB, RamLayout};
use crate::memory_slots::KvmSlots;
use crate::platform::{self, PlatformConfig};
use crate::vcpu::{self, Vcpu, VcpuShared};
use crate::x86::boot_cpu;

/// KVM's TSS for real-mode emulation on Intel: three pages just below the BIOS ROM.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// How long the main thread waits for vCPU threads to leave KVM_RUN after being kicked.
const VCPU_STOP_GRACE: Duration = Duration::from_secs(2);

fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}

/// Boots `config` and runs the VM until it stops. Returns the exit summary; errors before the
/// guest ran are `Err`.
pub fn run(config: &VmConfig) -> Result<ExitSummary, Error> {
    let setup_start = Instant::now();
    config.validate()?;
    let kernel = config.kernel.read()?;
    let serial_sink = config.serial.open()?;

    let ram = GuestRam::new(RamLayout::new(config.memory_mib * MIB))?;
    let e820 = ram.layout.e820();
    let kernel_name = config.kernel.name();
    let request = BootRequest {
        kernel_name: &kernel_name,
        kernel: &kernel,
        initrd: config.initrd.as_deref(),
        cmdline: &config.cmdline,
        protocol: config.entry,
        rsdp: Some(ACPI_RSDP_ADDR),
    };
    let entry = boot::load(&request, &ram.memory, &ram.layout, &e820)?;
    boot_cpu::write_tables(&ram.memory, &entry).map_err(|e| Error::GuestMemory(e.to_string()))?;
    drop(kernel);

    let kvm = Kvm::new().map_err(|source| Error::KvmUnavailable(source.to_string()))?;
    let vm = kvm.create_vm().map_err(kvm_error("KVM_CREATE_VM"))?;
    vm.set_tss_address(KVM_TSS_ADDRESS).map_err(kvm_error("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(kvm_error("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
    vm.create_pit2(pit).map_err(kvm_error("KVM_CREATE_PIT2"))?;
    register_memory(&vm, &ram)?;

    let vm = Arc::new(vm);
    let interrupts = Arc::new(KvmInterrupts::new(vm.clone()).map_err(|e| Error::Platform(e.to_string()))?);
    let stop = Arc::new(VmStop::new());
    let events: Arc<dyn GuestEventSink> = stop.clone();
    let platform_config = PlatformConfig { vcpus: config.vcpus, iommu: config.iommu, devices: config.devices.clone() };
    let slots = Arc::new(KvmSlots::new(vm.clone(), ram.memory.num_regions() as u32));
    let platform = platform::build(&vm, &ram, interrupts, slots, events, serial_sink, platform_config)?;
    let tables = crate::acpi::build(&platform.acpi).map_err(|e| Error::Platform(e.to_string()))?;
    crate::acpi::write(&ram.memory, &tables).map_err(|e| Error::Platform(e.to_string()))?;
    let serial = platform.serial.clone();

    let counters = Arc::new(ExitCounters::default());
    let shared = VcpuShared {
        io_bus: platform.io_bus.clone(),
        mmio_bus: platform.mmio_bus.clone(),
        memory: ram.memory.clone(),
        stop: stop.clone(),
        counters: counters.clone(),
        final_rips: Arc::new(Mutex::new(vec![None; config.vcpus as usize])),
    };
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_error("KVM_GET_SUPPORTED_CPUID"))?;
    let mut vcpus = Vec::with_capacity(config.vcpus as usize);
    let mut tsc_khz = None;
    for id in 0..config.vcpus {
        let fd = vm.create_vcpu(id as u64).map_err(kvm_error("KVM_CREATE_VCPU"))?;
        if id == 0 {
            tsc_khz = fd.get_tsc_khz().ok();
        }
        let boot = (id == 0).then_some(&entry);
        vcpus.push(Vcpu::new(fd, id, config.vcpus, &supported, tsc_khz, boot, shared.clone())?);
    }

    let filters = if config.seccomp { Some(crate::seccomp::filters()?) } else { None };
    vcpu::register_kick_handler().map_err(Error::Io)?;
    let started = Instant::now();
    let setup_ms = ms(started - setup_start);
    let mut threads = Vec::with_capacity(vcpus.len());
    for vcpu in vcpus {
        match vcpu.start(filters.as_ref().map(|f| f.vcpu.clone())) {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                stop.request(ExitReason::VmmError(format!("cannot start a vCPU thread: {e}")));
                break;
            }
        }
    }
    if let Some(filters) = &filters
        && let Err(e) = crate::seccomp::apply(&filters.main)
    {
        stop.request(ExitReason::VmmError(e.to_string()));
    }

    let reason = stop.wait(config.timeout).unwrap_or_else(|| {
        stop.request(ExitReason::Timeout);
        stop.wait(Some(Duration::ZERO)).unwrap_or(ExitReason::Timeout)
    });
    let stopped = Instant::now();
    stop_vcpus(threads);
    let detail = match &reason {
        ExitReason::Timeout => Some(describe_rips(&shared.final_rips.lock().unwrap_or_else(|p| p.into_inner()))),
        other => other.detail(),
    };
    {
        let mut serial = serial.lock().unwrap_or_else(|p| p.into_inner());
        serial.flush();
    }
    let devices = platform.teardown();

    Ok(ExitSummary {
        vmm: "exit".into(),
        reason: reason.name().into(),
        exit_code: reason.exit_code(),
        detail,
        entry: entry.name().into(),
        vcpus: config.vcpus,
        memory_mib: config.memory_mib,
        setup_ms,
        run_ms: ms(stopped - started),
        first_serial_ms: platform.serial_stats.first_byte().map(|t| ms(t.saturating_duration_since(started))),
        serial_bytes: platform.serial_stats.bytes(),
        viommu: platform.iommu.as_ref().map(|iommu| iommu.counts()),
        devices,
        exits: counters.counts(),
    })
}

/// "vCPU 0 at rip 0x...; vCPU 1 at rip 0x...": where a hung guest was.
fn describe_rips(rips: &[Option<u64>]) -> String {
    let parts: Vec<String> = rips
        .iter()
        .enumerate()
        .map(|(id, rip)| match rip {
            Some(rip) => format!("vCPU {id} at rip {rip:#x}"),
            None => format!("vCPU {id} did not stop"),
        })
        .collect();
    parts.join("; ")
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

/// Kicks every vCPU thread out of KVM_RUN until it exits, then joins it.
fn stop_vcpus(threads: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + VCPU_STOP_GRACE;
    for thread in threads {
        while !thread.is_finished() && Instant::now() < deadline {
            let _ = thread.kill(vcpu::kick_signal());
            std::thread::sleep(Duration::from_micros(200));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            tracing::warn!("a vCPU thread did not stop; leaving it behind");
        }
    }
}
