//! A PCI Express root port with a hot-plug slot: a type-1 header with one secondary bus, a
//! PCIe capability that says Slot Implemented and Hot-Plug Capable, a link that reports Data Link
//! Layer Link Active, and an MSI vector for the slot's events. Linux's pciehp drives it
//! (drivers/pci/hotplug/pciehp_hpc.c): it enables the events in Slot Control, reads Slot Status
//! in its interrupt handler and clears the events it saw by writing them back.
//!
//! What the slot holds is the root complex's business ([`crate::PciRoot`]); the port only keeps
//! the state a guest sees: presence, link, power, and the events it has not acknowledged yet.

use std::sync::Arc;

use vm_device::interrupt::MsiInterrupts;

use super::PciError;
use super::config::{PciConfiguration, PciIds};
use super::device::{BarMapping, PciDevice};
use super::msi::{self, MsiConfig, MsiState};
use super::pcie::*;

/// PCI IDs of the port: Red Hat's generic PCIe root port (1b36:000c), which Linux drives with
/// its class driver alone (no quirk matches it), class 06/04/00.
const IDS: PciIds = PciIds {
    vendor: 0x1b36,
    device: 0x000c,
    subsystem_vendor: 0,
    subsystem: 0,
    class: [0x06, 0x04, 0x00],
    revision: 0,
};

/// The link the port reports: what a Strix Halo USB4 root port reports with a Thunderbolt NIC
/// behind it (`LnkCap: Speed 2.5GT/s, Width x1`, `LLActRep+`).
const LINK_WIDTH: u32 = 1;

/// Where the ACS extended capability sits: the first (and only) one in extended space.
const ACS: usize = 0x100;
/// ACS extended capability ID, version 1, no next capability.
const ACS_HEADER: u32 = 0x000d | 1 << 16;
/// What the port's ACS offers (PCIe 4.0 §7.7.8): source validation, translation blocking, P2P
/// request and completion redirect, upstream forwarding. Linux asks for these where a VIOT (or
/// another IOMMU table) is present (`pci_request_acs()` in drivers/acpi/viot.c) and then puts
/// each port's adapter in an IOMMU group of its own (`pci_device_group()` in
/// drivers/iommu/iommu.c), as on a real root port; without it the adapter joins the port's
/// group and its default domain, which is decided before the adapter is seen.
const ACS_CAPABILITIES: u16 = 0x001f;

/// A root port as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootPortState {
    /// Its configuration registers (bus numbers, window, the PCIe capability with the slot's).
    pub config: Vec<u32>,
    /// Its MSI capability.
    pub msi: MsiState,
    /// Whether the slot's interrupt condition held.
    pub asserted: bool,
    /// ACS control.
    pub acs_control: u16,
}

/// A root port and the state of its slot.
pub struct RootPort {
    name: String,
    config: PciConfiguration,
    /// Offset of the PCIe capability.
    pcie: usize,
    /// Offset of the MSI capability and its state.
    msi: (usize, MsiConfig),
    /// Whether the slot's interrupt condition held at the last look (MSI fires on its rising edge).
    asserted: bool,
    /// ACS control, as the guest set it.
    acs_control: u16,
}

impl RootPort {
    /// A port whose slot has physical number `slot_number` (what pciehp names the slot after;
    /// unique per machine), empty, its power off (as firmware leaves an empty slot: Linux's
    /// pciehp takes a powered, occupied slot at its start for one the boot scan enumerated, and
    /// would not scan a card that arrived in between), its link down.
    pub fn new(slot_number: u16, interrupts: Arc<dyn MsiInterrupts>) -> Result<Self, PciError> {
        let mut config = PciConfiguration::bridge(IDS);
        let pcie = config.add_capability(CAPABILITY_ID, &pcie_body(slot_number), &pcie_writable())?;
        for (register, bits) in
            [(DEVICE_STATUS, 0x000fu16), (LINK_STATUS, LINK_STATUS_W1C), (SLOT_STATUS, SLOT_STATUS_EVENTS)]
        {
            config.set_write_one_to_clear(pcie + register, &bits.to_le_bytes());
        }
        config.set_write_one_to_clear(pcie + ROOT_STATUS, &ROOT_STATUS_PME.to_le_bytes());
        let state = MsiConfig::new(msi::CONTROL_64BIT, 1, interrupts)?;
        let at = config.add_capability(msi::CAPABILITY_ID, &vec![0; state.size() - 2], &[])?;
        config.set(pcie + SLOT_CONTROL, &SLOT_CONTROL_PCC.to_le_bytes());
        Ok(RootPort {
            name: format!("root port {slot_number}"),
            config,
            pcie,
            msi: (at, state),
            asserted: false,
            acs_control: 0,
        })
    }

