//! The MSI capability: message control, address, data, and (where the function has them) the
//! per-vector mask and pending bits. Each of the vectors the guest enables is a `MsiVector`
//! whose route carries the capability's message with the vector number in the low data bits.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::PciError;
use super::vector::MsiVector;
use vm_device::interrupt::{MsiInterrupts, MsiMessage};

/// MSI capability ID.
pub const CAPABILITY_ID: u8 = 0x05;
/// Message control: MSI enable.
pub const CONTROL_ENABLE: u16 = 1 << 0;
/// Message control: 64-bit address capable.
pub const CONTROL_64BIT: u16 = 1 << 7;
/// Message control: per-vector masking capable.
pub const CONTROL_PER_VECTOR_MASK: u16 = 1 << 8;
const MULTIPLE_CAPABLE_SHIFT: u16 = 1;
const MULTIPLE_ENABLE_SHIFT: u16 = 4;
/// The largest register block (64-bit, with mask and pending bits).
const MAX_SIZE: usize = 24;

/// An MSI capability as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MsiState {
    /// The capability's registers.
    pub regs: Vec<u8>,
    /// Each vector's latched signal.
    pub pending: Vec<bool>,
}

/// One function's MSI state, addressed by offset from the start of the capability.
pub struct MsiConfig {
    /// The capability bytes as the guest sees them (ID and next pointer excluded: offsets 0-1
    /// belong to whoever builds the capability list).
    regs: [u8; MAX_SIZE],
    writable: [u8; MAX_SIZE],
    size: usize,
    vectors: Vec<MsiVector>,
    interrupts: Arc<dyn MsiInterrupts>,
}

impl MsiConfig {
    /// The capability as a function with message control `control` offers it (its 64-bit,
    /// per-vector-mask and multiple-message-capable bits count; the rest is reset state).
    /// `max_vectors` caps the multiple-message capability (what the backend can deliver).
    pub fn new(control: u16, max_vectors: u32, interrupts: Arc<dyn MsiInterrupts>) -> Result<Self, PciError> {
        let wide = control & CONTROL_64BIT != 0;
        let maskable = control & CONTROL_PER_VECTOR_MASK != 0;
        let mut capable = ((control >> MULTIPLE_CAPABLE_SHIFT) & 7).min(5);
        while capable > 0 && 1u32 << capable > max_vectors {
            capable -= 1;
        }
        let mut vectors = Vec::with_capacity(1 << capable);
        for _ in 0..1u32 << capable {
            vectors.push(MsiVector::new(interrupts.as_ref()).map_err(PciError::Vector)?);
        }
        let mut regs = [0u8; MAX_SIZE];
        let mut writable = [0u8; MAX_SIZE];
        let fixed = capable << MULTIPLE_CAPABLE_SHIFT | control & (CONTROL_64BIT | CONTROL_PER_VECTOR_MASK);
        regs[2..4].copy_from_slice(&fixed.to_le_bytes());
        writable[2..4].copy_from_slice(&(CONTROL_ENABLE | 7 << MULTIPLE_ENABLE_SHIFT).to_le_bytes());
        writable[4..8].copy_from_slice(&0xffff_fffcu32.to_le_bytes());
        let data = if wide {
            writable[8..12].fill(0xff);
            12
        } else {
            8
        };
        writable[data..data + 2].fill(0xff);
        let size = if maskable {
            let mask = data + 4;
            writable[mask..mask + 4].copy_from_slice(&((1u64 << vectors.len()) - 1).to_le_bytes()[..4]);
            mask + 8
        } else {
            data + 2
        };
        Ok(MsiConfig { regs, writable, size, vectors, interrupts })
    }

    /// Bytes the capability occupies from its start.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The vectors the function may use (the multiple-message capability).
    pub fn count(&self) -> u16 {
        self.vectors.len() as u16
    }

    fn control(&self) -> u16 {
        u16::from_le_bytes([self.regs[2], self.regs[3]])
    }

    fn wide(&self) -> bool {
        self.control() & CONTROL_64BIT != 0
    }

