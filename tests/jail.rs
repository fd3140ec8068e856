//! The jail (docs/vmm.md, "The jail"), through the real binary: a running VMM seen from outside
//! through /proc, and a hostile helper in the same confinement (the VMM's own code path) that
//! tries what a guest that broke out would try.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{driverlab, driverlab_cmd, kvm_available, start_model, vm_run};
use engines::{ControlClient, VmProcess};
use vm_spec::control::ShutdownRequest;
use vm_spec::{Kernel, VmSpec};

/// True if the test runs as root; otherwise prints why it skips.
fn root(test: &str) -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    common::skip(test, common::Lacks::Setup, "not root: the jail's namespaces, uid and cgroup need root");
    false
}

/// A field of /proc/PID/status.
fn status(pid: u32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn namespace(pid: &str, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap().display().to_string()
}

#[test]
fn a_running_vmm_is_jailed_and_its_exit_line_says_how() {
    let test = "a_running_vmm_is_jailed_and_its_exit_line_says_how";
    if !kvm_available(test) || !root(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let spec = VmSpec {
        cmdline: "probe.viommu_ops=0 probe.hold=60000".into(),
        timeout_s: Some(90.0),
        ..VmSpec::new(Kernel::Probe)
    };
    let vm = VmProcess::new(&common::programs().vmm, spec.clone(), Duration::from_secs(120))
        .with_control(&socket)
        .start()
        .unwrap();
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    let info = control.wait_until_serving(Duration::from_secs(20)).expect("the control socket serves");
    assert_eq!(info.pid, vm.pid(), "vm.info's pid is the process that was started (the jail's supervisor)");
    let confinement = info.confinement.expect("vm.info says how the VMM is confined");
    assert!(confinement.jailed);
    let steps: Vec<&str> = confinement.steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(steps, vm_spec::confinement::STEPS, "every step, in order: {confinement:?}");
    for must in ["namespaces", "cgroup", "rlimits", "root", "identity", "no_new_privs"] {
        let step = confinement.steps.iter().find(|s| s.step == must).unwrap();
        assert!(step.done, "{must} is taken as root: {step:?}");
    }
    let landlock = confinement.steps.iter().find(|s| s.step == "landlock").unwrap();
    assert!(landlock.done || landlock.detail.contains("no Landlock"), "{landlock:?}");

    // From outside, through /proc. The main thread installs its seccomp filter once the vCPUs
    // run, a moment after the control socket first answers.
    let pid = confinement.host_pid.expect("the VMM's host PID");
    assert_ne!(pid, vm.pid(), "the VMM runs as the supervisor's child");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(pid, "Seccomp") != "2" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(status(pid, "Seccomp"), "2", "seccomp filter mode");
    let uid = status(pid, "Uid");
    let uids: Vec<u32> = uid.split_whitespace().map(|u| u.parse().unwrap()).collect();
    assert!(uids.iter().all(|&u| u == uids[0] && u >= jail::UID_BASE), "real, effective, saved, fs uid: {uid}");
    assert_eq!(Some(uids[0]), confinement.uid);
    assert!(status(pid, "Gid").split_whitespace().all(|g| g == uids[0].to_string()), "gid");
    assert_eq!(status(pid, "Groups"), "", "no supplementary groups");
    for caps in ["CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"] {
        assert_eq!(status(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    for kind in ["mnt", "pid", "net", "ipc", "uts"] {
        assert_ne!(namespace(&pid.to_string(), kind), namespace("self", kind), "{kind} namespace");
    }
    // Its network namespace is the one its supervisor made while it set up, which no other
    // process joins; the supervisor keeps the host's other namespaces.
    let supervisor = vm.pid().to_string();
    assert_eq!(namespace(&pid.to_string(), "net"), namespace(&supervisor, "net"), "the supervisor's network");
    for kind in ["mnt", "ipc", "uts"] {
        assert_eq!(namespace(&supervisor, kind), namespace("self", kind), "the supervisor's {kind} namespace");
    }
    let its_root = std::fs::metadata(format!("/proc/{pid}/root/")).unwrap();
    let host_root = std::fs::metadata("/").unwrap();
    assert_ne!((its_root.dev(), its_root.ino()), (host_root.dev(), host_root.ino()), "its root is not the host's");
    let entries = std::fs::read_dir(format!("/proc/{pid}/root/")).unwrap().count();
    assert_eq!(entries, 0, "its root is empty");
    let cgroup = confinement.cgroup.expect("a cgroup of its own");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups.lines().any(|l| l.ends_with(&format!(":{cgroup}"))), "{cgroups} names {cgroup}");
    let limit = (spec.memory_mib << 20) + jail::MEMORY_OVERHEAD;
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let file = if v2 {
        format!("/sys/fs/cgroup{cgroup}/memory.max")
    } else {
        format!("/sys/fs/cgroup/memory{cgroup}/memory.limit_in_bytes")
    };
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), limit.to_string(), "{file}");
    // CPU time: its one vCPU plus a tenth of a CPU for its other threads.
    let cpu = if v2 {
        format!("/sys/fs/cgroup{cgroup}/cpu.max")
    } else {
        let line = cgroups.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "cpu")));
        let path = line.and_then(|l| l.splitn(3, ':').nth(2)).expect("a v1 cpu hierarchy");
        format!("/sys/fs/cgroup/cpu{path}/cpu.cfs_quota_us")
    };
    let quota = std::fs::read_to_string(&cpu).unwrap();
    assert_eq!(quota.split_whitespace().next(), Some("110000"), "{cpu}: {quota}");

    control.shutdown(ShutdownRequest::default()).unwrap();
    let out = vm.wait().unwrap();
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let exit = out.exit.expect("an exit line");
    let said = exit.confinement.expect("the exit line says how the VMM was confined");
    assert!(said.jailed && said.host_pid == Some(pid), "{said:?}");
    assert!(exit.setup.is_some_and(|s| s.jail_ms > 0.0), "the jail's time is a setup phase");
    assert!(!socket.exists(), "the supervisor removes the control socket the jailed VMM cannot");

    // The explicit way out, said as such.
    let (code, _, stderr) = driverlab_cmd(&["vm", "run", "--kernel", "probe", "--no-jail"]);
    assert_eq!(code, Some(0), "{stderr}");
    let exit = vm_spec::ExitSummary::find_in(&stderr).expect("an exit line");
    assert_eq!(exit.confinement.map(|c| c.summary()).as_deref(), Some("not jailed (--no-jail)"));
}

