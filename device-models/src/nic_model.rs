//! What the NIC models share around their register blocks ([`NicCore`]): the state both
//! threads reach (the registers behind a mutex, the DMA space, the MSI-X eventfds), the
//! data-path thread that moves frames from the wire into the NIC, the handle the control socket
//! uses, and the vfio-user [`Model`] over BAR 0 (registers) and BAR 2 (MSI-X, emulated by the
//! client).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::dma::DmaSpace;
use crate::pcie_link::Side;
use crate::server::{Model, ModelBar, MsixVectors};
use crate::wire::backend::{Backend, FrameSink, FrameSource, Readiness};
use pci::config::BarKind;
use pci::{PciConfiguration, PciIds, msix};
use vm_spec::counters::ModelCounters;
use vm_spec::pcie_link::LinkProfile;

/// Frames handled per lock of the NIC by the data path.
const RX_BATCH: usize = 64;
/// The longest the data path sleeps before looking at the link again.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// BAR 2: the MSI-X table and pending bits.
pub const BAR2_SIZE: u64 = 0x1000;

/// What a register access or a received frame asks of the model's plumbing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effects {
    /// MSI-X vectors to signal (a bit mask).
    pub vectors: u32,
    /// The receive side may be able to take frames now (wake the data path).
    pub rx_changed: bool,
}

impl Effects {
    /// Adds what `other` asks for.
    pub fn merge(&mut self, other: Effects) {
        self.vectors |= other.vectors;
        self.rx_changed |= other.rx_changed;
    }
}

pub use vm_spec::model_control::{MacAddress, NicCounters, NicStatus};

/// PCI Express capability ID.
const PCIE_CAPABILITY_ID: u8 = 0x10;
/// Device Capabilities: Function Level Reset supported.
const DEVCAP_FLR: u32 = 1 << 28;
/// Device Capabilities: role-based error reporting (every PCIe 1.1+ function sets it).
const DEVCAP_RBER: u32 = 1 << 15;
/// Offset of Device Control in the PCI Express capability.
const DEVCTL: usize = 8;
/// Device Control: Initiate Function Level Reset (writes of 1 reset the function; reads 0).
const DEVCTL_FLR: u16 = 1 << 15;
/// Device Control at reset: relaxed ordering and no-snoop enabled, 128-byte payloads.
const DEVCTL_DEFAULT: u16 = (1 << 4) | (1 << 11);

/// A NIC's configuration space: `ids`, BAR 0 (`bar0_size`, 64-bit, the registers), BAR 2
/// (64-bit: the MSI-X table at 0 and the pending bits at 0x800, `vectors` of them), and a PCI
/// Express endpoint capability for `link` with Function Level Reset, so that the host's
/// vfio-pci can reset the function whenever a VM takes or gives back the card, as it does a
/// real NIC. Returns the space and the offset of Device Control.
pub fn config_space(ids: PciIds, bar0_size: u64, vectors: u16, link: &LinkProfile) -> (PciConfiguration, usize) {
    let mut config = PciConfiguration::new(ids);
    config.add_bar(0, bar0_size, BarKind::Memory64).expect("valid BAR");
    config.add_bar(2, BAR2_SIZE, BarKind::Memory64).expect("valid BAR");
    let mut body = Vec::new();
    body.extend_from_slice(&(vectors - 1).to_le_bytes());
    body.extend_from_slice(&2u32.to_le_bytes());
    body.extend_from_slice(&(0x800u32 | 2).to_le_bytes());
    let writable = (msix::CONTROL_ENABLE | msix::CONTROL_FUNCTION_MASK).to_le_bytes();
    config.add_capability(msix::CAPABILITY_ID, &body, &writable).expect("room for MSI-X");
    let pcie = config.add_capability(PCIE_CAPABILITY_ID, &pcie_capability(link), &pcie_writable()).expect("room");
    (config, pcie + DEVCTL)
}

/// The body of a version 2 PCI Express capability (after ID and next pointer) of an endpoint on
/// `link`: FLR, its link speed and width, the chip's largest read request.
fn pcie_capability(link: &LinkProfile) -> Vec<u8> {
    // Link speed codes: 1 = 2.5 GT/s, 2 = 5, 3 = 8, 4 = 16.
    let speed = match link.gt_per_s {
        s if s <= 2.5 => 1u32,
        s if s <= 5.0 => 2,
        s if s <= 8.0 => 3,
        _ => 4,
    };
    let lanes = link.lanes.min(32);
    let read_request = (link.max_read_request.max(128) / 128).ilog2().min(5) as u16;
    let mut body = Vec::with_capacity(0x3a);
    body.extend_from_slice(&2u16.to_le_bytes()); // version 2, endpoint
    body.extend_from_slice(&(DEVCAP_FLR | DEVCAP_RBER).to_le_bytes());
    body.extend_from_slice(&(DEVCTL_DEFAULT | read_request << 12).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes()); // device status
    body.extend_from_slice(&(speed | lanes << 4).to_le_bytes()); // link capabilities
    body.extend_from_slice(&0u16.to_le_bytes()); // link control
    body.extend_from_slice(&((speed | lanes << 4) as u16).to_le_bytes()); // link status
    body.resize(0x3a, 0); // slot, root, and the version 2 registers: none
    body
}

