//! A repetition's device: a fresh model process for the VM (its wire the peer's TAP when the
//! workload needs a peer, else its generator), or the host device; and the traffic peer on the
//! device's wire (a network namespace the lab makes for a model, the host device's SSH peer).

use std::time::{Duration, Instant};

use vm_spec::DeviceSpec;

use super::{Repetition, ms};
use crate::failure::Failure;
use crate::matrix::{DeviceSource, HostPeer, Wire, Workload};
use crate::record::Record;
use engines::CounterSource;
use engines::model_process::ModelProcess;
use engines::peer::{Peer, RemoteCounters};

/// A device ready for the VM.
pub(super) struct StartedDevice {
    /// How the VM is given it.
    pub(super) spec: DeviceSpec,
    /// The model process the lab started for this VM.
    pub(super) model: Option<ModelProcess>,
    /// The traffic peer, for the workload's time.
    pub(super) peer: Option<Peer>,
    /// The model's counters through the peer (a nested box's card).
    pub(super) counters: Option<CounterSource>,
}

impl Repetition<'_> {
    /// Starts the device and its peer, noting in `record` how the model was confined and how
    /// long it took to start.
    pub(super) fn start_device(&self, record: &mut Record) -> Result<StartedDevice, Failure> {
        let setup = |what: String| Failure::Setup { what };
        let peer = self.peer().map_err(|e| setup(e.to_string()))?;
        let host_peer = match self.source {
            DeviceSource::Host { peer, .. } => peer.as_ref(),
            DeviceSource::Model { .. } => None,
        };
        // A host device that is a model behind its peer (a nested lab box's card): its counters
        // through the peer, for the cross-check against the virtio-iommu's.
        let counters = match host_peer {
            Some(HostPeer { destination, counters: true, .. }) => {
                let remote =
                    RemoteCounters::open(destination).map_err(|e| setup(format!("the model's counters: {e}")))?;
                record.model_confinement = remote.confinement();
                let remote = std::sync::Mutex::new(remote);
                let source: CounterSource =
                    std::sync::Arc::new(move || remote.lock().unwrap_or_else(|p| p.into_inner()).counters());
                Some(source)
            }
            _ => None,
        };
        let (spec, model) = match self.source {
            DeviceSource::Host { bdf, .. } => (DeviceSpec::vfio(*bdf), None),
            DeviceSource::Model { nic, wire } => {
                let model = self.start_model(*nic, wire, peer.as_ref(), record).map_err(|e| setup(e.to_string()))?;
                (model.device_spec(), Some(model))
            }
        };
        // In a Thunderbolt slot, the NIC is plugged once the guest is up (driverlab's engine
        // does it at the agent's first frame), as the user plugs the cable into a booted
        // machine; QEMU's root port is occupied at boot (its hot-plug is ACPI's, not pciehp's).
        let spec = match self.slot() {
            vm_spec::Slot::Thunderbolt if self.linux() && self.image.engine == crate::matrix::EngineKind::Driverlab => {
                spec.in_slot(vm_spec::Slot::Thunderbolt).plugged_later()
            }
            slot => spec.in_slot(slot),
        };
        Ok(StartedDevice { spec, model, peer, counters })
    }

    /// Where the guest sees the device: its matrix entry's slot; where the matrix does not say,
    /// a host device's Linux cell mirrors the host (a device the host takes for removable,
    /// behind an external-facing port, goes into a Thunderbolt slot), and anything else sits on
    /// the root bus.
    pub(super) fn slot(&self) -> vm_spec::Slot {
        if let Some(slot) = self.plan.plan.device(&self.cell.device).and_then(|d| d.slot) {
            return slot;
        }
        match self.source {
            DeviceSource::Host { bdf, .. }
                if self.linux() && vm_spec::host::pci_removable(std::path::Path::new("/"), *bdf) == Some(true) =>
            {
                vm_spec::Slot::Thunderbolt
            }
            _ => vm_spec::Slot::Root,
        }
    }

    /// The workload's traffic peer, when it needs one: a namespace for a model, the host
    /// device's SSH peer.
    fn peer(&self) -> Result<Option<Peer>, engines::peer::PeerError> {
        let server = self.plan.plan.workload(&self.cell.workload).and_then(Workload::peer_server);
        match (server, self.source) {
            (Some(server), DeviceSource::Model { .. }) => Peer::namespace(server).map(Some),
            (Some(server), DeviceSource::Host { peer: Some(host_peer), .. }) => {
                let limit = Duration::from_secs_f64(self.plan.plan.matrix.timeout_s);
                Peer::remote(&host_peer.destination, host_peer.addresses.clone(), limit, server).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// A fresh model process for this VM, its log the repetition's `model.log`.
    fn start_model(
        &self,
        nic: vm_spec::NicKind,
        wire: &Wire,
        peer: Option<&Peer>,
        record: &mut Record,
    ) -> Result<ModelProcess, engines::ModelError> {
        let started = Instant::now();
        let wire_args = wire.model_args();
        let args: Vec<&str> = match peer {
            Some(_) => vec!["--tap", engines::peer::TAP],
            None => wire_args.iter().map(String::as_str).collect(),
        };
        let log = self.dir.join("model.log");
        let netns = peer.and_then(Peer::netns);
        let model = ModelProcess::start_logged(&self.env.programs.model, nic.name(), &args, netns, Some(&log))?;
        record.timings.model_start_ms = Some(ms(started.elapsed()));
        record.model_confinement = model.confinement();
        Ok(model)
    }
}
