//! A software Microchip LAN7430 (1055:7430) that the unmodified Linux lan743x driver drives,
//! served over vfio-user.
//!
//! - BAR 0 (8 KiB, 64-bit): the registers ([`nic`]): identity and resets, the MAC and its MDIO
//!   bus to the internal PHY ([`phy`]), the receive filter, the interrupt block, the DMA
//!   controller, 4 RX and 1 TX channels ([`rings`]) with their descriptor spacing, statistics.
//! - BAR 2 (4 KiB, 64-bit): the MSI-X table and pending bits (8 vectors), emulated by the VMM.
//! - A data-path thread takes frames from the backend ([`crate::wire`]: a TAP or the frame
//!   generator) into RX channel 0 while the vfio-user thread serves register accesses;
//!   transmits happen on the TX tail write.
//!
//! DMA reaches only what the client mapped ([`DmaSpace`]): anything else is refused, counted as a
//! fault, and the frame is dropped.

pub mod nic;
pub mod phy;
pub mod regs;
pub mod rings;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use self::nic::{BAR0_SIZE, Effects, Nic};
use super::dma::DmaSpace;
use super::server::{Model, ModelBar, MsixVectors};
use crate::aqc100::{MacAddress, NicStatus};
use crate::wire::backend::{Backend, FrameSource, Readiness};
use devices::pci::config::BarKind;
use devices::pci::{PciConfiguration, PciIds, msix};
use vm_spec::counters::ModelCounters;

/// Microchip's (SMSC's) vendor ID.
pub const VENDOR: u16 = 0x1055;
/// The LAN7430's device ID.
pub const DEVICE: u16 = 0x7430;
/// The MAC address used when none is given: locally administered, stable.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x10, 0x55, 0x74, 0x30, 0x01];
const BAR2_SIZE: u64 = 0x1000;
/// Frames handled per lock of the NIC by the data path.
const RX_BATCH: usize = 64;
/// The longest the data path sleeps before looking at the link again.
const IDLE_WAIT: Duration = Duration::from_millis(100);

fn config_space() -> PciConfiguration {
    let ids = PciIds {
        vendor: VENDOR,
        device: DEVICE,
        subsystem_vendor: VENDOR,
        subsystem: 0x0001,
        class: [0x02, 0x00, 0x00],
        revision: 0x00,
    };
    let mut config = PciConfiguration::new(ids);
    config.add_bar(0, BAR0_SIZE, BarKind::Memory64).expect("valid BAR");
    config.add_bar(2, BAR2_SIZE, BarKind::Memory64).expect("valid BAR");
    // MSI-X: table at BAR 2 offset 0, pending bits at BAR 2 offset 0x800.
    let mut body = Vec::new();
    body.extend_from_slice(&(nic::VECTORS as u16 - 1).to_le_bytes());
    body.extend_from_slice(&2u32.to_le_bytes());
    body.extend_from_slice(&(0x800u32 | 2).to_le_bytes());
    let writable = (msix::CONTROL_ENABLE | msix::CONTROL_FUNCTION_MASK).to_le_bytes();
    config.add_capability(msix::CAPABILITY_ID, &body, &writable).expect("room for MSI-X");
    config
}

struct Shared {
    nic: Mutex<Nic>,
    dma: Arc<DmaSpace>,
    vectors: Arc<MsixVectors>,
    wake: EventFd,
    stop: AtomicBool,
}

impl Shared {
    fn nic(&self) -> MutexGuard<'_, Nic> {
        self.nic.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn apply(&self, effects: Effects) {
        let mut vectors = effects.vectors;
        while vectors != 0 {
            let vector = vectors.trailing_zeros();
            vectors &= vectors - 1;
            if self.vectors.signal(vector as usize) {
                self.dma.count_interrupt();
            }
        }
        if effects.rx_changed {
            let _ = self.wake.write(1);
        }
    }
}

/// A handle for controlling a running model from another thread (link, status).
#[derive(Clone)]
pub struct Lan743xHandle(Arc<Shared>);

impl Lan743xHandle {
    /// Sets the link administratively up or down.
    pub fn set_link(&self, up: bool) {
        let effects = self.0.nic().set_admin_up(up);
        self.0.apply(effects);
    }

    /// The model's status and counters.
    pub fn status(&self) -> NicStatus {
        let nic = self.0.nic();
        let t = nic.totals();
        NicStatus {
            link_mbps: nic.link_mbps(),
            mac: MacAddress(nic.mac()),
            rx_frames: t.rx_frames,
            rx_bytes: t.rx_bytes,
            rx_dropped: t.rx_dropped,
            rx_filtered: t.rx_filtered,
            rx_errors: t.rx_errors,
            tx_frames: t.tx_frames,
            tx_bytes: t.tx_bytes,
            tx_errors: t.tx_errors,
        }
    }

    /// The DMA and interrupt counters with the frames moved.
    pub fn counters(&self) -> ModelCounters {
        let t = self.0.nic().totals();
        ModelCounters {
            rx_frames: t.rx_frames,
            rx_bytes: t.rx_bytes,
            tx_frames: t.tx_frames,
            tx_bytes: t.tx_bytes,
            ..self.0.dma.counters()
        }
    }
}

/// The LAN7430 model.
pub struct Lan743x {
    config: PciConfiguration,
    shared: Arc<Shared>,
    data_path: Option<JoinHandle<()>>,
    description: String,
}