/// What the guest may change in the PCI Express capability: Device Control but its FLR bit
/// (which starts a reset and reads 0), and Link Control.
fn pcie_writable() -> Vec<u8> {
    let mut writable = vec![0u8; 0x3a];
    let devctl = (!DEVCTL_FLR).to_le_bytes();
    writable[DEVCTL - 2..DEVCTL].copy_from_slice(&devctl);
    writable[0x10 - 2..0x12 - 2].copy_from_slice(&0x0fc3u16.to_le_bytes());
    writable
}

/// Whether a write of `data` at `offset` sets Device Control's FLR bit (at `devctl`).
fn starts_flr(devctl: usize, offset: usize, data: &[u8]) -> bool {
    let high = devctl + 1;
    high >= offset && high - offset < data.len() && data[high - offset] & (DEVCTL_FLR >> 8) as u8 != 0
}

/// A NIC chip's registers and link, implemented where the chip's register file is (its
/// `nic.rs`).
pub trait NicRegisters: Sized {
    /// A NIC with permanent address `mac` sending to `sink`, in its power-on state.
    fn new(mac: [u8; 6], sink: Box<dyn FrameSink>) -> Self;
    /// A register read (it may have side effects, e.g. read-to-clear).
    fn read(&mut self, reg: u32) -> u32;
    /// A register write, with whatever it sets off (DMA for transmits, interrupts).
    fn write(&mut self, reg: u32, value: u32, dma: &DmaSpace) -> Effects;
    /// Tells the NIC whether the wire has a carrier.
    fn set_carrier(&mut self, carrier: bool) -> Effects;
    /// Sets the link down or lets it come up (an operator's command).
    fn set_admin_up(&mut self, up: bool) -> Effects;
    /// Back to the power-on state (a PCI reset).
    fn power_on_reset(&mut self);
}

/// A NIC chip's receive path, implemented where it is (its RX ring code).
pub trait NicReceive {
    /// Whether a frame of `len` bytes would find descriptors now.
    fn rx_room(&self, len: usize) -> bool;
    /// Receives one frame from the wire.
    fn receive(&mut self, frame: &[u8], dma: &DmaSpace) -> Effects;
}

/// A NIC as the model's shell drives it: its identity, its registers and its receive path.
pub trait NicCore: NicRegisters + NicReceive + Send + 'static {
    /// The NIC it is: its name, PCI vendor and device ID, and bus profile come from there.
    const KIND: vm_spec::NicKind;
    /// BAR 0's size.
    const BAR0_SIZE: u64;
    /// MSI-X vectors.
    const VECTORS: u32;
    /// Its subsystem IDs and revision; vendor and device are the kind's.
    fn subsystem() -> (u16, u16, u8);
    /// Its status.
    fn status(&self) -> NicStatus;
}

/// The PCI identity of `N`: the kind's vendor and device, the NIC's subsystem and revision.
fn ids<N: NicCore>() -> PciIds {
    let (vendor, device) = N::KIND.pci_id();
    let (subsystem_vendor, subsystem, revision) = N::subsystem();
    PciIds { vendor, device, subsystem_vendor, subsystem, class: [0x02, 0x00, 0x00], revision }
}

struct Shared<N> {
    nic: Mutex<N>,
    dma: Arc<DmaSpace>,
    vectors: Arc<MsixVectors>,
    wake: EventFd,
    stop: AtomicBool,
}

impl<N: NicCore> Shared<N> {
    fn nic(&self) -> MutexGuard<'_, N> {
        self.nic.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Signals what `effects` asks for. `side`: the data path's side whose event raised the
    /// interrupts (a frame from the wire: RX; a register write such as a TX doorbell: TX), where
    /// the bus ledger counts them; link changes are no data-path traffic.
    fn apply(&self, effects: Effects, side: Option<Side>) {
        let mut vectors = effects.vectors;
        while vectors != 0 {
            let vector = vectors.trailing_zeros();
            vectors &= vectors - 1;
            if self.vectors.signal(vector as usize) {
                self.dma.count_interrupt();
                if let Some(side) = side {
                    self.dma.link(|link| link.interrupt(side));
                }
            }
        }
        if effects.rx_changed {
            let _ = self.wake.write(1);
        }
    }
}

/// A handle for controlling a running model from another thread (link, status).
pub struct NicHandle<N>(Arc<Shared<N>>);

impl<N> Clone for NicHandle<N> {
    fn clone(&self) -> Self {
        NicHandle(self.0.clone())
    }
}

