//! The runner's phases, tested without a VM: the judge and the record's figures on what a guest
//! would leave, and whole repetitions and runs under an engine that boots nothing and writes
//! what a guest would have written.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_spec::counters::IommuCounts;
use vm_spec::{ExitReason, SerialOutput, VmSpec};

use super::collect::agent_figures;
use super::judge::judge;
use super::output::{GuestOutput, Report};
use super::*;
use crate::env::HostFacts;
use crate::failure::HOST_LOST_STATE;
use crate::matrix::{Direction, EngineKind, Plan};
use crate::measure::ktap::Ktap;
use crate::record::{GuestDma, IommuDomain, Status};
use crate::results_db::{ResultsDb, RunState};
use crate::scheduler::Progress;
use engines::agent::{Frames, encode};
use engines::{Ending, Engine, Snapshot, Window};

/// A Linux guest's output: its console and its agent's frames.
fn linux(serial: &str, frames: Frames) -> GuestOutput {
    GuestOutput { serial: serial.into(), report: Report::Linux(frames) }
}

fn counters(maps: u64) -> Snapshot {
    Snapshot { iommu: Some(IommuCounts { maps, unmaps: maps, ..IommuCounts::default() }), model: None, host_cpu: None }
}

/// A passing record of a Linux cell under `workload`.
fn passed(workload: &str) -> Record {
    let cell = Cell {
        index: 0,
        id: "c01".into(),
        image: "debian".into(),
        variant: "stock".into(),
        params: Default::default(),
        workload: workload.into(),
        device: "aq".into(),
        step: None,
    };
    Record::begun("r", &cell, 0).judged(None)
}

#[test]
fn a_hang_whose_vcpu_state_was_lost_is_the_host_s_error_and_a_plain_hang_the_guest_s_failure() {
    let exit = |lost: Option<&str>| vm_spec::ExitSummary {
        vcpu_state_lost: lost.map(String::from),
        snapshot: None,
        restored: None,
        ..serde_json::from_str(
            r#"{"vmm":"exit","reason":"shutdown","exit_code":7,"entry":"pvh","vcpus":1,"memory_mib":512,
                "setup_ms":1,"run_ms":9,"serial_bytes":0,"exits":{"io":0,"mmio":0,"unclaimed":0}}"#,
        )
        .unwrap()
    };
    let hung = |lost: Option<&str>| Booted {
        ending: Ending::Stopped { reason: ExitReason::Shutdown, detail: Some("vCPU 0 at rip 0x1 (not mapped)".into()) },
        exit: Some(exit(lost)),
        silent_for: Some(Duration::from_secs(150)),
        ..Booted::failed(Ending::Killed)
    };
    let record = passed("iperf-rx");
    let failure = judge(&hung(None), &linux("[ 1.0] last line\n", Frames::default()), &record, 600.0).unwrap_err();
    assert_eq!(failure.status(), Status::Fail);
    assert!(failure.to_string().starts_with("hung: no serial output for 150 s after \"[ 1.0] last line\"; vCPU 0"));
    let lost = "vCPU 0: it is at kernel address 0xffffffffc0413c60, which its own page tables do not map";
    let failure = judge(&hung(Some(lost)), &linux("", Frames::default()), &record, 600.0).unwrap_err();
    assert_eq!(failure, Failure::HostLostState { detail: lost.into() });
    assert_eq!(failure.to_string(), format!("{HOST_LOST_STATE}: {lost}"));
}

