//! MSI-X: the vector table, the pending-bit array and the capability's control bits, shared by
//! every device. Each vector is an EventFd wired to a GSI as an irqfd while it may fire; masking
//! unregisters the irqfd, so a signal stays pending and is delivered on unmask.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::PciError;
use super::vector::MsiVector;
use vm_device::interrupt::{MsiInterrupts, MsiMessage};

/// MSI-X capability ID.
pub const CAPABILITY_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
/// Most vectors one function can have.
pub const MAX_VECTORS: u16 = 2048;
/// Message control: MSI-X enable.
pub const CONTROL_ENABLE: u16 = 1 << 15;
/// Message control: all vectors masked.
pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector control: this vector masked.
const VECTOR_MASKED: u32 = 1;

struct Vector {
    entry: [u8; ENTRY_SIZE as usize],
    irq: MsiVector,
}

impl Vector {
    fn dword(&self, index: usize) -> u32 {
        u32::from_le_bytes(self.entry[index * 4..index * 4 + 4].try_into().expect("4 bytes"))
    }

    fn message(&self) -> MsiMessage {
        MsiMessage { address: self.dword(0) as u64 | (self.dword(1) as u64) << 32, data: self.dword(2) }
    }

    fn masked(&self) -> bool {
        self.dword(3) & VECTOR_MASKED != 0
    }
}

/// An MSI-X table and its control bits as a snapshot keeps them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MsixState {
    /// Each vector's table entry (address, data, vector control), as four dwords.
    pub entries: Vec<[u32; 4]>,
    /// Each vector's latched signal.
    pub pending: Vec<bool>,
    /// MSI-X enable.
    pub enabled: bool,
    /// Function mask.
    pub function_masked: bool,
}

/// One function's MSI-X state.
pub struct MsixConfig {
    vectors: Vec<Vector>,
    enabled: bool,
    function_masked: bool,
    interrupts: Arc<dyn MsiInterrupts>,
}

