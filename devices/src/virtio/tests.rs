//! The virtio-iommu through its PCI transport, driven the way a guest driver drives it: feature
//! negotiation, queue set-up, requests in a split virtqueue, notifications, MSI-X.

use std::sync::Arc;

use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::iommu::{self, VirtioIommu};
use super::pci::VirtioPciDevice;
use super::status;
use pci::PciDevice;
use vm_device::interrupt::RecordingInterrupts as FakeInterrupts;

const MEM: usize = 1 << 20;
const DESC: u64 = 0x1_0000;
const AVAIL: u64 = 0x1_1000;
const USED: u64 = 0x1_2000;
const BUF: u64 = 0x2_0000;
const QSIZE: u16 = 16;

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

struct Driver {
    mem: GuestMemoryMmap,
    dev: VirtioPciDevice<VirtioIommu>,
    interrupts: Arc<FakeInterrupts>,
    avail_idx: u16,
    used_idx: u16,
}

fn common_write(dev: &mut VirtioPciDevice<VirtioIommu>, offset: u64, value: u32, len: usize) {
    dev.bar_write(0, offset, &value.to_le_bytes()[..len]);
}

fn common_read(dev: &mut VirtioPciDevice<VirtioIommu>, offset: u64, len: usize) -> u32 {
    let mut b = [0u8; 4];
    dev.bar_read(0, offset, &mut b[..len]);
    u32::from_le_bytes(b)
}

impl Driver {
    fn new(endpoints: &[u32]) -> Driver {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
        let interrupts = Arc::new(FakeInterrupts::default());
        let iommu = VirtioIommu::new(endpoints.iter().copied(), vec![(0, MEM as u64)], false);
        let dev = VirtioPciDevice::new("viommu", iommu, iommu::PCI_CLASS, mem.clone(), interrupts.clone(), 0xc000_0000)
            .unwrap();
        let mut d = Driver { mem, dev, interrupts, avail_idx: 0, used_idx: 0 };
        d.negotiate(super::F_VERSION_1 | iommu::F_MAP_UNMAP | iommu::F_PROBE | iommu::F_BYPASS_CONFIG);
        d
    }

    fn negotiate(&mut self, features: u64) {
        let dev = &mut self.dev;
        common_write(dev, 0x14, 0, 1);
        common_write(dev, 0x14, (status::ACKNOWLEDGE | status::DRIVER) as u32, 1);
        common_write(dev, 0x08, 0, 4);
        common_write(dev, 0x0c, features as u32, 4);
        common_write(dev, 0x08, 1, 4);
        common_write(dev, 0x0c, (features >> 32) as u32, 4);
        common_write(dev, 0x14, (status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK) as u32, 1);
        common_write(dev, 0x16, 0, 2);
        common_write(dev, 0x18, QSIZE as u32, 2);
        for (offset, addr) in [(0x20, DESC), (0x28, AVAIL), (0x30, USED)] {
            common_write(dev, offset, addr as u32, 4);
            common_write(dev, offset + 4, (addr >> 32) as u32, 4);
        }
        common_write(dev, 0x1a, 1, 2); // queue 0 -> MSI-X vector 1
        common_write(dev, 0x1c, 1, 2);
        common_write(
            dev,
            0x14,
            (status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK) as u32,
            1,
        );
    }

