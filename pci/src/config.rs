//! A type-0 configuration space with the rules real hardware follows: read-only IDs, writable
//! command bits, write-1-to-clear status bits, BARs that answer size probes, and a capability list.

use super::PciError;

/// Number of BARs in a type-0 header.
pub const NUM_BARS: usize = 6;
/// Bytes of conventional configuration space.
pub const CONFIG_SIZE: usize = 256;
const REGS: usize = CONFIG_SIZE / 4;

use super::regs::{
    BAR0, BRIDGE_BUS_NUMBERS, BRIDGE_IO_WINDOW, BRIDGE_MEMORY_WINDOW, CACHE_LINE_SIZE, CAPABILITIES_POINTER, COMMAND,
    HEADER_END as FIRST_CAPABILITY, HEADER_TYPE, INTERRUPT_LINE, REVISION, STATUS, STATUS_CAPABILITIES,
    SUBSYSTEM_VENDOR_ID,
};

/// Command register: I/O space decoding.
pub const COMMAND_IO: u16 = 1 << 0;
/// Command register: memory space decoding.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: bus master (DMA).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// Command register: INTx disabled.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status register bits that are write-1-to-clear (error bits).
const STATUS_W1C: u16 = 0xf900;

/// What a BAR decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory.
    Memory32,
    /// 64-bit memory (takes this BAR and the next).
    Memory64,
    /// I/O ports.
    Io,
}

/// Identity of a PCI function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID.
    pub subsystem: u16,
    /// Class code: class, subclass, programming interface.
    pub class: [u8; 3],
    /// The revision ID.
    pub revision: u8,
}

#[derive(Debug, Clone, Copy)]
struct Bar {
    kind: BarKind,
    size: u64,
}

/// A type-0 configuration space.
#[derive(Debug, Clone)]
pub struct PciConfiguration {
    regs: [u32; REGS],
    writable: [u32; REGS],
    w1c: [u32; REGS],
    bars: [Option<Bar>; NUM_BARS],
    last_capability: Option<usize>,
    next_capability: usize,
}

impl PciConfiguration {
    /// A header for `ids` with no BARs and no capabilities.
    pub fn new(ids: PciIds) -> Self {
        let mut c = PciConfiguration {
            regs: [0; REGS],
            writable: [0; REGS],
            w1c: [0; REGS],
            bars: [None; NUM_BARS],
            last_capability: None,
            next_capability: FIRST_CAPABILITY,
        };
        c.regs[0] = ids.vendor as u32 | (ids.device as u32) << 16;
        c.regs[2] = ids.revision as u32
            | (ids.class[2] as u32) << 8
            | (ids.class[1] as u32) << 16
            | (ids.class[0] as u32) << 24;
        c.regs[SUBSYSTEM_VENDOR_ID / 4] = ids.subsystem_vendor as u32 | (ids.subsystem as u32) << 16;
        let command_bits = (COMMAND_IO | COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE) as u32;
        c.writable[COMMAND / 4] = command_bits;
        c.w1c[STATUS / 4] = (STATUS_W1C as u32) << 16;
        // Cache line size and latency timer are read/write scratch bytes.
        c.writable[CACHE_LINE_SIZE / 4] = 0x0000_ffff;
        c.writable[INTERRUPT_LINE / 4] = 0x0000_00ff;
        c
    }

