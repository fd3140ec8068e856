//! Driving the virtio-iommu: handshake, PROBE, ATTACH, then timed MAP/UNMAP pairs whose
//! completions must arrive as MSI-X interrupts.

use core::cell::UnsafeCell;

use crate::acpi::{self, Acpi};
use crate::pci::{Ecam, Function};
use crate::virtio::{NO_VECTOR, QueueMemory, VirtioPci, Virtqueue};
use crate::{interrupts, json, lapic, report, time};

const VIRTIO_VENDOR: u16 = 0x1af4;
const VIRTIO_IOMMU_ID: u16 = 0x1057;
const F_INPUT_RANGE: u64 = 1 << 0;
const F_DOMAIN_RANGE: u64 = 1 << 1;
const F_MAP_UNMAP: u64 = 1 << 2;
const F_PROBE: u64 = 1 << 4;
const T_ATTACH: u8 = 1;
const T_MAP: u8 = 3;
const T_UNMAP: u8 = 4;
const T_PROBE: u8 = 5;
/// A request type the device does not know: it returns the buffer unwritten. Its round trip is
/// the transport's cost alone (notify exit, used ring, MSI-X), the reference for MAP and UNMAP.
const T_NULL: u8 = 0x7f;
const MAP_READ_WRITE: u32 = 3;
/// What `Viommu::request` reports for a buffer the device returned without a status.
const NO_STATUS: u8 = 0xff;
/// The interrupt vector request completions arrive on.
const COMPLETION_VECTOR: u8 = 0x41;
/// MSI-X table entry of the request queue (entry 0 stays for configuration changes).
const QUEUE_MSIX_ENTRY: u16 = 1;
/// Where the probe maps: an IOVA outside the MSI window, onto RAM the probe does not use.
const IOVA: u64 = 0x4000_0000;
const GPA: u64 = 0x40_0000;
const SIZES: [u64; 2] = [4096, 2 << 20];
/// Most timed operations kept per kind and size.
const MAX_SAMPLES: usize = 8192;
/// Longest wait for one completion.
const COMPLETION_TIMEOUT_US: u64 = 1_000_000;
/// Bytes of a PROBE request's properties the probe offers (the device asks for at most this).
const MAX_PROBE_SIZE: usize = 1024;

/// Round-trip times, by kind (map, unmap) and size (4 KiB, 2 MiB), and of null requests.
struct Samples {
    ns: [[[u32; MAX_SAMPLES]; 2]; 2],
    len: [[usize; 2]; 2],
    null: [u32; MAX_SAMPLES],
    null_len: usize,
}

struct SampleCell(UnsafeCell<Samples>);

// SAFETY: the probe's single CPL3 thread is the only user.
unsafe impl Sync for SampleCell {}

static SAMPLES: SampleCell = SampleCell(UnsafeCell::new(Samples {
    ns: [[[0; MAX_SAMPLES]; 2]; 2],
    len: [[0; 2]; 2],
    null: [0; MAX_SAMPLES],
    null_len: 0,
}));

struct QueueCell(UnsafeCell<QueueMemory>);

// SAFETY: as above.
unsafe impl Sync for QueueCell {}

static QUEUE: QueueCell = QueueCell(UnsafeCell::new(QueueMemory::new()));

/// The event queue: the device reports faults there. A device may refuse to start without it
/// (Cloud Hypervisor's does), and Linux's driver always sets it up and fills it.
static EVENT_QUEUE: QueueCell = QueueCell(UnsafeCell::new(QueueMemory::new()));

/// Buffers offered on the event queue (a fault report is 24 bytes).
const EVENT_BUFFERS: usize = 8;

struct EventCell(UnsafeCell<[[u8; 64]; EVENT_BUFFERS]>);

// SAFETY: as above; the device writes these, the probe only hands them over.
unsafe impl Sync for EventCell {}

static EVENTS: EventCell = EventCell(UnsafeCell::new([[0; 64]; EVENT_BUFFERS]));

#[repr(C, align(64))]
struct Buffers {
    request: [u8; 128],
    reply: [u8; MAX_PROBE_SIZE + 4],
}

struct BufferCell(UnsafeCell<Buffers>);

// SAFETY: as above.
unsafe impl Sync for BufferCell {}

static BUFFERS: BufferCell = BufferCell(UnsafeCell::new(Buffers { request: [0; 128], reply: [0; MAX_PROBE_SIZE + 4] }));

fn completions() -> u64 {
    interrupts::count(COMPLETION_VECTOR)
}

/// A driven virtio-iommu, kept for other devices' DMA (the test device maps through it).
pub struct Viommu {
    transport: VirtioPci,
    queue: Virtqueue,
    events: Virtqueue,
    tsc_khz: u64,
    interrupts_ok: bool,
    /// The first domain ID the device allows.
    pub first_domain: u32,
    ranges: [(u16, u16); 8],
    range_count: usize,
}

