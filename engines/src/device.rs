//! What a VM's device is, checked: a driverlab model with its wire, or a host PCI device with its
//! traffic peer. The lab's matrices and the API describe devices in their own words and make one
//! of these from them; everything that starts a device takes this form.

use vm_spec::Bdf;

use crate::peer::Addresses;

/// A model's wire: its frame generator or a TAP interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    /// `--generate`: frames from the model's generator.
    Generator(vm_spec::model_control::GeneratorConfig),
    /// `--tap`: a host TAP interface.
    Tap(String),
}

impl Wire {
    /// Its arguments after `driverlab model KIND`.
    pub fn model_args(&self) -> Vec<String> {
        match self {
            Wire::Generator(config) => vec!["--generate".into(), config.as_option()],
            Wire::Tap(tap) => vec!["--tap".into(), tap.clone()],
        }
    }
}

/// A host device's traffic peer: an SSH destination on its wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPeer {
    /// `[user@]host`.
    pub destination: String,
    /// The guest's and the peer's addresses on the wire.
    pub addresses: Addresses,
    /// The peer also serves the device's model counters (`driverlab model counters`).
    pub counters: bool,
}

/// What a device is, checked: the typed form of a matrix's `[[device]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSource {
    /// A driverlab model, a fresh process per VM.
    Model {
        /// The NIC it models.
        nic: vm_spec::NicKind,
        /// Its wire.
        wire: Wire,
    },
    /// A host PCI device bound to vfio-pci.
    Host {
        /// Its address.
        bdf: Bdf,
        /// Its traffic peer, when it has one.
        peer: Option<HostPeer>,
    },
}