    fn data_offset(&self) -> usize {
        if self.wide() { 12 } else { 8 }
    }

    fn mask_offset(&self) -> Option<usize> {
        (self.control() & CONTROL_PER_VECTOR_MASK != 0).then(|| self.data_offset() + 4)
    }

    fn dword(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.regs[at..at + 4].try_into().expect("in range"))
    }

    /// Whether MSI is enabled.
    pub fn enabled(&self) -> bool {
        self.control() & CONTROL_ENABLE != 0
    }

    /// How many vectors the guest enabled (0 while MSI is disabled).
    pub fn enabled_vectors(&self) -> u16 {
        if !self.enabled() {
            return 0;
        }
        let enabled = (self.control() >> MULTIPLE_ENABLE_SHIFT) & 7;
        (1u16 << enabled.min(5)).min(self.count())
    }

    fn masked(&self, vector: usize) -> bool {
        self.mask_offset().is_some_and(|at| self.dword(at) & 1 << vector != 0)
    }

    /// Guest read at `offset` from the start of the capability (offsets 0 and 1 read as 0).
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        let pending = self.mask_offset().map(|at| at + 4);
        let pending_bits =
            self.vectors.iter().enumerate().filter(|(_, v)| v.pending()).fold(0u32, |acc, (i, _)| acc | 1 << i);
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset + i;
            *b = match pending {
                Some(p) if (p..p + 4).contains(&at) => pending_bits.to_le_bytes()[at - p],
                _ if at < self.size && at >= 2 => self.regs[at],
                _ => 0,
            };
        }
    }

    /// Guest write at `offset` from the start of the capability; read-only bits stay.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let at = offset + i;
            if at < self.size {
                self.regs[at] = self.regs[at] & !self.writable[at] | b & self.writable[at];
            }
        }
        self.update();
    }

    /// The capability's registers and latched vectors, as a snapshot keeps them.
    pub fn state(&self) -> MsiState {
        MsiState { regs: self.regs[..self.size].to_vec(), pending: self.vectors.iter().map(|v| v.pending()).collect() }
    }

    /// Puts back a state from [`MsiConfig::state`] of a capability with the same layout, and
    /// routes the vectors it enables.
    pub fn restore(&mut self, state: &MsiState) -> Result<(), String> {
        if state.regs.len() != self.size || state.pending.len() != self.vectors.len() {
            return Err(format!(
                "MSI: {} bytes and {} vectors saved, the capability has {} and {}",
                state.regs.len(),
                state.pending.len(),
                self.size,
                self.vectors.len()
            ));
        }
        self.regs[..self.size].copy_from_slice(&state.regs);
        for (vector, &pending) in self.vectors.iter_mut().zip(&state.pending) {
            vector.set_pending(pending);
        }
        self.update();
        Ok(())
    }

    /// The message vector `vector` sends while enabled.
    fn message(&self, vector: usize, enabled: u16) -> MsiMessage {
        let address =
            if self.wide() { self.dword(4) as u64 | (self.dword(8) as u64) << 32 } else { self.dword(4) as u64 };
        let at = self.data_offset();
        let data = u16::from_le_bytes([self.regs[at], self.regs[at + 1]]);
        MsiMessage { address, data: (data & !(enabled - 1) | vector as u16) as u32 }
    }

    fn update(&mut self) {
        let enabled = self.enabled_vectors();
        for index in 0..self.vectors.len() {
            let deliverable = (index as u16) < enabled && !self.masked(index);
            let message = deliverable.then(|| self.message(index, enabled));
            if let Err(e) = self.vectors[index].steer(self.interrupts.as_ref(), message) {
                tracing::warn!("MSI vector {index}: {e}");
            }
        }
    }

    /// The device signals `vector`: delivered now, or latched (pending) if it cannot fire.
    pub fn notify(&mut self, vector: u16) {
        let Some(v) = self.vectors.get_mut(vector as usize) else { return };
        if let Err(e) = v.notify() {
            tracing::warn!("MSI vector {vector}: {e}");
        }
    }

    /// The EventFd behind `vector` (a passed-through device signals it directly).
    pub fn eventfd(&self, vector: u16) -> Option<&EventFd> {
        self.vectors.get(vector as usize).map(|v| v.fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_device::interrupt::RecordingInterrupts as FakeInterrupts;

    fn read32(msi: &MsiConfig, at: usize) -> u32 {
        let mut b = [0u8; 4];
        msi.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn layouts_follow_the_capability_bits() {
        let fake = Arc::new(FakeInterrupts::default());
        let plain = MsiConfig::new(0, 32, fake.clone()).unwrap();
        assert_eq!((plain.size(), plain.count()), (10, 1));
        let wide = MsiConfig::new(CONTROL_64BIT, 32, fake.clone()).unwrap();
        assert_eq!(wide.size(), 14);
        let full = MsiConfig::new(CONTROL_64BIT | CONTROL_PER_VECTOR_MASK | 3 << 1, 32, fake.clone()).unwrap();
        assert_eq!((full.size(), full.count()), (24, 8));
        let capped = MsiConfig::new(5 << 1, 4, fake).unwrap();
        assert_eq!(capped.count(), 4, "the backend delivers at most 4");
        assert_eq!(read32(&capped, 0) >> 16 & 0xe, 2 << 1, "multiple message capable shows 4");
    }

    #[test]
    fn enabling_routes_each_vector_with_its_number_in_the_data() {
        let fake = Arc::new(FakeInterrupts::default());
        let mut msi = MsiConfig::new(CONTROL_64BIT | CONTROL_PER_VECTOR_MASK | 2 << 1, 32, fake.clone()).unwrap();
        msi.write(4, &0xfee0_1003u32.to_le_bytes());
        msi.write(8, &0u32.to_le_bytes());
        msi.write(12, &0x4043u16.to_le_bytes());
        assert_eq!(read32(&msi, 4), 0xfee0_1000, "address is dword aligned");
        assert!(fake.irqfds.lock().unwrap().is_empty(), "disabled");

        msi.notify(1);
        let mut pending = [0u8; 4];
        msi.read(20, &mut pending);
        assert_eq!(pending[0], 0b10, "latched while disabled");

        // Enable with 4 vectors (MME = 2), vector 3 masked.
        msi.write(16, &0b1000u32.to_le_bytes());
        msi.write(2, &(CONTROL_ENABLE | 2 << 4).to_le_bytes());
        assert_eq!(msi.enabled_vectors(), 4);
        let routes = fake.routes.lock().unwrap().clone();
        let data: Vec<u32> = routes.values().map(|m| m.data).collect();
        assert_eq!(data, vec![0x4040, 0x4041, 0x4042], "low bits carry the vector; vector 3 masked");
        assert!(routes.values().all(|m| m.address == 0xfee0_1000));
        assert_eq!(fake.irqfds.lock().unwrap().len(), 3);
        assert_eq!(msi.eventfd(1).unwrap().read().unwrap(), 1, "the latched interrupt fired");

        msi.write(16, &0u32.to_le_bytes());
        assert_eq!(fake.irqfds.lock().unwrap().len(), 4, "unmasked");
        msi.write(2, &0u16.to_le_bytes());
        assert!(fake.irqfds.lock().unwrap().is_empty(), "disable disarms every vector");
        assert_eq!(msi.enabled_vectors(), 0);
    }

    #[test]
    fn read_only_bits_stay() {
        let mut msi = MsiConfig::new(0, 32, Arc::new(FakeInterrupts::default())).unwrap();
        msi.write(2, &0xffffu16.to_le_bytes());
        assert_eq!(read32(&msi, 0) >> 16, (CONTROL_ENABLE | 7 << 4) as u32, "only enable and MME");
        assert_eq!(msi.enabled_vectors(), 1, "MME beyond the capability clamps to it");
        msi.write(10, &[0xff; 16]);
        assert_eq!(read32(&msi, 12), 0, "beyond the capability");
    }
}
