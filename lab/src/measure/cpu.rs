//! What the CPU paid for a workload: the guest's CPU time by what it did (its `/proc/stat`
//! before and after, from the agent's `stat-before` and `stat-after` frames) and the host's CPU
//! time for the VM (the engine's threads and the model's process, read by the engine at the
//! window's begin and end), and both per packet.

use serde::{Deserialize, Serialize};

use engines::HostCpu;
use engines::agent::{FrameKind, Frames};

/// Nanoseconds in one of `/proc/stat`'s ticks: its unit is `USER_HZ`, which is 100 on x86
/// whatever the kernel's `HZ` (`USER_HZ` in arch/x86/include/asm/param.h via
/// include/asm-generic/param.h).
const NS_PER_TICK: u64 = 10_000_000;

/// The guest's CPU time over the workload, all its CPUs together, in ms; `/proc/stat`'s `cpu`
/// line (`show_stat()` in fs/proc/stat.c) in 10 ms ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GuestCpu {
    /// User mode, `nice` included.
    pub user_ms: f64,
    /// Kernel mode outside interrupts: system calls, the stack's process context.
    pub system_ms: f64,
    /// Softirqs: NAPI polls, the stack's receive path.
    pub softirq_ms: f64,
    /// Hard interrupts.
    pub irq_ms: f64,
    /// Idle, waiting for I/O included.
    pub idle_ms: f64,
    /// Time the host ran something else while the guest wanted to run (the hypervisor's report).
    pub steal_ms: f64,
}

impl GuestCpu {
    /// The time the guest was busy: all but idle and steal.
    pub fn busy_ms(&self) -> f64 {
        self.user_ms + self.system_ms + self.softirq_ms + self.irq_ms
    }
}

/// What the CPU paid for the workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CpuCost {
    /// The guest's CPU time, by what it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<GuestCpu>,
    /// The host's CPU time for the VM, ns: its vCPU threads, the engine's other threads, the
    /// device model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostCpu>,
    /// The guest's busy time per packet the workload moved, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ns_per_packet: Option<f64>,
    /// The host's CPU time per packet the workload moved, ns: everything the VM cost it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ns_per_packet: Option<f64>,
}

impl CpuCost {
    /// The cost over the window: the guest's from the agent's frames, the host's between the
    /// window's begin and end; per packet over `packets` (the packets the workload moved).
    /// `None` when neither side could be read.
    pub fn over(
        frames: &Frames,
        host_begin: Option<&HostCpu>,
        host_end: Option<&HostCpu>,
        packets: Option<u64>,
    ) -> Option<CpuCost> {
        let guest = guest_cpu(frames);
        let host = host_begin.zip(host_end).map(|(a, b)| a.until(b));
        if guest.is_none() && host.is_none() {
            return None;
        }
        let packets = packets.filter(|&p| p > 0).map(|p| p as f64);
        Some(CpuCost {
            guest,
            host,
            guest_ns_per_packet: guest.zip(packets).map(|(g, p)| g.busy_ms() * 1e6 / p),
            host_ns_per_packet: host.zip(packets).map(|(h, p)| h.total_ns() as f64 / p),
        })
    }
}

/// The guest's CPU time between its `stat-before` and `stat-after` frames.
pub fn guest_cpu(frames: &Frames) -> Option<GuestCpu> {
    let ticks = |kind| frames.first(kind)?.as_str().and_then(cpu_ticks);
    let (before, after) = (ticks(FrameKind::StatBefore)?, ticks(FrameKind::StatAfter)?);
    let d = |i: usize| after[i].saturating_sub(before[i]) * NS_PER_TICK;
    let ms = |ns: u64| ns as f64 / 1e6;
    // user nice system idle iowait irq softirq steal
    Some(GuestCpu {
        user_ms: ms(d(0) + d(1)),
        system_ms: ms(d(2)),
        idle_ms: ms(d(3) + d(4)),
        irq_ms: ms(d(5)),
        softirq_ms: ms(d(6)),
        steal_ms: ms(d(7)),
    })
}

/// The first eight fields of `/proc/stat`'s `cpu` line (all CPUs): user, nice, system, idle,
/// iowait, irq, softirq, steal, in ticks; `None` without a whole one.
fn cpu_ticks(stat: &str) -> Option<[u64; 8]> {
    let line = stat.lines().find_map(|l| l.strip_prefix("cpu "))?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<u64>());
    let mut out = [0u64; 8];
    for slot in &mut out {
        *slot = fields.next()?.ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engines::agent::{Frame, FrameKind, Frames};

    fn frames(before: &str, after: &str) -> Frames {
        let text = |kind, t: &str| Frame { seq: 0, kind, payload: serde_json::Value::String(t.into()) };
        Frames { frames: vec![text(FrameKind::StatBefore, before), text(FrameKind::StatAfter, after)], broken: 0 }
    }

    const BEFORE: &str = "cpu  100 5 200 1000 10 3 40 0 0 0\ncpu0 100 5 200 1000 10 3 40 0 0 0\nintr 1 2\n";
    const AFTER: &str = "cpu  150 5 260 1100 20 5 140 2 0 0\ncpu0 150 5 260 1100 20 5 140 2 0 0\nintr 9 9\n";

    #[test]
    fn the_guest_cpu_line_is_split_by_what_it_did() {
        let cpu = guest_cpu(&frames(BEFORE, AFTER)).unwrap();
        assert_eq!(
            cpu,
            GuestCpu {
                user_ms: 500.0,
                system_ms: 600.0,
                idle_ms: 1100.0,
                irq_ms: 20.0,
                softirq_ms: 1000.0,
                steal_ms: 20.0
            }
        );
        assert_eq!(cpu.busy_ms(), 2120.0);
    }

    #[test]
    fn a_broken_or_missing_stat_is_no_figure() {
        assert_eq!(guest_cpu(&frames(BEFORE, "cpu  1 2 3\n")), None);
        assert_eq!(guest_cpu(&frames("cpu0 1 2 3 4 5 6 7 8\n", AFTER)), None);
        assert_eq!(guest_cpu(&frames(BEFORE, "cpu  1 2 x 4 5 6 7 8\n")), None);
        assert_eq!(guest_cpu(&Frames::default()), None);
    }

    #[test]
    fn the_cost_per_packet_counts_both_sides_over_the_packets_moved() {
        let begin = HostCpu { vcpu_ns: 1_000, vmm_other_ns: 0, model_ns: 0 };
        let end = HostCpu { vcpu_ns: 2_000_001_000, vmm_other_ns: 500_000_000, model_ns: 500_000_000 };
        let cost = CpuCost::over(&frames(BEFORE, AFTER), Some(&begin), Some(&end), Some(1_000_000)).unwrap();
        assert_eq!(cost.host.unwrap().total_ns(), 3_000_000_000);
        assert_eq!(cost.host_ns_per_packet, Some(3_000.0));
        assert_eq!(cost.guest_ns_per_packet, Some(2_120.0));
        let no_packets = CpuCost::over(&frames(BEFORE, AFTER), Some(&begin), Some(&end), Some(0)).unwrap();
        assert_eq!((no_packets.guest_ns_per_packet, no_packets.host_ns_per_packet), (None, None));
        assert!(no_packets.guest.is_some() && no_packets.host.is_some(), "the times stay");
        assert_eq!(CpuCost::over(&Frames::default(), Some(&begin), None, Some(5)), None);
    }
}