impl Lan743x {
    /// A NIC with permanent address `mac` on `backend`; starts its data-path thread.
    pub fn new(mac: MacAddress, backend: Backend) -> std::io::Result<Self> {
        let Backend { source, sink, description } = backend;
        let shared = Arc::new(Shared {
            nic: Mutex::new(Nic::new(mac.0, sink)),
            dma: Arc::new(DmaSpace::new()),
            vectors: Arc::new(MsixVectors::default()),
            wake: EventFd::new(EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let data_path =
            std::thread::Builder::new().name("lan743x-rx".into()).spawn(move || data_path(&thread_shared, source))?;
        Ok(Lan743x { config: config_space(), shared, data_path: Some(data_path), description })
    }

    /// A handle for control from other threads.
    pub fn handle(&self) -> Lan743xHandle {
        Lan743xHandle(self.shared.clone())
    }

    /// What the backend is.
    pub fn backend_description(&self) -> &str {
        &self.description
    }
}

impl Drop for Lan743x {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.shared.wake.write(1);
        if let Some(thread) = self.data_path.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until `fd` (if any) is readable, the wake eventfd fires, or `timeout` passes.
fn wait(shared: &Shared, fd: Option<i32>, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd { fd: shared.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: fd.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    let count = if fd.is_some() { 2 } else { 1 };
    // SAFETY: `fds` is a valid array of `count` pollfd structures that outlives the call.
    unsafe { libc::poll(fds.as_mut_ptr(), count, timeout.as_millis().min(i32::MAX as u128) as i32) };
    if fds[0].revents & libc::POLLIN != 0 {
        let _ = shared.wake.read();
    }
}

/// The data path: moves frames from the backend into RX channel 0 until the model is dropped.
fn data_path(shared: &Shared, mut source: Box<dyn FrameSource>) {
    let mut last_error: Option<Instant> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let carrier = source.carrier();
        let mut effects = Effects::default();
        let mut received = 0;
        let mut idle = false;
        {
            let mut nic = shared.nic();
            effects.merge(nic.set_carrier(carrier));
            while received < RX_BATCH {
                if source.lossless() && !nic.rx_room(source.max_frame()) {
                    idle = true;
                    break;
                }
                match source.receive() {
                    Ok(Some(frame)) => {
                        let (_, e) = nic.receive(frame, &shared.dma);
                        effects.merge(e);
                        received += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            tracing::warn!("backend receive failed: {e}");
                            last_error = Some(Instant::now());
                        }
                        idle = true;
                        break;
                    }
                }
            }
        }
        shared.apply(effects);
        if received == RX_BATCH {
            continue;
        }
        if idle {
            wait(shared, None, IDLE_WAIT);
            continue;
        }
        match source.readiness() {
            Readiness::Fd(fd) => wait(shared, Some(fd), IDLE_WAIT),
            Readiness::At(due) => {
                let now = Instant::now();
                if due > now {
                    wait(shared, None, (due - now).min(IDLE_WAIT));
                }
            }
            Readiness::Exhausted => wait(shared, None, IDLE_WAIT),
        }
    }
}

impl Model for Lan743x {
    fn name(&self) -> &'static str {
        "lan743x"
    }

    fn config(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn bars(&self) -> Vec<Option<ModelBar>> {
        vec![Some(ModelBar { size: BAR0_SIZE, shared: None }), None, Some(ModelBar { size: BAR2_SIZE, shared: None })]
    }

    fn msix_vectors(&self) -> u32 {
        nic::VECTORS as u32
    }

    fn bar_read(&mut self, bar: u32, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 || offset >= BAR0_SIZE {
            return;
        }
        let mut nic = self.shared.nic();
        for (i, chunk) in data.chunks_mut(4).enumerate() {
            let at = offset + 4 * i as u64;
            let word = nic.read((at & !3) as u32).to_le_bytes();
            let start = (at & 3) as usize;
            let n = chunk.len().min(4 - start);
            chunk[..n].copy_from_slice(&word[start..start + n]);
        }
    }

    fn bar_write(&mut self, bar: u32, offset: u64, data: &[u8]) {
        if bar != 0 || offset >= BAR0_SIZE {
            return;
        }
        let mut effects = Effects::default();
        {
            let mut nic = self.shared.nic();
            for (i, chunk) in data.chunks(4).enumerate() {
                let at = offset + 4 * i as u64;
                let reg = (at & !3) as u32;
                let start = (at & 3) as usize;
                let n = chunk.len().min(4 - start);
                let value = if start == 0 && n == 4 {
                    u32::from_le_bytes(chunk.try_into().expect("4 bytes"))
                } else {
                    let mut word = nic.read(reg).to_le_bytes();
                    word[start..start + n].copy_from_slice(&chunk[..n]);
                    u32::from_le_bytes(word)
                };
                let e = nic.write(reg, value, &self.shared.dma);
                effects.merge(e);
            }
        }
        self.shared.apply(effects);
    }

    fn reset(&mut self) {
        self.config = config_space();
        self.shared.nic().power_on_reset();
        let _ = self.shared.wake.write(1);
    }

    fn dma(&self) -> Arc<DmaSpace> {
        self.shared.dma.clone()
    }

    fn vectors(&self) -> Arc<MsixVectors> {
        self.shared.vectors.clone()
    }

    fn counters(&self) -> ModelCounters {
        self.handle().counters()
    }
}

#[cfg(test)]
mod tests;
