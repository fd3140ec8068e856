//! The LAN7430 model end to end under the probe: the real binary serves the model with its frame
//! generator over vfio-user, another boots the probe against it behind the virtio-iommu, and the
//! probe's lan743x-style driver receives frames at a descriptor spacing of 16 bytes (Linux 6.12)
//! and of 64 (before seed 004), each write-back checked in its slot, with each RX strategy's
//! maps counted by the probe, the VMM's virtio-iommu and the model.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use common::{kvm_available, start_model, vm_run};
use engines::ProbeReport;

const FRAMES: u64 = 5000;
const MAC: &str = "02:10:55:00:00:07";

fn receive(spacing: u32, strategy: &str) -> serde_json::Value {
    let model = start_model("lan743x", &["--mac", MAC, "--generate", "size=1514"]);
    let device = model.device_arg();
    let cmdline = format!(
        "probe.viommu_ops=0 probe.nic=lan743x probe.dspace={spacing} probe.rx={strategy} probe.frames={FRAMES}"
    );
    let out = vm_run(&["--kernel", "probe", "--iommu", "--device", &device, "--cmdline", &cmdline]);
    assert_eq!(out.code(), Some(0), "stderr: {}\nserial: {}", out.stderr, out.serial);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok, "{:?}\n{}", report.done(), out.serial);
    let nic = report.section("nic").expect("nic section").clone();
    assert_eq!((nic["id"].as_str(), nic["mac"].as_str()), (Some("1055:7430"), Some(MAC)), "{nic}");
    assert_eq!((nic["phy_id"].as_u64(), nic["link_mbps"].as_u64()), (Some(0x0007_c132), Some(1000)));
    assert_eq!(nic["descriptor_spacing"], spacing);
    assert_eq!(nic["rx_frames"], FRAMES);
    assert_eq!(nic["slots_ok"], true, "every write-back in the slot the spacing puts it: {nic}");
    assert_eq!(nic["in_order"], true);
    // The three counts of the maps agree: the probe's, the VMM's virtio-iommu's, the model's.
    let exit = out.exit.expect("exit line");
    let viommu = exit.viommu.expect("viommu counters");
    assert_eq!(viommu.maps, nic["iommu_maps"].as_u64().unwrap(), "{nic}");
    let model_maps = exit.devices[0].device.counters.expect("model counters").dma_maps;
    // The model saw each as a vfio-user DMA_MAP, plus the identity map of RAM while the
    // endpoint was still in bypass (a map per RAM range).
    assert!(
        (viommu.maps..=viommu.maps + 2).contains(&model_maps),
        "the model saw {model_maps} maps, the virtio-iommu {}",
        viommu.maps
    );
    nic
}

#[test]
fn the_probe_receives_through_the_model_at_both_descriptor_spacings() {
    if !kvm_available("the_probe_receives_through_the_model_at_both_descriptor_spacings") {
        return;
    }
    for spacing in [16, 64] {
        for (strategy, maps) in [("flip", 0.5), ("order3", 0.0625), ("pool", 0.0)] {
            let nic = receive(spacing, strategy);
            let got = nic["maps_per_frame"].as_f64().unwrap();
            assert!((got - maps).abs() < 0.002, "spacing {spacing}, {strategy}: {got} maps per frame, want {maps}");
        }
    }
}
