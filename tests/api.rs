//! The lab daemon end to end: `driverlab serve` with its own database, driven with `curl
//! --unix-socket` and the API client; runs, their event streams and reports, devices, VMs, the
//! token, refused paths, every error as JSON, and a daemon killed with -9 that resumes.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::client::{Answer, Client};
use common::{driverlab, kvm_available};
use serde_json::{Value, json};

/// A daemon on its own socket and database, killed when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
    tcp: Option<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_under(&[], dir, extra)
    }

    /// The daemon run by `prefix` (e.g. `prlimit --as=...`), when it is not empty.
    fn start_under(prefix: &[&str], dir: &Path, extra: &[&str]) -> Daemon {
        let socket = dir.join("api.sock");
        let mut command = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(driverlab());
                c
            }
            None => Command::new(driverlab()),
        };
        let mut child = command
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--db")
            .arg(dir.join("lab.db"))
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("driverlab serve starts");
        // Its first lines say where it listens.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("driverlab API on tcp://") {
                    let _ = tx.send(addr.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        });
        let tcp = extra.contains(&"--listen").then(|| rx.recv_timeout(Duration::from_secs(10)).expect("a TCP address"));
        // Answering, not just there: a daemon killed before leaves its socket behind.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon answers on its socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket, tcp }
    }

    fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// `curl --unix-socket` with `args`; (HTTP status, body).
    fn curl(&self, args: &[&str]) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn call(client: &Client, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
    runtime().block_on(client.call(method, path, headers, body.map(<[u8]>::to_vec))).unwrap()
}

fn json_of(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|e| panic!("{e}: {} {}", answer.status, String::from_utf8_lossy(&answer.body)))
}

fn have_curl(test: &str) -> bool {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("SKIP {test}: no curl (apt-get install curl)");
        return false;
    }
    true
}

/// The events of a run's stream, as JSON, until it ends (or `recorded` repetitions came).
fn events(daemon: &Daemon, run: &str, recorded: Option<usize>) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    runtime()
        .block_on(daemon.client().events(&format!("/v1/runs/{run}/events"), |data| {
            seen.push(serde_json::from_str(data).unwrap());
            recorded.is_none_or(|n| seen.iter().filter(|e| e["event"] == "recorded").count() < n)
        }))
        .unwrap();
    seen
}

fn probe_matrix() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/probe-matrix.toml").display().to_string()
}

