//! Serving a device model over vfio-user (the `vfio_user` crate's server), one client at a time;
//! the model is reset and its DMA maps dropped whenever a client goes away.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE, vfio_region_info,
    vfio_region_sparse_mmap_area,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, Server, ServerBackend, ServerRegion, SparseArea};

use super::dma::DmaSpace;
use pci::PciConfiguration;
use vm_spec::counters::{COUNTERS_REGION, COUNTERS_SIZE, ModelCounters};

/// VFIO region index of configuration space.
const CONFIG_REGION: u32 = 7;
/// VFIO PCI interrupt index of error reporting.
const ERR_IRQ_INDEX: u32 = 3;
/// VFIO PCI interrupt index of device requests.
const REQ_IRQ_INDEX: u32 = 4;

/// Errors serving a model.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be set up.
    #[error("socket {path}: {reason}")]
    Socket {
        /// The path.
        path: String,
        /// What went wrong, in words.
        reason: String,
    },
}

/// The eventfds a client gave for the model's MSI-X vectors.
#[derive(Default)]
pub struct MsixVectors {
    fds: Mutex<Vec<Option<File>>>,
}

impl MsixVectors {
    /// Signals vector `vector`; false if the client gave no eventfd for it.
    pub fn signal(&self, vector: usize) -> bool {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        match fds.get(vector) {
            Some(Some(fd)) => {
                let mut writer: &File = fd;
                writer.write_all(&1u64.to_le_bytes()).is_ok()
            }
            _ => false,
        }
    }

    pub(crate) fn set(&self, start: usize, fds: Vec<File>) {
        let mut slots = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        for (i, fd) in fds.into_iter().enumerate() {
            let at = start + i;
            if slots.len() <= at {
                slots.resize_with(at + 1, || None);
            }
            slots[at] = Some(fd);
        }
    }

    /// Drops the eventfds of `count` vectors from `start` (VFIO's eventfd -1: the vector stays
    /// set up, signalling nothing).
    fn unset(&self, start: usize, count: usize) {
        let mut slots = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        for slot in slots.iter_mut().skip(start).take(count) {
            *slot = None;
        }
    }

    fn clear(&self) {
        self.fds.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One BAR of a model.
pub struct ModelBar {
    /// Size in bytes (a power of two).
    pub size: u64,
    /// A memfd the client may mmap the BAR from (shared memory BARs).
    pub shared: Option<File>,
}

/// A device model behind a vfio-user server.
pub trait Model: Send {
    /// The model's name, for logs.
    fn name(&self) -> &'static str;
    /// Its configuration space.
    fn config(&mut self) -> &mut PciConfiguration;
    /// A write to its configuration space (a model may act on it, e.g. a function reset).
    fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.config().write(offset as usize, data);
    }
    /// Its BARs, by index.
    fn bars(&self) -> Vec<Option<ModelBar>>;
    /// Number of MSI-X vectors.
    fn msix_vectors(&self) -> u32;
    /// A BAR read.
    fn bar_read(&mut self, bar: u32, offset: u64, data: &mut [u8]);
    /// A BAR write.
    fn bar_write(&mut self, bar: u32, offset: u64, data: &[u8]);
    /// Back to the power-on state.
    fn reset(&mut self);
    /// What it may DMA to.
    fn dma(&self) -> Arc<DmaSpace>;
    /// The client's MSI-X eventfds.
    fn vectors(&self) -> Arc<MsixVectors>;
    /// What the model counted (published in the counters region and printed per client).
    fn counters(&self) -> ModelCounters {
        self.dma().counters()
    }
}

struct Adapter<'a> {
    model: &'a mut dyn Model,
}

fn invalid() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

