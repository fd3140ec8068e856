//! What a VM costs the host's CPU: the run time of its engine's threads, read from `/proc` at the
//! workload's begin and end (the window's snapshots), split into the vCPU threads, the engine's
//! other threads (device emulation, the virtio-iommu, I/O, the jail's supervisor) and the device
//! model's process.
//!
//! A thread's run time is the first field of `/proc/PID/task/TID/schedstat`: nanoseconds on a
//! CPU, as the scheduler accounts them (`proc_pid_schedstat()` in fs/proc/base.c). A process is
//! read with its descendants (`/proc/PID/task/TID/children`): the jail forks, and the VM runs in
//! the child. Threads that ended during the window are missed; an engine's threads live as long
//! as its VM.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Most processes below one root that are read (the jail's supervisor and its VMM, a model and
/// its own).
const MAX_PROCESSES: usize = 16;

/// CPU time the host spent for a VM until one moment, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostCpu {
    /// The engine's vCPU threads (this project's VMM's `vcpuN`, QEMU's `CPU N/TCG` or
    /// `CPU N/KVM`).
    pub vcpu_ns: u64,
    /// The engine's other threads.
    pub vmm_other_ns: u64,
    /// The device model's process (a model the lab started; 0 for a host device).
    pub model_ns: u64,
}

impl HostCpu {
    /// What was spent between `self` (earlier) and `later`.
    pub fn until(&self, later: &HostCpu) -> HostCpu {
        HostCpu {
            vcpu_ns: later.vcpu_ns.saturating_sub(self.vcpu_ns),
            vmm_other_ns: later.vmm_other_ns.saturating_sub(self.vmm_other_ns),
            model_ns: later.model_ns.saturating_sub(self.model_ns),
        }
    }

    /// All of it.
    pub fn total_ns(&self) -> u64 {
        self.vcpu_ns + self.vmm_other_ns + self.model_ns
    }
}

/// The processes of one VM, to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCpuSource {
    /// The engine's process (the VMM as started, or QEMU).
    pub engine: u32,
    /// The device model's process, when the lab started one.
    pub model: Option<u32>,
}

impl HostCpuSource {
    /// The CPU time so far; `None` when the engine's process cannot be read (gone, or `/proc`
    /// lacks schedstat).
    pub fn sample(&self) -> Option<HostCpu> {
        self.sample_in(Path::new("/proc"))
    }

    fn sample_in(&self, proc: &Path) -> Option<HostCpu> {
        let mut cpu = HostCpu::default();
        let mut any = false;
        for thread in threads(proc, self.engine) {
            any = true;
            if is_vcpu(&thread.name) {
                cpu.vcpu_ns += thread.run_ns;
            } else {
                cpu.vmm_other_ns += thread.run_ns;
            }
        }
        if let Some(model) = self.model {
            cpu.model_ns = threads(proc, model).iter().map(|t| t.run_ns).sum();
        }
        any.then_some(cpu)
    }
}

/// Whether a thread of the name `name` runs a vCPU: this project's VMM names them `vcpuN`
/// (vmm/src/vcpu.rs), QEMU with `-name debug-threads=on` `CPU N/TCG` or `CPU N/KVM`
/// (`qemu_thread_create()` calls in accel/).
pub fn is_vcpu(name: &str) -> bool {
    let vmm = name.strip_prefix("vcpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let qemu = name.strip_prefix("CPU ").and_then(|rest| rest.split_once('/')).is_some_and(|(n, accel)| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && matches!(accel, "TCG" | "KVM")
    });
    vmm || qemu
}

/// One thread's name and run time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Thread {
    name: String,
    run_ns: u64,
}

/// The threads of `root` and of its descendants (breadth first, at most [`MAX_PROCESSES`]).
fn threads(proc: &Path, root: u32) -> Vec<Thread> {
    let mut out = Vec::new();
    let mut processes = vec![root];
    let mut next = 0;
    while next < processes.len() {
        let pid = processes[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(proc.join(pid.to_string()).join("task")) else { continue };
        for task in tasks.flatten() {
            let dir = task.path();
            let run_ns = std::fs::read_to_string(dir.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim_end().to_string();
            if let Some(run_ns) = run_ns {
                out.push(Thread { name, run_ns });
            }
            let children = std::fs::read_to_string(dir.join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if processes.len() < MAX_PROCESSES && !processes.contains(&child) {
                    processes.push(child);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_threads_are_told_by_name() {
        for name in ["vcpu0", "vcpu15", "CPU 0/TCG", "CPU 3/KVM"] {
            assert!(is_vcpu(name), "{name}");
        }
        for name in ["vcpu", "vcpux", "control", "CPU /TCG", "CPU 0/HVF", "qemu-system-x86", "CPU 0"] {
            assert!(!is_vcpu(name), "{name}");
        }
    }

    /// A `/proc` of one engine (a supervisor whose child runs two vCPUs and a control thread)
    /// and a model.
    fn fake_proc(dir: &Path) {
        let task = |pid: u32, tid: u32, name: &str, ns: u64, children: &str| {
            let d = dir.join(format!("{pid}/task/{tid}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("comm"), format!("{name}\n")).unwrap();
            std::fs::write(d.join("schedstat"), format!("{ns} 77 5\n")).unwrap();
            std::fs::write(d.join("children"), children).unwrap();
        };
        task(100, 100, "driverlab", 1_000, "101 ");
        task(101, 101, "driverlab", 2_000, "");
        task(101, 102, "vcpu0", 50_000, "");
        task(101, 103, "vcpu1", 30_000, "");
        task(101, 104, "control", 400, "");
        task(200, 200, "aqc100", 7_000, "");
        task(200, 201, "aqc100-control", 300, "");
    }

    #[test]
    fn a_vm_is_read_with_its_descendants_split_by_thread_kind() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(dir.path());
        let source = HostCpuSource { engine: 100, model: Some(200) };
        let cpu = source.sample_in(dir.path()).unwrap();
        assert_eq!(cpu, HostCpu { vcpu_ns: 80_000, vmm_other_ns: 3_400, model_ns: 7_300 });
        assert_eq!(cpu.total_ns(), 90_700);
        let gone = HostCpuSource { engine: 999, model: None };
        assert_eq!(gone.sample_in(dir.path()), None, "an engine that cannot be read is no figure");
    }

    #[test]
    fn a_window_is_the_difference_and_never_negative() {
        let a = HostCpu { vcpu_ns: 10, vmm_other_ns: 5, model_ns: 7 };
        let b = HostCpu { vcpu_ns: 25, vmm_other_ns: 4, model_ns: 9 };
        assert_eq!(a.until(&b), HostCpu { vcpu_ns: 15, vmm_other_ns: 0, model_ns: 2 });
    }

    #[test]
    fn this_process_is_read_from_the_real_proc() {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let busy = std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn(move || {
                // Busy until the scheduler has counted 30 ms of this thread's running, however
                // loaded the machine is; then alive until it was read.
                let ran = || -> u64 {
                    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
                    stat.split_whitespace().next().unwrap().parse().unwrap()
                };
                while ran() < 30_000_000 {
                    std::hint::black_box((0..1000u64).sum::<u64>());
                }
                ready_tx.send(()).unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        ready_rx.recv().unwrap();
        let cpu = HostCpuSource { engine: std::process::id(), model: None }.sample().expect("/proc/self is readable");
        done_tx.send(()).unwrap();
        busy.join().unwrap();
        assert!(cpu.vcpu_ns >= 30_000_000, "the busy 'vcpu0' thread ran 30 ms: {cpu:?}");
        assert!(cpu.vmm_other_ns > 0, "{cpu:?}");
    }
}