/// What a report says per cell that does not change from run to run.
fn cell_facts(report: &Value) -> Vec<(String, String, u64, Value, f64)> {
    report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["cell"].as_str().unwrap().into(),
                c["variant"].as_str().unwrap().into(),
                c["n"].as_u64().unwrap(),
                c["status"].clone(),
                c["metrics"]["maps_per_packet"]["mean"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_probe_matrix_submitted_with_curl_streams_and_reports_as_lab_run_does() {
    let test = "a_probe_matrix_submitted_with_curl_streams_and_reports_as_lab_run_does";
    if !kvm_available(test) || !have_curl(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let data = format!("@{}", probe_matrix());
    let (status, body) = daemon.curl(&[
        "-X",
        "POST",
        "-H",
        "content-type: application/toml",
        "--data-binary",
        &data,
        "http://x/v1/runs",
    ]);
    assert_eq!(status, 201, "{body}");
    let run = serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_string();

    let seen = events(&daemon, &run, None);
    assert_eq!(seen.first().unwrap()["event"], "state", "the stream opens with the state");
    let last = seen.last().unwrap();
    assert_eq!((last["event"].as_str(), last["status"]["state"].as_str()), (Some("state"), Some("done")), "{last}");
    assert_eq!(last["status"]["cells_done"], 3);
    let recorded: Vec<&Value> = seen.iter().filter(|e| e["event"] == "recorded").collect();
    assert_eq!(recorded.len(), 15, "every repetition streamed once");
    assert_eq!(recorded.last().unwrap()["done"], 15);

    let (status, body) = daemon.curl(&["-H", "accept: application/json", &format!("http://x/v1/runs/{run}/report")]);
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    // The same report as the CLI gives for this run from the same database.
    let cli = Command::new(driverlab())
        .args(["lab", "report", &run, "--format", "json", "--db"])
        .arg(dir.path().join("lab.db"))
        .output()
        .unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&cli.stdout).unwrap(), report);
    // And a `driverlab lab run` of the same matrix gives the same cells, counts and maps.
    let local = Command::new(driverlab())
        .args(["lab", "run", &probe_matrix(), "--format", "json", "--db"])
        .arg(dir.path().join("local.db"))
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", String::from_utf8_lossy(&local.stderr));
    let text = String::from_utf8_lossy(&local.stdout);
    let json = &text[text.find('{').unwrap()..=text.rfind('}').unwrap()];
    assert_eq!(cell_facts(&serde_json::from_str(json).unwrap()), cell_facts(&report));

    for (accept, starts) in
        [("text/markdown", "## probe-rx-strategies"), ("image/svg+xml", "<svg"), ("text/html", "<!doctype html>")]
    {
        let answer = call(&daemon.client(), "GET", &format!("/v1/runs/{run}/report"), &[("accept", accept)], None);
        assert_eq!(answer.status, 200);
        assert!(answer.content_type.starts_with(accept), "{}", answer.content_type);
        let text = String::from_utf8_lossy(&answer.body);
        assert!(
            text.trim_start().starts_with(starts) || text.contains(starts),
            "{accept}: {}",
            &text[..80.min(text.len())]
        );
    }
    let answer = call(&daemon.client(), "GET", &format!("/v1/runs/{run}/report"), &[("accept", "image/png")], None);
    assert_eq!((answer.status, json_of(&answer)["code"].as_str()), (406, Some("not_acceptable")));

    // Results, filtered, and exported.
    let answer = call(&daemon.client(), "GET", &format!("/v1/results?run={run}&variant=pool&status=PASS"), &[], None);
    let records = json_of(&answer);
    assert_eq!(records.as_array().unwrap().len(), 5);
    assert!(records.as_array().unwrap().iter().all(|r| r["cell"]["variant"] == "pool"));
    let answer = call(&daemon.client(), "GET", &format!("/v1/results?run={run}&format=csv"), &[], None);
    assert_eq!(String::from_utf8_lossy(&answer.body).lines().count(), 16, "a header and 15 records");
    assert_eq!(answer.link, None, "one page holds them all");
    // Paged: 6, 6, then the last 3, each page naming the next; together every record once.
    let (mut path, mut seen) = (Some(format!("/v1/results?run={run}&limit=6")), Vec::new());
    let mut pages = 0;
    while let Some(p) = path {
        let answer = call(&daemon.client(), "GET", &p, &[], None);
        assert_eq!(answer.status, 200);
        let page = json_of(&answer);
        pages += 1;
        seen.extend(page.as_array().unwrap().iter().map(|r| (r["cell"]["id"].clone(), r["repetition"].clone())));
        path = answer.link.map(|l| {
            assert!(l.ends_with(">; rel=\"next\""), "{l}");
            l.trim_start_matches('<').split('>').next().unwrap().to_string()
        });
    }
    assert_eq!((pages, seen.len()), (3, 15));
    seen.dedup();
    assert_eq!(seen.len(), 15, "nothing twice");
    let answer = call(&daemon.client(), "GET", &format!("/v1/results?run={run}&format=kcidb"), &[], None);
    assert_eq!(json_of(&answer)["tests"].as_array().unwrap().len(), 15);

    // A run that is done can be neither cancelled nor resumed.
    let answer = call(&daemon.client(), "POST", &format!("/v1/runs/{run}/cancel"), &[], None);
    assert_eq!(answer.status, 409);
    let answer = call(&daemon.client(), "POST", &format!("/v1/runs/{run}/resume"), &[], None);
    assert_eq!((answer.status, json_of(&answer)["code"].as_str()), (409, Some("conflict")));
}

#[test]
fn a_daemon_killed_with_minus_9_restarts_with_its_runs_resumable() {
    if !kvm_available("a_daemon_killed_with_minus_9_restarts_with_its_runs_resumable") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let run = {
        let daemon = Daemon::start(dir.path(), &[]);
        let answer = call(&daemon.client(), "POST", "/v1/runs", &[("content-type", "application/toml")], Some(&matrix));
        assert_eq!(answer.status, 201);
        let run = json_of(&answer)["id"].as_str().unwrap().to_string();
        // Three repetitions in, kill it.
        let seen = events(&daemon, &run, Some(3));
        assert_eq!(seen.iter().filter(|e| e["event"] == "recorded").count(), 3);
        let mut daemon = daemon;
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(daemon.child.id() as i32, libc::SIGKILL) };
        let _ = daemon.child.wait();
        run
    };
    let daemon = Daemon::start(dir.path(), &[]);
    let status = json_of(&call(&daemon.client(), "GET", &format!("/v1/runs/{run}"), &[], None));
    assert_eq!(status["state"], "interrupted", "{status}");
    let kept = status["results"].as_u64().unwrap();
    assert!((3..15).contains(&kept), "{status}");
    let answer = call(&daemon.client(), "POST", &format!("/v1/runs/{run}/resume"), &[], None);
    assert_eq!(answer.status, 202, "{}", String::from_utf8_lossy(&answer.body));
    let seen = events(&daemon, &run, None);
    let last = &seen.last().unwrap()["status"];
    assert_eq!((last["state"].as_str(), last["results"].as_u64()), (Some("done"), Some(15)), "{last}");
    let recorded = seen.iter().filter(|e| e["event"] == "recorded").count() as u64;
    assert_eq!(recorded, 15 - kept, "only what had no result ran again");
    let report = json_of(&call(&daemon.client(), "GET", &format!("/v1/runs/{run}/report"), &[], None));
    assert!(report["cells"].as_array().unwrap().iter().all(|c| c["n"] == 5), "{report}");
}