impl Viommu {
    /// Whether the VIOT puts requester ID `rid` behind this IOMMU.
    pub fn translates(&self, rid: u16) -> bool {
        self.ranges[..self.range_count].iter().any(|&(first, last)| (first..=last).contains(&rid))
    }

    fn simple(&mut self, request: &[u8], what: &'static str) -> Result<(), &'static str> {
        match self.request(request, 4) {
            Some((0, _)) => Ok(()),
            Some(_) => Err(what),
            None => Err("a virtio-iommu request did not complete"),
        }
    }

    /// ATTACH `endpoint` to `domain`.
    pub fn attach(&mut self, domain: u32, endpoint: u32) -> Result<(), &'static str> {
        self.simple(&attach(domain, endpoint), "ATTACH failed")
    }

    /// MAP `[iova, iova + size)` to `gpa`, readable and writable.
    pub fn map(&mut self, domain: u32, iova: u64, size: u64, gpa: u64) -> Result<(), &'static str> {
        self.simple(&map(domain, iova, size, gpa), "MAP failed")
    }

    /// UNMAP `[iova, iova + size)`.
    pub fn unmap(&mut self, domain: u32, iova: u64, size: u64) -> Result<(), &'static str> {
        self.simple(&unmap(domain, iova, size), "UNMAP failed")
    }

    /// Sends one request and waits for its completion interrupt (or polls the used ring, without
    /// MSI-X). Returns (status byte of the tail, or `NO_STATUS`; round trip in ns) or `None` if
    /// the request never completed.
    fn request(&mut self, request: &[u8], reply_len: usize) -> Option<(u8, u64)> {
        // SAFETY: single-threaded; the device only touches these while the request is in flight,
        // and the probe waits for it to finish.
        let buffers = unsafe { &mut *BUFFERS.0.get() };
        buffers.request[..request.len()].copy_from_slice(request);
        let before = completions();
        let start = time::tsc();
        self.queue.submit(&buffers.request[..request.len()], &mut buffers.reply[..reply_len]);
        self.transport.notify(&self.queue);
        let deadline = time::deadline_after_micros(COMPLETION_TIMEOUT_US);
        let end = if self.transport.has_msix() {
            let interrupted = time::wait_until(deadline, || completions() != before);
            self.interrupts_ok &= interrupted;
            time::tsc()
        } else {
            let queue = &self.queue;
            time::wait_until(deadline, || queue.ready());
            time::tsc()
        };
        // Without the interrupt the request may still have completed: that is a failure of
        // interrupt delivery, not of the request.
        let used = self.queue.poll()? as usize;
        let ns = (end - start) * 1_000_000 / self.tsc_khz;
        // The status is the last byte the device wrote; a buffer returned unwritten has none.
        let status = if (4..=reply_len).contains(&used) { buffers.reply[used - 4] } else { NO_STATUS };
        Some((status, ns))
    }
}

fn header(kind: u8, out: &mut [u8]) {
    out[..4].copy_from_slice(&[kind, 0, 0, 0]);
}

fn attach(domain: u32, endpoint: u32) -> [u8; 20] {
    let mut r = [0u8; 20];
    header(T_ATTACH, &mut r);
    r[4..8].copy_from_slice(&domain.to_le_bytes());
    r[8..12].copy_from_slice(&endpoint.to_le_bytes());
    r
}

fn map(domain: u32, iova: u64, size: u64, gpa: u64) -> [u8; 36] {
    let mut r = [0u8; 36];
    header(T_MAP, &mut r);
    r[4..8].copy_from_slice(&domain.to_le_bytes());
    r[8..16].copy_from_slice(&iova.to_le_bytes());
    r[16..24].copy_from_slice(&(iova + size - 1).to_le_bytes());
    r[24..32].copy_from_slice(&gpa.to_le_bytes());
    r[32..36].copy_from_slice(&MAP_READ_WRITE.to_le_bytes());
    r
}

fn unmap(domain: u32, iova: u64, size: u64) -> [u8; 28] {
    let mut r = [0u8; 28];
    header(T_UNMAP, &mut r);
    r[4..8].copy_from_slice(&domain.to_le_bytes());
    r[8..16].copy_from_slice(&iova.to_le_bytes());
    r[16..24].copy_from_slice(&(iova + size - 1).to_le_bytes());
    r
}

fn probe_request(endpoint: u32) -> [u8; 72] {
    let mut r = [0u8; 72];
    header(T_PROBE, &mut r);
    r[4..8].copy_from_slice(&endpoint.to_le_bytes());
    r
}

