//! x86-64 vCPU set-up: CPUID, MSRs, the local APIC and the entry state of the boot CPU.

pub mod boot_cpu;
pub mod cpuid;
pub mod lapic;
pub mod msr;