#[test]
fn devices_and_vms_over_the_api() {
    if !kvm_available("devices_and_vms_over_the_api") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let json_body = [("content-type", "application/json")];
    let answer = call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"aq","model":"aqc100"}"#));
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let answer = call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"aq","model":"aqc100"}"#));
    assert_eq!(answer.status, 409, "the name is taken");
    // The model is one of the NICs the schema lists; a device that does not check out is 422.
    let answer = call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"x","model":"e1000"}"#));
    assert_eq!(answer.status, 400);
    let message = json_of(&answer)["message"].as_str().unwrap().to_string();
    assert!(message.contains("at model: unknown variant `e1000`"), "{message}");
    let answer =
        call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"x","model":"aqc100","generate":"size=9"}"#));
    assert_eq!(answer.status, 422);
    let health = json_of(&call(&client, "POST", "/v1/devices/aq/health", &[], None));
    assert_eq!(health["ok"], true, "{health}");
    assert!(health["verdict"].as_str().unwrap().starts_with("PASS aq: AQC100 fw 3.1.38"), "{health}");
    let answer = call(&client, "POST", "/v1/devices/aq/quarantine", &json_body, Some(br#"{"reason":"x"}"#));
    assert_eq!(answer.status, 409, "models are fresh per VM");
    let devices = json_of(&call(&client, "GET", "/v1/devices", &[], None));
    assert_eq!(devices[0]["kind"], "model");

    // A VM with the registered model behind the virtio-iommu, watched and stopped.
    let request = json!({"kernel": "probe", "iommu": true, "devices": ["aq"],
        "cmdline": "probe.nic=aqc100 probe.hold=20000", "timeout_s": 60});
    let answer = call(&client, "POST", "/v1/vms", &json_body, Some(request.to_string().as_bytes()));
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let vm = json_of(&answer)["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let counters = loop {
        let answer = call(&client, "GET", &format!("/v1/vms/{vm}/counters"), &[], None);
        if answer.status == 200 {
            let counters = json_of(&answer);
            if counters["viommu"]["maps"].as_u64().unwrap_or(0) > 0 {
                break counters;
            }
        }
        assert!(Instant::now() < deadline, "no live counters: {}", String::from_utf8_lossy(&answer.body));
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(counters["state"], "running");
    let answer = call(&client, "DELETE", &format!("/v1/vms/{vm}"), &[], None);
    assert_eq!(answer.status, 409, "it still runs");
    let answer = call(&client, "POST", &format!("/v1/vms/{vm}/stop"), &[], None);
    assert_eq!(answer.status, 202, "{}", String::from_utf8_lossy(&answer.body));
    // The serial log, followed to the VM's end.
    let serial = call(&client, "GET", &format!("/v1/vms/{vm}/serial?follow=true"), &[], None);
    let text = String::from_utf8_lossy(&serial.body);
    assert!(text.contains("\"probe\":\"nic\"") && text.contains("\"probe\":\"done\""), "{text}");
    let status = json_of(&call(&client, "GET", &format!("/v1/vms/{vm}"), &[], None));
    assert_eq!(status["state"], "exited", "{status}");
    assert!(["poweroff", "shutdown"].contains(&status["exit"]["reason"].as_str().unwrap()), "{status}");
    let answer = call(&client, "DELETE", &format!("/v1/vms/{vm}"), &[], None);
    assert_eq!(answer.status, 204);
    let answer = call(&client, "GET", &format!("/v1/vms/{vm}"), &[], None);
    assert_eq!(answer.status, 404);
    let answer = call(&client, "DELETE", "/v1/devices/aq", &[], None);
    assert_eq!(answer.status, 204);
}

#[test]
fn tcp_needs_the_token_and_remote_requests_name_no_host_resource() {
    let dir = tempfile::tempdir().unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
    let token_file = dir.path().join("token").display().to_string();
    let daemon = Daemon::start(dir.path(), &["--listen", "127.0.0.1:0", "--token-file", &token_file]);
    let addr = daemon.tcp.clone().unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&daemon.socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the socket is private");

    for client in [Client::tcp(&addr, ""), Client::tcp(&addr, "0123456789abcdef0123456789abcdeX")] {
        let answer = call(&client, "GET", "/v1/version", &[], None);
        assert_eq!((answer.status, json_of(&answer)["code"].as_str()), (401, Some("unauthorized")));
    }
    let remote = Client::tcp(&addr, token);
    assert_eq!(call(&remote, "GET", "/v1/version", &[], None).status, 200);
    let json_body = [("content-type", "application/json")];
    let host_device = br#"{"name":"nic","bdf":"0000:63:00.0"}"#;
    let answer = call(&remote, "POST", "/v1/devices", &json_body, Some(host_device));
    assert_eq!((answer.status, json_of(&answer)["code"].as_str()), (403, Some("forbidden")));
    let answer = call(&daemon.client(), "POST", "/v1/devices", &json_body, Some(host_device));
    assert_eq!(answer.status, 201, "the owner may, over the Unix socket");
    let answer = call(&remote, "POST", "/v1/devices", &json_body, Some(br#"{"name":"aq","model":"aqc100"}"#));
    assert_eq!(answer.status, 201, "a model names nothing of the host");

    // A host device's quarantine, and its release.
    let answer = call(&remote, "POST", "/v1/devices/nic/quarantine", &json_body, Some(br#"{"reason":"link flaps"}"#));
    let state = json_of(&answer);
    assert_eq!((answer.status, state["quarantine"]["reason"].as_str()), (200, Some("link flaps")), "{state}");
    assert_eq!(state["kind"], "host");
    let state = json_of(&call(&remote, "POST", "/v1/devices/nic/release", &[], None));
    assert!(state["quarantine"].is_null(), "{state}");
    let images = json_of(&call(&remote, "GET", "/v1/images", &[], None));
    assert!(images.is_array());
}

#[test]
fn runs_are_queued_one_at_a_time_and_cancelled_waiting_or_running() {
    if !kvm_available("runs_are_queued_one_at_a_time_and_cancelled_waiting_or_running") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let toml = [("content-type", "application/toml")];
    let submit =
        || json_of(&call(&client, "POST", "/v1/runs", &toml, Some(&matrix)))["id"].as_str().unwrap().to_string();
    let (first, second) = (submit(), submit());
    let status = |run: &str| json_of(&call(&client, "GET", &format!("/v1/runs/{run}"), &[], None));
    assert_eq!(status(&second)["state"], "queued", "one run at a time");
    // The waiting one leaves the queue at once, every repetition MISS.
    let answer = call(&client, "POST", &format!("/v1/runs/{second}/cancel"), &[], None);
    assert_eq!(answer.status, 202);
    let seen = events(&daemon, &second, None);
    let last = &seen.last().unwrap()["status"];
    assert_eq!((last["state"].as_str(), last["counts"]["MISS"].as_u64()), (Some("cancelled"), Some(15)), "{last}");
    // The running one stops after the repetition in flight.
    events(&daemon, &first, Some(1));
    assert_eq!(status(&first)["state"], "running");
    assert_eq!(call(&client, "POST", &format!("/v1/runs/{first}/cancel"), &[], None).status, 202);
    let seen = events(&daemon, &first, None);
    let last = &seen.last().unwrap()["status"];
    assert_eq!(last["state"], "cancelled", "{last}");
    let missed = last["counts"]["MISS"].as_u64().unwrap_or(0);
    assert!(missed > 0 && last["results"] == 15, "{last}");
    // A cancelled run resumes: what was MISS runs.
    assert_eq!(call(&client, "POST", &format!("/v1/runs/{first}/resume"), &[], None).status, 202);
    let seen = events(&daemon, &first, None);
    let recorded = seen.iter().filter(|e| e["event"] == "recorded").count() as u64;
    let last = &seen.last().unwrap()["status"];
    assert_eq!((last["state"].as_str(), last["counts"]["PASS"].as_u64()), (Some("done"), Some(15)), "{last}");
    assert_eq!(recorded, missed, "exactly the missed repetitions ran");
}

/// A request and the status it must get: method, path, headers, body, status.
type Case<'a> = (&'a str, String, &'a [(&'a str, &'a str)], Vec<u8>, u16);
/// Method, path, headers, body, the status expected, and what its message must say.
type CarelessCase<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], String, u16, &'a str);

#[test]
fn no_request_reads_a_host_file_and_every_error_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "TOPSECRET-CONTENTS\n").unwrap();
    let secret = secret.display().to_string();
    let json_body = [("content-type", "application/json")];
    let toml_body = [("content-type", "application/toml")];
    let matrix = |kernel: &str| {
        format!(
            "name = \"m\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"k\"\nkernel = \"{kernel}\"\n\
             [[variant]]\nname = \"v\"\nimage = \"k\"\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n"
        )
    };
    let cases: Vec<Case> = vec![
        ("POST", "/v1/vms".into(), &json_body, json!({"kernel": secret}).to_string().into_bytes(), 422),
        (
            "POST",
            "/v1/vms".into(),
            &json_body,
            json!({"kernel": "probe", "initrd": secret}).to_string().into_bytes(),
            422,
        ),
        ("POST", "/v1/runs".into(), &toml_body, matrix(&secret).into_bytes(), 422),
        ("POST", "/v1/runs".into(), &toml_body, matrix("../../etc/passwd").into_bytes(), 422),
        (
            "POST",
            "/v1/runs".into(),
            &toml_body,
            matrix("probe")
                .replace("kernel = \"probe\"", &format!("kernel = \"probe\"\npatches = [{secret:?}]"))
                .into_bytes(),
            422,
        ),
        (
            "POST",
            "/v1/runs".into(),
            &toml_body,
            matrix("probe").replace("model = \"aqc100\"", "model = \"aqc100\"\ntap = \"eth0\"").into_bytes(),
            422,
        ),
        ("POST", "/v1/images/module".into(), &json_body, json!({"kernel": secret}).to_string().into_bytes(), 422),
        (
            "POST",
            "/v1/images/initramfs".into(),
            &json_body,
            json!({"kernel": "kernel-00", "modules": [secret]}).to_string().into_bytes(),
            422,
        ),
        ("POST", "/v1/bench/boot".into(), &json_body, json!({"kernel": secret}).to_string().into_bytes(), 422),
        (
            "POST",
            "/v1/bench/boot".into(),
            &json_body,
            json!({"kernel": "kernel-0123456789abcdef", "runs": 0}).to_string().into_bytes(),
            422,
        ),
        (
            "POST",
            "/v1/bench/boot".into(),
            &json_body,
            json!({"kernel": "kernel-0123456789abcdef", "runs": 31}).to_string().into_bytes(),
            422,
        ),
        ("POST", "/v1/bench/boot".into(), &json_body, br#"{"kernel":"kernel-0123456789abcdef","x":1}"#.to_vec(), 400),
        ("GET", "/v1/images/..%2F..%2Fetc".into(), &[], Vec::new(), 404),
        ("GET", "/v1/images/kernel-0000".into(), &[], Vec::new(), 404),
        ("POST", "/v1/runs".into(), &toml_body, b"name = [".to_vec(), 400),
        ("POST", "/v1/runs".into(), &[("content-type", "image/png")], b"x".to_vec(), 415),
        ("POST", "/v1/runs?skip_unrunnable=maybe".into(), &toml_body, matrix("probe").into_bytes(), 400),
        ("POST", "/v1/vms".into(), &json_body, b"{not json".to_vec(), 400),
        ("POST", "/v1/vms".into(), &json_body, br#"{"kernel":"probe","colour":"red"}"#.to_vec(), 400),
        ("POST", "/v1/vms".into(), &json_body, br#"{"kernel":"probe","timeout_s":0}"#.to_vec(), 422),
        ("POST", "/v1/vms".into(), &json_body, br#"{"kernel":"probe","devices":["nope"]}"#.to_vec(), 422),
        ("POST", "/v1/vms".into(), &json_body, vec![b' '; 2 << 20], 413),
        ("GET", "/v1/runs/nope".into(), &[], Vec::new(), 404),
        ("GET", "/v1/runs/nope/report".into(), &[], Vec::new(), 404),
        ("GET", "/v1/runs/nope/events".into(), &[], Vec::new(), 404),
        ("POST", "/v1/runs/nope/cancel".into(), &[], Vec::new(), 404),
        ("POST", "/v1/runs/nope/resume".into(), &[], Vec::new(), 404),
        ("GET", "/v1/results?status=GREEN".into(), &[], Vec::new(), 400),
        ("GET", "/v1/results?run=nope".into(), &[], Vec::new(), 404),
        ("GET", "/v1/devices/nope".into(), &[], Vec::new(), 404),
        ("POST", "/v1/devices/nope/health".into(), &[], Vec::new(), 404),
        ("DELETE", "/v1/devices/nope".into(), &[], Vec::new(), 404),
        ("GET", "/v1/vms/nope".into(), &[], Vec::new(), 404),
        ("GET", "/v1/vms/nope/serial".into(), &[], Vec::new(), 404),
        ("PUT", "/v1/runs".into(), &[], Vec::new(), 405),
        ("GET", "/v2/nothing".into(), &[], Vec::new(), 404),
    ];
    for (method, path, headers, body, expected) in cases {
        let answer = call(&client, method, &path, headers, Some(&body));
        let text = String::from_utf8_lossy(&answer.body);
        assert_eq!(answer.status, expected, "{method} {path}: {text}");
        assert!(answer.content_type.starts_with("application/json"), "{method} {path}: {}", answer.content_type);
        let error = json_of(&answer);
        assert!(error["code"].is_string() && error["message"].is_string(), "{method} {path}: {error}");
        assert!(!text.contains("TOPSECRET") && !text.contains("root:x:"), "{method} {path} echoed a file: {text}");
    }
    let doc = json_of(&call(&client, "GET", "/v1/openapi.json", &[], None));
    assert_eq!(doc["openapi"], "3.1.0");
}

#[test]
fn lab_run_through_the_daemon_prints_what_it_prints_in_process() {
    if !kvm_available("lab_run_through_the_daemon_prints_what_it_prints_in_process") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let out = Command::new(driverlab())
        .args(["lab", "run", &probe_matrix(), "--socket"])
        .arg(&daemon.socket)
        .env("DRIVERLAB_DB", dir.path().join("not-used.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let run = stdout.lines().next().and_then(|l| l.strip_prefix("run ")).and_then(|l| l.strip_suffix(" started"));
    let run = run.unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(stdout.lines().last().unwrap(), format!("run {run}: 3 cells, 15 passed, 0 failed, 0 errors"));
    assert!(stdout.contains("| c03 | pool | rx-20k | aqc100 | 5 | 5 PASS |"), "{stdout}");
    let progress: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(progress.len(), 15, "{stderr}");
    assert!(progress[0].starts_with("[1/15] c01 flip probe.rx=flip rep 1: PASS "), "{}", progress[0]);
    assert!(!dir.path().join("not-used.db").exists(), "the daemon's database holds the run");

    let report = Command::new(driverlab())
        .args(["lab", "report", run, "--format", "json"])
        .env("DRIVERLAB_SOCKET", &daemon.socket)
        .output()
        .unwrap();
    let served = json_of(&call(&daemon.client(), "GET", &format!("/v1/runs/{run}/report"), &[], None));
    assert_eq!(serde_json::from_slice::<Value>(&report.stdout).unwrap(), served);

    let lab = |args: &[&str]| {
        let out =
            Command::new(driverlab()).arg("lab").args(args).env("DRIVERLAB_SOCKET", &daemon.socket).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let list = lab(&["list"]);
    assert!(list.lines().any(|l| l.starts_with(run) && l.contains(" done ") && l.contains("15/15")), "{list}");
    let show = lab(&["show", run]);
    assert!(show.starts_with(&format!("run {run}: matrix probe-rx-strategies (request.toml), done")), "{show}");
    assert_eq!(show.lines().filter(|l| l.starts_with("  c0")).count(), 15, "{show}");
}

#[test]
fn schemathesis_finds_nothing_against_a_live_daemon() {
    let test = "schemathesis_finds_nothing_against_a_live_daemon";
    let Some(st) = std::env::var_os("DRIVERLAB_SCHEMATHESIS").filter(|s| !s.is_empty()) else {
        eprintln!("SKIP {test}: set DRIVERLAB_SCHEMATHESIS to schemathesis's st (scripts/fetch-schemathesis.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token = "schemathesis-token-0123456789abcdef";
    std::fs::write(dir.path().join("token"), token).unwrap();
    let token_file = dir.path().join("token").display().to_string();
    let daemon = Daemon::start(dir.path(), &["--listen", "127.0.0.1:0", "--token-file", &token_file]);
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    // Every check but positive_data_acceptance: that one would need every semantic rule (a
    // matrix that checks out, a device that is one kind or the other) in the schema.
    // Its run folder (.schemathesis) goes into the test's own folder, not the repository.
    let out = Command::new(st)
        .current_dir(dir.path())
        .arg("run")
        .arg(&schema)
        .args(["--url", &format!("http://{}", daemon.tcp.as_ref().unwrap())])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["--max-examples", "30", "--seed", "1", "--no-color"])
        .output()
        .expect("st runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    println!("{summary}");
    assert!(out.status.success(), "schemathesis found failures:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_report_page_renders_in_headless_chromium() {
    let test = "the_report_page_renders_in_headless_chromium";
    if !kvm_available(test) {
        return;
    }
    if Command::new("chromium").arg("--version").output().is_err() {
        eprintln!("SKIP {test}: no chromium (apt-get install chromium)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = std::fs::read_to_string(probe_matrix()).unwrap().replace("repetitions = 5", "repetitions = 2");
    assert!(matrix.contains("repetitions = 2"));
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let answer = call(&client, "POST", "/v1/runs", &[("content-type", "application/toml")], Some(matrix.as_bytes()));
    assert_eq!(answer.status, 201);
    let run = json_of(&answer)["id"].as_str().unwrap().to_string();
    events(&daemon, &run, None);
    let page = call(&client, "GET", &format!("/v1/runs/{run}/report"), &[("accept", "text/html")], None);
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    let file = dir.path().join("report.html");
    std::fs::write(&file, &page.body).unwrap();
    let out = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(format!("file://{}", file.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dom = String::from_utf8_lossy(&out.stdout);
    // What the browser built: the table with a row per cell, the bus table (the model counts
    // its link's traffic) with a row per cell, and the chart.
    assert!(dom.contains("<table id=\"cells\">"), "{dom}");
    let (cells, bus) = dom.split_once("<table id=\"bus\">").expect("the bus table");
    assert_eq!(cells.matches("<tr><td>").count(), 3, "{dom}");
    assert_eq!(bus.matches("<tr><td>").count(), 3, "{dom}");
    assert!(cells.contains("<td>c02</td><td>order3</td>"), "{dom}");
    assert!(bus.contains("<td>c02</td><td>order3</td><td>PCIe Gen3 x2</td>"), "{dom}");
    assert!(dom.contains("<figure id=\"chart\">") && dom.contains("<svg"), "{dom}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "the page logged to the console: {console:?}");
}

#[test]
fn the_hardware_workflow_is_valid_and_its_matrix_builds_through_a_daemon() {
    let test = "the_hardware_workflow_is_valid_and_its_matrix_builds_through_a_daemon";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workflow = root.join(".github/workflows/hardware-lab.yml");
    // GitHub's schema for workflows, through check-jsonschema next to schemathesis.
    match std::env::var_os("DRIVERLAB_SCHEMATHESIS").filter(|s| !s.is_empty()) {
        Some(st) => {
            let checker = Path::new(&st).with_file_name("check-jsonschema");
            let out = Command::new(checker)
                .args(["--builtin-schema", "vendor.github-workflows"])
                .arg(&workflow)
                .output()
                .expect("check-jsonschema runs");
            assert!(
                out.status.success(),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        None => eprintln!("SKIP {test}: its schema part: set DRIVERLAB_SCHEMATHESIS (scripts/fetch-schemathesis.sh)"),
    }
    if std::env::var_os("DRIVERLAB_IMAGE_TESTS").is_none() || Command::new("jq").arg("--version").output().is_err() {
        eprintln!(
            "SKIP {test}: set DRIVERLAB_IMAGE_TESTS=1 with the kernel headers and jq installed (scripts/test.sh does)"
        );
        return;
    }
    // The workflow's image step against a daemon here: Debian's kernel, seeds 000 and 001 built
    // from their patches, an initramfs each, their IDs in the matrix.
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let out = Command::new(root.join("scripts/ci-matrix.sh"))
        .arg(root.join("examples/hardware-matrix.toml"))
        .env("DRIVERLAB_SOCKET", &daemon.socket)
        .output()
        .unwrap();
    let matrix = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!matrix.contains('@'), "every placeholder filled: {matrix}");
    let initrds: Vec<&str> = matrix.lines().filter_map(|l| l.strip_prefix("initrd = \"initramfs-")).collect();
    assert_eq!(initrds.len(), 3);
    assert!(initrds[0] != initrds[1] && initrds[1] != initrds[2], "three different initramfs: {initrds:?}");
    // On this box the device is the model; the matrix checks out, and the host decides.
    let client = daemon.client();
    let json_body = [("content-type", "application/json")];
    let answer = call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"aqc100-tb","model":"aqc100"}"#));
    assert_eq!(answer.status, 201);
    let answer = call(&client, "POST", "/v1/runs", &[("content-type", "application/toml")], Some(matrix.as_bytes()));
    let virt = vm_spec::host::virtualization();
    if virt.boots_linux() && lab::peer::can_create() {
        assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
        let run = json_of(&answer)["id"].as_str().unwrap().to_string();
        assert_eq!(call(&client, "POST", &format!("/v1/runs/{run}/cancel"), &[], None).status, 202);
    } else {
        let error = json_of(&answer);
        assert_eq!(answer.status, 422, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("3 cell(s) cannot run on this host"), "{message}");
    }
}

/// A test daemon on TCP with a token; its token.
fn tcp_daemon(dir: &Path, prefix: &[&str]) -> (Daemon, String) {
    let token = "bounds-token-0123456789abcdef".to_string();
    std::fs::write(dir.join("token"), &token).unwrap();
    let token_file = dir.join("token").display().to_string();
    (Daemon::start_under(prefix, dir, &["--listen", "127.0.0.1:0", "--token-file", &token_file]), token)
}

/// Raises this process's open-file limit to its hard limit (the flood needs thousands).
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a pointer to a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_flood_of_half_sent_requests_starves_neither_token_holders_nor_the_unix_socket() {
    use std::io::{Read, Write};
    let test = "a_flood_of_half_sent_requests_starves_neither_token_holders_nor_the_unix_socket";
    if raise_open_files() < 4096 {
        eprintln!("SKIP {test}: this process may open fewer than 4096 files (ulimit -Hn)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, token) = tcp_daemon(dir.path(), &[]);
    let addr = daemon.tcp.clone().unwrap();
    // 3000 connections, each with a request head that never ends: more than the daemon keeps.
    let mut flood = Vec::new();
    for _ in 0..3000 {
        let Ok(mut stream) = std::net::TcpStream::connect(&addr) else { continue };
        let _ = stream.write_all(b"GET /v1/version HTTP/1.1\r\nHost: x\r\n");
        flood.push(stream);
    }
    assert!(flood.len() > 2500, "the flood connected ({})", flood.len());
    let fds = open_fds(daemon.child.id());
    assert!(fds < 700, "the daemon holds {fds} descriptors: its connections are capped");
    // A token holder is served at once, and the Unix socket too.
    let client = Client::tcp(addr.clone(), token);
    let start = Instant::now();
    let answer = call(&client, "GET", "/v1/runs", &[], None);
    let took = start.elapsed();
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert!(took < Duration::from_secs(1), "a token holder waited {took:?} during the flood");
    assert_eq!(call(&daemon.client(), "GET", "/v1/version", &[], None).status, 200);
    // The flood's oldest connections were dropped to make room, or timed out.
    let first = &mut flood[0];
    first.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(first.read(&mut byte), Ok(0) | Err(_)), "the first half-sent request's connection is closed");
    drop(flood);
    assert_eq!(call(&daemon.client(), "GET", "/v1/version", &[], None).status, 200, "the daemon lives on");
}

#[test]
fn a_body_that_trickles_is_cut_with_408() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (daemon, token) = tcp_daemon(dir.path(), &[]);
    let mut stream = std::net::TcpStream::connect(daemon.tcp.as_ref().unwrap()).unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/toml\r\nContent-Length: 1000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let start = Instant::now();
    // A byte a second, for longer than the daemon waits.
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..60 {
                if stream.write_all(b"#").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    stream.set_read_timeout(Some(Duration::from_secs(50))).unwrap();
    let mut answer = vec![0u8; 4096];
    let n = stream.read(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"timeout\"") && text.contains("did not arrive within 30 s"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(45), "cut after {:?}", start.elapsed());
    drop(stream);
    let _ = writer.join();
}

#[test]
fn limits_are_checked_before_the_work_they_limit() {
    let dir = tempfile::tempdir().unwrap();
    // A ceiling on the daemon's memory: expanding a huge matrix would hit it (and abort).
    let daemon = Daemon::start_under(&["prlimit", "--as=4294967296"], dir.path(), &[]);
    let client = daemon.client();
    let toml = [("content-type", "application/toml")];
    let params: Vec<String> = (0..12).map(|i| format!("\"m.p{i}\" = [0,1,2,3,4,5,6,7,8,9]")).collect();
    let huge = format!(
        "name = \"huge\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"probe\"\nkernel = \"probe\"\n\
         [[variant]]\nname = \"v\"\nimage = \"probe\"\nparams = {{ {} }}\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n",
        params.join(", ")
    );
    assert!(huge.len() < 1000, "about 800 bytes");
    let start = Instant::now();
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(huge.as_bytes()));
    assert_eq!(answer.status, 422, "{}", String::from_utf8_lossy(&answer.body));
    assert!(json_of(&answer)["message"].as_str().unwrap().contains("1000000000000 cells; at most 10000"));
    assert!(start.elapsed() < Duration::from_secs(5), "refused at once");
    // Few cells, too many results.
    let sweep = huge.replace(&format!("params = {{ {} }}", params.join(", ")), "params = { \"m.p\" = [0,1,2,3,4,5,6,7,8,9] }")
        .replace("name = \"huge\"", "name = \"sweep\"\nrepetitions = 1000\n[[device]]\nname = \"aq2\"\nmodel = \"aqc100\"\n[[device]]\nname = \"aq3\"\nmodel = \"aqc100\"\n[[device]]\nname = \"aq4\"\nmodel = \"aqc100\"");
    let sweep = sweep.replace(
        "params = { \"m.p\" = [0,1,2,3,4,5,6,7,8,9] }",
        "params = { \"m.p\" = [0,1,2,3,4,5,6,7,8,9], \"m.q\" = [0,1,2] }",
    );
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(sweep.as_bytes()));
    assert_eq!(answer.status, 422, "{}", String::from_utf8_lossy(&answer.body));
    assert!(
        json_of(&answer)["message"].as_str().unwrap().contains("120000 results; at most 100000"),
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    // The VM limits every VM has, in a matrix too.
    let big_vm = huge
        .replace(&format!("params = {{ {} }}", params.join(", ")), "")
        .replace("kernel = \"probe\"", "kernel = \"probe\"\nmemory_mib = 1048577");
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(big_vm.as_bytes()));
    assert_eq!(answer.status, 422);
    assert!(json_of(&answer)["message"].as_str().unwrap().contains("at most 1048576 MiB"));
    assert!(json_of(&call(&client, "GET", "/v1/runs", &[], None)).as_array().unwrap().is_empty(), "no run was created");
    assert_eq!(call(&client, "GET", "/v1/version", &[], None).status, 200, "the daemon lives");
}

#[test]
fn careless_input_is_refused_with_the_reason_and_the_status_docs_give() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let json = [("content-type", "application/json")];
    let toml = [("content-type", "application/toml")];
    let cases: Vec<CarelessCase> = vec![
        ("POST", "/v1/vms", &json, r#"{"kernel":"probe","cmdline":"a\u0000b"}"#.into(), 422, "NUL byte"),
        ("POST", "/v1/vms", &json, r#"["probe"]"#.into(), 400, "give a JSON object"),
        (
            "POST",
            "/v1/devices",
            &json,
            r#"{"name":"t","model":"aqc100","tap":"../../etc/x"}"#.into(),
            422,
            "not an interface name",
        ),
        (
            "POST",
            "/v1/devices",
            &json,
            format!(r#"{{"name":"t","model":"aqc100","tap":"{}"}}"#, "t".repeat(40)),
            422,
            "1 to 15",
        ),
        (
            "POST",
            "/v1/devices",
            &json,
            r#"{"name":"t","model":"aqc100","generate":"size=99999999"}"#.into(),
            422,
            "size=99999999",
        ),
        ("POST", "/v1/runs", &toml, "name = \"m\"\ncolour = 1\n".into(), 400, "colour"),
        ("POST", "/v1/runs", &toml, "name = = \"m\"\n".into(), 400, "syntax"),
    ];
    for (method, path, headers, body, status, says) in cases {
        let answer = call(&client, method, path, headers, Some(body.as_bytes()));
        let text = String::from_utf8_lossy(&answer.body).to_string();
        assert_eq!(answer.status, status, "{method} {path} {body}: {text}");
        assert!(text.contains(says), "{method} {path} {body}: {text}");
    }
}

#[test]
fn the_daemon_leaves_what_is_not_its_own_alone_and_cleans_up_after_its_dead() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the socket should go: refused, untouched.
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let out = Command::new(driverlab())
        .args(["serve", "--socket"])
        .arg(&precious)
        .arg("--db")
        .arg(dir.path().join("lab.db"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exists and is not a socket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    // A file that is not a database: refused, untouched, and its bytes never quoted.
    let notes = dir.path().join("notes.db");
    std::fs::write(&notes, "secret notes, not SQLite\n".repeat(100)).unwrap();
    let out = Command::new(driverlab())
        .args(["serve", "--socket"])
        .arg(dir.path().join("s.sock"))
        .arg("--db")
        .arg(&notes)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("not a database") && !said.contains("secret"), "{said}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "secret notes, not SQLite\n".repeat(100));
    // What a process killed with -9 left in the temporary directory goes; the database is 0600.
    let stale = std::env::temp_dir().join("driverlab-model-4194303-7");
    std::fs::create_dir_all(stale.join("inner")).unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    assert!(!stale.exists(), "{} is gone", stale.display());
    for file in ["lab.db", "lab.db-wal"] {
        let path = dir.path().join(file);
        if path.exists() {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file} is {mode:o}");
        }
    }
    drop(daemon);
    // `lab import` of a database that does not exist creates nothing.
    let typo = dir.path().join("typo.db");
    let out = Command::new(driverlab())
        .args(["lab", "import"])
        .arg(&typo)
        .arg("--db")
        .arg(dir.path().join("lab.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!typo.exists());
}

#[test]
fn cancels_at_once_are_one_cancel_and_a_refused_submit_leaves_no_run() {
    let test = "cancels_at_once_are_one_cancel_and_a_refused_submit_leaves_no_run";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let toml = [("content-type", "application/toml")];
    // One runs, sixteen wait, and the rest are refused: 429, and no run made for them.
    let mut accepted = Vec::new();
    let mut refused = 0;
    for _ in 0..20 {
        let answer = call(&client, "POST", "/v1/runs", &toml, Some(&matrix));
        match answer.status {
            201 => accepted.push(json_of(&answer)["id"].as_str().unwrap().to_string()),
            429 => refused += 1,
            other => panic!("{other}: {}", String::from_utf8_lossy(&answer.body)),
        }
    }
    assert!(refused >= 1 && accepted.len() >= 17, "{} accepted, {refused} refused", accepted.len());
    let runs = json_of(&call(&client, "GET", "/v1/runs", &[], None));
    assert_eq!(runs.as_array().unwrap().len(), accepted.len(), "only the accepted runs exist");
    // Four cancels of a waiting run at once: it is cancelled once, its repetitions MISS once.
    let waiting = accepted.last().unwrap().clone();
    let stream = {
        let socket = daemon.socket.clone();
        let run = waiting.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            runtime()
                .block_on(Client::new(&socket).events(&format!("/v1/runs/{run}/events"), |data| {
                    seen.push(serde_json::from_str::<Value>(data).unwrap());
                    true
                }))
                .unwrap();
            seen
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let cancels: Vec<_> = (0..4)
        .map(|_| {
            let socket = daemon.socket.clone();
            let path = format!("/v1/runs/{waiting}/cancel");
            std::thread::spawn(move || call(&Client::new(&socket), "POST", &path, &[], None).status)
        })
        .collect();
    let statuses: Vec<u16> = cancels.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 202 || *s == 409), "{statuses:?}");
    let seen = stream.join().unwrap();
    let recorded = seen.iter().filter(|e| e["event"] == "recorded").count();
    assert!(recorded <= 1, "one cancel's MISS records come as one event, not {recorded}");
    let last = &seen.last().unwrap()["status"];
    assert_eq!(
        (last["state"].as_str(), last["counts"]["MISS"].as_u64(), last["results"].as_u64()),
        (Some("cancelled"), Some(15), Some(15)),
        "{last}"
    );
    for run in &accepted {
        let _ = call(&client, "POST", &format!("/v1/runs/{run}/cancel"), &[], None);
    }
}

#[test]
fn health_checks_beyond_the_one_running_are_answered_429_at_once() {
    let test = "health_checks_beyond_the_one_running_are_answered_429_at_once";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let json = [("content-type", "application/json")];
    let device = br#"{"name":"aq","model":"aqc100"}"#;
    assert_eq!(call(&daemon.client(), "POST", "/v1/devices", &json, Some(device)).status, 201);
    let start = Instant::now();
    let checks: Vec<_> = (0..6)
        .map(|_| {
            let socket = daemon.socket.clone();
            std::thread::spawn(move || {
                let answer = call(&Client::new(&socket), "POST", "/v1/devices/aq/health", &[], None);
                (answer.status, start.elapsed())
            })
        })
        .collect();
    let answers: Vec<(u16, Duration)> = checks.into_iter().map(|t| t.join().unwrap()).collect();
    let ran = answers.iter().filter(|(s, _)| *s == 200).count();
    let busy: Vec<&Duration> = answers.iter().filter(|(s, _)| *s == 429).map(|(_, t)| t).collect();
    assert!(ran >= 1 && !busy.is_empty() && ran + busy.len() == 6, "{answers:?}");
    let slowest_refusal = busy.iter().max().unwrap();
    let check_took = answers.iter().filter(|(s, _)| *s == 200).map(|(_, t)| *t).min().unwrap();
    assert!(**slowest_refusal < check_took, "refusals come before the check ends, not after it: {answers:?}");
}

#[test]
fn a_model_killed_mid_repetition_is_an_error_that_says_so() {
    let test = "a_model_killed_mid_repetition_is_an_error_that_says_so";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("long.toml");
    let text = std::fs::read_to_string(probe_matrix())
        .unwrap()
        .replace("repetitions = 5", "repetitions = 1")
        .replace("frames = 20000", "frames = 20000000")
        .replace("timeout_s = 120", "timeout_s = 300");
    let text = text.split("[[variant]]\nname = \"order3\"").next().unwrap().to_string()
        + "[[workload]]\nname = \"rx-20m\"\nkind = \"probe-rx\"\nframes = 20000000\n";
    std::fs::write(&matrix, text).unwrap();
    let mut lab = Command::new(driverlab())
        .args(["lab", "run"])
        .arg(&matrix)
        .arg("--db")
        .arg(dir.path().join("lab.db"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The health check's model comes and goes first (the lab says `health PASS ...`); the
    // repetition's is the one after: `driverlab model aqc100 --once --socket /tmp/driverlab-model-LABPID-N/...`.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = lab.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let health = rx.iter().find(|l| l.starts_with("health ")).expect("the health check's line");
    assert!(health.starts_with("health PASS"), "{health}");
    let pattern = format!("driverlab-model-{}-", lab.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    let model = loop {
        let out = Command::new("pgrep").args(["-f", &pattern]).output().expect("pgrep (procps) runs");
        let pids: Vec<i32> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if let Some(&pid) = pids.first() {
            break pid;
        }
        assert!(Instant::now() < deadline, "no model of the repetition within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) of the model process the lab started.
    unsafe { libc::kill(model, libc::SIGKILL) };
    let out = lab.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().last().unwrap_or_default().ends_with("0 passed, 0 failed, 1 errors"), "{stdout}");
    let run = stdout.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap().to_string();
    let shown = Command::new(driverlab())
        .args(["lab", "show", &run, "--json", "--db"])
        .arg(dir.path().join("lab.db"))
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let record = &shown["records"][0];
    assert_eq!(record["status"], "ERROR", "{record}");
    assert_eq!(record["reason"], "the aqc100 model ended (signal 9) during the repetition", "{record}");
}
