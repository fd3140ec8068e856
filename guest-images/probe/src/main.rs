//! The probe guest: boots like a kernel, checks what the VMM handed it, reports one JSON object
//! per line on COM1 and powers off. See `docs/probe.md` for the report format.
#![no_std]
#![no_main]

mod boot_info;
mod entry;
mod interrupts;
mod json;
mod lapic;
mod options;
mod port;
mod power;
mod report;
mod serial;
mod smp;
mod time;

use boot_info::BootInfo;
use options::Options;

/// CPL3 entry, reached from `entry.rs` with the boot information pointer and the entry kind.
#[unsafe(no_mangle)]
extern "C" fn probe_main(boot_info: u64, entry_kind: u64) -> ! {
    interrupts::install();
    match BootInfo::read(boot_info, entry_kind) {
        Ok(boot) => {
            let options = Options::parse(boot.cmdline());
            report_boot(&boot);
            smp::start_aps();
            if options.echo {
                report_options(&options);
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
