//! What a cell's guest is told on its kernel command line: the image's words, the variant's,
//! its parameters, then what the workload needs (the probe's `probe.*`, the guest agent's
//! `driverlab.*`, guest-images/agent/init). A plan checks every cell's line as part of its VM
//! (vm-spec's limits) before a run is made.

use vm_spec::NicKind;

use super::{Cell, Device, IommuDomainChoice, Plan, Workload};

impl Plan {
    /// The kernel command line of a cell: the image's words, the variant's, its parameters, then
    /// what the workload needs.
    pub fn cmdline(&self, cell: &Cell) -> String {
        let mut words: Vec<String> = Vec::new();
        if let Some(image) = self.image(&cell.image) {
            words.extend(image.cmdline.split_whitespace().map(String::from));
        }
        if let Some(variant) = self.variant(&cell.variant) {
            words.extend(variant.cmdline.split_whitespace().map(String::from));
            if variant.iommu_domain == Some(IommuDomainChoice::Lazy) {
                // The agent writes the group's type in its iommu-group step.
                words.push("driverlab.iommu_domain=lazy".into());
            }
        }
        words.extend(cell.params.iter().map(|(k, v)| format!("{k}={v}")));
        match self.workload(&cell.workload) {
            Some(Workload::ProbeRx { frames, .. }) => {
                // The probe drives the NICs driverlab knows (the matrix's check refuses a probe-rx
                // workload on any other).
                let nic = self.device(&cell.device).and_then(Device::nic).unwrap_or(NicKind::Aqc100);
                words.extend([
                    "probe.viommu_ops=0".into(),
                    format!("probe.nic={nic}"),
                    format!("probe.frames={frames}"),
                ]);
            }
            Some(Workload::Iperf3 { direction, duration_s, ip, mtu, streams, protocol, bitrate_mbit, .. }) => {
                words.extend(self.agent_words(cell, *mtu));
                let seconds = duration_s.ceil() as u64;
                words.push(match bitrate_mbit {
                    0 => format!("driverlab.iperf={direction},{seconds},{ip},{streams},{protocol}"),
                    rate => format!("driverlab.iperf={direction},{seconds},{ip},{streams},{protocol},{rate}M"),
                });
                if let Some((_, kind)) = self.workload(&cell.workload).and_then(Workload::unplug) {
                    // The agent expects the device to go mid-traffic and checks how the guest took it.
                    words.push(format!("driverlab.unplug={kind}"));
                }
            }
            Some(Workload::PacketRate { direction, frame_bytes, rate_pps, duration_s, ip, mtu, streams, .. }) => {
                words.extend(self.agent_words(cell, *mtu));
                // iperf3's UDP datagrams of the frame's payload, its rate in payload bits per
                // second per stream (0: unlimited).
                let payload = super::udp_payload(*frame_bytes, *ip).unwrap_or(super::MIN_IPERF_PAYLOAD);
                let bits = rate_pps.saturating_mul(u64::from(payload) * 8) / u64::from((*streams).max(1));
                let seconds = duration_s.ceil() as u64;
                words.push(format!("driverlab.iperf={direction},{seconds},{ip},{streams},udp,{bits},{payload}"));
            }
            Some(Workload::Xdp { action, frame_bytes, rate_pps, duration_s, mtu, .. }) => {
                words.extend(self.agent_words(cell, *mtu));
                let payload = super::udp_payload(*frame_bytes, 4).unwrap_or(super::MIN_IPERF_PAYLOAD);
                let seconds = duration_s.ceil() as u64;
                words.push(format!("driverlab.xdp={action},{seconds},{payload},{rate_pps}"));
            }
            Some(Workload::Latency { protocol, message_bytes, rate_mps, duration_s, mtu, .. }) => {
                words.extend(self.agent_words(cell, *mtu));
                let seconds = duration_s.ceil() as u64;
                words.push(format!("driverlab.sockperf={protocol},{seconds},{message_bytes},{rate_mps}"));
            }
            Some(Workload::Kselftest { tests, timeout_s, mtu, .. }) => {
                words.extend(self.agent_words(cell, *mtu));
                let tests: Vec<&str> = tests.iter().map(super::SelftestName::as_str).collect();
                words.push(format!("driverlab.kselftest={timeout_s},{}", tests.join(",")));
            }
            None => {}
        }
        words.join(" ")
    }

    /// The guest agent's words every traffic workload needs (guest-images/agent/init): the
    /// console, its driver, the MTU.
    fn agent_words(&self, cell: &Cell, mtu: u32) -> [String; 4] {
        let driver = self.linux_driver(cell);
        ["console=ttyS0".into(), "panic=-1".into(), format!("driverlab.nic={driver}"), format!("driverlab.mtu={mtu}")]
    }

    /// The Linux driver of a cell's NIC.
    pub fn linux_driver(&self, cell: &Cell) -> String {
        self.device(&cell.device).map_or_else(|| NicKind::Aqc100.linux_driver().into(), Device::linux_driver)
    }

    /// Every cell's VM as far as the plan fixes it (the image's memory and vCPUs, the cell's
    /// command line) within a lab's limits (vm-spec's, as `/v1/vms` checks them): the variant
    /// whose cell does not fit, and why.
    pub(super) fn check_vms(&self) -> Result<(), (usize, String)> {
        for cell in &self.cells {
            let Some(image) = self.image(&cell.image) else { continue };
            let vm = vm_spec::VmSpec {
                memory_mib: image.memory_mib,
                vcpus: image.vcpus,
                cmdline: self.cmdline(cell),
                ..vm_spec::VmSpec::new(vm_spec::Kernel::Probe)
            };
            if let Err(e) = vm.validate_within(&vm_spec::VmLimits::LAB) {
                let variant = self.matrix.variants.iter().position(|v| v.get_ref().name == cell.variant).unwrap_or(0);
                return Err((variant, format!("cell {} ({}): {e}", cell.id, cell.label())));
            }
        }
        Ok(())
    }
}