/// Whether the PROBE reply lists the MSI doorbell window as a reserved region.
fn lists_msi_window(properties: &[u8]) -> bool {
    let mut at = 0;
    while at + 4 <= properties.len() {
        let kind = u16::from_le_bytes([properties[at], properties[at + 1]]) & 0xfff;
        let len = u16::from_le_bytes([properties[at + 2], properties[at + 3]]) as usize;
        if kind == 0 {
            return false;
        }
        if kind == 1 && len >= 20 && at + 4 + len <= properties.len() {
            let p = &properties[at + 4..];
            let start = u64::from_le_bytes(p[4..12].try_into().unwrap_or_default());
            let end = u64::from_le_bytes(p[12..20].try_into().unwrap_or_default());
            if p[0] == 1 && start == 0xfee0_0000 && end == 0xfeef_ffff {
                return true;
            }
        }
        at += 4 + len;
    }
    false
}

/// The `q`th percentile (nearest rank below) of sorted samples.
fn percentile(sorted: &[u32], q: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as u64 * q / 100) as usize] as u64
}

/// The `q`th percentile of two sorted sample sets taken together.
fn merged_percentile(a: &[u32], b: &[u32], q: u64) -> u64 {
    let total = a.len() + b.len();
    if total == 0 {
        return 0;
    }
    let rank = ((total - 1) as u64 * q / 100) as usize;
    let (mut i, mut j) = (0, 0);
    loop {
        let take_a = j >= b.len() || (i < a.len() && a[i] <= b[j]);
        let value = if take_a { a[i] } else { b[j] };
        if i + j == rank {
            return value as u64;
        }
        if take_a { i += 1 } else { j += 1 }
    }
}

/// Runs the virtio-iommu checks and reports `{"probe":"viommu",...}`. `ops` MAP/UNMAP pairs
/// alternate 4 KiB and 2 MiB. `required` makes a missing device a failure. Returns the driver for
/// other devices to use.
pub fn run(acpi: &Acpi, ecam: Ecam, functions: &[Function], ops: u32, required: bool) -> Option<Viommu> {
    let Some(f) = functions.iter().find(|f| f.vendor == VIRTIO_VENDOR && f.id == VIRTIO_IOMMU_ID) else {
        if required {
            report::fail("probe.viommu_ops given, but there is no virtio-iommu");
        }
        return None;
    };
    match drive(acpi, ecam, functions, f, ops) {
        Ok(viommu) => Some(viommu),
        Err(why) => {
            json::section("viommu", |o| {
                o.bool("attached", false).str("error", why);
            });
            report::fail(why);
            None
        }
    }
}

fn drive(acpi: &Acpi, ecam: Ecam, functions: &[Function], f: &Function, ops: u32) -> Result<Viommu, &'static str> {
    let transport = VirtioPci::new(ecam, f)?;
    transport.negotiate(F_PROBE | F_INPUT_RANGE | F_DOMAIN_RANGE, F_MAP_UNMAP)?;
    let domain: u32 = transport.config::<u32>(24).max(1);
    let probe_size = (transport.config::<u32>(32) as usize).min(MAX_PROBE_SIZE);
    // SAFETY: single-threaded; the queue memory is handed to the device once.
    let queue_memory = unsafe { &mut *QUEUE.0.get() };
    let queue = transport.setup_queue(0, queue_memory, QUEUE_MSIX_ENTRY)?;
    // SAFETY: as above, the event queue's memory and buffers.
    let (event_memory, event_buffers) = unsafe { (&mut *EVENT_QUEUE.0.get(), &mut *EVENTS.0.get()) };
    let mut events = transport.setup_queue(1, event_memory, NO_VECTOR)?;
    events.offer(event_buffers);
    transport.msix_route(QUEUE_MSIX_ENTRY, lapic::id(), COMPLETION_VECTOR);
    transport.driver_ok();

    // The endpoint: the first function the VIOT puts behind this IOMMU.
    let viot = acpi.viot.ok_or("no VIOT table describes the virtio-iommu")?;
    let mut ranges = [(0u16, 0u16); 8];
    let (_, count) = acpi::viot_pci_ranges(viot, &mut ranges);
    let endpoint = functions
        .iter()
        .map(Function::requester_id)
        .find(|rid| ranges[..count].iter().any(|&(first, last)| (first..=last).contains(rid)))
        .ok_or("no PCI function is behind the virtio-iommu")? as u32;

    let tsc_khz = time::tsc_khz().ok_or("the TSC rate is unknown (no hypervisor timing leaf, no ACPI PM timer)")?;
    let mut driver = Viommu {
        transport,
        queue,
        events,
        tsc_khz,
        interrupts_ok: true,
        first_domain: domain,
        ranges,
        range_count: count,
    };
    exercise(&mut driver, domain, endpoint, probe_size, ops)?;
    Ok(driver)
}