#[test]
fn a_breakout_from_the_jail_finds_nothing_to_take() {
    let test = "a_breakout_from_the_jail_finds_nothing_to_take";
    if !root(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Stand-ins for what is worth taking on a lab box: the daemon's socket, another VMM, the
    // network.
    let socket = dir.path().join("daemon.sock");
    let daemon = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    daemon.set_nonblocking(true).unwrap();
    let mut other = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let network = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    network.set_nonblocking(true).unwrap();
    let port = network.local_addr().unwrap().port().to_string();
    let pid = other.id().to_string();
    let (code, stdout, stderr) =
        driverlab_cmd(&["vm", "jail-break", "--socket", &socket.display().to_string(), "--pid", &pid, "--port", &port]);
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let attempts = report["attempts"].as_array().unwrap();
    let names: Vec<&str> = attempts.iter().map(|a| a["attempt"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "read /etc/shadow",
            "read /proc/1/environ",
            "write under /",
            "connect to the daemon's socket",
            "ptrace another VMM",
            "signal another VMM",
            "connect to the network",
            "fork past the pids limit",
        ]
    );
    for a in attempts {
        assert_eq!(a["blocked"], true, "{a}");
    }
    let bomb = attempts.last().unwrap()["outcome"].as_str().unwrap();
    assert!(bomb.starts_with("stopped after "), "{bomb}");
    assert!(daemon.accept().is_err() && network.accept().is_err(), "nothing reached either");
    assert!(!Path::new("/escaped").exists());
    let steps = report["confinement"]["steps"].as_array().unwrap();
    for must in ["namespaces", "root", "identity", "no_new_privs"] {
        let step = steps.iter().find(|s| s["step"] == must).unwrap();
        assert_eq!(step["done"], true, "{step}");
    }
}

/// The jailed child of a model's `supervisor` (its only child), once it has jailed itself (it
/// does once its sockets are bound, a moment after the socket appears).
fn wait_for_jailed_child(supervisor: u32) -> u32 {
    let children = format!("/proc/{supervisor}/task/{supervisor}/children");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let child = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = child.split_whitespace().next().and_then(|p| p.parse::<u32>().ok())
            && status(pid, "NoNewPrivs") == "1"
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no jailed child of the model's supervisor {supervisor}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_model_is_jailed_serves_a_vm_and_still_reports_on_sigterm() {
    let test = "a_model_is_jailed_serves_a_vm_and_still_reports_on_sigterm";
    if !kvm_available(test) || !root(test) {
        return;
    }
    let model = start_model("aqc100", &["--generate", "size=1514"]);
    let supervisor = model.pid();
    let pid = wait_for_jailed_child(supervisor);
    let uid: u32 = status(pid, "Uid").split_whitespace().next().unwrap().parse().unwrap();
    assert!(uid >= jail::UID_BASE, "uid {uid}");
    assert_eq!(status(pid, "CapEff"), "0000000000000000");
    for kind in ["mnt", "pid", "net", "ipc", "uts"] {
        assert_ne!(namespace(&pid.to_string(), kind), namespace("self", kind), "{kind} namespace");
    }
    assert_eq!(std::fs::read_dir(format!("/proc/{pid}/root/")).unwrap().count(), 0, "its root is empty");
    // Its seccomp filter goes on every thread once its threads run, just before it serves.
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(pid, "Seccomp") != "2" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().file_name().into_string().unwrap();
        let seccomp = std::fs::read_to_string(format!("/proc/{pid}/task/{task}/status")).unwrap();
        assert!(seccomp.lines().any(|l| l == "Seccomp:\t2"), "thread {task} of the model: {seccomp}");
    }
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups.contains(&format!("/driverlab/aqc100-{supervisor}")), "{cgroups}");
    // Its memory limit: 1 GiB for what its DMA touches first, plus the overhead.
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let hierarchy = |l: &&str| {
        l.split(':').nth(1).is_some_and(|c| if v2 { c.is_empty() } else { c.split(',').any(|c| c == "memory") })
    };
    let path = cgroups.lines().find(hierarchy).and_then(|l| l.splitn(3, ':').nth(2)).expect("its memory cgroup");
    let file = if v2 {
        format!("/sys/fs/cgroup{path}/memory.max")
    } else {
        format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    };
    let limit = ((1u64 << 30) + jail::MEMORY_OVERHEAD).to_string();
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), limit, "{file}");

    // Jailed, it serves a VM as before.
    let device = model.device_arg();
    let out = vm_run(&[
        "--kernel",
        "probe",
        "--iommu",
        "--device",
        &device,
        "--cmdline",
        "probe.nic=aqc100 probe.rx=order3 probe.frames=2000",
    ]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    // A --once model ends after its one client, and its supervisor with it, exit code 0.
    let (code, stdout) = model.terminate().unwrap();
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains("\"client\":1")), "{stdout}");

    // SIGTERM reaches a jailed model through its supervisor: it prints its final counters.
    // (Removing the sockets is the supervisor's job too; the lab's folder goes with the model.)
    let idle = start_model("aqc100", &["--generate", "size=1514"]);
    wait_for_jailed_child(idle.pid());
    let (code, stdout) = idle.terminate().unwrap();
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("\"exit\":\"SIGTERM\""), "the final counters: {stdout}");
}