    fn read16(&self, register: usize) -> u16 {
        let mut b = [0u8; 2];
        self.config.read(self.pcie + register, &mut b);
        u16::from_le_bytes(b)
    }

    fn set16(&mut self, register: usize, value: u16) {
        self.config.set(self.pcie + register, &value.to_le_bytes());
    }

    /// Slot status as the guest reads it.
    pub fn slot_status(&self) -> u16 {
        self.read16(SLOT_STATUS)
    }

    /// Slot control as the guest last wrote it.
    pub fn slot_control(&self) -> u16 {
        self.read16(SLOT_CONTROL)
    }

    /// Whether an adapter is in the slot.
    pub fn occupied(&self) -> bool {
        self.slot_status() & SLOT_STATUS_PDS != 0
    }

    /// Whether the guest has the slot's power on (Power Controller Control clear).
    pub fn powered(&self) -> bool {
        self.slot_control() & SLOT_CONTROL_PCC == 0
    }

    /// The secondary bus number the guest (or firmware) gave the port; `None` while unset.
    pub fn secondary_bus(&self) -> Option<u8> {
        let (_, secondary, _) = self.config.bridge_buses();
        (secondary != 0).then_some(secondary)
    }

    /// Sets the bus numbers and memory window as firmware does before the guest boots.
    pub fn assign(&mut self, secondary: u8, window: (u64, u64)) {
        self.config.set_bridge_buses(0, secondary, secondary);
        self.config.set_bridge_memory_window(window.0, window.1);
    }

    /// The memory window the port forwards, `[base, limit]`.
    pub fn memory_window(&self) -> Option<(u64, u64)> {
        self.config.bridge_memory_window()
    }

    /// An adapter that was in the slot before the guest started: powered, present, link up, no
    /// event.
    pub fn insert_at_boot(&mut self) {
        let control = self.slot_control() & !SLOT_CONTROL_PCC;
        self.set16(SLOT_CONTROL, control);
        self.set_presence(true, false);
    }

    /// An adapter plugged in while the guest runs: presence and link change, with events.
    pub fn hot_plug(&mut self) {
        self.set_presence(true, true);
    }

    /// The adapter pulled out without notice: presence and link drop, with events.
    pub fn surprise_removal(&mut self) {
        self.set_presence(false, true);
    }

    /// The attention button pressed: the guest's request to prepare the slot for removal (pciehp
    /// waits 5 s for a second press that cancels, then unbinds and turns the slot's power off).
    pub fn press_attention_button(&mut self) {
        let status = self.slot_status() | SLOT_STATUS_ABP;
        self.set16(SLOT_STATUS, status);
        self.refresh_interrupt();
    }

    fn set_presence(&mut self, present: bool, events: bool) {
        let mut status = self.slot_status();
        let mut link = self.read16(LINK_STATUS);
        if present {
            status |= SLOT_STATUS_PDS;
            link |= LINK_STATUS_DLLLA;
        } else {
            status &= !SLOT_STATUS_PDS;
            link &= !LINK_STATUS_DLLLA;
        }
        if events {
            status |= SLOT_STATUS_PDC | SLOT_STATUS_DLLSC;
        }
        self.set16(SLOT_STATUS, status);
        self.set16(LINK_STATUS, link);
        self.refresh_interrupt();
    }

    /// Signals the MSI when an enabled event is pending and none was before.
    fn refresh_interrupt(&mut self) {
        let control = self.slot_control();
        let status = self.slot_status();
        let enabled = SLOT_EVENT_ENABLES.iter().filter(|(enable, _)| control & enable != 0).fold(0, |a, (_, e)| a | e);
        let asserted = control & SLOT_CONTROL_HPIE != 0 && status & enabled != 0;
        if asserted && !self.asserted {
            self.msi.1.notify(0);
        }
        self.asserted = asserted;
    }
}

