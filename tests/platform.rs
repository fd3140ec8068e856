//! The platform the guest sees: ACPI tables, PCI enumeration through ECAM, and the virtio-iommu
//! driven by the probe guest, whose counts must agree with the VMM's.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use common::{kvm_available, vm_run};
use engines::ProbeReport;

#[test]
fn probe_drives_the_virtio_iommu_and_counts_agree() {
    if !kvm_available("probe_drives_the_virtio_iommu_and_counts_agree") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--iommu", "--cmdline", "probe.viommu_ops=1000"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    let done = report.done().expect("done");
    assert!(done.ok, "failures: {:?}", done.failures);

    let acpi = report.section("acpi").expect("acpi section");
    assert_eq!(acpi["checksums_ok"], true);
    let tables: Vec<&str> = acpi["tables"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    for wanted in ["FACP", "APIC", "MCFG", "DSDT", "VIOT"] {
        assert!(tables.contains(&wanted), "{wanted} missing from {tables:?}");
    }

    let pci = report.section("pci").expect("pci section");
    let devices = pci["devices"].as_array().unwrap();
    let viommu = devices.iter().find(|d| d["id"] == "1af4:1057").expect("virtio-iommu on the bus");
    assert_eq!(viommu["bdf"], "00:01.0");
    assert_eq!(viommu["class"], "080600");
    let bar = &viommu["bars"][0];
    assert_eq!((bar["kind"].as_str(), bar["size"].as_u64()), (Some("mem64"), Some(0x8000)));
    assert!(bar["addr"].as_u64().unwrap() >= 0xc000_0000 && bar["addr"].as_u64().unwrap() < 0xe000_0000);
    assert!(devices.iter().any(|d| d["bdf"] == "00:00.0" && d["class"] == "060000"), "host bridge");

    let guest = report.section("viommu").expect("viommu section");
    assert_eq!(guest["attached"], true);
    assert_eq!(guest["msix"], true, "completions arrived as MSI-X interrupts");
    assert_eq!(guest["probe_msi_window"], true, "PROBE reported the MSI window");
    assert_eq!((guest["maps"].as_u64(), guest["unmaps"].as_u64()), (Some(1000), Some(1000)));
    for key in ["map_ns_median", "unmap_ns_median", "map_4k_ns_median", "map_2m_ns_median"] {
        assert!(guest[key].as_u64().unwrap() > 0, "{key}");
    }

    let vmm = out.exit.as_ref().unwrap().viommu.clone().expect("the exit line counts the virtio-iommu");
    assert_eq!((vmm.maps, vmm.unmaps), (1000, 1000), "the VMM counted what the guest did");
    assert_eq!(vmm.map_bytes, 500 * 4096 + 500 * (2 << 20));
    assert_eq!((vmm.live_mappings, vmm.peak_mappings, vmm.faults, vmm.failed_requests), (0, 1, 0, 0));
    // Two more requests than pairs: PROBE and ATTACH.
    assert_eq!(vmm.requests, 2002);
}

#[test]
fn without_iommu_there_is_no_viot_and_no_virtio_iommu() {
    if !kvm_available("without_iommu_there_is_no_viot_and_no_virtio_iommu") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--vcpus", "3"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok);
    let tables = report.section("acpi").unwrap()["tables"].clone();
    assert!(!tables.as_array().unwrap().iter().any(|t| t == "VIOT"));
    assert_eq!(report.section("pci").unwrap()["devices"].as_array().unwrap().len(), 1, "only the host bridge");
    assert!(report.section("viommu").is_none());
    assert_eq!(report.section("cpus").unwrap()["expected"], 3, "the MADT lists every vCPU");
    assert!(out.exit.unwrap().viommu.is_none());
}

#[test]
fn asking_for_viommu_ops_without_an_iommu_fails_the_probe() {
    if !kvm_available("asking_for_viommu_ops_without_an_iommu_fails_the_probe") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--cmdline", "probe.viommu_ops=10"]);
    assert_eq!(out.code(), Some(0));
    let done = ProbeReport::parse(&out.serial).done().unwrap();
    assert!(!done.ok && done.failures[0].contains("no virtio-iommu"), "{done:?}");
}
