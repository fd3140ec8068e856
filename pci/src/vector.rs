//! One message-signalled interrupt vector, as MSI and MSI-X both keep it: an EventFd that the
//! device (or its emulation) signals, a GSI whose route carries the message, and whether the
//! EventFd is currently registered as an irqfd. A vector that cannot fire keeps its signal
//! pending and delivers it when it is armed again.

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use vm_device::interrupt::{InterruptError, MsiInterrupts, MsiMessage};

/// A vector and its routing state.
pub(crate) struct MsiVector {
    pub(crate) gsi: u32,
    fd: EventFd,
    route: Option<MsiMessage>,
    armed: bool,
    pending: bool,
}

impl MsiVector {
    /// A disarmed vector on a fresh GSI.
    pub(crate) fn new(interrupts: &dyn MsiInterrupts) -> Result<Self, InterruptError> {
        let gsi = interrupts.allocate_gsi()?;
        let fd = EventFd::new(EFD_NONBLOCK).map_err(InterruptError::EventFd)?;
        Ok(MsiVector { gsi, fd, route: None, armed: false, pending: false })
    }

    /// Arms the vector with `message`, or disarms it (`None`). A latched signal fires on arming.
    pub(crate) fn steer(
        &mut self,
        interrupts: &dyn MsiInterrupts,
        message: Option<MsiMessage>,
    ) -> Result<(), InterruptError> {
        match message {
            Some(message) => {
                if self.route != Some(message) {
                    interrupts.set_route(self.gsi, message)?;
                    self.route = Some(message);
                }
                if !self.armed {
                    interrupts.register_irqfd(self.gsi, &self.fd)?;
                    self.armed = true;
                }
                if self.pending {
                    self.pending = false;
                    self.fd.write(1).map_err(InterruptError::EventFd)?;
                }
                Ok(())
            }
            None if self.armed => {
                self.armed = false;
                interrupts.unregister_irqfd(self.gsi, &self.fd)
            }
            None => Ok(()),
        }
    }

    /// The emulated device signals the vector: delivered if armed, latched otherwise.
    pub(crate) fn notify(&mut self) -> Result<(), InterruptError> {
        if self.armed {
            self.fd.write(1).map_err(InterruptError::EventFd)
        } else {
            self.pending = true;
            Ok(())
        }
    }

    /// The EventFd (a passed-through device signals it directly).
    pub(crate) fn fd(&self) -> &EventFd {
        &self.fd
    }

    /// Whether a signal is latched.
    pub(crate) fn pending(&self) -> bool {
        self.pending
    }

    /// Latches a signal (a restored vector's) or drops the latch, without touching the route;
    /// the next [`MsiVector::steer`] delivers a latched one.
    pub(crate) fn set_pending(&mut self, pending: bool) {
        self.pending = pending;
    }
}
