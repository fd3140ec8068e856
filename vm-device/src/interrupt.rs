//! How devices raise message-signalled interrupts without the VMM in the delivery path: each
//! vector is an EventFd registered with KVM as an irqfd on a GSI whose route carries the MSI
//! address and data. The VMM implements [`MsiInterrupts`] with KVM's GSI routing.

use vmm_sys_util::eventfd::EventFd;

/// An MSI message: where and what the device writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsiMessage {
    /// Address (0xFEEx_xxxx on x86).
    pub address: u64,
    /// The MSI data word (the vector and delivery mode).
    pub data: u32,
}

/// Errors setting up interrupt delivery.
#[derive(Debug, thiserror::Error)]
pub enum InterruptError {
    /// Every GSI is in use.
    #[error("interrupt routing: all {0} GSIs are in use")]
    Exhausted(u32),
    /// An interrupt's EventFd could not be created or signalled.
    #[error("interrupt eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// The hypervisor refused a routing or irqfd change.
    #[error("interrupt routing: {what}: {source}")]
    Hypervisor {
        /// The operation, e.g. "KVM_IRQFD gsi 24".
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

/// The VMM's interrupt routing, as devices see it.
pub trait MsiInterrupts: Send + Sync {
    /// Allocates a GSI for an MSI route.
    fn allocate_gsi(&self) -> Result<u32, InterruptError>;
    /// Points `gsi` at `message`.
    fn set_route(&self, gsi: u32, message: MsiMessage) -> Result<(), InterruptError>;
    /// Delivers `gsi` whenever `fd` is signalled (KVM_IRQFD). If `fd` is already signalled, the
    /// interrupt is delivered at once.
    fn register_irqfd(&self, gsi: u32, fd: &EventFd) -> Result<(), InterruptError>;
    /// Stops delivering `gsi` from `fd`; signals then stay pending in `fd`.
    fn unregister_irqfd(&self, gsi: u32, fd: &EventFd) -> Result<(), InterruptError>;
}

/// [`MsiInterrupts`] without a hypervisor: records routes and irqfds as KVM would hold them, for
/// the unit tests of devices that raise MSIs (PCI's MSI and MSI-X, virtio).
#[derive(Debug, Default)]
pub struct RecordingInterrupts {
    next_gsi: std::sync::Mutex<u32>,
    /// Each GSI's route.
    pub routes: std::sync::Mutex<std::collections::BTreeMap<u32, MsiMessage>>,
    /// Each GSI's irqfd (its file descriptor number).
    pub irqfds: std::sync::Mutex<std::collections::BTreeMap<u32, i32>>,
}

impl MsiInterrupts for RecordingInterrupts {
    fn allocate_gsi(&self) -> Result<u32, InterruptError> {
        let mut next = self.next_gsi.lock().unwrap_or_else(|p| p.into_inner());
        *next += 1;
        Ok(23 + *next)
    }

    fn set_route(&self, gsi: u32, message: MsiMessage) -> Result<(), InterruptError> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).insert(gsi, message);
        Ok(())
    }

    fn register_irqfd(&self, gsi: u32, fd: &EventFd) -> Result<(), InterruptError> {
        use std::os::fd::AsRawFd;
        self.irqfds.lock().unwrap_or_else(|p| p.into_inner()).insert(gsi, fd.as_raw_fd());
        Ok(())
    }

    fn unregister_irqfd(&self, gsi: u32, _fd: &EventFd) -> Result<(), InterruptError> {
        self.irqfds.lock().unwrap_or_else(|p| p.into_inner()).remove(&gsi);
        Ok(())
    }
}