    /// Puts a raw descriptor chain on queue 0 and notifies; returns the used length if the device
    /// returned the buffer.
    fn submit(&mut self, descriptors: &[(u64, u32, u16, u16)]) -> Option<u32> {
        for (i, &(addr, len, flags, next)) in descriptors.iter().enumerate() {
            let at = DESC + i as u64 * 16;
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
        }
        self.mem.write_obj(0u16, GuestAddress(AVAIL + 4 + (self.avail_idx % QSIZE) as u64 * 2)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem.write_obj(self.avail_idx, GuestAddress(AVAIL + 2)).unwrap();
        self.dev.bar_write(0, 0x3000, &0u16.to_le_bytes());
        let used_idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        if used_idx == self.used_idx {
            return None;
        }
        let slot = USED + 4 + (self.used_idx % QSIZE) as u64 * 8;
        self.used_idx = used_idx;
        Some(self.mem.read_obj(GuestAddress(slot + 4)).unwrap())
    }

    /// Sends a request: `readable` then `writable` bytes; returns (used length, writable bytes).
    fn request(&mut self, readable: &[u8], writable: usize) -> (Option<u32>, Vec<u8>) {
        self.mem.write_slice(readable, GuestAddress(BUF)).unwrap();
        let out = BUF + 0x1000;
        self.mem.write_slice(&vec![0xaa; writable], GuestAddress(out)).unwrap();
        let used = self.submit(&[(BUF, readable.len() as u32, F_NEXT, 1), (out, writable as u32, F_WRITE, 0)]);
        let mut back = vec![0u8; writable];
        self.mem.read_slice(&mut back, GuestAddress(out)).unwrap();
        (used, back)
    }

    fn status_of(&mut self, readable: &[u8]) -> u8 {
        let (used, tail) = self.request(readable, 4);
        assert_eq!(used, Some(4), "request {readable:?}");
        tail[0]
    }
}

fn attach(domain: u32, endpoint: u32) -> Vec<u8> {
    let mut r = vec![1, 0, 0, 0];
    for v in [domain, endpoint, 0, 0] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r
}

fn map(domain: u32, start: u64, end: u64, phys: u64, flags: u32) -> Vec<u8> {
    let mut r = vec![3, 0, 0, 0];
    r.extend_from_slice(&domain.to_le_bytes());
    for v in [start, end, phys] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r.extend_from_slice(&flags.to_le_bytes());
    r
}

fn unmap(domain: u32, start: u64, end: u64) -> Vec<u8> {
    let mut r = vec![4, 0, 0, 0];
    r.extend_from_slice(&domain.to_le_bytes());
    for v in [start, end] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r.extend_from_slice(&[0; 4]);
    r
}

#[test]
fn transport_identity_and_negotiation() {
    let mut d = Driver::new(&[8]);
    assert_eq!(d.dev.config_read(0), 0x1057_1af4, "virtio-iommu-pci");
    assert_eq!(d.dev.config_read(2) >> 8, 0x080600, "class: IOMMU");
    let status = common_read(&mut d.dev, 0x14, 1) as u8;
    assert_eq!(status & status::DRIVER_OK, status::DRIVER_OK);
    assert_eq!(common_read(&mut d.dev, 0x12, 2), 2, "two queues");
    // A driver that does not accept VERSION_1 is refused at FEATURES_OK.
    d.negotiate(iommu::F_MAP_UNMAP);
    assert_eq!(common_read(&mut d.dev, 0x14, 1) as u8 & status::FEATURES_OK, 0);
    let mut page_size_mask = [0u8; 8];
    d.dev.bar_read(0, 0x2000, &mut page_size_mask);
    assert_eq!(u64::from_le_bytes(page_size_mask), iommu::PAGE_SIZE_MASK);
}

#[test]
fn requests_get_precise_status_codes() {
    let mut d = Driver::new(&[8, 16]);
    assert_eq!(d.status_of(&attach(1, 99)), 6, "NOENT: no such endpoint");
    assert_eq!(d.status_of(&attach(1, 8)), 0);
    assert_eq!(d.status_of(&map(1, 0x1000, 0x1fff, 0x8000, 3)), 0);
    assert_eq!(d.status_of(&map(1, 0x1000, 0x1fff, 0x9000, 3)), 4, "INVAL: overlap");
    assert_eq!(d.status_of(&map(2, 0x1000, 0x1fff, 0x9000, 3)), 6, "NOENT: no such domain");
    assert_eq!(d.status_of(&map(1, 0x3000, 0x3fff, 64 << 20, 3)), 5, "RANGE: past guest memory");
    assert_eq!(d.status_of(&map(1, 0xfee0_0000, 0xfee0_0fff, 0x9000, 3)), 4, "INVAL: MSI window");
    assert_eq!(d.status_of(&unmap(1, 0x1000, 0x17ff)), 5, "RANGE: would split");
    assert_eq!(d.status_of(&unmap(1, 0, 0xffff)), 0);
    assert_eq!(d.status_of(&map(1, 0x1000, 0x1fff, 0x8000, 3)[..20]), 4, "INVAL: short body");
    let mut bad_reserved = attach(1, 16);
    bad_reserved[16] = 1;
    assert_eq!(d.status_of(&bad_reserved), 4, "INVAL: reserved bytes");
    // Unknown type: not written, used length 0.
    assert_eq!(d.request(&[9, 0, 0, 0, 0, 0, 0, 0], 4), (Some(0), vec![0xaa; 4]));
    // No room for the tail: returned unwritten.
    assert_eq!(d.request(&attach(1, 8), 2).0, Some(0));
    let counts = d.dev.device().handle().counts();
    assert_eq!((counts.maps, counts.unmaps, counts.live_mappings), (1, 1, 0));
    assert!(counts.failed_requests >= 8);
}

#[test]
fn probe_reports_the_msi_window() {
    let mut d = Driver::new(&[8]);
    let mut probe = vec![5, 0, 0, 0];
    probe.extend_from_slice(&8u32.to_le_bytes());
    probe.extend_from_slice(&[0; 64]);
    let (used, out) = d.request(&probe, iommu::PROBE_SIZE as usize + 4);
    assert_eq!(used, Some(iommu::PROBE_SIZE + 4));
    assert_eq!(&out[0..4], &[1, 0, 20, 0], "RESV_MEM, 20 bytes");
    assert_eq!(out[4], 1, "MSI");
    assert_eq!(u64::from_le_bytes(out[8..16].try_into().unwrap()), 0xfee0_0000);
    assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 0xfeef_ffff);
    assert!(out[24..iommu::PROBE_SIZE as usize].iter().all(|&b| b == 0));
    assert_eq!(out[iommu::PROBE_SIZE as usize], 0, "status OK");
    let (used, out) = d.request(&probe, 100);
    assert_eq!((used, out[96]), (Some(100), 4), "INVAL: properties buffer too small");
}

