//! CPUID for each vCPU: what KVM supports, with the topology of this VM (one socket, one thread
//! per core, `vcpus` cores) and the TSC frequency in the hypervisor timing leaf.

use kvm_bindings::{CpuId, kvm_cpuid_entry2};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const LEAF_HYPERVISOR: u32 = 0x4000_0000;
/// Hypervisor timing leaf: EAX = TSC frequency in kHz, EBX = APIC timer frequency in kHz.
pub const LEAF_HYPERVISOR_TIMING: u32 = 0x4000_0010;
const LEAF_AMD_SIZE: u32 = 0x8000_0008;
const LEAF_AMD_TOPOLOGY: u32 = 0x8000_001e;

const ECX_HYPERVISOR: u32 = 1 << 31;
const EDX_HTT: u32 = 1 << 28;
/// KVM's local APIC timer ticks once per nanosecond.
const APIC_TIMER_KHZ: u32 = 1_000_000;
const KVM_CPUID_FLAG_SIGNIFCANT_INDEX: u32 = 1;

/// Bits needed to number `n` items.
fn id_bits(n: u32) -> u32 {
    32 - (n.max(1) - 1).leading_zeros()
}

fn topology_level(function: u32, index: u32, vcpus: u32, apic_id: u32) -> kvm_cpuid_entry2 {
    // Level 0: SMT (1 thread per core); level 1: core (all vCPUs); then invalid.
    let (eax, ebx, level_type) = match index {
        0 => (0, 1, 1),
        1 => (id_bits(vcpus), vcpus, 2),
        _ => (0, 0, 0),
    };
    kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax,
        ebx,
        ecx: index | (level_type << 8),
        edx: apic_id,
        ..Default::default()
    }
}

/// Patches `cpuid` (from KVM_GET_SUPPORTED_CPUID) for vCPU `vcpu_id` of `vcpus`.
pub fn configure(cpuid: &CpuId, vcpu_id: u32, vcpus: u32, tsc_khz: Option<u32>) -> CpuId {
    let apic_id = vcpu_id;
    let mut entries: Vec<kvm_cpuid_entry2> = Vec::with_capacity(cpuid.as_slice().len() + 4);
    let mut has_timing_leaf = false;
    for &entry in cpuid.as_slice() {
        let mut e = entry;
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | (vcpus.min(255) << 16);
                e.ecx |= ECX_HYPERVISOR;
                if vcpus > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
            }
            LEAF_CACHE_PARAMS => {
                let cores = (1u32 << id_bits(vcpus)) - 1;
                let cache_level = (e.eax >> 5) & 0x7;
                let sharing = if cache_level >= 3 { vcpus - 1 } else { 0 };
                e.eax = (e.eax & 0x3fff) | (cores << 26) | ((sharing & 0xfff) << 14);
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                // Replaced below with one entry per level.
                if e.index == 0 {
                    for index in 0..3 {
                        entries.push(topology_level(e.function, index, vcpus, apic_id));
                    }
                }
                continue;
            }
            LEAF_HYPERVISOR => e.eax = e.eax.max(LEAF_HYPERVISOR_TIMING),
            LEAF_HYPERVISOR_TIMING => {
                // Some hosts list the leaf with zeros; it is only useful with the rate in it.
                if let Some(khz) = tsc_khz {
                    (e.eax, e.ebx) = (khz, APIC_TIMER_KHZ);
                }
                has_timing_leaf = true;
            }
            LEAF_AMD_SIZE => e.ecx = (e.ecx & !0xf0ff) | (vcpus - 1) | (id_bits(vcpus) << 12),
            LEAF_AMD_TOPOLOGY => {
                e.eax = apic_id;
                e.ebx = apic_id & 0xff;
                e.ecx = 0;
            }
            _ => {}
        }
        entries.push(e);
    }
    if let (Some(khz), false) = (tsc_khz, has_timing_leaf)
        && entries.iter().any(|e| e.function == LEAF_HYPERVISOR)
    {
        entries.push(kvm_cpuid_entry2 {
            function: LEAF_HYPERVISOR_TIMING,
            eax: khz,
            ebx: APIC_TIMER_KHZ,
            ..Default::default()
        });
    }
    CpuId::from_entries(&entries).unwrap_or_else(|_| cpuid.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, index, ..Default::default() }
    }

    fn find(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid.as_slice().iter().find(|e| e.function == function && e.index == index).unwrap()
    }

    #[test]
    fn topology_describes_the_vcpu_count() {
        let base = CpuId::from_entries(&[
            entry(LEAF_FEATURES, 0),
            entry(LEAF_EXT_TOPOLOGY, 0),
            entry(LEAF_EXT_TOPOLOGY, 1),
            kvm_cpuid_entry2 { function: LEAF_HYPERVISOR, eax: 0x4000_0001, ..Default::default() },
            entry(LEAF_AMD_SIZE, 0),
        ])
        .unwrap();
        let c = configure(&base, 2, 3, Some(2_500_000));
        let f = find(&c, LEAF_FEATURES, 0);
        assert_eq!(f.ebx >> 24, 2, "APIC id");
        assert_eq!((f.ebx >> 16) & 0xff, 3, "logical processors");
        assert_ne!(f.edx & EDX_HTT, 0);
        assert_ne!(f.ecx & ECX_HYPERVISOR, 0);
        let core = find(&c, LEAF_EXT_TOPOLOGY, 1);
        assert_eq!((core.eax, core.ebx, core.ecx >> 8, core.edx), (2, 3, 2, 2));
        assert_eq!(find(&c, LEAF_EXT_TOPOLOGY, 2).ecx >> 8, 0, "level 2 is invalid");
        assert_eq!(c.as_slice().iter().filter(|e| e.function == LEAF_EXT_TOPOLOGY).count(), 3);
        assert_eq!(find(&c, LEAF_AMD_SIZE, 0).ecx & 0xff, 2);
        assert_eq!(find(&c, LEAF_HYPERVISOR, 0).eax, LEAF_HYPERVISOR_TIMING);
        assert_eq!(find(&c, LEAF_HYPERVISOR_TIMING, 0).eax, 2_500_000);
    }

    #[test]
    fn a_listed_empty_timing_leaf_gets_the_rate() {
        let base = CpuId::from_entries(&[
            kvm_cpuid_entry2 { function: LEAF_HYPERVISOR, eax: 0x4000_0010, ..Default::default() },
            entry(LEAF_HYPERVISOR_TIMING, 0),
        ])
        .unwrap();
        let c = configure(&base, 0, 1, Some(2_596_134));
        let timing = find(&c, LEAF_HYPERVISOR_TIMING, 0);
        assert_eq!((timing.eax, timing.ebx), (2_596_134, APIC_TIMER_KHZ));
        assert_eq!(c.as_slice().iter().filter(|e| e.function == LEAF_HYPERVISOR_TIMING).count(), 1);
    }

    #[test]
    fn id_bits_rounds_up() {
        assert_eq!([1, 2, 3, 4, 5, 8, 9].map(id_bits), [0, 1, 2, 2, 3, 3, 4]);
    }
}
