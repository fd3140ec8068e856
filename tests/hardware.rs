//! Hardware tests: the probe guest against a real device through kernel VFIO. They run where
//! `DRIVERLAB_HW_DEVICE=BDF` names a device bound to vfio-pci (lab hosts, labelled CI runners)
//! and skip with that reason elsewhere. docs/hardware.md describes the host set-up.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use common::{driverlab_cmd, kvm_available, vm_run};
use engines::ProbeReport;

fn hardware_device(test: &str) -> Option<String> {
    match std::env::var("DRIVERLAB_HW_DEVICE") {
        Ok(bdf) if !bdf.is_empty() => Some(bdf),
        _ => {
            let why = "set DRIVERLAB_HW_DEVICE=BDF (a device bound to vfio-pci) to run it";
            common::skip(test, common::Lacks::Hardware, why);
            None
        }
    }
}

fn sysfs_ids(bdf: &str) -> String {
    let read = |attr: &str| {
        let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bdf}/{attr}")).unwrap();
        text.trim().trim_start_matches("0x").to_string()
    };
    format!("{}:{}", read("vendor"), read("device"))
}

#[test]
fn host_passes_the_preflight() {
    let Some(bdf) = hardware_device("host_passes_the_preflight") else { return };
    let (code, stdout, _) = driverlab_cmd(&["doctor", "--device", &bdf]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn probe_sees_the_real_device_behind_the_iommu_and_it_resets() {
    let test = "probe_sees_the_real_device_behind_the_iommu_and_it_resets";
    let Some(bdf) = hardware_device(test) else { return };
    if !kvm_available(test) {
        return;
    }
    let device = format!("vfio={bdf}");
    for iommu in [true, false] {
        let mut args = vec!["--kernel", "probe", "--device", &device, "--memory", "512"];
        if iommu {
            args.push("--iommu");
        }
        let out = vm_run(&args);
        assert_eq!(out.code(), Some(0), "iommu={iommu}: {}", out.stderr);
        let report = ProbeReport::parse(&out.serial);
        let pci = report.section("pci").unwrap();
        let seen =
            pci["devices"].as_array().unwrap().iter().find(|d| d["bdf"] == "00:02.0").expect("the device at 00:02.0");
        assert_eq!(seen["id"], sysfs_ids(&bdf).as_str());
        assert!(!seen["bars"].as_array().unwrap().is_empty(), "its BARs are assigned");
        let exit = out.exit.unwrap();
        let summary = &exit.devices[0];
        assert!(summary.device.error.is_none() && summary.reset_ok, "{summary:?}");
    }
}