impl ServerBackend for Adapter<'_> {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        match region {
            0..=5 => self.model.bar_read(region, offset, data),
            CONFIG_REGION => self.model.config().read(offset as usize, data),
            COUNTERS_REGION => {
                let counters = self.model.counters().encode();
                let start = (offset as usize).min(counters.len());
                let end = (start + data.len()).min(counters.len());
                data.fill(0);
                data[..end - start].copy_from_slice(&counters[start..end]);
            }
            _ => return Err(invalid()),
        }
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match region {
            0..=5 => self.model.bar_write(region, offset, data),
            CONFIG_REGION => self.model.config_write(offset, data),
            _ => return Err(invalid()),
        }
        Ok(())
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> std::io::Result<()> {
        // Without a file descriptor the client would expect DMA_READ/DMA_WRITE messages, which
        // these models do not use: the mapping is noted, and the memory stays out of reach.
        match fd {
            Some(file) => self.model.dma().map(address, size, &file, offset, flags.contains(DmaMapFlags::WRITE)),
            None => {
                self.model.dma().map_unbacked(address, size);
                Ok(())
            }
        }
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> std::io::Result<()> {
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            self.model.dma().unmap(0, u64::MAX);
        } else {
            self.model.dma().unmap(address, size);
        }
        Ok(())
    }

    fn reset(&mut self) -> std::io::Result<()> {
        self.model.reset();
        Ok(())
    }

    fn set_irqs(&mut self, index: u32, flags: u32, start: u32, count: u32, fds: Vec<File>) -> std::io::Result<()> {
        if index == ERR_IRQ_INDEX || index == REQ_IRQ_INDEX {
            // Accepted and dropped: the models never report errors or request the device back.
            return if start.checked_add(count).is_some_and(|end| end <= 1) { Ok(()) } else { Err(invalid()) };
        }
        if index != VFIO_PCI_MSIX_IRQ_INDEX {
            return if count == 0 { Ok(()) } else { Err(invalid()) };
        }
        let vectors = self.model.vectors();
        if flags & VFIO_IRQ_SET_DATA_NONE != 0 && count == 0 {
            vectors.clear();
        } else if flags & VFIO_IRQ_SET_DATA_EVENTFD != 0 {
            if start.checked_add(count).is_none_or(|end| end > self.model.msix_vectors()) {
                return Err(invalid());
            }
            // An eventfd of -1 cannot travel over the socket: a client sends none for it. QEMU
            // enables MSI-X that way (vector 0 with -1) before the guest sets any vector up.
            match fds.len() {
                0 => vectors.unset(start as usize, count as usize),
                n if n == count as usize => vectors.set(start as usize, fds),
                _ => return Err(invalid()),
            }
        }
        Ok(())
    }
}

fn region(index: u32, size: u64, flags: u32) -> ServerRegion {
    ServerRegion {
        region_info: vfio_region_info { argsz: 32, flags, index, cap_offset: 0, size, offset: 0 },
        sparse_areas: Vec::new(),
        mmap_fd: None,
    }
}

/// Serves `model` on `socket` (which must not exist). Each client gets a freshly reset model;
/// `on_disconnect` runs after each client. With `once`, returns after the first client.
pub fn serve(
    socket: &Path,
    model: &mut dyn Model,
    once: bool,
    on_disconnect: impl FnMut(&dyn Model),
) -> Result<(), ServeError> {
    bind(socket, model)?.run(model, once, on_disconnect);
    Ok(())
}

/// A vfio-user socket bound for a model, not yet serving: a process that jails itself binds,
/// enters the jail, then serves.
pub struct Bound {
    server: Server,
    /// The BARs' files: the server hands their descriptors to each client, so they stay open.
    _bars: Vec<Option<ModelBar>>,
}