#[test]
fn completions_raise_the_queue_vector() {
    let mut d = Driver::new(&[8]);
    // Program MSI-X vector 1 and enable MSI-X (capability at 0x40, control at 0x42).
    d.dev.bar_write(0, 0x4000 + 16, &0xfee0_0000u32.to_le_bytes());
    d.dev.bar_write(0, 0x4000 + 16 + 8, &0x41u32.to_le_bytes());
    d.dev.bar_write(0, 0x4000 + 16 + 12, &0u32.to_le_bytes());
    d.dev.config_write(0x42, &0x8000u16.to_le_bytes());
    assert_eq!(d.interrupts.irqfds.lock().unwrap().len(), 1);
    assert_eq!(d.status_of(&attach(1, 8)), 0);
    let mut isr = [0u8];
    d.dev.bar_read(0, 0x1000, &mut isr);
    assert_eq!(isr[0], 1, "ISR shows the queue interrupt, and reading clears it");
    d.dev.bar_read(0, 0x1000, &mut isr);
    assert_eq!(isr[0], 0);
}

#[test]
fn a_restored_transport_goes_on_with_the_same_queue_domains_and_vectors() {
    let mut d = Driver::new(&[8, 16]);
    d.dev.bar_write(0, 0x4000 + 16, &0xfee0_0000u32.to_le_bytes());
    d.dev.bar_write(0, 0x4000 + 16 + 8, &0x41u32.to_le_bytes());
    d.dev.bar_write(0, 0x4000 + 16 + 12, &0u32.to_le_bytes());
    d.dev.config_write(0x42, &0x8000u16.to_le_bytes());
    assert_eq!(d.status_of(&attach(1, 8)), 0);
    assert_eq!(d.status_of(&map(1, 0x1000, 0x1fff, 0x8000, 3)), 0);
    let saved = d.dev.snapshot_state().expect("the virtio-iommu saves its state");
    let json = serde_json::to_string(&saved).unwrap();

    // A new device on the same guest memory, in its reset state, given the saved state: the
    // driver goes on where it was (its next request is the queue's next entry).
    let interrupts = Arc::new(FakeInterrupts::default());
    let iommu = VirtioIommu::new([8, 16], vec![(0, MEM as u64)], false);
    let handle = iommu.handle();
    let dev = VirtioPciDevice::new("viommu", iommu, iommu::PCI_CLASS, d.mem.clone(), interrupts.clone(), 0xc000_0000)
        .unwrap();
    let mut restored = Driver { mem: d.mem.clone(), dev, interrupts, avail_idx: d.avail_idx, used_idx: d.used_idx };
    restored.dev.restore_state(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(restored.interrupts.irqfds.lock().unwrap().len(), 1, "MSI-X vector 1 routed again");
    assert_eq!(common_read(&mut restored.dev, 0x14, 1) as u8 & status::DRIVER_OK, status::DRIVER_OK);
    assert_eq!(handle.translate(8, 0x1004, 4, iommu::domains::Access::Write), Ok(0x8004), "the mapping");
    assert_eq!(restored.status_of(&map(1, 0x3000, 0x3fff, 0x9000, 3)), 0, "the queue goes on");
    assert_eq!(restored.status_of(&attach(1, 16)), 0);
    assert_eq!(handle.translate(16, 0x3000, 4, iommu::domains::Access::Read), Ok(0x9000));

    let other = VirtioIommu::new([8], vec![(0, MEM as u64)], false);
    let mut other =
        VirtioPciDevice::new("viommu", other, iommu::PCI_CLASS, d.mem.clone(), d.interrupts.clone(), 0).unwrap();
    assert!(other.restore_state(&saved).is_err(), "another IOMMU's endpoints");
}

#[test]
fn pci_cfg_capability_reaches_the_bar() {
    let mut d = Driver::new(&[8]);
    // Find the VIRTIO_PCI_CAP_PCI_CFG capability (cfg_type 5) by walking the list.
    let mut cap = (d.dev.config_read(0x34 / 4) & 0xff) as usize;
    while cap != 0 {
        let dword = d.dev.config_read(cap / 4);
        if dword & 0xff == 0x09 && (dword >> 24) & 0xff == 5 {
            break;
        }
        cap = ((dword >> 8) & 0xff) as usize;
    }
    assert_ne!(cap, 0, "the capability exists");
    d.dev.config_write(cap + 4, &[0]); // BAR 0
    d.dev.config_write(cap + 8, &0x12u32.to_le_bytes()); // num_queues in the common config
    d.dev.config_write(cap + 12, &2u32.to_le_bytes());
    assert_eq!(d.dev.config_read((cap + 16) / 4) & 0xffff, 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Malformed chains never panic: each is answered with a status or returned unwritten.
    #[test]
    fn malformed_requests_never_panic(
        readable in proptest::collection::vec(any::<u8>(), 0..120),
        writable in 0usize..600,
        kind in 1u8..7,
        wild in proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u16>(), 0u16..20), 0..6),
    ) {
        let mut d = Driver::new(&[8]);
        let mut request = readable.clone();
        if let Some(first) = request.first_mut() {
            *first = kind;
        }
        let (used, out) = d.request(&request, writable);
        if let Some(len) = used
            && len >= 4
        {
            prop_assert!(out[len as usize - 4] <= 8, "a status code");
        }
        // Arbitrary descriptors: addresses anywhere, loops, indirect flags, huge lengths.
        let _ = d.submit(&wild);
        prop_assert!(d.status_of(&attach(1, 8)) == 0, "the queue still works");
    }
}
