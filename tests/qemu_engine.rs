//! The QEMU engine against this project's own stack: the probe guest boots under both engines,
//! drives each one's virtio-iommu and the AQC100 and LAN7430 models, and must report the same maps per frame
//! for each RX strategy; any difference is a bug in one of them, and the test says which figures
//! disagree. The report of such a mixed run judges maps per packet across the engines and leaves
//! throughput unjudged, saying why.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::process::Command;

use common::{driverlab, kvm_available};
use serde_json::Value;

/// Whether forky's QEMU is set up where the engine looks (`driverlab engine setup qemu`).
fn qemu_available(test: &str) -> bool {
    match engines::qemu::Qemu::find(&engines::qemu::default_root()) {
        Ok(_) => true,
        Err(e) => {
            common::skip(test, common::Lacks::Setup, e);
            false
        }
    }
}

const MATRIX: &str = r#"
name = "probe-cross-check"
repetitions = 2
baseline = "driverlab"
timeout_s = 120
silence_s = 30

[[device]]
name = "aqc100"
model = "aqc100"
generate = "size=1514"

[[device]]
name = "lan7430"
model = "lan743x"
generate = "size=1514"

[[image]]
name = "probe"
kernel = "probe"

[[image]]
name = "probe-qemu"
kernel = "probe"
engine = "qemu"

[[variant]]
name = "driverlab"
image = "probe"
params = { "probe.rx" = ["flip", "order3", "pool"] }

[[variant]]
name = "qemu"
image = "probe-qemu"
params = { "probe.rx" = ["flip", "order3", "pool"] }

[[workload]]
name = "rx-20k"
kind = "probe-rx"
frames = 20000
"#;

