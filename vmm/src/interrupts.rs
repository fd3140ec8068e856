//! Interrupt routing with KVM: the legacy lines of the in-kernel PIC and IOAPIC, and one GSI per
//! MSI vector whose route carries the MSI address and data. Devices signal EventFds registered as
//! irqfds, so delivery never passes through the VMM's user space.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KvmIrqRouting, kvm_irq_routing_entry,
    kvm_irq_routing_entry__bindgen_ty_1, kvm_irq_routing_irqchip, kvm_irq_routing_msi,
};
use kvm_ioctls::VmFd;
use vm_device::interrupt::{InterruptError, MsiInterrupts, MsiMessage};
use vmm_sys_util::eventfd::EventFd;

/// GSIs wired to IOAPIC pins.
pub const IOAPIC_PINS: u32 = 24;
/// The first GSI handed out for MSI routes.
pub const FIRST_MSI_GSI: u32 = IOAPIC_PINS;
/// KVM's routing table size.
const MAX_GSI: u32 = 4096;
const KVM_IRQCHIP_PIC_MASTER: u32 = 0;
const KVM_IRQCHIP_PIC_SLAVE: u32 = 1;
const KVM_IRQCHIP_IOAPIC: u32 = 2;

/// The VM's GSI routing table and irqfds.
pub struct KvmInterrupts {
    vm: Arc<VmFd>,
    state: Mutex<State>,
}

struct State {
    next_gsi: u32,
    msi_routes: BTreeMap<u32, MsiMessage>,
}

fn irqchip(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        u: kvm_irq_routing_entry__bindgen_ty_1 { irqchip: kvm_irq_routing_irqchip { irqchip: chip, pin } },
        ..Default::default()
    }
}

/// The legacy routes: ISA IRQ 0 (the PIT) to IOAPIC pin 2, as the MADT's interrupt source
/// override says; every other GSI below 24 to the IOAPIC pin of the same number; GSIs below 16
/// also to the PIC.
pub fn legacy_routes() -> Vec<kvm_irq_routing_entry> {
    let mut routes = Vec::new();
    for gsi in 0..IOAPIC_PINS {
        match gsi {
            0 => routes.push(irqchip(0, KVM_IRQCHIP_IOAPIC, 2)),
            2 => {}
            _ => routes.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi)),
        }
        if gsi < 16 && gsi != 2 {
            let chip = if gsi < 8 { KVM_IRQCHIP_PIC_MASTER } else { KVM_IRQCHIP_PIC_SLAVE };
            routes.push(irqchip(gsi, chip, gsi % 8));
        }
    }
    routes
}

fn msi(gsi: u32, message: MsiMessage) -> kvm_irq_routing_entry {
    kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_MSI,
        u: kvm_irq_routing_entry__bindgen_ty_1 {
            msi: kvm_irq_routing_msi {
                address_lo: message.address as u32,
                address_hi: (message.address >> 32) as u32,
                data: message.data,
                ..Default::default()
            },
        },
        ..Default::default()
    }
}

fn hypervisor(what: String) -> impl FnOnce(kvm_ioctls::Error) -> InterruptError {
    move |e| InterruptError::Hypervisor { what, source: std::io::Error::from_raw_os_error(e.errno()) }
}

impl KvmInterrupts {
    /// Installs the legacy routes on `vm` (which has an in-kernel irqchip).
    pub fn new(vm: Arc<VmFd>) -> Result<Self, InterruptError> {
        let interrupts =
            KvmInterrupts { vm, state: Mutex::new(State { next_gsi: FIRST_MSI_GSI, msi_routes: BTreeMap::new() }) };
        interrupts.apply(&interrupts.state.lock().unwrap_or_else(|p| p.into_inner()))?;
        Ok(interrupts)
    }

    fn apply(&self, state: &State) -> Result<(), InterruptError> {
        let mut entries = legacy_routes();
        entries.extend(state.msi_routes.iter().map(|(&gsi, &message)| msi(gsi, message)));
        let routing = KvmIrqRouting::from_entries(&entries).map_err(|e| InterruptError::Hypervisor {
            what: format!("building a routing table of {} entries: {e:?}", entries.len()),
            source: std::io::Error::from_raw_os_error(libc::E2BIG),
        })?;
        self.vm.set_gsi_routing(&routing).map_err(hypervisor("KVM_SET_GSI_ROUTING".into()))
    }
}

impl MsiInterrupts for KvmInterrupts {
    fn allocate_gsi(&self) -> Result<u32, InterruptError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.next_gsi >= MAX_GSI {
            return Err(InterruptError::Exhausted(MAX_GSI));
        }
        state.next_gsi += 1;
        Ok(state.next_gsi - 1)
    }

    fn set_route(&self, gsi: u32, message: MsiMessage) -> Result<(), InterruptError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.msi_routes.insert(gsi, message);
        self.apply(&state)
    }

    fn register_irqfd(&self, gsi: u32, fd: &EventFd) -> Result<(), InterruptError> {
        self.vm.register_irqfd(fd, gsi).map_err(hypervisor(format!("KVM_IRQFD gsi {gsi}")))
    }

    fn unregister_irqfd(&self, gsi: u32, fd: &EventFd) -> Result<(), InterruptError> {
        self.vm.unregister_irqfd(fd, gsi).map_err(hypervisor(format!("KVM_IRQFD deassign gsi {gsi}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_routes_match_the_madt_override() {
        let routes = legacy_routes();
        let pins: Vec<(u32, u32, u32)> = routes
            .iter()
            .map(|r| {
                // SAFETY: every legacy entry is an irqchip route, so `irqchip` is the union member set.
                let chip = unsafe { r.u.irqchip };
                (r.gsi, chip.irqchip, chip.pin)
            })
            .collect();
        assert!(pins.contains(&(0, KVM_IRQCHIP_IOAPIC, 2)), "ISA IRQ 0 -> pin 2");
        assert!(pins.contains(&(4, KVM_IRQCHIP_IOAPIC, 4)) && pins.contains(&(4, KVM_IRQCHIP_PIC_MASTER, 4)), "COM1");
        assert!(pins.contains(&(9, KVM_IRQCHIP_PIC_SLAVE, 1)));
        assert!(!pins.iter().any(|&(gsi, _, _)| gsi == 2), "GSI 2 is the cascade");
        assert!(pins.contains(&(23, KVM_IRQCHIP_IOAPIC, 23)));
        assert!(routes.iter().all(|r| r.gsi < FIRST_MSI_GSI));
    }

    #[test]
    fn msi_routes_go_to_kvm() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            testkit::skip("msi_routes_go_to_kvm", testkit::Lacks::Setup, "no /dev/kvm");
            return;
        };
        let vm = Arc::new(kvm.create_vm().unwrap());
        vm.create_irq_chip().unwrap();
        let interrupts = KvmInterrupts::new(vm).unwrap();
        let gsi = interrupts.allocate_gsi().unwrap();
        assert_eq!(gsi, FIRST_MSI_GSI);
        interrupts.set_route(gsi, MsiMessage { address: 0xfee0_0000, data: 0x41 }).unwrap();
        let fd = EventFd::new(0).unwrap();
        interrupts.register_irqfd(gsi, &fd).unwrap();
        interrupts.unregister_irqfd(gsi, &fd).unwrap();
    }
}
