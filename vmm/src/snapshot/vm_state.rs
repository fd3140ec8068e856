//! A VM's own KVM state beside its vCPUs': the in-kernel irqchip (both PICs and the IOAPIC) and
//! the KVM clock. There is no PIT (the VMM creates none).

use kvm_bindings::{KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, kvm_clock_data, kvm_irqchip};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

use super::KvmStateError as Error;
use super::vcpu_state::kvm;

/// The VM's irqchips and clock.
#[derive(Serialize, Deserialize)]
pub struct VmState {
    /// The master PIC, the slave PIC and the IOAPIC, in that order.
    pub irqchips: Vec<kvm_irqchip>,
    /// The KVM clock (its `flags` as KVM gave them; stepped to now on restore when
    /// `KVM_CLOCK_REALTIME` is among them).
    pub clock: kvm_clock_data,
}

impl std::fmt::Debug for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmState").field("clock_ns", &self.clock.clock).finish_non_exhaustive()
    }
}

const CHIPS: [u32; 3] = [KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC];

impl VmState {
    /// Reads `vm`'s irqchips and clock (its vCPUs stopped).
    pub fn capture(vm: &VmFd) -> Result<VmState, Error> {
        let mut irqchips = Vec::new();
        for chip_id in CHIPS {
            let mut chip = kvm_irqchip { chip_id, ..Default::default() };
            vm.get_irqchip(&mut chip).map_err(kvm("KVM_GET_IRQCHIP"))?;
            irqchips.push(chip);
        }
        let clock = vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?;
        Ok(VmState { irqchips, clock })
    }

    /// Writes the state into `vm` (a new VM with its irqchip created, before its vCPUs run). The
    /// clock goes on from where it was: the guest does not see the time the snapshot waited.
    /// Returns the saved clock and the clock read back, for the vCPUs' TSCs ([`super::tsc`]).
    pub fn restore(&self, vm: &VmFd) -> Result<super::tsc::ClockPair, Error> {
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(kvm("KVM_SET_IRQCHIP"))?;
        }
        // Only the clock's value is set: KVM refuses flags it did not give for setting.
        let clock = kvm_clock_data { clock: self.clock.clock, ..Default::default() };
        vm.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))?;
        let now = vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?;
        Ok(super::tsc::ClockPair { saved: self.clock, now })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_ioctls::Kvm;

    #[test]
    fn the_irqchips_and_the_clock_go_through_a_snapshot_file_into_a_new_vm() {
        let Ok(kvm_fd) = Kvm::new() else {
            testkit::skip(
                "the_irqchips_and_the_clock_go_through_a_snapshot_file_into_a_new_vm",
                testkit::Lacks::Setup,
                "no /dev/kvm",
            );
            return;
        };
        let vm = kvm_fd.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        // Route something distinctive: IOAPIC pin 5 to vector 0x45, level-triggered, masked.
        let mut ioapic = kvm_irqchip { chip_id: KVM_IRQCHIP_IOAPIC, ..Default::default() };
        vm.get_irqchip(&mut ioapic).unwrap();
        let redirection = 0x45 | (1 << 15) | (1 << 16);
        // SAFETY: the IOAPIC's chip holds the `ioapic` member of the union (chip_id says so).
        unsafe { ioapic.chip.ioapic.redirtbl[5].bits = redirection };
        vm.set_irqchip(&ioapic).unwrap();
        let clock = kvm_clock_data { clock: 5_000_000_000, ..Default::default() };
        vm.set_clock(&clock).unwrap();

        let state = VmState::capture(&vm).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.snap");
        crate::snapshot::write_snapshot(&path, &state).unwrap();
        let read: VmState = crate::snapshot::read_snapshot(&path).unwrap();

        let second = kvm_fd.create_vm().unwrap();
        second.create_irq_chip().unwrap();
        read.restore(&second).unwrap();
        let again = VmState::capture(&second).unwrap();
        // SAFETY: as above, the IOAPIC's chip.
        let bits = unsafe { again.irqchips[2].chip.ioapic.redirtbl[5].bits };
        assert_eq!(bits, redirection);
        // The clock goes on from the snapshot's value, not from the new VM's zero.
        assert!(again.clock.clock >= 5_000_000_000 && again.clock.clock < 6_000_000_000, "{}", again.clock.clock);
    }
}