impl MsixConfig {
    /// `count` vectors, all masked, MSI-X disabled (the reset state).
    pub fn new(count: u16, interrupts: Arc<dyn MsiInterrupts>) -> Result<Self, PciError> {
        if count == 0 || count > MAX_VECTORS {
            return Err(PciError::MsixSize(count as usize));
        }
        let mut vectors = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let irq = MsiVector::new(interrupts.as_ref()).map_err(PciError::Vector)?;
            let mut entry = [0u8; ENTRY_SIZE as usize];
            entry[12] = VECTOR_MASKED as u8;
            vectors.push(Vector { entry, irq });
        }
        Ok(MsixConfig { vectors, enabled: false, function_masked: false, interrupts })
    }

    /// Number of vectors.
    pub fn count(&self) -> u16 {
        self.vectors.len() as u16
    }

    /// Size of the vector table in bytes.
    pub fn table_size(&self) -> u64 {
        self.vectors.len() as u64 * ENTRY_SIZE
    }

    /// Size of the pending-bit array in bytes (whole qwords).
    pub fn pba_size(&self) -> u64 {
        (self.vectors.len() as u64).div_ceil(64) * 8
    }

    /// The capability body (after ID and next pointer) and its write mask, for a table at
    /// `table_offset` of BAR `table_bar` and a PBA at `pba_offset` of BAR `pba_bar`.
    pub fn capability(&self, table_bar: u8, table_offset: u32, pba_bar: u8, pba_offset: u32) -> (Vec<u8>, Vec<u8>) {
        let mut body = Vec::with_capacity(10);
        body.extend_from_slice(&(self.count() - 1).to_le_bytes());
        body.extend_from_slice(&(table_offset | table_bar as u32).to_le_bytes());
        body.extend_from_slice(&(pba_offset | pba_bar as u32).to_le_bytes());
        let writable = ((CONTROL_ENABLE | CONTROL_FUNCTION_MASK).to_le_bytes()).to_vec();
        (body, writable)
    }

    /// Applies the capability's message control word as the guest left it.
    pub fn set_control(&mut self, control: u16) {
        self.enabled = control & CONTROL_ENABLE != 0;
        self.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        for v in 0..self.vectors.len() {
            self.update(v);
        }
    }

    /// True if MSI-X is enabled.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Guest read of the vector table.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset + i as u64;
            *b = self.vectors.get((at / ENTRY_SIZE) as usize).map_or(0, |v| v.entry[(at % ENTRY_SIZE) as usize]);
        }
    }

    /// Guest write to the vector table.
    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        let mut touched = Vec::new();
        for (i, &b) in data.iter().enumerate() {
            let at = offset + i as u64;
            let index = (at / ENTRY_SIZE) as usize;
            let byte = (at % ENTRY_SIZE) as usize;
            let Some(vector) = self.vectors.get_mut(index) else { continue };
            vector.entry[byte] = match byte {
                12 => b & VECTOR_MASKED as u8,
                13..=15 => 0, // reserved vector control bits
                _ => b,
            };
            if touched.last() != Some(&index) {
                touched.push(index);
            }
        }
        for index in touched {
            self.update(index);
        }
    }

    /// Guest read of the pending-bit array.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let first = (offset + i as u64) * 8;
            *b = (0..8u64)
                .filter(|bit| self.vectors.get((first + bit) as usize).is_some_and(|v| v.irq.pending()))
                .fold(0, |acc, bit| acc | 1 << bit);
        }
    }

    /// The device signals `vector`: delivered now, or latched if the vector cannot fire.
    pub fn notify(&mut self, vector: u16) {
        let Some(v) = self.vectors.get_mut(vector as usize) else { return };
        if let Err(e) = v.irq.notify() {
            tracing::warn!("MSI-X vector {vector}: {e}");
        }
    }

    /// The EventFd behind `vector` (a passed-through device signals it directly).
    pub fn eventfd(&self, vector: u16) -> Option<&EventFd> {
        self.vectors.get(vector as usize).map(|v| v.irq.fd())
    }

    /// Whether `vector` has a latched interrupt.
    pub fn pending(&self, vector: u16) -> bool {
        self.vectors.get(vector as usize).is_some_and(|v| v.irq.pending())
    }

    /// The table and control bits, as a snapshot keeps them.
    pub fn state(&self) -> MsixState {
        MsixState {
            entries: self.vectors.iter().map(|v| [0, 1, 2, 3].map(|i| v.dword(i))).collect(),
            pending: self.vectors.iter().map(|v| v.irq.pending()).collect(),
            enabled: self.enabled,
            function_masked: self.function_masked,
        }
    }

    /// Puts back a state from [`MsixConfig::state`] of a table of the same size, and routes the
    /// vectors it lets fire.
    pub fn restore(&mut self, state: &MsixState) -> Result<(), String> {
        if state.entries.len() != self.vectors.len() || state.pending.len() != self.vectors.len() {
            return Err(format!("MSI-X: {} vectors saved, the table has {}", state.entries.len(), self.vectors.len()));
        }
        for ((vector, entry), &pending) in self.vectors.iter_mut().zip(&state.entries).zip(&state.pending) {
            for (i, dword) in entry.iter().enumerate() {
                vector.entry[i * 4..i * 4 + 4].copy_from_slice(&dword.to_le_bytes());
            }
            vector.entry[12] &= VECTOR_MASKED as u8;
            vector.entry[13..].fill(0);
            vector.irq.set_pending(pending);
        }
        (self.enabled, self.function_masked) = (state.enabled, state.function_masked);
        for v in 0..self.vectors.len() {
            self.update(v);
        }
        Ok(())
    }

    /// Brings vector `index`'s route and irqfd in line with the table and control bits.
    fn update(&mut self, index: usize) {
        let v = &mut self.vectors[index];
        let deliverable = self.enabled && !self.function_masked && !v.masked();
        let message = deliverable.then(|| v.message());
        if let Err(e) = v.irq.steer(self.interrupts.as_ref(), message) {
            tracing::warn!("MSI-X vector {index}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_device::interrupt::RecordingInterrupts as FakeInterrupts;

    fn program(msix: &mut MsixConfig, vector: u64, address: u64, data: u32, masked: bool) {
        let base = vector * ENTRY_SIZE;
        msix.table_write(base, &(address as u32).to_le_bytes());
        msix.table_write(base + 4, &((address >> 32) as u32).to_le_bytes());
        msix.table_write(base + 8, &data.to_le_bytes());
        msix.table_write(base + 12, &(masked as u32).to_le_bytes());
    }

    #[test]
    fn vectors_start_masked_and_latch_until_unmasked() {
        let fake = Arc::new(FakeInterrupts::default());
        let mut msix = MsixConfig::new(3, fake.clone()).unwrap();
        let mut ctrl = [0u8; 4];
        msix.table_read(12, &mut ctrl);
        assert_eq!(u32::from_le_bytes(ctrl), 1, "masked at reset");

        msix.notify(1);
        assert!(msix.pending(1));
        let mut pba = [0u8; 8];
        msix.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0b010);

        program(&mut msix, 1, 0xfee0_0000, 0x41, false);
        assert!(fake.irqfds.lock().unwrap().is_empty(), "MSI-X still disabled");
        msix.set_control(CONTROL_ENABLE);
        let gsi = msix.vectors[1].irq.gsi;
        assert_eq!(fake.routes.lock().unwrap()[&gsi], MsiMessage { address: 0xfee0_0000, data: 0x41 });
        assert!(fake.irqfds.lock().unwrap().contains_key(&gsi));
        assert!(!msix.pending(1), "the latched interrupt fired on enable");
        assert_eq!(msix.eventfd(1).unwrap().read().unwrap(), 1);

        msix.notify(1);
        assert_eq!(msix.eventfd(1).unwrap().read().unwrap(), 1, "armed: straight to the irqfd");

        msix.set_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        assert!(fake.irqfds.lock().unwrap().is_empty(), "function mask disarms every vector");
        msix.notify(1);
        assert!(msix.pending(1));
        msix.set_control(CONTROL_ENABLE);
        assert!(!msix.pending(1));

        program(&mut msix, 1, 0xfee0_1000, 0x42, false);
        assert_eq!(fake.routes.lock().unwrap()[&gsi].data, 0x42, "re-routed on change");
        msix.table_write(12 + 16, &1u32.to_le_bytes());
        assert!(!fake.irqfds.lock().unwrap().contains_key(&gsi), "per-vector mask");
    }

    #[test]
    fn a_restored_table_routes_its_vectors_and_fires_what_was_latched() {
        let fake = Arc::new(FakeInterrupts::default());
        let mut msix = MsixConfig::new(3, fake.clone()).unwrap();
        program(&mut msix, 0, 0xfee0_0000, 0x41, false);
        program(&mut msix, 2, 0xfee0_0000, 0x43, true);
        msix.set_control(CONTROL_ENABLE);
        msix.notify(2);
        let saved: MsixState = serde_json::from_str(&serde_json::to_string(&msix.state()).unwrap()).unwrap();

        let again = Arc::new(FakeInterrupts::default());
        let mut restored = MsixConfig::new(3, again.clone()).unwrap();
        restored.restore(&saved).unwrap();
        let gsi = |m: &MsixConfig, v: usize| m.vectors[v].irq.gsi;
        assert_eq!(again.routes.lock().unwrap()[&gsi(&restored, 0)].data, 0x41, "vector 0 routed");
        assert!(again.irqfds.lock().unwrap().contains_key(&gsi(&restored, 0)));
        assert!(restored.pending(2), "masked vector 2 keeps its latched signal");
        let mut entry = [0u8; 16];
        restored.table_read(32, &mut entry);
        assert_eq!(entry[8..13], [0x43, 0, 0, 0, 1]);
        restored.table_write(44, &0u32.to_le_bytes());
        assert!(!restored.pending(2), "unmasked: the latched signal fires");
        assert!(MsixConfig::new(2, again).unwrap().restore(&saved).is_err(), "another table size");
    }

    #[test]
    fn reserved_bits_and_out_of_range_accesses() {
        let mut msix = MsixConfig::new(2, Arc::new(FakeInterrupts::default())).unwrap();
        msix.table_write(12, &0xffff_ffffu32.to_le_bytes());
        let mut ctrl = [0u8; 4];
        msix.table_read(12, &mut ctrl);
        assert_eq!(u32::from_le_bytes(ctrl), 1, "only the mask bit is writable");
        msix.table_write(64, &[0xff; 8]);
        let mut beyond = [0xaa; 8];
        msix.table_read(64, &mut beyond);
        assert_eq!(beyond, [0; 8]);
        msix.notify(7);
        assert!(MsixConfig::new(0, Arc::new(FakeInterrupts::default())).is_err());
        assert_eq!((msix.table_size(), msix.pba_size()), (32, 8));
        let (body, writable) = msix.capability(0, 0x4000, 0, 0x5000);
        assert_eq!(body, vec![1, 0, 0x00, 0x40, 0, 0, 0x00, 0x50, 0, 0]);
        assert_eq!(writable, vec![0, 0xc0]);
    }
}