impl<N: NicCore> NicHandle<N> {
    /// Sets the link administratively up or down.
    pub fn set_link(&self, up: bool) {
        let effects = self.0.nic().set_admin_up(up);
        self.0.apply(effects, None);
    }

    /// The model's status and counters.
    pub fn status(&self) -> NicStatus {
        self.0.nic().status()
    }

    /// The DMA and interrupt counters with the frames moved.
    pub fn counters(&self) -> ModelCounters {
        let s = self.status().counters;
        ModelCounters {
            rx_frames: s.rx_frames,
            rx_bytes: s.rx_bytes,
            tx_frames: s.tx_frames,
            tx_bytes: s.tx_bytes,
            ..self.0.dma.counters()
        }
    }
}

/// A NIC model: the register block `N` served over vfio-user, with its data-path thread.
pub struct NicModel<N> {
    config: PciConfiguration,
    /// Where Device Control is in `config` (its FLR bit resets the function).
    devctl: usize,
    shared: Arc<Shared<N>>,
    data_path: Option<JoinHandle<()>>,
    /// The wire's receive side until the data path takes it ([`NicModel::start`]).
    source: Option<Box<dyn FrameSource>>,
    description: String,
}

impl<N: NicCore> NicModel<N> {
    /// A NIC with permanent address `mac` on `backend`; starts its data-path thread.
    pub fn new(mac: MacAddress, backend: Backend) -> std::io::Result<Self> {
        let mut model = Self::unstarted(mac, backend)?;
        model.start()?;
        Ok(model)
    }

    /// The same NIC without its data-path thread yet: a process that jails itself makes the
    /// model, binds its sockets, enters the jail, and only then starts threads ([`Self::start`]).
    pub fn unstarted(mac: MacAddress, backend: Backend) -> std::io::Result<Self> {
        let Backend { source, sink, description } = backend;
        let shared = Arc::new(Shared {
            nic: Mutex::new(N::new(mac.0, sink)),
            dma: Arc::new(DmaSpace::with_link(N::KIND.link_profile())),
            vectors: Arc::new(MsixVectors::default()),
            wake: EventFd::new(EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
        });
        let (config, devctl) = Self::power_on_config();
        Ok(NicModel { config, devctl, shared, data_path: None, source: Some(source), description })
    }

    /// Starts the data-path thread (once; later calls do nothing).
    pub fn start(&mut self) -> std::io::Result<()> {
        let Some(source) = self.source.take() else { return Ok(()) };
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-rx", N::KIND.name()))
            .spawn(move || data_path(&shared, source))?;
        self.data_path = Some(thread);
        Ok(())
    }

    fn power_on_config() -> (PciConfiguration, usize) {
        config_space(ids::<N>(), N::BAR0_SIZE, N::VECTORS as u16, &N::KIND.link_profile())
    }

    /// A handle for control from other threads.
    pub fn handle(&self) -> NicHandle<N> {
        NicHandle(self.shared.clone())
    }

    /// What the backend is.
    pub fn backend_description(&self) -> &str {
        &self.description
    }
}

impl<N> Drop for NicModel<N> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.shared.wake.write(1);
        if let Some(thread) = self.data_path.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until `fd` (if any) is readable, the wake eventfd fires, or `timeout` passes.
fn wait<N>(shared: &Shared<N>, fd: Option<i32>, timeout: Duration) {
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

/// The data path: moves frames from the backend into the NIC until the model is dropped.
fn data_path<N: NicCore>(shared: &Shared<N>, mut source: Box<dyn FrameSource>) {
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
                        effects.merge(nic.receive(frame, &shared.dma));
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
        shared.apply(effects, Some(Side::Rx));
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

impl<N: NicCore> Model for NicModel<N> {
    fn name(&self) -> &'static str {
        N::KIND.name()
    }

    fn config(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn bars(&self) -> Vec<Option<ModelBar>> {
        vec![
            Some(ModelBar { size: N::BAR0_SIZE, shared: None }),
            None,
            Some(ModelBar { size: BAR2_SIZE, shared: None }),
        ]
    }

    fn msix_vectors(&self) -> u32 {
        N::VECTORS
    }

    fn bar_read(&mut self, bar: u32, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 || offset >= N::BAR0_SIZE {
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
        if bar != 0 || offset >= N::BAR0_SIZE {
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
                effects.merge(nic.write(reg, value, &self.shared.dma));
            }
        }
        self.shared.apply(effects, Some(Side::Tx));
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.config.write(offset as usize, data);
        if starts_flr(self.devctl, offset as usize, data) {
            // A Function Level Reset: the function's state back to power-on; what the client set
            // up (its DMA maps and interrupt eventfds) is the client's and stays.
            tracing::debug!("{}: function level reset", N::KIND.name());
            self.reset();
        }
    }

    fn reset(&mut self) {
        self.config = Self::power_on_config().0;
        self.shared.nic().power_on_reset();
        self.shared.dma.link(|link| link.forget_fetched());
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