#[test]
fn the_iommu_group_step_says_how_the_guest_treated_the_devices_dma() {
    let step = |json: &[u8]| engines::agent::parse(&encode(0, "step", false, json));
    let strict = step(
        br#"{"step":"iommu-group","status":"ok","group":"3","type":"DMA","untrusted":true,"swiotlb":{"start":"0x1","end":"0x2"}}"#,
    );
    let dma = super::collect::guest_dma(&strict, vm_spec::Slot::Thunderbolt).unwrap();
    assert_eq!(
        dma,
        GuestDma { slot: vm_spec::Slot::Thunderbolt, domain: IommuDomain::Dma, untrusted: true, swiotlb: true }
    );
    let lazy =
        step(br#"{"step":"iommu-group","status":"ok","group":"3","type":"DMA-FQ","untrusted":false,"swiotlb":null}"#);
    let dma = super::collect::guest_dma(&lazy, vm_spec::Slot::Root).unwrap();
    assert_eq!((dma.domain, dma.untrusted, dma.swiotlb), (IommuDomain::DmaFq, false, false));
    let odd = step(br#"{"step":"iommu-group","status":"ok","type":"unmanaged","untrusted":false,"swiotlb":null}"#);
    assert_eq!(super::collect::guest_dma(&odd, vm_spec::Slot::Root).unwrap().domain, IommuDomain::Other);
    let old_agent = step(br#"{"step":"iommu-group","status":"ok","group":"3","type":"DMA-FQ"}"#);
    assert_eq!(super::collect::guest_dma(&old_agent, vm_spec::Slot::Root), None);
    assert_eq!(super::collect::guest_dma(&Frames::default(), vm_spec::Slot::Root), None);
}

#[test]
fn bounced_maps_are_counted_against_the_pool_and_are_none_without_one() {
    let frames = |swiotlb: &str| {
        let mut port = encode(
            0,
            "step",
            false,
            format!(r#"{{"step":"iommu-group","status":"ok","type":"DMA","untrusted":true,"swiotlb":{swiotlb}}}"#)
                .as_bytes(),
        );
        port.extend(encode(1, "netdev-before", false, br#"{"rx_packets":0,"tx_packets":0}"#));
        port.extend(encode(2, "workload-begin", false, br#"{"workload":"iperf3","direction":"tx"}"#));
        port.extend(encode(3, "netdev-after", false, br#"{"rx_packets":100,"tx_packets":1000}"#));
        engines::agent::parse(&port)
    };
    let snapshot = |writable: u64, read_only: u64, bounced_w: u64, bounced_r: u64| Snapshot {
        host_cpu: None,
        iommu: Some(IommuCounts {
            maps: writable + read_only,
            maps_writable: writable,
            maps_read_only: read_only,
            bounced_maps_writable: bounced_w,
            bounced_maps_read_only: bounced_r,
            ..IommuCounts::default()
        }),
        model: None,
    };
    let window =
        Window { begin: Some(snapshot(10, 10, 0, 5)), end: Some(snapshot(60, 1010, 0, 905)), ..Default::default() };
    let with_pool = frames(r#"{"start":"0x1000","end":"0x1fff"}"#);
    let mut record = passed("tx");
    record.guest_dma = super::collect::guest_dma(&with_pool, vm_spec::Slot::Thunderbolt);
    agent_figures(&mut record, &with_pool, &window);
    assert_eq!((record.rx_maps_per_packet, record.tx_maps_per_packet), (Some(0.5), Some(1.0)));
    assert_eq!((record.rx_bounced_maps_per_packet, record.tx_bounced_maps_per_packet), (Some(0.0), Some(0.9)));
    let without = frames("null");
    let mut record = passed("tx");
    record.guest_dma = super::collect::guest_dma(&without, vm_spec::Slot::Root);
    agent_figures(&mut record, &without, &window);
    assert_eq!(
        (record.rx_bounced_maps_per_packet, record.tx_bounced_maps_per_packet),
        (Some(0.0), Some(0.0)),
        "no pool"
    );
    let mut record = passed("tx");
    agent_figures(&mut record, &Frames::default(), &window);
    assert_eq!(record.tx_bounced_maps_per_packet, None, "the guest did not say");
}

#[test]
fn a_restored_guest_s_steps_count_from_its_restore() {
    let mut port = encode(0, "ready", false, br#"{"slot":"empty","at":5.5}"#);
    port.extend(encode(1, "step", false, br#"{"step":"probe","status":"ok","secs":0.4,"at":6.0}"#));
    port.extend(encode(2, "step", false, br#"{"step":"link-up","status":"ok","secs":1.2,"at":7.25}"#));
    let frames = engines::agent::parse(&port);
    let mut restored = passed("iperf-rx");
    restored.boot = Some(BootKind::Restored);
    agent_figures(&mut restored, &frames, &Window::default());
    assert_eq!((restored.timings.driver_probe_ms, restored.timings.link_up_ms), (Some(500.0), Some(1750.0)));
    let mut booted = passed("iperf-rx");
    booted.boot = Some(BootKind::Booted);
    agent_figures(&mut booted, &frames, &Window::default());
    assert_eq!((booted.timings.driver_probe_ms, booted.timings.link_up_ms), (Some(6000.0), Some(7250.0)));
}

#[test]
fn the_agent_s_frames_fill_the_record_over_the_workload_s_window() {
    let mut port = Vec::new();
    port.extend(encode(0, "step", false, br#"{"step":"probe","status":"ok","secs":0.4,"at":2.25}"#));
    port.extend(encode(1, "step", false, br#"{"step":"link-up","status":"ok","secs":1.5,"at":3.75}"#));
    port.extend(encode(1, "netdev-before", false, br#"{"rx_packets":1000,"rx_bytes":100000}"#));
    port.extend(encode(2, "workload-begin", false, br#"{"workload":"iperf3","direction":"rx"}"#));
    port.extend(encode(3, "workload-end", false, br#"{"workload":"iperf3","direction":"rx","exit":0}"#));
    port.extend(encode(4, "netdev-after", false, br#"{"rx_packets":81000,"rx_bytes":121100000}"#));
    let iperf = br#"{"end":{"sum_sent":{"bits_per_second":9.2e9,"retransmits":3},"sum_received":{"bits_per_second":9.14e9,"seconds":10.0}}}"#;
    port.extend(encode(5, "iperf3", false, iperf));
    let frames = engines::agent::parse(&port);
    let mut record = passed("iperf-rx");
    // Boot and link-up mapped 5000 times; the workload 48000 times more.
    let window = Window { begin: Some(counters(5000)), end: Some(counters(53_000)), ..Default::default() };
    agent_figures(&mut record, &frames, &window);
    assert_eq!(record.workload.gbit_s, Some(9.14));
    assert_eq!((record.timings.driver_probe_ms, record.timings.link_up_ms), (Some(2250.0), Some(3750.0)));
    assert_eq!((record.workload.rx_packets, record.workload.rx_bytes), (Some(80_000), Some(121_000_000)));
    assert_eq!(record.maps_per_packet, Some(0.6), "48000 maps over 80000 packets");
    assert_eq!(record.workload.packets_per_s, Some(8000.0));
    assert_eq!(record.workload.retransmits, Some(3));
    assert!(record.workload.output.as_ref().unwrap()["end"].is_object(), "iperf3's JSON, verbatim");
}

/// Counters split by direction, with the model's own count and the live mappings.
fn split(writable: u64, read_only: u64, model: u64, live: u64) -> Snapshot {
    let iommu = IommuCounts {
        maps: writable + read_only,
        maps_writable: writable,
        maps_read_only: read_only,
        live_mappings: live,
        // a request per map and unmap, and a few others
        requests: 2 * (writable + read_only) + 10,
        ..IommuCounts::default()
    };
    // the host's CPU grows with the maps: 1 us of vCPU per map, 100 ns of the VMM's others
    let host_cpu = engines::HostCpu {
        vcpu_ns: (writable + read_only) * 1000,
        vmm_other_ns: (writable + read_only) * 100,
        model_ns: model * 10,
    };
    Snapshot {
        iommu: Some(iommu),
        model: Some(vm_spec::counters::ModelCounters { dma_maps: model, ..Default::default() }),
        host_cpu: Some(host_cpu),
    }
}

#[test]
fn maps_split_by_direction_page_reuse_and_the_teardown_are_recorded() {
    let ethtool = |flips: u64, reuses: u64, frees: u64| {
        format!(
            "NIC statistics:\n     InPackets: 9\n     Queue[0] InPackets: 9\n     Queue[0] PageFlips: {flips}\n     \
             Queue[0] PageReuses: {reuses}\n     Queue[0] PageFrees: {frees}\n     Queue[1] PageFlips: 1\n"
        )
    };
    let mut port = Vec::new();
    port.extend(encode(1, "ethtool-S-before", true, ethtool(100, 50, 10).as_bytes()));
    port.extend(encode(2, "netdev-before", false, br#"{"rx_packets":0,"tx_packets":0}"#));
    port.extend(encode(3, "workload-begin", false, br#"{"workload":"iperf3","direction":"rx"}"#));
    port.extend(encode(4, "workload-end", false, br#"{"workload":"iperf3","direction":"rx","exit":0}"#));
    port.extend(encode(5, "netdev-after", false, br#"{"rx_packets":10000,"tx_packets":5000}"#));
    port.extend(encode(6, "ethtool-S-after", true, ethtool(4100, 2050, 2010).as_bytes()));
    port.extend(encode(7, "stat-before", true, b"cpu  10 0 20 500 0 1 30 0 0 0\nintr 0\n"));
    port.extend(encode(8, "stat-after", true, b"cpu  15 0 40 600 0 2 80 0 0 0\nintr 0\n"));
    port.extend(encode(9, "step", false, br#"{"step":"unload","status":"ok"}"#));
    let frames = engines::agent::parse(&port);
    let mut record = passed("iperf-rx");
    // 5000 RX buffer maps and 5000 TX maps in the window; the model saw 10100 (some split).
    let window = Window {
        begin: Some(split(1000, 200, 1300, 900)),
        end: Some(split(6000, 5200, 11_400, 950)),
        done: Some(split(6100, 5300, 11_600, 3)),
        ..Default::default()
    };
    agent_figures(&mut record, &frames, &window);
    assert_eq!(record.rx_maps_per_packet, Some(0.5), "5000 writable maps over 10000 packets received");
    assert_eq!(record.tx_maps_per_packet, Some(1.0), "5000 read-only maps over 5000 packets sent");
    assert_eq!(record.maps_per_packet, Some(1.0), "all 10000 maps over the packets received");
    assert_eq!(record.model_maps_per_packet, Some(1.01));
    assert_eq!(record.shown_maps(), Some(0.5), "the table's figure is the RX side");
    // Refills 4000 flips + 2000 reuses + 2000 frees: 6000 of 8000 needed no new page.
    assert_eq!(record.page_reuse, Some(0.75));
    assert_eq!(record.mappings_after_unload, Some(3));
    // Requests: 2 per map and unmap of the window's 10000 maps, over the 10000 packets.
    assert_eq!(record.viommu_requests_per_packet, Some(2.0));
    // CPU: the guest busy 5+20+1+50 ticks (760 ms), the host 10000 maps x 1.1 us and the
    // model's 10100 maps x 10 ns, over the 10000 packets received.
    let cpu = record.cpu.unwrap();
    assert_eq!(cpu.guest.unwrap().busy_ms(), 760.0);
    assert_eq!(cpu.guest_ns_per_packet, Some(76_000.0));
    assert_eq!(cpu.host.unwrap().vcpu_ns, 10_000_000);
    assert_eq!(cpu.host_ns_per_packet, Some(1110.1));
    let metrics = record.metrics();
    assert_eq!(metrics[&crate::metric::Metric::HostCpuNsPerPacket], 1110.1);
    assert_eq!(metrics[&crate::metric::Metric::GuestCpuNsPerPacket], 76_000.0);
    assert_eq!(metrics[&crate::metric::Metric::ViommuRequestsPerPacket], 2.0);
    let booted = Booted {
        ending: Ending::Stopped { reason: ExitReason::Poweroff, detail: None },
        exit: None,
        error: None,
        iommu: None,
        device_counters: None,
        device_error: None,
        window: window.clone(),
        silent_for: None,
        answered_ms: None,
        run_ms: None,
        vmm_stderr: String::new(),
        model_ended: None,
    };
    let output = linux("", frames);
    let failure = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert_eq!(failure.status(), Status::Fail);
    assert_eq!(failure.to_string(), "the driver left 3 IOMMU mapping(s) behind after it was unloaded");
    // The model died under the VM: the lab's error, whatever the guest made of it.
    let died = Booted {
        model_ended: Some("the aqc100 model ended (signal 9) during the repetition".into()),
        ..booted.clone()
    };
    let failure = judge(&died, &output, &record, 60.0).unwrap_err();
    assert_eq!(
        (failure.status(), failure.to_string().as_str()),
        (Status::Error, "the aqc100 model ended (signal 9) during the repetition")
    );
    // A model that saw fewer maps than the guest made: one of the counts is wrong.
    record.mappings_after_unload = Some(0);
    record.model_maps_per_packet = Some(0.9);
    let failure = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert_eq!(failure.status(), Status::Error);
    assert!(failure.to_string().contains("fewer DMA maps (0.9000 per packet) than the virtio-iommu saw"));
    // A few maps short over the 10000 packets (the last ones on their way to the model when
    // the window closed) is the window's edge; more is a disagreement.
    record.model_maps_per_packet = Some(0.9995);
    let next = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert_eq!(next.to_string(), "the agent did not finish; its last step: unload", "5 maps short: the next check's");
    record.model_maps_per_packet = Some(0.9990);
    let failure = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert!(matches!(failure, crate::failure::Failure::CountsDisagree { .. }), "10 maps short: {failure}");
}

#[test]
fn a_pulled_device_needs_no_throughput_but_a_clean_agent() {
    let mut port = encode(0, "step", false, br#"{"step":"surprise-unplug","status":"ok","gone_within_s":0.01}"#);
    port.extend(encode(1, "done", false, br#"{"ok":true,"failed":[]}"#));
    let output = linux("", engines::agent::parse(&port));
    let booted = Booted {
        ending: Ending::Stopped { reason: ExitReason::Poweroff, detail: None },
        ..Booted::failed(Ending::Killed)
    };
    let mut record = passed("rx-pulled");
    let failure = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert_eq!(failure.to_string(), "the workload reported nothing", "no figures and no pull");
    record.timings.pulled_ms = Some(12_000.0);
    judge(&booted, &output, &record, 60.0).unwrap();
    let mut port =
        encode(0, "step", false, br#"{"step":"surprise-unplug","status":"fail","reason":"eth0 still exists"}"#);
    port.extend(encode(1, "done", false, br#"{"ok":false,"failed":["surprise-unplug"]}"#));
    let failure = judge(&booted, &linux("", engines::agent::parse(&port)), &record, 60.0).unwrap_err();
    assert_eq!(failure.to_string(), "step surprise-unplug failed: eth0 still exists");
}

#[test]
fn selftests_fail_naming_their_subtests_and_a_guest_that_died_among_them_is_an_error_naming_the_last() {
    const KTAP: &str = "TAP version 13\n1..2\n# selftests: drivers/net: ping.py\n# KTAP version 1\n# 1..2\n\
                        # ok 1 ping.test_v4\n# not ok 2 ping.test_tcp\nnot ok 1 selftests: drivers/net: ping.py # exit=1\n\
                        # selftests: drivers/net: stats.py\n# KTAP version 1\n# 1..2\n# ok 1 stats.check_pause\n";
    let mut port =
        encode(0, "step", false, br#"{"step":"kselftest","status":"fail","reason":"selftests failed: ping.py"}"#);
    port.extend(encode(1, "done", false, br#"{"ok":false,"failed":["kselftest"]}"#));
    let output = linux("", engines::agent::parse(&port));
    let powered_off = Booted {
        ending: Ending::Stopped { reason: ExitReason::Poweroff, detail: None },
        ..Booted::failed(Ending::Killed)
    };
    let mut record = passed("nic-selftests");
    let finished = format!("{KTAP}# ok 2 stats.pkt_byte_sum\nok 2 selftests: drivers/net: stats.py\n");
    record.workload.kselftest = Some(Ktap::parse(&finished));
    let failure = judge(&powered_off, &output, &record, 60.0).unwrap_err();
    assert_eq!((failure.status(), failure.to_string()), (Status::Fail, "selftests failed: ping.test_tcp".into()));
    // The guest panicked in stats.py after its first subtest: the console's KTAP ends there.
    record.workload.kselftest =
        Some(Ktap::parse(&format!("{KTAP}[  80.1] Kernel panic - not syncing: Fatal exception\n")));
    record.crash = Some(engines::crash::Crash {
        kind: engines::crash::CrashKind::Panic,
        line: "Kernel panic - not syncing: Fatal exception".into(),
        frames: Vec::new(),
        fingerprint: "f".into(),
    });
    let died = Booted {
        ending: Ending::Stopped { reason: ExitReason::Panic, detail: None },
        ..Booted::failed(Ending::Killed)
    };
    let failure = judge(&died, &output, &record, 60.0).unwrap_err();
    assert_eq!(failure.status(), Status::Error);
    assert_eq!(
        failure.to_string(),
        "the selftests did not finish: selftests: drivers/net: stats.py, after stats.check_pause was running when the \
         kernel logged panic: Kernel panic - not syncing: Fatal exception"
    );
}

#[test]
fn a_thunderbolt_cell_whose_guest_trusted_the_device_is_an_error() {
    let port = encode(0, "done", false, br#"{"ok":true,"failed":[]}"#);
    let output = linux("", engines::agent::parse(&port));
    let booted = Booted {
        ending: Ending::Stopped { reason: ExitReason::Poweroff, detail: None },
        ..Booted::failed(Ending::Killed)
    };
    let mut record = passed("rx");
    record.workload.gbit_s = Some(1.0);
    record.engine = EngineKind::Qemu;
    let dma = |slot, untrusted| Some(GuestDma { slot, domain: IommuDomain::DmaFq, untrusted, swiotlb: false });
    record.guest_dma = dma(vm_spec::Slot::Thunderbolt, false);
    let failure = judge(&booted, &output, &record, 60.0).unwrap_err();
    assert_eq!(failure.status(), Status::Error);
    assert!(failure.to_string().contains("the guest did not take it for untrusted"), "{failure}");
    assert!(failure.to_string().contains("engine qemu"), "{failure}");
    record.guest_dma = dma(vm_spec::Slot::Thunderbolt, true);
    judge(&booted, &output, &record, 60.0).unwrap();
    record.guest_dma = dma(vm_spec::Slot::Root, false);
    judge(&booted, &output, &record, 60.0).unwrap();
}

#[test]
fn a_tx_workload_counts_maps_per_packet_sent() {
    let mut port = Vec::new();
    port.extend(encode(1, "netdev-before", false, br#"{"rx_packets":10,"tx_packets":100}"#));
    port.extend(encode(2, "workload-begin", false, br#"{"workload":"iperf3","direction":"tx"}"#));
    port.extend(encode(3, "workload-end", false, br#"{"workload":"iperf3","direction":"tx","exit":0}"#));
    port.extend(encode(4, "netdev-after", false, br#"{"rx_packets":2010,"tx_packets":4100}"#));
    let frames = engines::agent::parse(&port);
    let mut record = passed("iperf-tx");
    let window = Window { begin: Some(counters(100)), end: Some(counters(8100)), ..Default::default() };
    agent_figures(&mut record, &frames, &window);
    assert_eq!((record.workload.rx_packets, record.workload.tx_packets), (Some(2000), Some(4000)));
    assert_eq!(record.maps_per_packet, Some(2.0), "8000 maps over 4000 packets sent, not 2000 ACKs received");
    assert_eq!(record.workload.direction, Some(Direction::Tx));
    assert_eq!(record.shown_maps(), Some(2.0), "no split in these counters: all maps over packets sent");
    assert_eq!(record.workload.rx_bytes, None, "no byte counts in the frames");
}

#[test]
fn linux_cells_get_the_agent_s_words() {
    let text = "name = \"l\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"debian\"\nkernel = \"/boot/vmlinux\"\n\
                cmdline = \"quiet\"\n[[variant]]\nname = \"order3\"\nimage = \"debian\"\nparams = { \"atlantic.rxpageorder\" = 3 }\n\
                [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\nip = 6\nduration_s = 8\n";
    let plan = Plan::parse(std::path::Path::new("l.toml"), text).unwrap();
    let words = plan.cmdline(&plan.cells[0]);
    assert_eq!(
        words,
        "quiet atlantic.rxpageorder=3 console=ttyS0 panic=-1 driverlab.nic=atlantic driverlab.mtu=1500 \
         driverlab.iperf=rx,8,6,1,tcp"
    );
}

// --- Whole repetitions and runs under an engine that boots nothing -----------------------------

/// What one scripted boot leaves: the console, and how the engine says the VM ended.
struct Boot {
    serial: String,
    booted: Booted,
}

/// An engine that boots nothing: each boot writes its script's console into the spec's COM1
/// file and hands back its script's [`Booted`]. Health checks (their console is `health.log`)
/// get a healthy probe unless the script says otherwise.
#[derive(Clone, Default)]
struct Scripted {
    state: Arc<Mutex<ScriptState>>,
}

#[derive(Default)]
struct ScriptState {
    cells: VecDeque<Boot>,
    health: VecDeque<Boot>,
    specs: Vec<VmSpec>,
    /// How each cell's VM was asked to start: `boot`, `snapshot` or `restore`.
    starts: Vec<&'static str>,
    /// What each restored VM was to read on COM2.
    com2_inputs: Vec<String>,
    /// What each restored VM was to get in its payload window.
    payloads: Vec<Option<std::path::PathBuf>>,
    /// A VM to be snapshotted stops into its snapshot (its agent reached `ready`), or powers
    /// off without one.
    snapshots_fail: bool,
}

impl Scripted {
    fn cells(boots: impl IntoIterator<Item = Boot>) -> Scripted {
        let engine = Scripted::default();
        engine.state.lock().unwrap().cells.extend(boots);
        engine
    }

    fn with_health(self, boots: impl IntoIterator<Item = Boot>) -> Scripted {
        self.state.lock().unwrap().health.extend(boots);
        self
    }

    fn specs(&self) -> Vec<VmSpec> {
        self.state.lock().unwrap().specs.clone()
    }
}

impl Engine for Scripted {
    fn boot(&self, request: BootRequest<'_>) -> Booted {
        let SerialOutput::File(console) = &request.spec.serial.com1 else {
            return Booted::failed(Ending::Refused("COM1 is no file".into()));
        };
        let mut state = self.state.lock().unwrap();
        state.specs.push(request.spec.clone());
        let health = console.file_name().is_some_and(|n| n == "health.log");
        match request.start {
            engines::Start::Snapshot { dir } => {
                state.starts.push("snapshot");
                std::fs::write(console, "booted to the ready point\n").unwrap();
                if state.snapshots_fail {
                    return stopped(ExitReason::Poweroff, 0);
                }
                std::fs::create_dir(dir).unwrap();
                std::fs::write(dir.join("state"), "a snapshot").unwrap();
                if let Some(SerialOutput::File(agent)) = &request.spec.serial.com2 {
                    std::fs::write(agent, encode(0, "ready", false, br#"{"slot":"empty","at":5.5}"#)).unwrap();
                }
                return stopped(ExitReason::Snapshot, 0);
            }
            engines::Start::Restore { com2_input, payload, .. } => {
                state.starts.push("restore");
                state.com2_inputs.push(com2_input.unwrap_or_default().to_string());
                state.payloads.push(payload.map(Path::to_path_buf));
            }
            engines::Start::Boot if !health => state.starts.push("boot"),
            engines::Start::Boot => {}
        }
        let boot =
            if health { Some(state.health.pop_front().unwrap_or_else(healthy)) } else { state.cells.pop_front() };
        let Some(boot) = boot else { return Booted::failed(Ending::Refused("no boot scripted".into())) };
        std::fs::write(console, &boot.serial).unwrap();
        boot.booted
    }
}

/// A Linux matrix of `repetitions` whose NIC (a host device) waits in a Thunderbolt slot, its
/// cells started from their snapshot; its kernel and initrd are files in `dir`.
fn snapshot_plan(dir: &Path, repetitions: u32) -> RunPlan {
    snapshot_plan_with(dir, repetitions, "")
}

/// [`snapshot_plan`] with more of the `stock` variant's lines (its parameters).
fn snapshot_plan_with(dir: &Path, repetitions: u32, variant: &str) -> RunPlan {
    for file in ["vmlinux", "initrd"] {
        std::fs::write(dir.join(file), file).unwrap();
    }
    let text = format!(
        "name = \"s\"\nrepetitions = {repetitions}\nboot = \"snapshot\"\n[[device]]\nname = \"nic\"\n\
         bdf = \"0000:63:00.0\"\nslot = \"thunderbolt\"\n[[image]]\nname = \"debian\"\nkernel = \"{0}/vmlinux\"\n\
         initrd = \"{0}/initrd\"\ncmdline = \"loglevel=5\"\n[[variant]]\nname = \"stock\"\nimage = \"debian\"\n{variant}\n\
         [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\nip = 4\nduration_s = 1\n",
        dir.display()
    );
    let plan = Plan::parse(&dir.join("s.toml"), &text).unwrap();
    RunPlan::prepare(plan, &guest_images::store::ImageStore::new(dir.join("images")), &|_| {}).unwrap()
}

#[test]
fn a_cell_is_snapshotted_once_its_repetitions_restored_and_a_failed_restore_run_again_booted() {
    let dir = tempfile::tempdir().unwrap();
    let plan = snapshot_plan(dir.path(), 2);
    // Each restored guest and each booted one ends without its agent's frames: a failure.
    let ended = || Boot { serial: "restored guest's console\n".into(), booted: stopped(ExitReason::Poweroff, 0) };
    let engine = Scripted::cells((0..4).map(|_| ended()));
    let env = lab(dir.path(), &engine, false);
    let ctx = RunContext { run: "r".into(), artifacts: dir.path().join("artifacts") };
    let cell = &plan.plan.cells[0];
    let first = run(&env, &plan, &ctx, cell, 0);
    let second = run(&env, &plan, &ctx, cell, 1);
    let starts = engine.state.lock().unwrap().starts.clone();
    assert_eq!(starts, ["snapshot", "restore", "boot", "restore", "boot"], "one snapshot for the cell");
    for record in [&first, &second] {
        assert_eq!(record.boot, Some(BootKind::Booted), "the booted re-run counts");
        assert_eq!(record.retried.len(), 1, "{:?}", record.retried);
        assert!(record.retried[0].reason.starts_with("restored from its cell's snapshot, it ended FAIL"));
    }
    let specs = engine.specs();
    assert_eq!(
        specs[0].cmdline, "loglevel=5 console=ttyS0 panic=-1 driverlab.snapshot=1",
        "the agent's words go later"
    );
    assert!(specs[1].cmdline.contains("driverlab.iperf=rx,1,4,1,tcp"), "{}", specs[1].cmdline);
    let inputs = engine.state.lock().unwrap().com2_inputs.clone();
    assert!(inputs.len() == 2 && inputs[0] == inputs[1], "{inputs:?}");
    assert!(
        inputs[0].starts_with("driverlab.nic=atlantic driverlab.mtu=1500 driverlab.iperf=rx,1,4,1,tcp"),
        "{inputs:?}"
    );
    assert!(!inputs[0].contains("console="), "only the words the snapshot's line lacks: {inputs:?}");
    assert!(!specs[2].cmdline.contains("driverlab.snapshot"), "the re-run boots as a cold cell does");
    assert!(specs[0].devices.iter().all(|d| !d.plugged), "the snapshot's slot is empty");
    // The restored attempt's console: the snapshot's guest's, then the restored one's.
    let restored = std::fs::read_to_string(dir.path().join("artifacts/c01/rep0.restored/serial.log")).unwrap();
    assert_eq!(restored, "booted to the ready point\nrestored guest's console\n");
    assert_eq!(first.retried[0].artifacts.as_deref(), Some("c01/rep0.restored"));
    let stored: Vec<_> = std::fs::read_dir(dir.path().join("images/.snapshots")).unwrap().flatten().collect();
    assert_eq!(stored.len(), 1, "one snapshot in the store");
    let key = std::fs::read_to_string(stored[0].path().join("key.json")).unwrap();
    assert!(key.contains("driverlab.snapshot=1") && key.contains("slot=thunderbolt,plugged=false"), "{key}");
}

/// Runs one repetition of each of `plan`'s two cells, every guest ending without its agent's
/// frames (so each restored one is run again booted); the engine, to ask what it started.
fn each_cell_once(dir: &Path, plan: &RunPlan) -> Scripted {
    let ended = || Boot { serial: "console\n".into(), booted: stopped(ExitReason::Poweroff, 0) };
    let engine = Scripted::cells((0..4).map(|_| ended()));
    let env = lab(dir, &engine, false);
    let ctx = RunContext { run: "r".into(), artifacts: dir.join("artifacts") };
    for cell in &plan.plan.cells {
        run(&env, plan, &ctx, cell, 0);
    }
    engine
}

#[test]
fn cells_that_differ_in_the_driver_s_parameters_share_one_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let plan = snapshot_plan_with(dir.path(), 1, "params = { \"atlantic.rxpageorder\" = [\"0\", \"3\"] }");
    assert_eq!(plan.plan.cells.len(), 2);
    let engine = each_cell_once(dir.path(), &plan);
    assert_eq!(engine.state.lock().unwrap().starts, ["snapshot", "restore", "boot", "restore", "boot"]);
    let specs = engine.specs();
    assert!(!specs[0].cmdline.contains("atlantic."), "the driver's parameters go later: {}", specs[0].cmdline);
    let inputs = engine.state.lock().unwrap().com2_inputs.clone();
    assert!(inputs[0].contains("atlantic.rxpageorder=0") && inputs[1].contains("atlantic.rxpageorder=3"), "{inputs:?}");
    let stored: Vec<_> = std::fs::read_dir(dir.path().join("images/.snapshots")).unwrap().flatten().collect();
    assert_eq!(stored.len(), 1, "one snapshot for both cells");
}

/// An initramfs image `id` in the store at `images` (no kernel named), in parts for snapshots:
/// `base` and its own `payload`.
fn split_image(images: &Path, id: &str, base: &[u8], payload: &[u8]) {
    use guest_images::initramfs_build::{InitramfsManifest, SnapshotParts};
    use guest_images::store::sha256;
    let dir = images.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let whole = [base, payload].concat();
    for (name, bytes) in [("initramfs.cpio.gz", &whole[..]), ("base.cpio.gz", base), ("payload.cpio", payload)] {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let parts = SnapshotParts {
        base: "base.cpio.gz".into(),
        base_sha256: sha256(base),
        payload: "payload.cpio".into(),
        payload_bytes: payload.len() as u64,
        payload_sha256: sha256(payload),
    };
    let manifest = InitramfsManifest {
        id: id.into(),
        kind: "initramfs".into(),
        kernel: String::new(),
        release: "6.12.0".into(),
        archive: "initramfs.cpio.gz".into(),
        size: whole.len() as u64,
        drivers: vec!["atlantic".into()],
        modules: Vec::new(),
        patches: Vec::new(),
        tools: Vec::new(),
        kselftest: None,
        files: Default::default(),
        snapshot_parts: Some(parts),
    };
    guest_images::store::write_manifest(&dir, &manifest).unwrap();
}

#[test]
fn driver_variants_of_one_kernel_share_one_snapshot_and_each_restored_guest_gets_its_payload() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let (stock, patched) = ("initramfs-00000000000000aa", "initramfs-00000000000000bb");
    split_image(&images, stock, b"base", b"stock module");
    split_image(&images, patched, b"base", b"patched module");
    std::fs::write(dir.path().join("vmlinux"), "a kernel").unwrap();
    let image = |name: &str, id: &str| {
        format!("[[image]]\nname = \"{name}\"\nkernel = \"{}/vmlinux\"\ninitrd = \"{id}\"\n", dir.path().display())
    };
    let text = format!(
        "name = \"s\"\nboot = \"snapshot\"\n[[device]]\nname = \"nic\"\nbdf = \"0000:63:00.0\"\nslot = \"thunderbolt\"\n\
         {}{}[[variant]]\nname = \"stock\"\nimage = \"stock\"\n[[variant]]\nname = \"patched\"\nimage = \"patched\"\n\
         [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\nip = 4\nduration_s = 1\n",
        image("stock", stock),
        image("patched", patched)
    );
    let plan = Plan::parse(&dir.path().join("s.toml"), &text).unwrap();
    let plan = RunPlan::prepare(plan, &guest_images::store::ImageStore::new(images.clone()), &|_| {}).unwrap();
    let engine = each_cell_once(dir.path(), &plan);
    let state = engine.state.lock().unwrap();
    assert_eq!(state.starts, ["snapshot", "restore", "boot", "restore", "boot"], "one snapshot for both images");
    let specs = &state.specs;
    assert_eq!(specs[0].initrd, Some(images.join(stock).join("base.cpio.gz")), "the snapshot boots the base");
    assert_eq!(specs[0].payload_window_mib, super::snapshot::PAYLOAD_WINDOW_MIB);
    assert_eq!(specs[2].initrd, Some(images.join(stock).join("initramfs.cpio.gz")), "a booted cell: the whole");
    assert_eq!(specs[2].payload_window_mib, 0);
    let payloads: Vec<_> = state.payloads.iter().map(|p| p.as_ref().unwrap().strip_prefix(&images).unwrap()).collect();
    assert_eq!(payloads, [Path::new(stock).join("payload.cpio"), Path::new(patched).join("payload.cpio")]);
    let sum = guest_images::store::sha256(b"patched module");
    assert!(state.com2_inputs[1].ends_with(&format!(" driverlab.payload=14:{sum}")), "{:?}", state.com2_inputs);
    let stored: Vec<_> = std::fs::read_dir(images.join(".snapshots")).unwrap().flatten().collect();
    assert_eq!(stored.len(), 1, "one snapshot in the store");
}

#[test]
fn a_snapshot_that_cannot_be_taken_is_tried_once_and_the_cell_boots() {
    let dir = tempfile::tempdir().unwrap();
    let plan = snapshot_plan(dir.path(), 2);
    let ended = || Boot { serial: "console\n".into(), booted: stopped(ExitReason::Poweroff, 0) };
    let engine = Scripted::cells((0..2).map(|_| ended()));
    engine.state.lock().unwrap().snapshots_fail = true;
    let env = lab(dir.path(), &engine, false);
    let ctx = RunContext { run: "r".into(), artifacts: dir.path().join("artifacts") };
    let records: Vec<Record> = (0..2).map(|rep| run(&env, &plan, &ctx, &plan.plan.cells[0], rep)).collect();
    assert_eq!(engine.state.lock().unwrap().starts, ["snapshot", "boot", "boot"]);
    assert!(records.iter().all(|r| r.boot == Some(BootKind::Booted) && r.retried.is_empty()));
    let notes: Vec<_> = std::fs::read_dir(dir.path().join("images/.snapshots")).unwrap().flatten().collect();
    let note = std::fs::read_to_string(notes[0].path()).unwrap();
    assert!(note.starts_with("r\nthe guest did not reach its ready point"), "{note}");
}

/// A VM that stopped for `reason`, its virtio-iommu having counted `maps`.
fn stopped(reason: ExitReason, maps: u64) -> Booted {
    Booted {
        ending: Ending::Stopped { reason, detail: None },
        iommu: Some(IommuCounts { maps, unmaps: maps, ..IommuCounts::default() }),
        run_ms: Some(12.0),
        ..Booted::failed(Ending::Killed)
    }
}

/// The probe's report of 1000 frames received after 64 set-up maps, and its end.
fn probe_report(ok: bool, failures: &[&str]) -> String {
    let done = serde_json::json!({"probe": "done", "ok": ok, "failures": failures});
    format!(
        "{{\"probe\":\"nic\",\"rx_frames\":1000,\"rx_bytes\":1514000,\"elapsed_ns\":1000000,\"rx_interrupts\":10,\
         \"initial_maps\":64}}\n{done}\n"
    )
}

/// A probe that passed its checks and received 1000 frames with 500 maps.
fn passing() -> Boot {
    Boot { serial: probe_report(true, &[]), booted: stopped(ExitReason::Poweroff, 564) }
}

/// A health check that passed.
fn healthy() -> Boot {
    passing()
}

/// A probe matrix of `repetitions` on a host device (no model process, no peer to start).
fn probe_plan(dir: &Path, repetitions: u32) -> RunPlan {
    let text = format!(
        "name = \"m\"\nrepetitions = {repetitions}\n[[device]]\nname = \"nic\"\nbdf = \"0000:63:00.0\"\n\
         [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"flip\"\nimage = \"probe\"\n\
         params = {{ \"probe.rx\" = \"flip\" }}\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\nframes = 1000\n"
    );
    let plan = Plan::parse(&dir.join("m.toml"), &text).unwrap();
    RunPlan::prepare(plan, &guest_images::store::ImageStore::new(dir.join("images")), &|_| {}).unwrap()
}

/// A lab whose VMs run under `engine`, on a host that `emulated` says TCG emulates or not.
fn lab(dir: &Path, engine: &Scripted, emulated: bool) -> LabEnv {
    let host = HostFacts {
        virt: vm_spec::host::Virtualization::Pvm,
        vfio: true,
        root: false,
        ssh: false,
        emulated_by_tcg: emulated,
    };
    let images = guest_images::store::ImageStore::new(dir.join("images"));
    let programs = engines::Programs::of(&dir.join("driverlab"));
    LabEnv::with_engines(programs, images, host, Box::new(engine.clone()), Err("no QEMU".into()))
}

/// One repetition of the plan's first cell under `engine`.
fn one(boot: Boot) -> (Record, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let plan = probe_plan(dir.path(), 1);
    let engine = Scripted::cells([boot]);
    let env = lab(dir.path(), &engine, false);
    let ctx = RunContext { run: "r".into(), artifacts: dir.path().join("artifacts") };
    (run(&env, &plan, &ctx, &plan.plan.cells[0], 0), dir)
}

#[test]
fn a_passing_repetition_has_the_probe_s_figures_and_its_console_as_an_artifact() {
    let (record, dir) = one(passing());
    assert_eq!((record.status, record.failure.as_ref()), (Status::Pass, None), "{:?}", record.reason);
    assert_eq!(record.maps_per_packet, Some(0.5), "500 maps beyond the 64 of set-up, over 1000 frames");
    assert_eq!(record.workload.gbit_s, Some(12.112), "1514000 bytes in 1 ms");
    assert_eq!((record.workload.rx_packets, record.interrupts), (Some(1000), Some(10)));
    assert_eq!(record.serial_log.as_deref(), Some("c01/rep0/serial.log"));
    assert!(dir.path().join("artifacts/c01/rep0/serial.log").exists());
}

#[test]
fn a_guest_that_falls_silent_is_a_hang_with_its_last_line_and_a_hang_among_the_crashes() {
    let booted = Booted {
        ending: Ending::Stopped { reason: ExitReason::Shutdown, detail: None },
        silent_for: Some(Duration::from_secs(61)),
        ..Booted::failed(Ending::Killed)
    };
    let (record, _dir) = one(Boot { serial: "[ 2.5] atlantic: link up\n".into(), booted });
    assert_eq!(record.status, Status::Fail);
    assert!(matches!(record.failure, Some(Failure::Hang { .. })), "{:?}", record.failure);
    assert_eq!(record.reason.as_deref(), Some("hung: no serial output for 61 s after \"[ 2.5] atlantic: link up\""));
    assert_eq!(record.crash.map(|c| c.kind), Some(CrashKind::Hang));
}

#[test]
fn a_panic_in_the_console_is_a_crash_whatever_the_guest_then_did() {
    let serial = "[ 3.1] Kernel panic - not syncing: Fatal exception in interrupt\n";
    let (record, _dir) = one(Boot { serial: serial.into(), booted: stopped(ExitReason::Panic, 0) });
    assert_eq!(record.status, Status::Fail);
    assert_eq!(
        record.failure,
        Some(Failure::Crash {
            crash: CrashKind::Panic,
            line: "Kernel panic - not syncing: Fatal exception in interrupt".into()
        })
    );
}

#[test]
fn a_model_that_died_under_the_vm_is_the_lab_s_error_not_the_guest_s() {
    let booted = Booted { model_ended: Some("the aqc100 model ended (signal 9)".into()), ..passing().booted };
    let (record, _dir) = one(Boot { serial: probe_report(false, &["no frames"]), booted });
    assert_eq!(record.status, Status::Error);
    assert_eq!(record.failure, Some(Failure::ModelDied { what: "the aqc100 model ended (signal 9)".into() }));
}

#[test]
fn the_workload_s_own_verdict_fails_a_repetition_that_ended_cleanly() {
    let boot =
        Boot { serial: probe_report(false, &["rx: 0 of 1000 frames"]), booted: stopped(ExitReason::Poweroff, 64) };
    let (record, _dir) = one(boot);
    assert_eq!((record.status, record.reason.as_deref()), (Status::Fail, Some("rx: 0 of 1000 frames")));
    let (record, _dir) = one(Boot { serial: String::new(), booted: stopped(ExitReason::Poweroff, 64) });
    assert_eq!(record.reason.as_deref(), Some("the probe did not finish its report"));
}

#[test]
fn the_engine_s_refusal_and_a_missing_engine_are_errors() {
    let (record, _dir) = one(Boot {
        serial: String::new(),
        booted: Booted::failed(Ending::Refused("the VMM could not run the VM (Kvm): no /dev/kvm".into())),
    });
    assert_eq!(
        (record.status, record.reason.as_deref()),
        (Status::Error, Some("the VMM could not run the VM (Kvm): no /dev/kvm"))
    );
    // An image under QEMU on a lab without it: nothing starts.
    let dir = tempfile::tempdir().unwrap();
    let text = "name = \"m\"\n[[device]]\nname = \"nic\"\nbdf = \"0000:63:00.0\"\n[[image]]\nname = \"probe\"\n\
                kernel = \"probe\"\nengine = \"qemu\"\n[[variant]]\nname = \"flip\"\nimage = \"probe\"\n\
                [[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n";
    let plan = Plan::parse(&dir.path().join("m.toml"), text).unwrap();
    let plan = RunPlan::prepare(plan, &guest_images::store::ImageStore::new(dir.path().join("i")), &|_| {}).unwrap();
    let engine = Scripted::default();
    let ctx = RunContext { run: "r".into(), artifacts: dir.path().join("artifacts") };
    let record = run(&lab(dir.path(), &engine, false), &plan, &ctx, &plan.plan.cells[0], 0);
    assert_eq!(
        (record.status, record.reason.as_deref(), record.engine),
        (Status::Error, Some("no QEMU"), EngineKind::Qemu)
    );
    assert!(engine.specs().is_empty(), "nothing booted");
}

/// A run's progress, kept.
#[derive(Default)]
struct Kept(Mutex<Vec<String>>);

impl Progress for Kept {
    fn recorded(&self, record: &Record, done: usize, total: usize) {
        self.0.lock().unwrap().push(format!("{done}/{total} {}", record.status));
    }
    fn note(&self, line: &str) {
        self.0.lock().unwrap().push(line.to_string());
    }
}

/// Runs `plan` to its end under `engine` in a fresh database; the store and the run's ID.
fn whole_run(dir: &Path, plan: &RunPlan, engine: &Scripted, emulated: bool, progress: &Kept) -> (ResultsDb, String) {
    let env = lab(dir, engine, emulated);
    let mut store = ResultsDb::open(&dir.join("lab.db")).unwrap();
    let run_id = store.create_run(&plan.plan).unwrap();
    let store = Arc::new(Mutex::new(store));
    crate::scheduler::execute(store.clone(), &env, plan, &run_id, progress, &AtomicBool::new(false)).unwrap();
    let store = Arc::try_unwrap(store).ok().unwrap().into_inner().unwrap();
    (store, run_id)
}

#[test]
fn a_repetition_the_host_spoiled_is_run_again_and_the_spoiled_attempt_kept() {
    let dir = tempfile::tempdir().unwrap();
    let plan = probe_plan(dir.path(), 1);
    let lost = Booted {
        exit: serde_json::from_str(
            r#"{"vmm":"exit","reason":"shutdown","exit_code":7,"entry":"pvh","vcpus":1,"memory_mib":256,
                "setup_ms":1,"run_ms":9,"serial_bytes":0,"exits":{"io":0,"mmio":0,"unclaimed":0},
                "vcpu_state_lost":"vCPU 0: its page tables (cr3 0x123000) are outside guest memory"}"#,
        )
        .ok(),
        ..stopped(ExitReason::Shutdown, 0)
    };
    let engine = Scripted::cells([Boot { serial: String::new(), booted: lost }, passing()]);
    let progress = Kept::default();
    let (store, run_id) = whole_run(dir.path(), &plan, &engine, false, &progress);
    let records = store.records(&run_id).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Pass);
    assert_eq!(records[0].retried.len(), 1);
    assert!(records[0].retried[0].reason.starts_with(HOST_LOST_STATE), "{:?}", records[0].retried);
    let aside = records[0].retried[0].artifacts.as_deref().unwrap();
    assert!(store.artifacts(&run_id).join(aside).join("serial.log").exists(), "the spoiled attempt's console, kept");
    assert_eq!(store.run(&run_id).unwrap().state, RunState::Done);
    let notes = progress.0.lock().unwrap();
    assert!(notes.iter().any(|n| n.contains("running it again")), "{notes:?}");
    assert!(notes.iter().any(|n| n.starts_with("health PASS")), "{notes:?}");
}

#[test]
fn a_device_that_fails_its_health_check_is_quarantined_and_its_repetitions_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let plan = probe_plan(dir.path(), 3);
    let sick = Boot { serial: probe_report(false, &["link down"]), booted: stopped(ExitReason::Poweroff, 0) };
    let engine = Scripted::default().with_health([sick]);
    let (store, run_id) = whole_run(dir.path(), &plan, &engine, false, &Kept::default());
    let records = store.records(&run_id).unwrap();
    assert_eq!(records.len(), 3);
    for r in &records {
        assert_eq!(r.status, Status::Error);
        assert!(matches!(r.failure, Some(Failure::DeviceUnhealthy { .. })), "{:?}", r.failure);
        assert!(r.reason.as_deref().unwrap().contains("failed its health check: link down"), "{:?}", r.reason);
    }
    assert_eq!(store.quarantined("vfio=0000:63:00.0").unwrap().as_deref(), Some("link down"));
    assert_eq!(engine.specs().len(), 1, "one health check, no repetition booted");
}

#[test]
fn a_guest_that_died_on_an_emulated_host_is_run_again_and_on_a_real_one_is_not() {
    for (emulated, boots) in [(false, 1), (true, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let plan = probe_plan(dir.path(), 1);
        let reset = Boot { serial: String::new(), booted: stopped(ExitReason::TripleFault, 0) };
        let engine = Scripted::cells([reset, passing()]);
        let (store, run_id) = whole_run(dir.path(), &plan, &engine, emulated, &Kept::default());
        let record = store.records(&run_id).unwrap().remove(0);
        let cells = engine.specs().iter().filter(|s| s.cmdline.contains("probe.rx=flip")).count();
        assert_eq!(cells, boots, "emulated {emulated}");
        let want = if emulated { Status::Pass } else { Status::Fail };
        assert_eq!(record.status, want, "emulated {emulated}: {:?}", record.reason);
    }
}
