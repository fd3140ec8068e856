//! The lab through the real binary: the embedded default matrix end to end, kill -9 and resume,
//! hung and panicking guests, a device that fails its health check, cells this host cannot run.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{driverlab, kvm_available};
use serde_json::Value;

/// A results database of its own, and matrices next to it.
struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Lab {
        Lab { dir: tempfile::tempdir().unwrap() }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lab.db")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(driverlab());
        command.arg("lab").args(args).env("DRIVERLAB_DB", self.db());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().expect("driverlab starts")
    }

    fn matrix(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run ID from `run ID started`.
fn run_id(out: &str) -> String {
    let first = out.lines().next().unwrap_or_default();
    first.strip_prefix("run ").and_then(|r| r.strip_suffix(" started")).unwrap_or_else(|| panic!("{out}")).to_string()
}

fn metric(cell: &Value, name: &str) -> f64 {
    cell["metrics"][name]["mean"].as_f64().unwrap_or_else(|| panic!("{name} in {cell}"))
}

#[test]
fn the_embedded_default_matrix_ranks_the_strategies() {
    if !kvm_available("the_embedded_default_matrix_ranks_the_strategies") {
        return;
    }
    let lab = Lab::new();
    let matrix = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/probe-matrix.toml");
    let out = lab.run(&["run", matrix.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let run = run_id(&text);
    let last = text.lines().last().unwrap();
    assert_eq!(last, format!("run {run}: 3 cells, 15 passed, 0 failed, 0 errors"));

    let report = lab.json(&["report", &run, "--format", "json"]);
    assert_eq!((report["run"].as_str(), report["baseline"].as_str()), (Some(run.as_str()), Some("flip")));
    let cells = report["cells"].as_array().unwrap();
    let by_variant = |v: &str| cells.iter().find(|c| c["variant"] == v).unwrap_or_else(|| panic!("{v}"));
    let (flip, order3, pool) = (by_variant("flip"), by_variant("order3"), by_variant("pool"));
    for cell in [flip, order3, pool] {
        assert_eq!((cell["n"].as_u64(), cell["status"]["PASS"].as_u64()), (Some(5), Some(5)), "{cell}");
        // The 95 % interval of the mean of 5 samples: mean ± t(0.975, 4) · s / √5.
        let m = &cell["metrics"]["gbit_s"];
        let (mean, sd) = (m["mean"].as_f64().unwrap(), m["stddev"].as_f64().unwrap());
        let half = 2.776_445_105 * sd / 5f64.sqrt();
        let ci = [m["ci95"][0].as_f64().unwrap(), m["ci95"][1].as_f64().unwrap()];
        assert!((ci[0] - (mean - half)).abs() < 1e-6 && (ci[1] - (mean + half)).abs() < 1e-6, "{m} vs ±{half}");
    }
    let maps = [metric(flip, "maps_per_packet"), metric(order3, "maps_per_packet"), metric(pool, "maps_per_packet")];
    assert!(maps[0] > maps[1] && maps[1] > maps[2], "{maps:?}");
    assert_eq!(maps, [0.5, 0.0625, 0.0], "what the virtio-iommu counted, per received frame");
    assert_eq!(flip["verdict"], "baseline");
    for cell in [order3, pool] {
        assert_eq!(cell["metrics"]["maps_per_packet"]["verdict"], "better", "{cell}");
        assert!(cell["verdict"].is_string(), "{cell}");
    }

    let svg = lab.run(&["report", &run, "--format", "svg"]);
    let svg = stdout(&svg);
    assert!(svg.starts_with("<svg") && svg.contains("IOMMU maps per packet") && svg.contains("order3"));
    let csv = stdout(&lab.run(&["report", &run, "--format", "csv"]));
    assert!(csv.starts_with("cell,image,variant,params,workload,device,n,"), "{csv}");
    let kcidb = lab.json(&["export", &run, "--format", "kcidb"]);
    assert_eq!(kcidb["tests"].as_array().unwrap().len(), 15);
    let listed = stdout(&lab.run(&["list"]));
    assert!(listed.contains(&run) && listed.contains("done") && listed.contains("15/15"), "{listed}");
    let compared = lab.json(&["compare", &run, &run, "--format", "json"]);
    assert!(compared["cells"].as_array().unwrap().iter().all(|c| c["verdict"] == "same"), "{compared}");
}

const QUICK: &str = r#"
name = "quick"
repetitions = 4
baseline = "flip"
silence_s = 20

[[device]]
name = "aq"
model = "aqc100"

[[image]]
name = "probe"
kernel = "probe"

[[variant]]
name = "flip"
image = "probe"
params = { "probe.rx" = "flip" }

[[variant]]
name = "pool"
image = "probe"
params = { "probe.rx" = "pool" }

[[workload]]
name = "rx"
kind = "probe-rx"
frames = 3000
"#;

#[test]
fn a_lab_killed_mid_run_loses_nothing_and_resumes_without_duplicates() {
    if !kvm_available("a_lab_killed_mid_run_loses_nothing_and_resumes_without_duplicates") {
        return;
    }
    let lab = Lab::new();
    let matrix = lab.matrix("quick.toml", QUICK);
    let mut child = lab.command(&["run", &matrix]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    // Wait for two results, then kill the lab without warning.
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        assert!(Instant::now() < deadline, "no results in time");
        std::thread::sleep(Duration::from_millis(100));
        let listed = lab.run(&["list", "--json"]);
        let Some(line) = stdout(&listed).lines().next().map(String::from) else { continue };
        let info: Value = serde_json::from_str(&line).unwrap();
        if info["results"].as_u64().unwrap() >= 2 {
            break info["id"].as_str().unwrap().to_string();
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let before = lab.json(&["show", &run, "--json"]);
    assert_eq!(before["run"]["state"], "interrupted");
    let kept = before["records"].as_array().unwrap().len();
    assert!((2..8).contains(&kept), "{kept} records kept");
    // Its models die with it (their parent-death signal): wait for that, not for a fixed time.
    let orphans = || {
        let out = Command::new("pgrep")
            .args(["-f", &format!("driverlab-model-{}", child.id())])
            .output()
            .expect("pgrep (procps) runs");
        stdout(&out).trim().to_string()
    };
    common::wait_until(Duration::from_secs(10), Duration::from_millis(20), || orphans().is_empty());
    assert_eq!(orphans(), "", "a model outlived its lab");

    let resumed = lab.run(&["resume", &run]);
    let text = stdout(&resumed);
    assert!(resumed.status.success(), "{text}{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(text.lines().next(), Some(format!("run {run} resumed").as_str()));
    assert_eq!(text.lines().last().unwrap(), format!("run {run}: 2 cells, 8 passed, 0 failed, 0 errors"));
    let after = lab.json(&["show", &run, "--json"]);
    assert_eq!(after["run"]["state"], "done");
    let records = after["records"].as_array().unwrap();
    let mut keys: Vec<(u64, u64)> =
        records.iter().map(|r| (r["cell"]["index"].as_u64().unwrap(), r["repetition"].as_u64().unwrap())).collect();
    keys.sort();
    keys.dedup();
    assert_eq!((records.len(), keys.len()), (8, 8), "every repetition once");
    // Each repetition's model jailed itself, and its record says how: every step, taken or why not.
    for r in records {
        let confinement = &r["model_confinement"];
        assert_eq!(confinement["jailed"], true, "{r}");
        let steps: Vec<&str> =
            confinement["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
        assert_eq!(steps, vm_spec::confinement::STEPS, "{confinement}");
    }
    // The records kept from before the kill are the same ones.
    for old in before["records"].as_array().unwrap() {
        assert!(records.contains(old), "{old} was kept as it was");
    }
    let again = lab.run(&["resume", &run]);
    assert_eq!(again.status.code(), Some(1), "a done run is not resumed");
}

#[test]
fn hung_and_panicking_guests_fail_with_a_reason_and_a_fingerprint() {
    if !kvm_available("hung_and_panicking_guests_fail_with_a_reason_and_a_fingerprint") {
        return;
    }
    let lab = Lab::new();
    let text = QUICK
        .replace("repetitions = 4", "repetitions = 1")
        .replace("silence_s = 20", "silence_s = 2")
        .replace("params = { \"probe.rx\" = \"flip\" }", "params = { \"probe.rx\" = \"flip\", \"probe.hold\" = 60000 }")
        .replace("params = { \"probe.rx\" = \"pool\" }", "params = { \"probe.panic\" = 1 }");
    let matrix = lab.matrix("broken.toml", &text);
    let out = lab.run(&["run", &matrix]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.lines().last().unwrap().ends_with(": 2 cells, 0 passed, 2 failed, 0 errors"), "{text}");
    let run = run_id(&text);
    let shown = lab.json(&["show", &run, "--json"]);
    let records = shown["records"].as_array().unwrap();
    let hung = records.iter().find(|r| r["cell"]["variant"] == "flip").unwrap();
    assert_eq!(hung["status"], "FAIL");
    assert!(hung["reason"].as_str().unwrap().starts_with("hung: no serial output for"), "{hung}");
    assert!(hung["reason"].as_str().unwrap().contains(" after \"{\\\"probe\\\":"), "the console's last line: {hung}");
    assert!(hung["reason"].as_str().unwrap().contains("; vCPU 0 at rip 0x"), "where the vCPU was: {hung}");
    assert_eq!(hung["crash"]["kind"], "hang");
    let panicked = records.iter().find(|r| r["cell"]["variant"] == "pool").unwrap();
    assert_eq!(panicked["status"], "FAIL");
    assert_eq!(panicked["crash"]["kind"], "panic");
    // The probe's panic location: the line of its `probe.panic` panic in its source.
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-images/probe/src/main.rs"));
    let line = source.unwrap().lines().position(|l| l.contains("panic!(\"probe.panic=1")).unwrap() + 1;
    assert_eq!(panicked["crash"]["frames"][0], format!("src/main.rs:{line}").as_str());
    assert_eq!(panicked["crash"]["fingerprint"].as_str().unwrap().len(), 16);
    // The serial log is kept as an artifact.
    let artifacts = Path::new(shown["artifacts"].as_str().unwrap());
    let log = std::fs::read_to_string(artifacts.join(panicked["serial_log"].as_str().unwrap())).unwrap();
    assert!(log.contains("\"probe\":\"panic\""), "{log}");
}

#[test]
fn a_device_that_fails_its_health_check_is_not_used() {
    if !kvm_available("a_device_that_fails_its_health_check_is_not_used") {
        return;
    }
    let lab = Lab::new();
    // A generator that stops after 10 frames: the check's 64 never arrive.
    let text = QUICK.replace("model = \"aqc100\"", "model = \"aqc100\"\ngenerate = \"size=1514,count=10\"");
    let matrix = lab.matrix("dead.toml", &text);
    let out = lab.run(&["run", &matrix]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(text.lines().last().unwrap().ends_with(": 2 cells, 0 passed, 0 failed, 8 errors"), "{text}");
    let run = run_id(&text);
    let shown = lab.json(&["show", &run, "--json"]);
    for r in shown["records"].as_array().unwrap() {
        assert_eq!(r["status"], "ERROR");
        assert!(r["reason"].as_str().unwrap().starts_with("device aq failed its health check: "), "{r}");
        assert!(r["exit"].is_null(), "no VM ran for the cells");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("health FAIL vfio-user=") && stderr.contains("quarantined"), "{stderr}");
}

#[test]
fn cells_this_host_cannot_run_are_refused_with_the_reason() {
    let lab = Lab::new();
    let kernel = lab.dir.path().join("vmlinux");
    std::fs::write(&kernel, b"not really a kernel").unwrap();
    let text = format!(
        "name = \"linux\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"debian\"\nkernel = \"{}\"\n\
         [[variant]]\nname = \"stock\"\nimage = \"debian\"\n[[workload]]\nname = \"iperf\"\nkind = \"iperf3\"\n",
        kernel.display()
    );
    let matrix = lab.matrix("linux.toml", &text);
    let out = lab.run(&["run", &matrix]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("1 cell(s) cannot run on this host") && stderr.contains("c01"), "{stderr}");
    assert!(stdout(&out).is_empty(), "no run was created");

    let out = lab.run(&["run", &matrix, "--skip-unrunnable"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().last().unwrap().ends_with(": 1 cells, 0 passed, 0 failed, 0 errors, 1 skipped"), "{text}");
    let run = run_id(&text);
    let shown = lab.json(&["show", &run, "--json"]);
    assert_eq!(shown["records"][0]["status"], "SKIP");

    let missing = lab.matrix("missing.toml", &text_with_kernel("/nonexistent/vmlinux"));
    let out = lab.run(&["run", &missing]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/vmlinux does not exist"));

    let bad = lab.matrix("bad.toml", "name = \"x\"\nrepetitions = 0\n");
    let out = lab.run(&["run", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("bad.toml") && stderr.contains("repetitions"), "{stderr}");
}

fn text_with_kernel(kernel: &str) -> String {
    format!(
        "name = \"m\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"k\"\nkernel = \"{kernel}\"\n\
         [[variant]]\nname = \"v\"\nimage = \"k\"\n[[workload]]\nname = \"iperf\"\nkind = \"iperf3\"\n"
    )
}

#[test]
fn the_probe_command_checks_a_device_in_one_line_and_json() {
    if !kvm_available("the_probe_command_checks_a_device_in_one_line_and_json") {
        return;
    }
    let model = common::start_model("aqc100", &["--generate", "size=1514"]);
    let out = Command::new(driverlab()).args(["probe", "--device", &model.device_arg()]).output().unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("PASS vfio-user=") && lines[0].contains("fw 3.1.38"), "{text}");
    let health: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(
        (health["ok"].as_bool(), health["rx_frames"].as_u64(), health["msix"].as_bool()),
        (Some(true), Some(64), Some(true))
    );
    assert_eq!((health["iommu"].as_bool(), health["reset_ok"].as_bool()), (Some(true), Some(true)));
    assert!(health["ms"].as_f64().unwrap() < 10_000.0);
    drop(model);

    let out = Command::new(driverlab()).args(["probe", "--device", "vfio-user=/nonexistent/aq.sock"]).output().unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.starts_with("FAIL vfio-user=/nonexistent/aq.sock: "), "{text}");
}

#[test]
fn cells_on_different_devices_run_in_parallel() {
    if !kvm_available("cells_on_different_devices_run_in_parallel") {
        return;
    }
    let lab = Lab::new();
    let text = QUICK
        .replace("repetitions = 4", "repetitions = 2")
        .replace(
            "[[device]]\nname = \"aq\"\nmodel = \"aqc100\"",
            "[[device]]\nname = \"aq1\"\nmodel = \"aqc100\"\n\n[[device]]\nname = \"aq2\"\nmodel = \"aqc100\"",
        )
        .replace("frames = 3000", "frames = 6000");
    let matrix = lab.matrix("two.toml", &text);
    let out = lab.run(&["run", &matrix]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().last().unwrap().ends_with(": 4 cells, 8 passed, 0 failed, 0 errors"), "{text}");
    let shown = lab.json(&["show", &run_id(&text), "--json"]);
    // Each device's repetitions as (start, end) in ms since the epoch.
    let spans = |device: &str| -> Vec<(f64, f64)> {
        shown["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["cell"]["device"] == device)
            .map(|r| {
                let start = humantime::parse_rfc3339(r["started_at"].as_str().unwrap()).unwrap();
                let start = start.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() * 1e3;
                (start, start + r["timings"]["total_ms"].as_f64().unwrap())
            })
            .collect()
    };
    let (one, two) = (spans("aq1"), spans("aq2"));
    assert_eq!((one.len(), two.len()), (4, 4));
    let overlap = one.iter().any(|a| two.iter().any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(overlap, "the two devices' repetitions never overlapped: {one:?} {two:?}");
}

#[test]
fn a_bisection_that_cannot_be_is_refused_before_anything_is_built_or_run() {
    let lab = Lab::new();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let synthetic = std::fs::read_to_string(examples.join("atlantic-series-synthetic.toml")).unwrap();
    let with_series = |series: &Path| {
        synthetic.replace(
            "series = [\"patches/series-synthetic\"]",
            &format!("series = [{:?}]", series.display().to_string()),
        )
    };
    let refused = |matrix: &str, args: &[&str], why: &str| {
        let out = lab.run(&[&["bisect", matrix][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{matrix} {args:?}: {stderr}");
        assert!(stderr.contains(why), "{matrix} {args:?}: {stderr}");
        assert!(stdout(&out).is_empty(), "no run was created: {}", stdout(&out));
    };
    let series = lab.matrix("series.toml", &with_series(&examples.join("patches/series-synthetic")));
    let probe = examples.join("probe-matrix.toml").display().to_string();
    refused(&probe, &["--metric", "maps_per_packet"], "a bisection needs an image with `series`");
    refused(&series, &["--metric", "nope"], "no metric \"nope\"; the report's are agent_ready_ms");
    refused(&series, &["--metric", "latency_p99_us"], "workload \"rx\" gives no latency_p99_us");
    refused(&series, &["--metric", "gbit_s", "--budget", "0"], "--budget 0");
    refused(&series, &["--metric", "gbit_s", "--budget", "1"], "from the matrix's 2");
    refused(&series, &["--metric", "gbit_s", "--direction", "sideways"], "give up, down or any");
    let two = with_series(&examples.join("patches/series-synthetic"))
        .replace("[[workload]]", "[[workload]]\nname = \"tx\"\nkind = \"iperf3\"\ndirection = \"tx\"\n\n[[workload]]");
    refused(&lab.matrix("two.toml", &two), &["--metric", "gbit_s"], "the matrix has 2 workload(s) and 1 device(s)");
    // A mail with no patch; seed 003's series, which is mtk_eth_soc's (no device of its kind here).
    let words = lab.dir.path().join("words.mbox");
    std::fs::write(&words, "From: a@b\nSubject: [PATCH 0/2] a cover letter\n\nJust words.\n").unwrap();
    refused(&lab.matrix("words.toml", &with_series(&words)), &["--metric", "gbit_s"], "no patch in it");
    let seed = lab.matrix("seed3.toml", &with_series(&examples.join("patches/003-mtk-eth-soc-rx.mbox")));
    refused(&seed, &["--metric", "gbit_s"], "changes nothing in drivers/net/ethernet/aquantia/atlantic");
    refused(&seed, &["--metric", "gbit_s"], "it changes drivers/net/ethernet/mediatek");
    let out = lab.run(&["run", &seed]);
    assert_eq!(out.status.code(), Some(2), "lab run refuses it the same: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&lab.run(&["list", "--json"])).trim().is_empty(), "no run was made");
}

#[test]
fn lab_try_writes_shows_and_keeps_the_matrix_and_runs_it_as_lab_run() {
    let lab = Lab::new();
    let patch = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/patches/000-atlantic-rxpageorder.patch");
    let kept = lab.dir.path().join("try.toml");
    let out = lab.run(&[
        "try",
        &patch.display().to_string(),
        "--engine",
        "qemu",
        "--repetitions",
        "0",
        "--out",
        &kept.display().to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(
        stderr.contains(&format!("# the matrix, kept in {}:", kept.display())) && stderr.contains(&text),
        "{stderr}"
    );
    assert!(
        text.contains("baseline = \"stock\"")
            && text.contains(&format!("patches = [{:?}]", patch.display().to_string())),
        "{text}"
    );
    // Then as `lab run`, whose check refuses it (on any host: no repetition) before anything is
    // built, naming the kept file.
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("{}: repetitions: must be between 1 and 1000", kept.display())), "{stderr}");
    // --every-prefix wants a series.
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/probe-matrix.toml").display().to_string();
    let out = lab.run(&["run", &probe, "--every-prefix"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the matrix has no image with `series`"));
}

#[test]
fn lab_prune_deletes_the_snapshots_no_run_can_use() {
    let lab = Lab::new();
    let images = lab.dir.path().join("images");
    let stale = images.join(".snapshots").join("0123abcd");
    std::fs::create_dir_all(&stale).unwrap();
    let key = r#"{"driverlab":"0.0.1","format":1,"kernel":null,"initrd":null,"cmdline":"","memory_mib":256,"vcpus":1,"iommu":null,"slots":[]}"#;
    std::fs::write(stale.join("key.json"), key).unwrap();
    let out = lab
        .command(&["prune", "--keep", "1"])
        .env("DRIVERLAB_IMAGES", &images)
        .env_remove("DRIVERLAB_SNAPSHOTS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("deleted snapshot 0123abcd: taken by driverlab 0.0.1 (snapshot format 1)"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("pruned 0 runs (0 results, 0 MiB of artifacts), kept 1"), "{stdout}");
    assert!(!stale.exists());
}
