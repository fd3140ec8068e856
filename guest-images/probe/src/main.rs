//! The probe guest: boots like a kernel, checks what the VMM handed it, reports one JSON object
//! per line on COM1 and powers off. See `docs/probe.md` for the report format.
#![no_std]
#![no_main]

mod acpi;
mod boot_info;
mod dma;
mod entry;
mod high_mmio;
mod interrupts;
mod json;
mod lan743x;
mod lapic;
mod mmio;
mod nic;
mod options;
mod pci;
mod port;
mod power;
mod power_button;
mod receive;
mod report;
mod rx_buffers;
mod sequence;
mod serial;
mod smp;
mod testdev;
mod time;
mod viommu;
mod virtio;

use acpi::Acpi;
use boot_info::BootInfo;
use options::Options;
use pci::{Ecam, Function};

/// MAP/UNMAP pairs timed on a virtio-iommu when `probe.viommu_ops` is not given.
const DEFAULT_VIOMMU_OPS: u32 = 64;

/// CPL3 entry, reached from `entry.rs` with the boot information pointer and the entry kind.
#[unsafe(no_mangle)]
extern "C" fn probe_main(boot_info: u64, entry_kind: u64) -> ! {
    interrupts::install();
    lapic::enable();
    match BootInfo::read(boot_info, entry_kind) {
        Ok(boot) => {
            let options = Options::parse(boot.cmdline());
            if options.out_com2 {
                if serial::present(serial::COM2) {
                    json::section("report", |o| {
                        o.str("port", "com2");
                    });
                    serial::report_to(serial::COM2);
                } else {
                    report::fail("probe.out=com2: no UART at 0x2f8");
                }
            }
            report_boot(&boot);
            if options.panic {
                panic!("probe.panic=1 asked for a panic");
            }
            let acpi = Acpi::read(&boot);
            match &acpi {
                Some(acpi) => acpi.report(),
                None => report::fail("no ACPI RSDP"),
            }
            smp::start_aps(acpi.as_ref().and_then(|a| a.lapics));
            if let Some(acpi) = &acpi
                && let Some(base) = acpi.ecam
            {
                let ecam = Ecam::new(base);
                let mut functions = [Function::default(); pci::MAX_FUNCTIONS];
                let count = ecam.enumerate(&mut functions);
                pci::report(&functions[..count]);
                let ops = options.viommu_ops.unwrap_or(DEFAULT_VIOMMU_OPS);
                let mut viommu = viommu::run(acpi, ecam, &functions[..count], ops, options.viommu_ops.is_some());
                testdev::run(ecam, &functions[..count], viommu.as_mut());
                nic::run(ecam, &functions[..count], viommu.as_mut(), options.nic());
                lan743x::run(ecam, &functions[..count], viommu.as_mut(), options.lan743x());
            }
            if options.echo {
                report_options(&options);
            }
            if let Some(hold_ms) = options.hold_ms
                && power_button::hold(acpi.as_ref(), hold_ms)
            {
                report::done();
                power::poweroff()
            }
        }
        Err(why) => report::fail(why),
    }
    report::done();
    power::poweroff()
}

fn report_boot(boot: &BootInfo) {
    json::section("boot", |o| {
        o.str("entry", boot.entry.name()).str("cmdline", boot.cmdline()).array("e820", |a| {
            for e in boot.e820() {
                a.object(|o| {
                    o.u64("addr", e.addr).u64("size", e.size).u64("type", e.kind as u64);
                });
            }
        });
    });
}

fn report_options(options: &Options) {
    json::section("options", |o| {
        o.bool("echo", options.echo);
        if let Some(ops) = options.viommu_ops {
            o.u64("viommu_ops", ops as u64);
        }
        if let Some(nic) = options.nic() {
            o.str("nic", "aqc100").str("rx", nic.strategy.name()).u64("frames", nic.frames as u64);
        }
    });
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    json::section("panic", |o| {
        if let Some(location) = info.location() {
            o.str("file", location.file()).u64("line", location.line() as u64);
        }
        if let Some(message) = info.message().as_str() {
            o.str("message", message);
        }
    });
    report::fail("panic");
    report::done();
    power::panic()
}
