//! The workload's window: the counters when the guest agent announced the workload's begin and
//! end and its teardown's end, read the moment its frames arrive on its port.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use vm_spec::counters::{IommuCounts, ModelCounters};

use crate::agent::{FrameKind, Header};
use crate::host_cpu::HostCpu;

/// The counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// What the virtio-iommu had counted.
    pub iommu: Option<IommuCounts>,
    /// What the device model had counted.
    pub model: Option<ModelCounters>,
    /// The host's CPU time for the VM so far.
    pub host_cpu: Option<HostCpu>,
}

/// The counters when the agent announced the workload's begin and end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// At `workload-begin`.
    pub begin: Option<Snapshot>,
    /// At `workload-end`.
    pub end: Option<Snapshot>,
    /// At `done`, after the agent unloaded the driver: what the teardown left.
    pub done: Option<Snapshot>,
    /// When the lab saw the agent's first frame, ms after spawning the VMM: the guest is up.
    pub first_frame_ms: Option<f64>,
    /// When it saw `workload-begin`, ms after spawning the VMM: the cell is ready.
    pub begin_ms: Option<f64>,
    /// When the device was plugged into its hot-plug slot (at the agent's first frame), ms
    /// after spawning the VMM.
    pub plugged_ms: Option<f64>,
    /// When the device was pulled out of its slot (the `surprise-unplug` check) or its slot's
    /// attention button pressed (the `orderly-unplug` check), ms after spawning the VMM.
    pub pulled_ms: Option<f64>,
}

impl Window {
    /// Notes the agent's fresh frames `kinds`, seen `at_ms` after spawning the VMM, taking a
    /// snapshot of the virtio-iommu's counts (`iommu`), the model's (`model`) and the host's
    /// CPU time (`host_cpu`) at the workload's begin and end and at `done`.
    ///
    /// A guest's map reaches the model after the virtio-iommu counted it (in the nested box
    /// through L1's IOMMU and QEMU's vfio-user client, which does not wait for its DMA_MAPs),
    /// so the model is read first at the begin and last at the end: then every map the
    /// virtio-iommu counted in the window is in the model's window too, but for those still on
    /// their way to the model when the window closed (the lab's cross-check allows a few).
    pub(crate) fn saw(
        &mut self,
        kinds: &[FrameKind],
        at_ms: f64,
        iommu: impl Fn() -> Option<IommuCounts>,
        model: impl Fn() -> Option<ModelCounters>,
        host_cpu: impl Fn() -> Option<HostCpu>,
    ) {
        if !kinds.is_empty() {
            self.first_frame_ms.get_or_insert(at_ms);
        }
        // The CPU time inside the counters' reads at both ends: the window's CPU covers its
        // counts.
        let model_first = || {
            let host_cpu = host_cpu();
            let model = model();
            Snapshot { iommu: iommu(), model, host_cpu }
        };
        let iommu_first = || {
            let iommu = iommu();
            let model = model();
            Snapshot { iommu, model, host_cpu: host_cpu() }
        };
        for kind in kinds {
            match kind {
                FrameKind::WorkloadBegin => {
                    self.begin = Some(model_first());
                    self.begin_ms = Some(at_ms);
                }
                FrameKind::WorkloadEnd => self.end = Some(iommu_first()),
                FrameKind::Done => self.done = Some(iommu_first()),
                _ => {}
            }
        }
    }
}

/// Reads the agent's frames as they arrive, for the window's begin and end.
#[derive(Default)]
pub(crate) struct AgentFrames {
    /// Bytes of the log read up to the end of its last whole line.
    seen: u64,
}

impl AgentFrames {
    /// The kinds of the frames that arrived since the last look. Only whole lines count: a
    /// header line the guest is still writing (COM2 moves a byte per exit) is read next time.
    /// Reads only what is new.
    pub(crate) fn fresh(&mut self, log: Option<&Path>) -> Vec<FrameKind> {
        let Some(mut file) = log.and_then(|l| std::fs::File::open(l).ok()) else { return Vec::new() };
        let mut data = Vec::new();
        if file.seek(SeekFrom::Start(self.seen)).is_err() || file.read_to_end(&mut data).is_err() {
            return Vec::new();
        }
        let Some(end) = data.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        self.seen += end as u64 + 1;
        data[..end + 1]
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(crate::agent::BEGIN.as_bytes()))
            .filter_map(|l| Header::parse(l).map(|h| h.kind))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_read_first_at_the_begin_and_last_at_the_end() {
        // A map reaches the model after the virtio-iommu counted it: with this order the
        // model's window holds every map the virtio-iommu's does, whatever the lag.
        let order = std::cell::RefCell::new(Vec::new());
        let iommu = || {
            order.borrow_mut().push("iommu");
            Some(IommuCounts::default())
        };
        let model = || {
            order.borrow_mut().push("model");
            Some(ModelCounters::default())
        };
        let mut window = Window::default();
        let host_cpu = || {
            order.borrow_mut().push("cpu");
            Some(HostCpu::default())
        };
        window.saw(&[FrameKind::WorkloadBegin], 1.0, iommu, model, host_cpu);
        window.saw(&[FrameKind::WorkloadEnd], 2.0, iommu, model, host_cpu);
        window.saw(&[FrameKind::Done], 3.0, iommu, model, host_cpu);
        assert_eq!(*order.borrow(), ["cpu", "model", "iommu", "iommu", "model", "cpu", "iommu", "model", "cpu"]);
        assert!(window.begin.is_some() && window.end.is_some() && window.done.is_some());
        assert_eq!(window.begin_ms, Some(1.0));
    }

    #[test]
    fn agent_frames_are_read_as_they_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let mut frames = AgentFrames::default();
        assert!(frames.fresh(Some(&log)).is_empty(), "no file yet");
        std::fs::write(&log, crate::agent::encode(1, "workload-begin", false, b"{}")).unwrap();
        assert_eq!(frames.fresh(Some(&log)), [FrameKind::WorkloadBegin]);
        assert!(frames.fresh(Some(&log)).is_empty(), "each frame once");
        // A header line caught half written is read whole the next time.
        let whole = crate::agent::encode(2, "workload-end", false, b"{}");
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut file, &whole[..9]).unwrap();
        assert!(frames.fresh(Some(&log)).is_empty(), "nothing whole yet");
        std::io::Write::write_all(&mut file, &whole[9..]).unwrap();
        assert_eq!(frames.fresh(Some(&log)), [FrameKind::WorkloadEnd]);
    }
}