    /// A type-1 (PCI-to-PCI bridge) header for `ids`: writable bus numbers and a 32-bit memory
    /// window, no I/O and no prefetchable window (their registers read 0, which tells the guest
    /// the bridge forwards neither), write-1-to-clear secondary status, a writable bridge control.
    /// A bridge has no BARs of its own here.
    pub fn bridge(ids: PciIds) -> Self {
        let mut c = PciConfiguration::new(ids);
        c.set_byte(HEADER_TYPE, 1);
        // 0x2c is the prefetchable base's upper half in a type-1 header, not a subsystem ID.
        c.regs[SUBSYSTEM_VENDOR_ID / 4] = 0;
        // Primary, secondary and subordinate bus numbers; the secondary latency timer.
        c.writable[BRIDGE_BUS_NUMBERS / 4] = 0xffff_ffff;
        // Secondary status (upper half of the I/O base/limit dword): its error bits.
        c.w1c[BRIDGE_IO_WINDOW / 4] = (STATUS_W1C as u32) << 16;
        // Memory base and limit: address bits 31:20 of each.
        c.writable[BRIDGE_MEMORY_WINDOW / 4] = 0xfff0_fff0;
        // Closed until assigned: base above limit.
        c.regs[BRIDGE_MEMORY_WINDOW / 4] = 0x0000_fff0;
        // Bridge control: parity, SERR, ISA, VGA, VGA 16-bit, master abort, secondary bus reset.
        c.writable[INTERRUPT_LINE / 4] = 0x007f_00ff;
        c
    }

    /// Makes the bits of `mask` at byte `offset` write-1-to-clear (a capability's status bits).
    pub fn set_write_one_to_clear(&mut self, offset: usize, mask: &[u8]) {
        for (i, &m) in mask.iter().enumerate() {
            let at = offset + i;
            if at < CONFIG_SIZE {
                self.w1c[at / 4] |= (m as u32) << ((at % 4) * 8);
            }
        }
    }

    /// The 32-bit memory window a bridge forwards, `[base, limit]` inclusive; none while the
    /// limit is below the base.
    pub fn bridge_memory_window(&self) -> Option<(u64, u64)> {
        let window = self.regs[BRIDGE_MEMORY_WINDOW / 4];
        let base = ((window & 0xfff0) as u64) << 16;
        let limit = ((window >> 16 & 0xfff0) as u64) << 16 | 0xf_ffff;
        (limit > base).then_some((base, limit))
    }

    /// Sets a bridge's 32-bit memory window to `[base, limit]` (1 MiB granules), as firmware does.
    pub fn set_bridge_memory_window(&mut self, base: u64, limit: u64) {
        let value = (base >> 16) as u32 & 0xfff0 | ((limit >> 16) as u32 & 0xfff0) << 16;
        self.regs[BRIDGE_MEMORY_WINDOW / 4] = value;
    }

    /// A bridge's (primary, secondary, subordinate) bus numbers.
    pub fn bridge_buses(&self) -> (u8, u8, u8) {
        let b = self.regs[BRIDGE_BUS_NUMBERS / 4].to_le_bytes();
        (b[0], b[1], b[2])
    }

    /// Sets a bridge's bus numbers, as firmware does.
    pub fn set_bridge_buses(&mut self, primary: u8, secondary: u8, subordinate: u8) {
        let latency = self.regs[BRIDGE_BUS_NUMBERS / 4] & 0xff00_0000;
        self.regs[BRIDGE_BUS_NUMBERS / 4] =
            latency | primary as u32 | (secondary as u32) << 8 | (subordinate as u32) << 16;
    }

    /// Declares BAR `index` of `size` bytes (a power of two; at least 16 for memory, 4 for I/O).
    pub fn add_bar(&mut self, index: usize, size: u64, kind: BarKind) -> Result<(), PciError> {
        let fail = |reason| Err(PciError::Bar { index, reason });
        let slots = if kind == BarKind::Memory64 { 2 } else { 1 };
        if index + slots > NUM_BARS {
            return fail("past the last BAR");
        }
        if self.bars[index..index + slots].iter().any(Option::is_some) || (index > 0 && self.is_upper_half(index)) {
            return fail("already in use");
        }
        let min = if kind == BarKind::Io { 4 } else { 16 };
        if !size.is_power_of_two() || size < min || (kind != BarKind::Memory64 && size > 1 << 31) {
            return fail("size must be a power of two that the BAR type can hold");
        }
        self.bars[index] = Some(Bar { kind, size });
        let reg = BAR0 / 4 + index;
        let (type_bits, flag_mask) = match kind {
            BarKind::Memory32 => (0x0, 0xf),
            BarKind::Memory64 => (0x4, 0xf),
            BarKind::Io => (0x1, 0x3),
        };
        self.regs[reg] = type_bits;
        self.writable[reg] = !((size - 1) as u32) & !flag_mask;
        if kind == BarKind::Memory64 {
            self.writable[reg + 1] = !((size - 1) >> 32) as u32;
        }
        Ok(())
    }

