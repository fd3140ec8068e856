//! Hot-plug slots on the control socket (`vm.plug`, `vm.unplug`): a device in a Thunderbolt
//! slot comes and goes as a user plugs and pulls the cable.
//!
//! The device's backend stays open for the VM's life (the jail allows no new one); what comes
//! and goes is the guest's view of it. Plugged, the device appears in its root port's slot with
//! presence and link events, and its DMA is routed through the virtio-iommu again. Pulled (by
//! surprise at once; orderly once the guest has unbound it and turned the slot's power off after
//! the attention button), it leaves the bus, its decoding and vectors are turned off, it is reset
//! (no DMA in flight), and every mapping its backend held is taken down, whatever the guest
//! left mapped.

use std::sync::{Arc, Mutex};

use devices::virtio::iommu::IommuHandle;
use passthrough::device::PciPassthroughDevice;
use passthrough::dma::DmaMirror;
use pci::{Arrival, Removal, SlotError};
use vm_spec::control::{SlotInfo, SlotState};

use crate::platform::{Passthrough, Platform, lock};

/// A device's hot-plug slot: its root port and what the slot holds.
pub struct HotPlugSlot {
    /// The root port's device number on bus 0.
    pub port: u8,
    /// The requester ID of the device in the slot (its endpoint at the virtio-iommu).
    pub requester_id: u16,
    /// What the slot holds.
    pub state: Arc<Mutex<SlotState>>,
}

/// Why a slot operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum HotPlugError {
    /// No device of that name.
    #[error(
        "no device {0:?} in this VM: name it as the spec does (vfio-user=PATH or vfio=BDF); vm.info lists the slots"
    )]
    NoSuchDevice(String),
    /// The device sits on the root bus.
    #[error("{0} is on the root bus, which has no hot-plug slot (give it slot=thunderbolt)")]
    NotHotPluggable(String),
    /// The slot is not in the state the request needs.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The device's DMA could not be routed again.
    #[error("{device}: {reason}")]
    Device {
        /// The device.
        device: String,
        /// What failed.
        reason: String,
    },
}

impl HotPlugError {
    /// Whether the request named something that does not exist (404) rather than something in
    /// the wrong state (409) or a failure (500).
    pub fn status(&self) -> u16 {
        match self {
            HotPlugError::NoSuchDevice(_) => 404,
            HotPlugError::NotHotPluggable(_) | HotPlugError::Slot(_) => 409,
            HotPlugError::Device { .. } => 500,
        }
    }
}

/// What leaving the guest takes down: the device's decoding, vectors and DMA, then a reset, then
/// every host mapping of its backend.
struct Departure {
    device: Arc<Mutex<PciPassthroughDevice>>,
    mirror: Arc<DmaMirror>,
    iommu: Option<IommuHandle>,
    requester_id: u16,
    state: Arc<Mutex<SlotState>>,
    name: String,
}

impl Departure {
    fn complete(self) {
        if let Some(iommu) = &self.iommu {
            iommu.remove_listener(self.requester_id as u32);
        }
        if let Err(e) = lock(&self.device).quiesce() {
            tracing::warn!("{}: reset after unplug: {e}", self.name);
        }
        match self.mirror.unmap_all() {
            Ok(0) => {}
            Ok(left) => tracing::info!("{}: unplugged with {left} DMA mappings the guest left; taken down", self.name),
            Err(e) => tracing::warn!("{}: taking its DMA mappings down after unplug: {e}", self.name),
        }
        *lock(&self.state) = SlotState::Empty;
    }
}

impl Platform {
    /// The hot-plug slots and what they hold.
    pub fn slots(&self) -> Vec<SlotInfo> {
        self.passthrough.iter().filter_map(|p| Some(slot_info(p, p.slot.as_ref()?))).collect()
    }

    fn hot_pluggable(&self, device: &str) -> Result<(&Passthrough, &HotPlugSlot), HotPlugError> {
        let p = self
            .passthrough
            .iter()
            .find(|p| p.spec.backend.to_string() == device)
            .ok_or_else(|| HotPlugError::NoSuchDevice(device.to_string()))?;
        let slot = p.slot.as_ref().ok_or_else(|| HotPlugError::NotHotPluggable(device.to_string()))?;
        Ok((p, slot))
    }

    /// Plugs `device` into its empty slot.
    ///
    /// The slot's state is never held locked across the root complex's lock: an orderly release
    /// completes on a vCPU thread that holds the root complex and then empties the slot.
    pub fn plug(&self, device: &str) -> Result<SlotInfo, HotPlugError> {
        let (p, slot) = self.hot_pluggable(device)?;
        if *lock(&slot.state) != SlotState::Empty {
            return Err(SlotError::Occupied(slot.port).into());
        }
        let routed = match &self.iommu {
            Some(iommu) => iommu.set_listener(slot.requester_id as u32, p.mirror.clone()).map_err(|e| e.to_string()),
            None => p.mirror.map_identity().map_err(|e| e.to_string()),
        };
        routed.map_err(|reason| HotPlugError::Device { device: device.to_string(), reason })?;
        lock(&self.pci).plug(slot.port, p.device.clone(), Arrival::HotPlug)?;
        *lock(&slot.state) = SlotState::Occupied;
        tracing::info!("{device}: plugged into the slot of 00:{:02x}.0", slot.port);
        Ok(slot_info(p, slot))
    }

    /// Pulls `device` out of its slot: at once (`surprise`), or by pressing the attention button
    /// and letting the guest release it (the slot reads `releasing` until it has).
    pub fn unplug(&self, device: &str, surprise: bool) -> Result<SlotInfo, HotPlugError> {
        let (p, slot) = self.hot_pluggable(device)?;
        let before = *lock(&slot.state);
        match before {
            SlotState::Empty => return Err(SlotError::Empty(slot.port).into()),
            SlotState::Releasing if !surprise => return Err(SlotError::Releasing(slot.port).into()),
            _ => {}
        }
        let departure = Departure {
            device: p.device.clone(),
            mirror: p.mirror.clone(),
            iommu: self.iommu.clone(),
            requester_id: slot.requester_id,
            state: slot.state.clone(),
            name: device.to_string(),
        };
        if surprise {
            lock(&self.pci).unplug(slot.port, Removal::Surprise)?;
            departure.complete();
            tracing::info!("{device}: pulled out of the slot of 00:{:02x}.0", slot.port);
        } else {
            *lock(&slot.state) = SlotState::Releasing;
            let asked = lock(&self.pci).request_release(slot.port, Box::new(move |_| departure.complete()));
            if let Err(e) = asked {
                *lock(&slot.state) = before;
                return Err(e.into());
            }
            tracing::info!("{device}: attention button pressed on the slot of 00:{:02x}.0", slot.port);
        }
        Ok(slot_info(p, slot))
    }
}

fn slot_info(p: &Passthrough, slot: &HotPlugSlot) -> SlotInfo {
    SlotInfo {
        device: p.spec.backend.to_string(),
        port: format!("00:{:02x}.0", slot.port),
        bdf: p.bdf.clone(),
        state: *lock(&slot.state),
    }
}