/// The capability's registers after its ID and next pointer, at reset.
fn pcie_body(slot_number: u16) -> Vec<u8> {
    let mut regs = vec![0u8; CAPABILITY_SIZE];
    let mut put = |at: usize, bytes: &[u8]| regs[at..at + bytes.len()].copy_from_slice(bytes);
    put(FLAGS, &(FLAGS_VERSION_2 | FLAGS_TYPE_ROOT_PORT | FLAGS_SLOT).to_le_bytes());
    put(DEVICE_CAPABILITIES, &DEVICE_CAPABILITIES_RBER.to_le_bytes());
    let speed = SPEED_2_5GT as u32;
    put(LINK_CAPABILITIES, &(speed | LINK_WIDTH << 4 | LINK_CAPABILITIES_DLLLARC).to_le_bytes());
    put(LINK_STATUS, &(speed as u16 | (LINK_WIDTH as u16) << 4 | LINK_STATUS_SLOT_CLOCK).to_le_bytes());
    let slot = SLOT_CAPABILITIES_ABP
        | SLOT_CAPABILITIES_PCP
        | SLOT_CAPABILITIES_HPS
        | SLOT_CAPABILITIES_HPC
        | SLOT_CAPABILITIES_NCCS
        | (slot_number as u32 & 0x1fff) << SLOT_CAPABILITIES_PSN_SHIFT;
    put(SLOT_CAPABILITIES, &slot.to_le_bytes());
    put(LINK_CAPABILITIES_2, &(1u32 << SPEED_2_5GT).to_le_bytes());
    put(LINK_CONTROL_2, &(SPEED_2_5GT as u16).to_le_bytes());
    regs.drain(..2);
    regs
}

