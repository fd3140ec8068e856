//! A Thunderbolt slot's hot-plug on the VMM's control socket, with the real binaries: the
//! conformance device served over vfio-user waits in an empty slot, is plugged, pulled by
//! surprise, plugged again, released in order; every refusal is a clear answer, and what the
//! device had mapped on the host goes with it. The probe guest (which drives bus 0 only) holds
//! meanwhile; what Linux's pciehp makes of the slot is the nested box's to show.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::time::Duration;

use common::{kvm_available, start_model};
use engines::VmProcess;
use engines::vm_control::{ControlClient, ControlError};
use vm_spec::control::{ShutdownRequest, SlotInfo, SlotState};
use vm_spec::{IommuSpec, Kernel, Slot, VmSpec};

/// The refusal's HTTP status.
fn refused(answer: Result<SlotInfo, ControlError>) -> (u16, String) {
    match answer {
        Err(ControlError::Refused { status, message, .. }) => (status, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The model's DMA maps and unmaps so far.
fn model_dma(control: &ControlClient) -> (u64, u64) {
    let counters = control.counters().unwrap();
    let model = counters.devices[0].counters.expect("the model's counters");
    (model.dma_maps, model.dma_unmaps)
}

#[test]
fn a_thunderbolt_slot_is_plugged_pulled_and_released_on_the_control_socket() {
    if !kvm_available("a_thunderbolt_slot_is_plugged_pulled_and_released_on_the_control_socket") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let model = start_model("testdev", &[]);
    let device = model.device_spec().in_slot(Slot::Thunderbolt).plugged_later();
    let name = device.backend.to_string();
    let spec = VmSpec {
        cmdline: "probe.viommu_ops=0 probe.hold=60000".into(),
        iommu: Some(IommuSpec::default()),
        devices: vec![device],
        timeout_s: Some(120.0),
        ..VmSpec::new(Kernel::Probe)
    };
    let vm =
        VmProcess::new(&common::programs().vmm, spec, Duration::from_secs(30)).with_control(&socket).start().unwrap();
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    control.wait_until_serving(Duration::from_secs(10)).unwrap();
    let slots = || {
        let info = control.info().unwrap();
        (!info.slots.is_empty()).then_some(info.slots)
    };
    assert!(common::wait_until(Duration::from_secs(20), Duration::from_millis(20), || slots().is_some()));
    let slot = &slots().unwrap()[0];
    assert_eq!(
        (slot.device.as_str(), slot.port.as_str(), slot.bdf.as_str(), slot.state),
        (name.as_str(), "00:02.0", "01:00.0", SlotState::Empty)
    );
    assert_eq!(model_dma(&control), (0, 0), "nothing mapped for a device the guest has not seen");

    // Refusals: an unknown device, an empty slot's unplug.
    assert_eq!(refused(control.plug("vfio-user=/nowhere")).0, 404);
    assert_eq!(refused(control.unplug(&name, true)).0, 409);
    let (status, why) = refused(control.unplug(&name, false));
    assert_eq!(status, 409);
    assert!(why.contains("is empty"), "{why}");

    // Plugged: the endpoint is in boot bypass, so all of RAM is mapped for it: one map per RAM
    // range (below the hole, and the 2 MiB above 4 GiB a Thunderbolt device's guest gets for its
    // bounce buffers).
    assert_eq!(control.plug(&name).unwrap().state, SlotState::Occupied);
    assert_eq!(model_dma(&control), (2, 0));
    let (status, why) = refused(control.plug(&name));
    assert_eq!(status, 409);
    assert!(why.contains("is occupied"), "{why}");

    // Pulled by surprise: gone at once, with nothing left mapped on the host.
    assert_eq!(control.unplug(&name, true).unwrap().state, SlotState::Empty);
    let (maps, unmaps) = model_dma(&control);
    assert_eq!(maps, unmaps, "every host mapping taken down");

    // Plugged again, then released in order: the attention button is pressed and the slot
    // waits for the guest (the probe has no pciehp: it stays releasing); a second orderly
    // request is refused, a surprise pull still works.
    assert_eq!(control.plug(&name).unwrap().state, SlotState::Occupied);
    assert_eq!(control.unplug(&name, false).unwrap().state, SlotState::Releasing);
    assert_eq!(slots().unwrap()[0].state, SlotState::Releasing);
    let (status, why) = refused(control.unplug(&name, false));
    assert_eq!(status, 409);
    assert!(why.contains("being released"), "{why}");
    assert_eq!(control.unplug(&name, true).unwrap().state, SlotState::Empty);
    let (maps, unmaps) = model_dma(&control);
    assert_eq!((maps, unmaps), (4, 4));

    control.shutdown(ShutdownRequest { grace_s: Some(0.0) }).unwrap();
    let out = vm.wait().unwrap();
    let exit = out.exit.expect("an exit line");
    assert_eq!(exit.devices[0].device.bdf, "01:00.0");
    assert!(exit.devices[0].reset_ok, "{}", out.stderr);
    drop(model);
}