/// Binds `socket` (which must not exist) for `model`'s regions and interrupts.
pub fn bind(socket: &Path, model: &dyn Model) -> Result<Bound, ServeError> {
    let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    let bars = model.bars();
    let mut regions = Vec::new();
    for index in 0..6u32 {
        match bars.get(index as usize).and_then(Option::as_ref) {
            Some(bar) => {
                let mut r = region(index, bar.size, rw);
                if let Some(file) = &bar.shared {
                    r.region_info.flags |= VFIO_REGION_INFO_FLAG_MMAP;
                    r.mmap_fd = Some(file.as_raw_fd());
                    // The server sends the file descriptor along with region capabilities only:
                    // describe the whole BAR as one sparse mmap area.
                    r.sparse_areas =
                        vec![SparseArea { area: vfio_region_sparse_mmap_area { offset: 0, size: bar.size } }];
                }
                regions.push(r);
            }
            None => regions.push(region(index, 0, 0)),
        }
    }
    regions.push(region(6, 0, 0)); // no expansion ROM
    // PCI Express configuration space, as kernel VFIO gives it for a PCIe function: 4 KiB, the
    // extended part reading 0 (no extended capabilities).
    regions.push(region(CONFIG_REGION, 4096, rw));
    regions.push(region(8, 0, 0)); // no VGA
    regions.push(region(COUNTERS_REGION, COUNTERS_SIZE, VFIO_REGION_INFO_FLAG_READ));
    let irqs = vec![
        IrqInfo { index: 0, flags: 0, count: 0 },
        IrqInfo { index: 1, flags: 0, count: 0 },
        IrqInfo { index: VFIO_PCI_MSIX_IRQ_INDEX, flags: VFIO_IRQ_INFO_EVENTFD, count: model.msix_vectors() },
        // Error and request interrupts: one each, so clients can set up error recovery; the
        // models never raise them.
        IrqInfo { index: ERR_IRQ_INDEX, flags: VFIO_IRQ_INFO_EVENTFD, count: 1 },
        IrqInfo { index: REQ_IRQ_INDEX, flags: VFIO_IRQ_INFO_EVENTFD, count: 1 },
    ];
    let server = Server::new(socket, true, irqs, regions)
        .map_err(|e| ServeError::Socket { path: socket.display().to_string(), reason: e.to_string() })?;
    Ok(Bound { server, _bars: bars })
}

impl Bound {
    /// Serves `model` (the one it was bound for), one client at a time, as [`serve`] does.
    /// Dropping the `Bound` afterwards removes the socket; a jailed process, which cannot see
    /// its socket's path, leaves that to its supervisor and forgets it instead.
    pub fn run(&self, model: &mut dyn Model, once: bool, mut on_disconnect: impl FnMut(&dyn Model)) {
        loop {
            model.reset();
            let result = self.server.run(&mut Adapter { model: &mut *model });
            if let Err(e) = result {
                tracing::warn!("{}: client connection ended: {e}", model.name());
            }
            model.dma().clear();
            model.vectors().clear();
            on_disconnect(&*model);
            if once {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdev::TestDevice;
    use vfio_bindings::bindings::vfio::VFIO_IRQ_SET_ACTION_TRIGGER;

    fn eventfd() -> File {
        // SAFETY: eventfd(2) with valid flags; the descriptor is owned by the File.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    }

    #[test]
    fn msix_set_up_without_eventfds_is_accepted_and_signals_nothing() {
        let mut device = TestDevice::new().unwrap();
        let mut adapter = Adapter { model: &mut device };
        let trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
        // QEMU's first SET_IRQS for MSI-X: vector 0, eventfd -1 (so no descriptor).
        adapter.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 1, Vec::new()).unwrap();
        assert!(!adapter.model.vectors().signal(0));
        adapter.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 1, vec![eventfd()]).unwrap();
        assert!(adapter.model.vectors().signal(0));
        adapter.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 1, Vec::new()).unwrap();
        assert!(!adapter.model.vectors().signal(0), "-1 takes the eventfd away again");
        let vectors = adapter.model.msix_vectors();
        assert!(adapter.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 2, vec![eventfd()]).is_err(), "1 fd for 2");
        assert!(adapter.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, vectors, 1, Vec::new()).is_err(), "no such vector");
    }

    #[test]
    fn configuration_space_reads_to_4_kib_like_a_pcie_function() {
        let mut device = TestDevice::new().unwrap();
        let mut adapter = Adapter { model: &mut device };
        let mut ext = [0xffu8; 4];
        adapter.region_read(CONFIG_REGION, 0x100, &mut ext).unwrap();
        assert_eq!(ext, [0; 4], "no extended capabilities");
        let mut id = [0u8; 2];
        adapter.region_read(CONFIG_REGION, 0, &mut id).unwrap();
        assert_ne!(id, [0, 0]);
    }
}