/// Which of the capability's bits the guest may write (offsets as in [`pcie_body`]).
fn pcie_writable() -> Vec<u8> {
    let mut mask = vec![0u8; CAPABILITY_SIZE];
    let mut put = |at: usize, bits: u16| mask[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    put(DEVICE_CONTROL, 0x7fff);
    put(LINK_CONTROL, 0x0ffb);
    put(SLOT_CONTROL, SLOT_CONTROL_WRITABLE);
    put(ROOT_CONTROL, 0x001f);
    put(DEVICE_CONTROL_2, 0x041f);
    put(LINK_CONTROL_2, 0x000f);
    mask.drain(..2);
    mask
}

impl PciDevice for RootPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&mut self, reg: usize) -> u32 {
        match reg * 4 {
            ACS => return ACS_HEADER,
            at if at == ACS + 4 => return ACS_CAPABILITIES as u32 | (self.acs_control as u32) << 16,
            _ => {}
        }
        let mut bytes = self.config.read_reg(reg).to_le_bytes();
        let (cap, state) = &self.msi;
        for (i, b) in bytes.iter_mut().enumerate() {
            let at = reg * 4 + i;
            if at >= cap + 2 && at < cap + state.size() {
                state.read(at - cap, std::slice::from_mut(b));
            }
        }
        u32::from_le_bytes(bytes)
    }

    fn config_write(&mut self, offset: usize, data: &[u8]) {
        let control = ACS + 6;
        if offset >= ACS {
            let mut value = self.acs_control.to_le_bytes();
            for (i, &b) in data.iter().enumerate() {
                if let Some(byte) = (offset + i).checked_sub(control).and_then(|at| value.get_mut(at)) {
                    *byte = b;
                }
            }
            self.acs_control = u16::from_le_bytes(value) & ACS_CAPABILITIES;
            return;
        }
        let (cap, state) = &mut self.msi;
        let (start, end) = (*cap + 2, *cap + state.size());
        if offset < end && offset + data.len() > start {
            let from = offset.max(start);
            let to = (offset + data.len()).min(end);
            state.write(from - *cap, &data[from - offset..to - offset]);
        } else {
            self.config.write(offset, data);
            let control = self.read16(LINK_CONTROL);
            self.set16(LINK_CONTROL, control & !LINK_CONTROL_RETRAIN);
        }
        self.refresh_interrupt();
    }

    fn bar_read(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}

    fn bar_mappings(&self) -> Vec<BarMapping> {
        Vec::new()
    }

    fn snapshot_state(&self) -> Option<serde_json::Value> {
        let state = RootPortState {
            config: self.config.registers(),
            msi: self.msi.1.state(),
            asserted: self.asserted,
            acs_control: self.acs_control,
        };
        serde_json::to_value(state).ok()
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let state: RootPortState = serde_json::from_value(state.clone()).map_err(|e| e.to_string())?;
        self.config.set_registers(&state.config)?;
        self.msi.1.restore(&state.msi)?;
        (self.asserted, self.acs_control) = (state.asserted, state.acs_control & ACS_CAPABILITIES);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_device::interrupt::RecordingInterrupts;

    const PCIE: usize = 0x40;

    fn port() -> (RootPort, Arc<RecordingInterrupts>) {
        let interrupts = Arc::new(RecordingInterrupts::default());
        (RootPort::new(7, interrupts.clone()).unwrap(), interrupts)
    }

    fn read(port: &mut RootPort, offset: usize, len: usize) -> u32 {
        let value = port.config_read(offset / 4) >> (offset % 4 * 8);
        if len == 4 { value } else { value & ((1 << (len * 8)) - 1) }
    }

    fn write16(port: &mut RootPort, offset: usize, value: u16) {
        port.config_write(offset, &value.to_le_bytes());
    }

    /// Enables MSI with address and data, as the guest's MSI setup does.
    fn enable_msi(port: &mut RootPort) {
        let msi = port.msi.0;
        port.config_write(msi + 4, &0xfee0_0000u32.to_le_bytes());
        port.config_write(msi + 12, &0x0041u16.to_le_bytes());
        write16(port, msi + 2, msi::CONTROL_ENABLE);
    }

    fn msi_fired(port: &RootPort) -> bool {
        port.msi.1.eventfd(0).unwrap().read().is_ok()
    }

    #[test]
    fn the_header_and_capability_say_root_port_with_a_hot_plug_slot() {
        let (mut port, _) = port();
        assert_eq!(read(&mut port, 0, 4), 0x000c_1b36);
        assert_eq!(read(&mut port, 8, 4) >> 8, 0x06_0400, "PCI-to-PCI bridge");
        assert_eq!(read(&mut port, 0x0e, 1), 1, "type-1 header");
        assert_eq!(read(&mut port, 0x34, 1) as usize, PCIE);
        assert_eq!(read(&mut port, PCIE, 1), CAPABILITY_ID as u32);
        let flags = read(&mut port, PCIE + FLAGS, 2) as u16;
        assert_eq!(flags & 0xf0, FLAGS_TYPE_ROOT_PORT);
        assert_ne!(flags & FLAGS_SLOT, 0);
        let slot = read(&mut port, PCIE + SLOT_CAPABILITIES, 4);
        assert_ne!(slot & SLOT_CAPABILITIES_HPC, 0);
        assert_ne!(slot & SLOT_CAPABILITIES_NCCS, 0, "no 1 s wait per slot control write");
        assert_eq!(slot >> SLOT_CAPABILITIES_PSN_SHIFT, 7);
        let link = read(&mut port, PCIE + LINK_CAPABILITIES, 4);
        assert_eq!((link & 0xf, link >> 4 & 0x3f), (1, 1), "2.5 GT/s x1");
        assert_ne!(link & LINK_CAPABILITIES_DLLLARC, 0);
        let next = read(&mut port, PCIE + 1, 1) as usize;
        assert_eq!(read(&mut port, next, 1), msi::CAPABILITY_ID as u32);
        assert_eq!(read(&mut port, next + 1, 1), 0, "last capability");
    }

    #[test]
    fn a_restored_port_keeps_its_window_acs_and_hot_plug_set_up_and_interrupts_on_a_plug() {
        let (mut first, _) = port();
        first.assign(1, (0xc000_0000, 0xc0ff_ffff));
        enable_msi(&mut first);
        write16(&mut first, ACS + 6, 0x1f);
        let enables = SLOT_CONTROL_PDCE | SLOT_CONTROL_DLLSCE | SLOT_CONTROL_HPIE | SLOT_CONTROL_PCC;
        write16(&mut first, PCIE + SLOT_CONTROL, enables);
        let saved = first.snapshot_state().unwrap();

        let (mut restored, interrupts) = port();
        restored.restore_state(&saved).unwrap();
        assert_eq!((restored.secondary_bus(), restored.memory_window()), (Some(1), Some((0xc000_0000, 0xc0ff_ffff))));
        assert_eq!(read(&mut restored, ACS + 6, 2), 0x1f);
        assert_eq!(restored.slot_control(), enables);
        assert!(!restored.occupied() && !restored.powered(), "still empty, its power off");
        assert!(!interrupts.routes.lock().unwrap().is_empty(), "MSI routed again");
        restored.hot_plug();
        assert!(msi_fired(&restored), "a plug after the restore interrupts as before");
        let (mut other, _) = port();
        let mut bad: RootPortState = serde_json::from_value(saved).unwrap();
        bad.config[0] = 0x1234_5678;
        assert!(other.restore_state(&serde_json::to_value(bad).unwrap()).is_err(), "another kind of function");
    }

    #[test]
    fn acs_is_offered_and_takes_only_what_it_offers() {
        let (mut port, _) = port();
        assert_eq!(read(&mut port, ACS, 4), 0x0001_000d, "ACS, version 1, the last extended capability");
        assert_eq!(read(&mut port, ACS + 4, 2), 0x1f);
        write16(&mut port, ACS + 6, 0xffff);
        assert_eq!(read(&mut port, ACS + 6, 2), 0x1f, "only the offered controls");
        write16(&mut port, ACS + 4, 0);
        assert_eq!(read(&mut port, ACS + 4, 4), 0x001f_001f, "capabilities are read-only");
        assert_eq!(read(&mut port, 0x108, 4), 0, "nothing after it");
    }

    #[test]
    fn link_status_follows_presence_and_keeps_a_trained_width() {
        let (mut port, _) = port();
        let link = |p: &mut RootPort| read(p, PCIE + LINK_STATUS, 2) as u16;
        assert_eq!(link(&mut port) & LINK_STATUS_DLLLA, 0, "empty slot: link down");
        assert!(!port.occupied());
        port.insert_at_boot();
        let status = link(&mut port);
        assert_ne!(status & LINK_STATUS_DLLLA, 0);
        assert_eq!(status >> 4 & 0x3f, 1, "a width: Linux's 'Cannot train link' otherwise");
        assert_eq!(status & (1 << 11), 0, "not training");
        assert_eq!(port.slot_status() & SLOT_STATUS_EVENTS, 0, "present from boot: no event");
        write16(&mut port, PCIE + LINK_CONTROL, LINK_CONTROL_RETRAIN);
        assert_eq!(read(&mut port, PCIE + LINK_CONTROL, 2) as u16 & LINK_CONTROL_RETRAIN, 0, "retrain reads 0");
    }

    #[test]
    fn slot_events_are_write_one_to_clear_and_interrupt_once_enabled() {
        let (mut port, _) = port();
        enable_msi(&mut port);
        port.hot_plug();
        assert!(!msi_fired(&port), "hot-plug interrupts not enabled yet");
        let status = port.slot_status();
        assert_eq!(status & (SLOT_STATUS_PDS | SLOT_STATUS_PDC | SLOT_STATUS_DLLSC), 0x148);
        // pciehp's init: enable the events and the interrupt; the pending change fires.
        let enables = SLOT_CONTROL_PDCE | SLOT_CONTROL_DLLSCE | SLOT_CONTROL_ABPE | SLOT_CONTROL_HPIE;
        write16(&mut port, PCIE + SLOT_CONTROL, enables);
        assert!(msi_fired(&port));
        // Its interrupt handler writes back what it saw; writing 0 clears nothing.
        write16(&mut port, PCIE + SLOT_STATUS, 0);
        assert_eq!(port.slot_status(), status);
        write16(&mut port, PCIE + SLOT_STATUS, SLOT_STATUS_PDC | SLOT_STATUS_DLLSC | SLOT_STATUS_PDS);
        assert_eq!(port.slot_status(), SLOT_STATUS_PDS, "events cleared, presence is read-only");
        assert!(!msi_fired(&port));
        port.surprise_removal();
        assert!(msi_fired(&port), "a new event after the old ones were cleared");
        assert_eq!(port.slot_status(), SLOT_STATUS_PDC | SLOT_STATUS_DLLSC);
        assert!(!port.occupied());
        port.press_attention_button();
        assert!(!msi_fired(&port), "the condition still held: no second edge");
        write16(&mut port, PCIE + SLOT_STATUS, SLOT_STATUS_EVENTS);
        port.press_attention_button();
        assert!(msi_fired(&port));
        assert_eq!(port.slot_status(), SLOT_STATUS_ABP);
    }

    #[test]
    fn the_guest_turns_the_slot_power_off_and_on() {
        let (mut port, _) = port();
        assert!(!port.powered(), "an empty slot starts off");
        port.insert_at_boot();
        assert!(port.powered(), "firmware powers an occupied one");
        write16(&mut port, PCIE + SLOT_CONTROL, SLOT_CONTROL_PCC | 0x00c0);
        assert!(!port.powered());
        write16(&mut port, PCIE + SLOT_CONTROL, 0xffff);
        assert_eq!(port.slot_control(), SLOT_CONTROL_WRITABLE, "reserved bits stay 0");
        assert_eq!(read(&mut port, PCIE + SLOT_CAPABILITIES, 4) & 0xff, 0x63, "capabilities read-only");
    }

    #[test]
    fn firmware_assigns_buses_and_a_window_the_guest_can_move() {
        let (mut port, _) = port();
        assert_eq!(port.secondary_bus(), None);
        port.assign(3, (0xc100_0000, 0xc1ff_ffff));
        assert_eq!(port.secondary_bus(), Some(3));
        assert_eq!(read(&mut port, 0x18, 4) & 0xff_ffff, 0x03_0300);
        assert_eq!(port.memory_window(), Some((0xc100_0000, 0xc1ff_ffff)));
        port.config_write(0x18, &[0, 5, 5]);
        assert_eq!(port.secondary_bus(), Some(5), "the guest renumbers");
    }
}