    fn is_upper_half(&self, index: usize) -> bool {
        matches!(self.bars[index - 1], Some(Bar { kind: BarKind::Memory64, .. }))
    }

    /// Places BAR `index` at `addr` (the VMM assigns addresses; the guest may move them).
    pub fn set_bar_address(&mut self, index: usize, addr: u64) {
        let Some(bar) = self.bars.get(index).copied().flatten() else { return };
        let reg = BAR0 / 4 + index;
        let flags = self.regs[reg] & if bar.kind == BarKind::Io { 0x3 } else { 0xf };
        self.regs[reg] = (addr as u32 & self.writable[reg]) | flags;
        if bar.kind == BarKind::Memory64 {
            self.regs[reg + 1] = (addr >> 32) as u32 & self.writable[reg + 1];
        }
    }

    /// Size and kind of BAR `index`, if it exists.
    pub fn bar(&self, index: usize) -> Option<(u64, BarKind)> {
        self.bars.get(index).copied().flatten().map(|b| (b.size, b.kind))
    }

    /// The address BAR `index` holds now.
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let bar = self.bars.get(index).copied().flatten()?;
        let reg = BAR0 / 4 + index;
        Some(match bar.kind {
            BarKind::Io => (self.regs[reg] & !0x3) as u64,
            BarKind::Memory32 => (self.regs[reg] & !0xf) as u64,
            BarKind::Memory64 => (self.regs[reg] & !0xf) as u64 | (self.regs[reg + 1] as u64) << 32,
        })
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.regs[COMMAND / 4] as u16
    }

    /// Appends a capability with `id` and `body` (the bytes after ID and next pointer); `writable`
    /// masks the body bits the guest may change (shorter than `body` means the rest read-only).
    /// Returns the capability's offset.
    pub fn add_capability(&mut self, id: u8, body: &[u8], writable: &[u8]) -> Result<usize, PciError> {
        let len = 2 + body.len();
        let offset = self.next_capability;
        if offset + len > CONFIG_SIZE {
            return Err(PciError::NoCapabilitySpace(len));
        }
        self.set_byte(offset, id);
        self.set_byte(offset + 1, 0);
        for (i, &b) in body.iter().enumerate() {
            self.set_byte(offset + 2 + i, b);
        }
        for (i, &m) in writable.iter().enumerate().take(body.len()) {
            let at = offset + 2 + i;
            self.writable[at / 4] |= (m as u32) << ((at % 4) * 8);
        }
        match self.last_capability {
            Some(last) => self.set_byte(last + 1, offset as u8),
            None => self.set_byte(CAPABILITIES_POINTER, offset as u8),
        }
        self.regs[STATUS / 4] |= (STATUS_CAPABILITIES as u32) << 16;
        self.last_capability = Some(offset);
        self.next_capability = (offset + len).next_multiple_of(4);
        Ok(offset)
    }

    fn set_byte(&mut self, offset: usize, value: u8) {
        let shift = (offset % 4) * 8;
        self.regs[offset / 4] = (self.regs[offset / 4] & !(0xff << shift)) | (value as u32) << shift;
    }

    /// Reads dword register `reg` (offset / 4); registers past the space read 0.
    pub fn read_reg(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(0)
    }

    /// Every register, as a snapshot keeps them.
    pub fn registers(&self) -> Vec<u32> {
        self.regs.to_vec()
    }

    /// Puts back registers from [`PciConfiguration::registers`] of a function with the same IDs
    /// (vendor, device, class, revision, subsystem), refusing those of another kind of function.
    pub fn set_registers(&mut self, saved: &[u32]) -> Result<(), String> {
        if saved.len() != REGS {
            return Err(format!("{} configuration registers saved, a function has {REGS}", saved.len()));
        }
        // Vendor and device; revision and class; subsystem.
        const IDS: [usize; 3] = [0, REVISION / 4, SUBSYSTEM_VENDOR_ID / 4];
        if let Some(&reg) = IDS.iter().find(|&&reg| saved[reg] != self.regs[reg]) {
            return Err(format!(
                "saved from another kind of function: register {:#x} is {:#010x} here, {:#010x} saved",
                reg * 4,
                self.regs[reg],
                saved[reg]
            ));
        }
        self.regs.copy_from_slice(saved);
        Ok(())
    }

    /// The registers as the snapshot of a function whose whole state they are takes them.
    pub fn state(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.registers()).ok()
    }

    /// Puts back registers [`PciConfiguration::state`] gave, as [`PciConfiguration::set_registers`].
    pub fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let registers: Vec<u32> = serde_json::from_value(state.clone()).map_err(|e| e.to_string())?;
        self.set_registers(&registers)
    }

    /// Reads `data.len()` bytes at `offset` without side effects.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset + i;
            *b = if at < CONFIG_SIZE { (self.regs[at / 4] >> ((at % 4) * 8)) as u8 } else { 0 };
        }
    }

    /// Applies a guest write of `data` at byte `offset`: only writable bits change, set
    /// write-1-to-clear bits clear.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &value) in data.iter().enumerate() {
            let at = offset + i;
            if at >= CONFIG_SIZE {
                return;
            }
            let shift = (at % 4) * 8;
            let reg = at / 4;
            let mask = (self.writable[reg] >> shift) as u8;
            let clear = (self.w1c[reg] >> shift) as u8 & value;
            let old = (self.regs[reg] >> shift) as u8;
            let new = ((old & !mask) | (value & mask)) & !clear;
            self.regs[reg] = (self.regs[reg] & !(0xff << shift)) | (new as u32) << shift;
        }
    }

    /// Sets bytes at `offset` as the device (ignoring the guest's write masks), e.g. status
    /// changes of a capability.
    pub fn set(&mut self, offset: usize, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            if offset + i < CONFIG_SIZE {
                self.set_byte(offset + i, b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> PciIds {
        PciIds {
            vendor: 0x1af4,
            device: 0x1057,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
            class: [0x08, 0x06, 0],
            revision: 1,
        }
    }

    fn read32(c: &PciConfiguration, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        c.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn ids_are_read_only_and_command_bits_are_masked() {
        let mut c = PciConfiguration::new(ids());
        c.write(0, &[0xff; 4]);
        assert_eq!(read32(&c, 0), 0x1057_1af4);
        assert_eq!(read32(&c, 8), 0x0806_0001);
        c.write(COMMAND, &0xffffu16.to_le_bytes());
        assert_eq!(c.command(), COMMAND_IO | COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE);
    }

    #[test]
    fn status_error_bits_are_write_one_to_clear() {
        let mut c = PciConfiguration::new(ids());
        c.set(STATUS, &0x8000u16.to_le_bytes()); // detected parity error
        c.write(STATUS, &0x0000u16.to_le_bytes());
        assert_eq!(read32(&c, 4) >> 16, 0x8000, "writing 0 keeps it");
        c.write(STATUS, &0x8000u16.to_le_bytes());
        assert_eq!(read32(&c, 4) >> 16, 0, "writing 1 clears it");
    }

    #[test]
    fn bars_answer_size_probes_and_keep_their_type() {
        let mut c = PciConfiguration::new(ids());
        c.add_bar(0, 0x8000, BarKind::Memory64).unwrap();
        c.add_bar(2, 0x100, BarKind::Io).unwrap();
        c.set_bar_address(0, 0x1_c000_0000);
        assert_eq!(c.bar_address(0), Some(0x1_c000_0000));
        assert_eq!(read32(&c, 0x10) & 0xf, 0x4, "64-bit memory");
        c.write(0x10, &[0xff; 4]);
        c.write(0x14, &[0xff; 4]);
        assert_eq!(read32(&c, 0x10), 0xffff_8004);
        assert_eq!(read32(&c, 0x14), 0xffff_ffff);
        c.write(0x18, &[0xff; 4]);
        assert_eq!(read32(&c, 0x18), 0xffff_ff01);
        c.write(0x10, &0xd000_0000u32.to_le_bytes());
        c.write(0x14, &0u32.to_le_bytes());
        assert_eq!(c.bar_address(0), Some(0xd000_0000));
        assert_eq!(read32(&c, 0x1c), 0, "absent BAR reads 0");
        c.write(0x1c, &[0xff; 4]);
        assert_eq!(read32(&c, 0x1c), 0, "absent BAR stays 0");
        assert_eq!(read32(&c, 0x30), 0, "no expansion ROM");
    }

    #[test]
    fn bad_bars_are_refused() {
        let mut c = PciConfiguration::new(ids());
        assert!(c.add_bar(5, 0x1000, BarKind::Memory64).is_err());
        assert!(c.add_bar(0, 0x1001, BarKind::Memory32).is_err());
        assert!(c.add_bar(0, 8, BarKind::Memory32).is_err());
        c.add_bar(0, 0x1000, BarKind::Memory64).unwrap();
        assert!(c.add_bar(1, 0x1000, BarKind::Memory32).is_err(), "upper half of BAR 0");
        assert!(c.add_bar(0, 0x1000, BarKind::Memory32).is_err());
    }

    #[test]
    fn a_bridge_header_has_bus_numbers_a_memory_window_and_nothing_else() {
        let mut c = PciConfiguration::bridge(ids());
        assert_eq!(read32(&c, 0x0c) >> 16 & 0x7f, 1, "header type 1");
        c.write(0x18, &[0, 3, 5, 0]);
        assert_eq!(c.bridge_buses(), (0, 3, 5));
        c.write(0x1c, &[0xff, 0xff]);
        assert_eq!(read32(&c, 0x1c) & 0xffff, 0, "no I/O window");
        c.write(0x24, &[0xff; 4]);
        assert_eq!(read32(&c, 0x24), 0, "no prefetchable window");
        assert_eq!(c.bridge_memory_window(), None, "closed at reset: base above limit");
        c.write(0x20, &0xc0f0_c010u32.to_le_bytes());
        assert_eq!(c.bridge_memory_window(), Some((0xc010_0000, 0xc0ff_ffff)));
        c.set_bridge_memory_window(0xc200_0000, 0xc3ff_ffff);
        assert_eq!(read32(&c, 0x20), 0xc3f0_c200);
        c.set(0x1e, &0x8000u16.to_le_bytes());
        c.write(0x1e, &0x8000u16.to_le_bytes());
        assert_eq!(read32(&c, 0x1c) >> 16, 0, "secondary status clears on a 1");
        c.write(0x3e, &0xffffu16.to_le_bytes());
        assert_eq!(read32(&c, 0x3c) >> 16, 0x7f, "bridge control");
        c.set(0x40, &[0x0f]);
        c.set_write_one_to_clear(0x40, &[0x05]);
        c.write(0x40, &[0xff]);
        assert_eq!(read32(&c, 0x40) & 0xff, 0x0a, "only the marked bits clear");
    }

    #[test]
    fn capabilities_form_a_list_with_write_masks() {
        let mut c = PciConfiguration::new(ids());
        let first = c.add_capability(0x11, &[0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0], &[0x00, 0xc0]).unwrap();
        let second = c.add_capability(0x09, &[16, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap();
        assert_eq!((first, second), (0x40, 0x4c));
        assert_ne!(read32(&c, 4) & (1 << 20), 0, "capability list bit");
        assert_eq!(read32(&c, 0x34) & 0xff, 0x40);
        assert_eq!(read32(&c, 0x40) & 0xffff, 0x4c11);
        assert_eq!(read32(&c, 0x4c) & 0xffff, 0x0009, "end of list");
        c.write(first + 2, &[0xff, 0xff]);
        let mut control = [0u8; 2];
        c.read(first + 2, &mut control);
        assert_eq!(u16::from_le_bytes(control), 0xc001, "only the masked bits changed");
        let mut big = PciConfiguration::new(ids());
        assert!(big.add_capability(0x09, &[0; 250], &[]).is_err());
    }
}