#[test]
fn the_operator_moves_the_uid_range_and_the_cgroup_parent_and_bad_values_are_refused() {
    let test = "the_operator_moves_the_uid_range_and_the_cgroup_parent_and_bad_values_are_refused";
    if !kvm_available(test) || !root(test) {
        return;
    }
    let run = |base: &str, parent: &str| {
        let out = std::process::Command::new(driverlab())
            .args(["vm", "run", "--kernel", "probe"])
            .env(jail::UID_BASE_ENV, base)
            .env(jail::CGROUP_PARENT_ENV, parent)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = run("200000000", "driverlab-test/settings");
    assert_eq!(code, Some(0), "{stderr}");
    let said = vm_spec::ExitSummary::find_in(&stderr).and_then(|e| e.confinement).expect("confinement");
    let uid = said.uid.expect("a uid of its own");
    assert!((200_000_000..200_000_000 + jail::UID_COUNT).contains(&uid), "uid {uid}");
    let cgroup = said.cgroup.expect("a cgroup of its own");
    assert!(cgroup.contains("/driverlab-test/settings/vm-"), "{cgroup}");
    let (code, stderr) = run("12", "driverlab");
    assert_eq!(code, Some(2), "{stderr}");
    let error = vm_spec::ErrorLine::find_in(&stderr).expect("an error line");
    assert!(error.message.contains("DRIVERLAB_JAIL_UID_BASE=12: must be from 65536"), "{}", error.message);
    let (code, stderr) = run("200000000", "../escape");
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn a_jailed_vmm_dies_with_the_process_that_was_started() {
    let test = "a_jailed_vmm_dies_with_the_process_that_was_started";
    if !kvm_available(test) || !root(test) {
        return;
    }
    // The lab kills a VMM past its deadline by killing the process it started: the jailed VMM
    // (whose uid change cleared its first death signal) must go with it.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let spec = VmSpec { cmdline: "probe.hold=60000".into(), timeout_s: Some(90.0), ..VmSpec::new(Kernel::Probe) };
    let vm =
        VmProcess::new(&common::programs().vmm, spec, Duration::from_secs(120)).with_control(&socket).start().unwrap();
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    let info = control.wait_until_serving(Duration::from_secs(20)).expect("the control socket serves");
    let pid = info.confinement.and_then(|c| c.host_pid).expect("the VMM's host PID");
    // SAFETY: kill(2) on the test's own child.
    unsafe { libc::kill(vm.pid() as i32, libc::SIGKILL) };
    let out = vm.wait().unwrap();
    assert_eq!(out.code(), None, "killed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_or(true, |s| s.lines().any(|l| l.starts_with("State:") && l.contains("Z")))
    };
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(), "the jailed VMM {pid} outlived its supervisor");
}

#[test]
fn a_model_in_its_wires_network_namespace_keeps_the_hosts_cgroup_tree() {
    let test = "a_model_in_its_wires_network_namespace_keeps_the_hosts_cgroup_tree";
    if !root(test) {
        return;
    }
    let netns = format!("dljail-{}", std::process::id());
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output().expect("ip runs");
    assert!(ip(&["netns", "add", &netns]).status.success(), "ip netns add {netns}");
    let model =
        engines::ModelProcess::start_in(&common::programs().model, "aqc100", &["--tap", "dlwire0"], Some(&netns));
    let links = ip(&["-n", &netns, "link", "show", "dlwire0"]);
    let on_host = ip(&["link", "show", "dlwire0"]);
    let confinement = model.as_ref().ok().and_then(engines::ModelProcess::confinement);
    drop(model);
    ip(&["netns", "delete", &netns]);
    let confinement = confinement.expect("the model started and answered on its control socket");
    // Its TAP is in the namespace, not on the host.
    assert!(links.status.success(), "{}", String::from_utf8_lossy(&links.stderr));
    assert!(!on_host.status.success(), "the TAP is not on the host");
    // Jailed in full: the namespace's network, the host's /sys/fs/cgroup (its own cgroup).
    let steps = &confinement.steps;
    assert_eq!(steps.len(), vm_spec::confinement::STEPS.len());
    for step in steps {
        assert!(step.done, "step {} not taken: {}", step.step, step.detail);
    }
}
