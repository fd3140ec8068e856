//! The PCI Express capability (ID 0x10, version 2): register offsets from the capability's start
//! and the bits a root port with a hot-plug slot uses, as PCIe Base 4.0 §7.5.3 and Linux's
//! `include/uapi/linux/pci_regs.h` name them.

/// PCI Express capability ID.
pub const CAPABILITY_ID: u8 = 0x10;
/// Bytes of a version 2 capability.
pub const CAPABILITY_SIZE: usize = 0x3c;

/// PCI Express capabilities register (16 bits).
pub const FLAGS: usize = 0x02;
/// Capability version 2.
pub const FLAGS_VERSION_2: u16 = 2;
/// Device/port type: root port of a root complex.
pub const FLAGS_TYPE_ROOT_PORT: u16 = 4 << 4;
/// Slot implemented: the link leads to a slot (which makes the slot registers valid).
pub const FLAGS_SLOT: u16 = 1 << 8;

/// Device capabilities (32 bits).
pub const DEVICE_CAPABILITIES: usize = 0x04;
/// Device capabilities: role-based error reporting (required since PCIe 1.1).
pub const DEVICE_CAPABILITIES_RBER: u32 = 1 << 15;
/// Device control (16 bits).
pub const DEVICE_CONTROL: usize = 0x08;
/// Device status (16 bits): error detected bits are write-1-to-clear.
pub const DEVICE_STATUS: usize = 0x0a;

/// Link capabilities (32 bits).
pub const LINK_CAPABILITIES: usize = 0x0c;
/// Link capabilities: data link layer link active reporting capable.
pub const LINK_CAPABILITIES_DLLLARC: u32 = 1 << 20;
/// Link control (16 bits).
pub const LINK_CONTROL: usize = 0x10;
/// Link control: retrain link (reads 0).
pub const LINK_CONTROL_RETRAIN: u16 = 1 << 5;
/// Link status (16 bits).
pub const LINK_STATUS: usize = 0x12;
/// Link status: slot clock configuration.
pub const LINK_STATUS_SLOT_CLOCK: u16 = 1 << 12;
/// Link status: data link layer link active.
pub const LINK_STATUS_DLLLA: u16 = 1 << 13;
/// Link status: bandwidth management and autonomous bandwidth status, write-1-to-clear.
pub const LINK_STATUS_W1C: u16 = 0xc000;

/// Slot capabilities (32 bits).
pub const SLOT_CAPABILITIES: usize = 0x14;
/// Slot capabilities: attention button present.
pub const SLOT_CAPABILITIES_ABP: u32 = 1 << 0;
/// Slot capabilities: power controller present.
pub const SLOT_CAPABILITIES_PCP: u32 = 1 << 1;
/// Slot capabilities: hot-plug surprise (the adapter may go without notice).
pub const SLOT_CAPABILITIES_HPS: u32 = 1 << 5;
/// Slot capabilities: hot-plug capable.
pub const SLOT_CAPABILITIES_HPC: u32 = 1 << 6;
/// Slot capabilities: no command completed support (slot control writes complete at once).
pub const SLOT_CAPABILITIES_NCCS: u32 = 1 << 18;
/// Slot capabilities: where the physical slot number starts.
pub const SLOT_CAPABILITIES_PSN_SHIFT: u32 = 19;
/// Slot control (16 bits).
pub const SLOT_CONTROL: usize = 0x18;
/// Slot control: attention button pressed enable.
pub const SLOT_CONTROL_ABPE: u16 = 1 << 0;
/// Slot control: power fault detected enable.
pub const SLOT_CONTROL_PFDE: u16 = 1 << 1;
/// Slot control: MRL sensor changed enable.
pub const SLOT_CONTROL_MRLSCE: u16 = 1 << 2;
/// Slot control: presence detect changed enable.
pub const SLOT_CONTROL_PDCE: u16 = 1 << 3;
/// Slot control: command completed interrupt enable.
pub const SLOT_CONTROL_CCIE: u16 = 1 << 4;
/// Slot control: hot-plug interrupt enable.
pub const SLOT_CONTROL_HPIE: u16 = 1 << 5;
/// Slot control: power controller control (1: power off).
pub const SLOT_CONTROL_PCC: u16 = 1 << 10;
/// Slot control: data link layer state changed enable.
pub const SLOT_CONTROL_DLLSCE: u16 = 1 << 12;
/// Slot control bits the guest may write (enables, indicators, power, interlock).
pub const SLOT_CONTROL_WRITABLE: u16 = 0x1fff;
/// Slot status (16 bits).
pub const SLOT_STATUS: usize = 0x1a;
/// Slot status: attention button pressed.
pub const SLOT_STATUS_ABP: u16 = 1 << 0;
/// Slot status: power fault detected.
pub const SLOT_STATUS_PFD: u16 = 1 << 1;
/// Slot status: MRL sensor changed.
pub const SLOT_STATUS_MRLSC: u16 = 1 << 2;
/// Slot status: presence detect changed.
pub const SLOT_STATUS_PDC: u16 = 1 << 3;
/// Slot status: command completed.
pub const SLOT_STATUS_CC: u16 = 1 << 4;
/// Slot status: presence detect state (an adapter is in the slot).
pub const SLOT_STATUS_PDS: u16 = 1 << 6;
/// Slot status: data link layer state changed.
pub const SLOT_STATUS_DLLSC: u16 = 1 << 8;
/// Slot status bits that are write-1-to-clear (the events).
pub const SLOT_STATUS_EVENTS: u16 =
    SLOT_STATUS_ABP | SLOT_STATUS_PFD | SLOT_STATUS_MRLSC | SLOT_STATUS_PDC | SLOT_STATUS_CC | SLOT_STATUS_DLLSC;

/// Root control (16 bits).
pub const ROOT_CONTROL: usize = 0x1c;
/// Root status (32 bits): PME status is write-1-to-clear.
pub const ROOT_STATUS: usize = 0x20;
/// Root status: PME status.
pub const ROOT_STATUS_PME: u32 = 1 << 16;
/// Device control 2 (16 bits).
pub const DEVICE_CONTROL_2: usize = 0x28;
/// Link capabilities 2 (32 bits): the supported link speeds vector from bit 1.
pub const LINK_CAPABILITIES_2: usize = 0x2c;
/// Link control 2 (16 bits): target link speed in bits 3:0.
pub const LINK_CONTROL_2: usize = 0x30;

/// Link speed 2.5 GT/s (the speed field's encoding; bit 1 of the speeds vector).
pub const SPEED_2_5GT: u8 = 1;

/// Which slot status event each slot control enable bit lets interrupt.
pub const SLOT_EVENT_ENABLES: [(u16, u16); 6] = [
    (SLOT_CONTROL_ABPE, SLOT_STATUS_ABP),
    (SLOT_CONTROL_PFDE, SLOT_STATUS_PFD),
    (SLOT_CONTROL_MRLSCE, SLOT_STATUS_MRLSC),
    (SLOT_CONTROL_PDCE, SLOT_STATUS_PDC),
    (SLOT_CONTROL_CCIE, SLOT_STATUS_CC),
    (SLOT_CONTROL_DLLSCE, SLOT_STATUS_DLLSC),
];