fn exercise(driver: &mut Viommu, domain: u32, endpoint: u32, probe_size: usize, ops: u32) -> Result<(), &'static str> {
    let (status, _) = driver.request(&probe_request(endpoint), probe_size + 4).ok_or("PROBE did not complete")?;
    if status != 0 {
        return Err("PROBE failed");
    }
    // SAFETY: the request completed; the device no longer writes the buffer.
    let buffers = unsafe { &*BUFFERS.0.get() };
    let msi_window = lists_msi_window(&buffers.reply[..probe_size]);
    let (status, _) = driver.request(&attach(domain, endpoint), 4).ok_or("ATTACH did not complete")?;
    if status != 0 {
        return Err("ATTACH failed");
    }
    // SAFETY: single-threaded.
    let samples = unsafe { &mut *SAMPLES.0.get() };
    samples.len = [[0; 2]; 2];
    let (mut maps, mut unmaps) = (0u64, 0u64);
    for i in 0..ops {
        let size_index = (i % 2) as usize;
        let size = SIZES[size_index];
        for (kind, request) in [(0usize, &map(domain, IOVA, size, GPA)[..]), (1, &unmap(domain, IOVA, size)[..])] {
            let (status, ns) = driver.request(request, 4).ok_or("a MAP or UNMAP did not complete")?;
            if status != 0 {
                return Err(if kind == 0 { "MAP failed" } else { "UNMAP failed" });
            }
            if kind == 0 {
                maps += 1
            } else {
                unmaps += 1
            }
            let n = &mut samples.len[kind][size_index];
            if *n < MAX_SAMPLES {
                samples.ns[kind][size_index][*n] = ns as u32;
                *n += 1;
            }
        }
    }
    samples.null_len = 0;
    for _ in 0..ops.min(MAX_SAMPLES as u32) {
        let (_, ns) = driver.request(&[T_NULL, 0, 0, 0], 4).ok_or("a null request did not complete")?;
        samples.null[samples.null_len] = ns as u32;
        samples.null_len += 1;
    }
    let null = &mut samples.null[..samples.null_len];
    null.sort_unstable();
    let (null_median, null_p99) = (percentile(null, 50), percentile(null, 99));
    let msix = driver.transport.has_msix();
    let interrupts_ok = driver.interrupts_ok;
    let fault_events = driver.events.used();
    let mut by_size = [[(0u64, 0u64); 2]; 2];
    for (kind, row) in by_size.iter_mut().enumerate() {
        for (size, cell) in row.iter_mut().enumerate() {
            let n = samples.len[kind][size];
            let slice = &mut samples.ns[kind][size][..n];
            slice.sort_unstable();
            *cell = (percentile(slice, 50), percentile(slice, 99));
        }
    }
    let both = |kind: usize, q: u64| {
        let (a, b) = (&samples.ns[kind][0][..samples.len[kind][0]], &samples.ns[kind][1][..samples.len[kind][1]]);
        merged_percentile(a, b, q)
    };
    let (map_median, map_p99) = (both(0, 50), both(0, 99));
    let (unmap_median, unmap_p99) = (both(1, 50), both(1, 99));
    json::section("viommu", |o| {
        o.bool("attached", true)
            .u64("endpoint", endpoint as u64)
            .u64("domain", domain as u64)
            .bool("probe_msi_window", msi_window)
            .u64("maps", maps)
            .u64("unmaps", unmaps)
            .u64("map_ns_median", map_median)
            .u64("unmap_ns_median", unmap_median)
            .u64("map_ns_p99", map_p99)
            .u64("unmap_ns_p99", unmap_p99)
            .u64("map_4k_ns_median", by_size[0][0].0)
            .u64("map_4k_ns_p99", by_size[0][0].1)
            .u64("unmap_4k_ns_median", by_size[1][0].0)
            .u64("unmap_4k_ns_p99", by_size[1][0].1)
            .u64("map_2m_ns_median", by_size[0][1].0)
            .u64("map_2m_ns_p99", by_size[0][1].1)
            .u64("unmap_2m_ns_median", by_size[1][1].0)
            .u64("unmap_2m_ns_p99", by_size[1][1].1)
            .u64("null_ns_median", null_median)
            .u64("null_ns_p99", null_p99)
            .bool("msix", msix)
            .str("completion", if msix { "msix" } else { "polled" })
            .u64("fault_events", fault_events as u64);
    });
    if !msi_window {
        report::fail("PROBE did not report the MSI window as reserved");
    }
    if msix && !interrupts_ok {
        report::fail("a virtio-iommu completion did not arrive as an MSI-X interrupt");
    }
    Ok(())
}
