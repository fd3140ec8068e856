//! Offsets and bits of the PCI type-0 (and type-1) configuration header, in one place for everything that
//! reads or builds one (the emulated configuration space, the passthrough shadow, the models).

/// Vendor ID (16 bits).
pub const VENDOR_ID: usize = 0x00;
/// Device ID (16 bits).
pub const DEVICE_ID: usize = 0x02;
/// Command register (16 bits).
pub const COMMAND: usize = 0x04;
/// Status register (16 bits).
pub const STATUS: usize = 0x06;
/// Revision ID.
pub const REVISION: usize = 0x08;
/// Programming interface, then subclass and base class.
pub const CLASS_PROG_IF: usize = 0x09;
/// Subclass.
pub const CLASS_SUB: usize = 0x0a;
/// Base class.
pub const CLASS_BASE: usize = 0x0b;
/// Cache line size; latency timer, header type and BIST follow in the same dword.
pub const CACHE_LINE_SIZE: usize = 0x0c;
/// Header type (bit 7: multifunction).
pub const HEADER_TYPE: usize = 0x0e;
/// Header type: more functions follow.
pub const HEADER_TYPE_MULTIFUNCTION: u8 = 0x80;
/// BAR 0; BARs 1-5 follow, 4 bytes apart.
pub const BAR0: usize = 0x10;
/// One past the last BAR.
pub const BAR_END: usize = 0x28;
/// Subsystem vendor ID (16 bits).
pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
/// Subsystem ID (16 bits).
pub const SUBSYSTEM_ID: usize = 0x2e;
/// Type-1 header: primary, secondary and subordinate bus numbers, secondary latency timer.
pub const BRIDGE_BUS_NUMBERS: usize = 0x18;
/// Type-1 header: I/O base and limit, then the secondary status.
pub const BRIDGE_IO_WINDOW: usize = 0x1c;
/// Type-1 header: memory base and limit.
pub const BRIDGE_MEMORY_WINDOW: usize = 0x20;
/// Type-1 header: bridge control (16 bits, after interrupt line and pin).
pub const BRIDGE_CONTROL: usize = 0x3e;
/// Bridge control: secondary bus reset.
pub const BRIDGE_CONTROL_BUS_RESET: u16 = 1 << 6;
/// Expansion ROM base address.
pub const ROM_BASE: usize = 0x30;
/// Capabilities pointer.
pub const CAPABILITIES_POINTER: usize = 0x34;
/// Interrupt line.
pub const INTERRUPT_LINE: usize = 0x3c;
/// Interrupt pin.
pub const INTERRUPT_PIN: usize = 0x3d;
/// End of the header; capabilities start here.
pub const HEADER_END: usize = 0x40;

/// Status register: the capability list exists.
pub const STATUS_CAPABILITIES: u16 = 1 << 4;