#[test]
fn the_probe_reports_the_same_maps_per_frame_under_both_engines() {
    let test = "the_probe_reports_the_same_maps_per_frame_under_both_engines";
    if !kvm_available(test) || !qemu_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("cross.toml");
    std::fs::write(&matrix, MATRIX).unwrap();
    let db = dir.path().join("lab.db");
    let out = Command::new(driverlab())
        .args(["lab", "run"])
        .arg(&matrix)
        .args(["--format", "json"])
        .env("DRIVERLAB_DB", &db)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let json = stdout.lines().skip(1).take_while(|l| !l.starts_with("run ")).collect::<Vec<_>>().join("\n");
    let report: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["engine"], "mixed");
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 12, "three strategies, two engines, two NICs");

    // The records, for the figures each engine counted.
    let run = report["run"].as_str().unwrap();
    let show =
        Command::new(driverlab()).args(["lab", "show", run, "--json"]).env("DRIVERLAB_DB", &db).output().unwrap();
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    let records = shown["records"].as_array().unwrap();
    let figures = |engine: &str, device: &str, strategy: &str| -> Vec<(f64, u64, u64)> {
        records
            .iter()
            .filter(|r| {
                r["engine"] == engine && r["cell"]["device"] == device && r["cell"]["params"]["probe.rx"] == strategy
            })
            .map(|r| {
                assert_eq!(r["status"], "PASS", "{r}");
                let nic = &r["workload"]["output"];
                (
                    r["maps_per_packet"].as_f64().unwrap(),
                    nic["iommu_maps"].as_u64().unwrap() - nic["initial_maps"].as_u64().unwrap(),
                    nic["rx_frames"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    for (device, strategy, expected) in ["aqc100", "lan7430"]
        .into_iter()
        .flat_map(|d| [("flip", 0.5), ("order3", 0.0625), ("pool", 0.0)].map(|(s, e)| (d, s, e)))
    {
        let (own, qemu) = (figures("driverlab", device, strategy), figures("qemu", device, strategy));
        assert_eq!((own.len(), qemu.len()), (2, 2), "{device} {strategy}: two repetitions under each engine");
        for ((own_maps, own_counted, own_frames), (qemu_maps, qemu_counted, qemu_frames)) in own.iter().zip(&qemu) {
            assert_eq!(
                (own_counted, own_frames),
                (qemu_counted, qemu_frames),
                "{device} {strategy}: the probe counted (maps while receiving, frames) {own_counted}/{own_frames} \
                 under driverlab's VMM and {qemu_counted}/{qemu_frames} under QEMU"
            );
            assert_eq!(
                own_maps, qemu_maps,
                "{device} {strategy}: the virtio-iommu counted {own_maps} maps per frame under driverlab's VMM, \
                 QEMU's {qemu_maps}; the probe itself counted {own_counted} maps over {own_frames} frames"
            );
            assert!(
                (own_maps - expected).abs() < 0.002,
                "{device} {strategy}: {own_maps} maps per frame, by design {expected}"
            );
        }
    }

    // Throughput is not judged across the engines; maps per packet are.
    for cell in cells.iter().filter(|c| c["engine"] == "qemu") {
        assert!(cell["metrics"]["gbit_s"].get("verdict").is_none(), "{cell}");
        assert!(cell["metrics"]["maps_per_packet"].get("verdict").is_some(), "{cell}");
        let note = cell["notes"][0].as_str().unwrap_or_default();
        assert!(note.contains("not compared") && note.contains("under driverlab"), "{cell}");
    }
    for cell in cells.iter().filter(|c| c["engine"] == "driverlab") {
        assert_eq!(cell["verdict"], "baseline", "{cell}");
    }
}

/// QEMU's firmware moves every 64-bit BAR above 4 GiB when one does not fit below (here a 2 GiB
/// ivshmem BAR): the probe must map them itself and work as before.
#[test]
fn the_probe_drives_devices_whose_bars_lie_above_4_gib() {
    let test = "the_probe_drives_devices_whose_bars_lie_above_4_gib";
    let Ok(qemu) = engines::qemu::Qemu::find(&engines::qemu::default_root()) else {
        qemu_available(test);
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("probe.elf");
    std::fs::write(&kernel, guest_images::PROBE_ELF).unwrap();
    let model = common::start_model("aqc100", &["--generate", "size=1514,count=2000"]);
    let (serial, trace) = (dir.path().join("serial.log"), dir.path().join("trace.log"));
    let device = model.device_spec();
    let machine = engines::qemu::Machine {
        kernel: &kernel,
        initrd: None,
        cmdline: "probe.nic=aqc100 probe.frames=2000 probe.viommu_ops=0",
        memory_mib: 256,
        vcpus: 1,
        accel: engines::qemu::Accel::Tcg,
        iommu: true,
        device: &device,
        ssdt: None,
        com1: &serial,
        com2: None,
        trace: &trace,
    };
    let mut args = engines::qemu::machine_args(&machine);
    args.extend(
        ["-object", "memory-backend-ram,id=big,size=2G", "-device", "ivshmem-plain,memdev=big"].map(String::from),
    );
    let out = qemu.command(&args).output().unwrap();
    assert!(out.status.success(), "QEMU: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&serial).unwrap();
    let report = engines::ProbeReport::parse(&text);
    let devices = report.section("pci").unwrap()["devices"].as_array().unwrap().clone();
    let nic = devices.iter().find(|d| d["id"] == "1d6a:00b1").unwrap_or_else(|| panic!("{text}"));
    for bar in nic["bars"].as_array().unwrap() {
        assert!(bar["addr"].as_u64().unwrap() >= 1 << 32, "the firmware placed the NIC's BARs high: {nic}");
    }
    let done = report.done().unwrap_or_else(|| panic!("{text}"));
    assert!(done.ok, "{text}");
    assert_eq!(report.section("nic").unwrap()["maps_per_frame"], 0.5, "{text}");
}

/// Debian 6.12's stock lan743x driver against the LAN7430 model, one lab cell under the QEMU
/// engine: probe, MAC, link at 1000, ping, iperf3 from the guest, link down and up, unload and
/// reload, a clean dmesg (the agent's verdict), no mapping left.
#[test]
fn the_stock_lan743x_driver_drives_the_model_under_qemu() {
    let test = "the_stock_lan743x_driver_drives_the_model_under_qemu";
    if std::env::var_os("DRIVERLAB_LINUX_CHECK").is_none() {
        let why = "DRIVERLAB_LINUX_CHECK is not set (scripts/test.sh sets it as root, with QEMU 11.1)";
        common::skip(test, common::Lacks::Setup, why);
        return;
    }
    if !qemu_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("lan743x.toml");
    std::fs::write(
        &matrix,
        "name = \"lan743x-check\"\ntimeout_s = 240\nsilence_s = 120\n[[device]]\nname = \"lan7430\"\nmodel = \"lan743x\"\n\
         [[image]]\nname = \"debian\"\nengine = \"qemu\"\nkernel = \"debian\"\ninitrd = \"agent\"\nmodule = \"lan743x\"\n\
         memory_mib = 512\n[[variant]]\nname = \"stock\"\nimage = \"debian\"\ncmdline = \"driverlab.check=1\"\n\
         [[workload]]\nname = \"tx\"\nkind = \"iperf3\"\ndirection = \"tx\"\nduration_s = 5\n",
    )
    .unwrap();
    let db = dir.path().join("lab.db");
    let out = Command::new(driverlab()).args(["lab", "run"]).arg(&matrix).env("DRIVERLAB_DB", &db).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let run = stdout.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap().to_string();
    let show =
        Command::new(driverlab()).args(["lab", "show", &run, "--json"]).env("DRIVERLAB_DB", &db).output().unwrap();
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    let record = &shown["records"][0];
    assert_eq!((record["status"].as_str(), record["engine"].as_str()), (Some("PASS"), Some("qemu")), "{record}");
    assert_eq!(record["mappings_after_unload"], 0, "{record}");
    assert_eq!(record["device_counters"]["dma_faults"], 0, "{record}");
    assert!(record["workload"]["tx_packets"].as_u64().unwrap_or(0) > 1000, "{record}");
    let artifacts = shown["artifacts"].as_str().unwrap();
    let frames = engines::agent::parse(&std::fs::read(format!("{artifacts}/c01/rep0/agent.log")).unwrap());
    for step in
        ["probe", "link-up", "ping", "iperf-tx", "link-down", "link-up-again", "reload", "ping-reloaded", "unload"]
    {
        assert_eq!(frames.step(step).map(|s| s.status), Some(engines::agent::StepStatus::Ok), "step {step}: {record}");
    }
    let probe = frames.step("probe").unwrap();
    assert_eq!(
        (probe.facts["id"].as_str(), probe.facts["mac_source"].as_str()),
        (Some("1055:7430"), Some("permanent"))
    );
    assert_eq!(frames.step("link-up").unwrap().facts["speed"], 1000);
}

/// The host's own QEMU firmware folders, which a fresh machine does not have.
const HOST_FIRMWARE: [&str; 4] = ["/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe", "/usr/share/ipxe"];

/// One probe cell under QEMU.
const FIRMWARE_MATRIX: &str = r#"
name = "qemu-firmware"
repetitions = 1
timeout_s = 120
silence_s = 30

[[device]]
name = "aqc100"
model = "aqc100"
generate = "size=1514"

[[image]]
name = "probe-qemu"
kernel = "probe"
engine = "qemu"

[[variant]]
name = "qemu"
image = "probe-qemu"
params = { "probe.rx" = "flip" }

[[workload]]
name = "rx-2k"
kind = "probe-rx"
frames = 2000
"#;

#[test]
fn the_qemu_engine_finds_its_firmware_in_the_chroot_alone() {
    let test = "the_qemu_engine_finds_its_firmware_in_the_chroot_alone";
    if !kvm_available(test) || !qemu_available(test) {
        return;
    }
    if !engines::peer::can_create() {
        let why = "needs root (a private mount namespace that hides the host's firmware)";
        common::skip(test, common::Lacks::Setup, why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let matrix = dir.path().join("firmware.toml");
    std::fs::write(&matrix, FIRMWARE_MATRIX).unwrap();
    // Each host folder that exists gets the empty one mounted over it, in a mount namespace of
    // this command's own; the run inside sees no firmware but the chroot's.
    let mut script = String::from("set -e\n");
    for folder in HOST_FIRMWARE.iter().filter(|f| std::path::Path::new(f).is_dir()) {
        script.push_str(&format!("mount --bind {} {folder}\n", empty.display()));
    }
    script.push_str("for f in /usr/share/qemu /usr/share/seabios; do [ ! -e $f/bios-256k.bin ] || { echo \"$f still has firmware\"; exit 3; }; done\n");
    script.push_str("exec \"$@\"\n");
    let db = dir.path().join("lab.db");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(driverlab())
        .args(["lab", "run"])
        .arg(&matrix)
        .env("DRIVERLAB_DB", &db)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.ends_with("1 cells, 1 passed, 0 failed, 0 errors"), "{last}\n{stderr}");
}
