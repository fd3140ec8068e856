//! A VM's kernel-VFIO devices opened on a thread of their own while the main thread loads the
//! guest's RAM (a kernel and initrd, or a snapshot's RAM copied in): vfio-pci resets a device as
//! it opens it (`vfio_pci_core_enable()` calls `pci_try_reset_function()`,
//! drivers/vfio/pci/vfio_pci_core.c; a function-level reset waits 100 ms at least,
//! `pcie_flr()`), and none of that needs the RAM. The platform takes each device from here
//! ([`OpenedDevices::take`]); a device this could not open is opened there again, which reports
//! the error as before.

use std::thread::JoinHandle;

use passthrough::backend::BackendError;
use passthrough::kernel_vfio::OpenedVfio;
use vm_spec::{DeviceBackend, DeviceSpec};

/// A device opened ahead, or why it could not be.
type Opened = Result<OpenedVfio, BackendError>;

/// The thread that opens the devices, if the VM has any on kernel VFIO.
pub struct OpeningDevices(Option<JoinHandle<Vec<Option<Opened>>>>);

/// The devices opened ahead, by their index in the VM's list (`None`: not a kernel-VFIO device,
/// or already taken).
#[derive(Default)]
pub struct OpenedDevices(Vec<Option<Opened>>);

impl OpeningDevices {
    /// Starts opening `devices`' kernel-VFIO ones. Call it after the jail's namespaces (the
    /// process must have a single thread there) and join it with [`Self::finish`] before the
    /// rest of the jail.
    pub fn start(devices: &[DeviceSpec]) -> OpeningDevices {
        let backends: Vec<Option<passthrough::Bdf>> = devices
            .iter()
            .map(|d| match d.backend {
                DeviceBackend::Vfio(bdf) => Some(bdf),
                DeviceBackend::VfioUser(_) => None,
            })
            .collect();
        if backends.iter().all(Option::is_none) {
            return OpeningDevices(None);
        }
        let open = move || backends.into_iter().map(|bdf| bdf.map(OpenedVfio::open)).collect();
        // A thread that cannot be started leaves the opening to the platform.
        OpeningDevices(std::thread::Builder::new().name("vfio-open".into()).spawn(open).ok())
    }

    /// Waits for the thread: what it opened. A thread that panicked opened nothing.
    pub fn finish(self) -> OpenedDevices {
        OpenedDevices(self.0.and_then(|thread| thread.join().ok()).unwrap_or_default())
    }
}

impl OpenedDevices {
    /// Device `index`'s opening, once: `None` if it was not opened ahead.
    pub fn take(&mut self, index: usize) -> Option<Opened> {
        self.0.get_mut(index).and_then(Option::take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernel_vfio_devices_are_opened_ahead_and_each_is_taken_once() {
        let on_vfio: DeviceSpec = "vfio=0000:ff:1f.7".parse().unwrap();
        let on_socket: DeviceSpec = "vfio-user=/nonexistent/model.sock".parse().unwrap();
        assert!(OpeningDevices::start(std::slice::from_ref(&on_socket)).0.is_none(), "no thread for a model");
        let mut opened = OpeningDevices::start(&[on_socket, on_vfio]).finish();
        assert!(opened.take(0).is_none(), "a model is connected by the platform");
        let Some(Err(BackendError::NotFound(why))) = opened.take(1) else {
            panic!("a device the host does not have is refused as not found");
        };
        assert!(why.contains("0000:ff:1f.7"), "{why}");
        assert!(opened.take(1).is_none(), "taken once");
        assert!(opened.take(7).is_none());
    }
}
