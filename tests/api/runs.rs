//! Runs over the API: submitted with curl and followed to their report, queued and cancelled, resumed after a daemon killed with -9, `lab run` through the daemon, a model killed mid-repetition, the report page in a browser, the hardware workflow's matrix.

#![allow(unused_imports)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::client::{Answer, Client};
use serde_json::{Value, json};

use crate::common::{self, driverlab, kvm_available};
use crate::fixture::*;

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
fn a_daemon_killed_with_minus_9_restarts_with_its_runs_resumable_and_its_waiting_runs_queued() {
    if !kvm_available("a_daemon_killed_with_minus_9_restarts_with_its_runs_resumable_and_its_waiting_runs_queued") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let (run, waiting) = {
        let daemon = Daemon::start(dir.path(), &[]);
        let submit = || {
            let answer =
                call(&daemon.client(), "POST", "/v1/runs", &[("content-type", "application/toml")], Some(&matrix));
            assert_eq!(answer.status, 201);
            json_of(&answer)["id"].as_str().unwrap().to_string()
        };
        // One runs, one waits behind it.
        let (run, waiting) = (submit(), submit());
        // Three repetitions in, kill it.
        let seen = events(&daemon, &run, Some(3));
        assert_eq!(seen.iter().filter(|e| e["event"] == "recorded").count(), 3);
        let mut daemon = daemon;
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(daemon.child.id() as i32, libc::SIGKILL) };
        let _ = daemon.child.wait();
        (run, waiting)
    };
    let daemon = Daemon::start(dir.path(), &[]);
    // The run that waited is queued again (it never started); the one that ran is interrupted.
    let status = json_of(&call(&daemon.client(), "GET", &format!("/v1/runs/{waiting}"), &[], None));
    assert!(status["state"] == "queued" || status["state"] == "running", "queued again: {status}");
    assert_eq!(call(&daemon.client(), "POST", &format!("/v1/runs/{waiting}/cancel"), &[], None).status, 202);
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
    // The stream is subscribed once its first event (the run's state) has come.
    let (subscribed, first_event) = std::sync::mpsc::channel();
    let stream = {
        let socket = daemon.socket.clone();
        let run = waiting.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            runtime()
                .block_on(Client::new(&socket).events(&format!("/v1/runs/{run}/events"), |data| {
                    seen.push(serde_json::from_str::<Value>(data).unwrap());
                    let _ = subscribed.send(());
                    true
                }))
                .unwrap();
            seen
        })
    };
    first_event.recv_timeout(Duration::from_secs(30)).expect("the run's event stream starts");
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
fn a_submit_refused_for_the_queued_results_leaves_no_run() {
    let test = "a_submit_refused_for_the_queued_results_leaves_no_run";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let toml = [("content-type", "application/toml")];
    // Two runs of 100,000 results each fill the daemon's 200,000; a third of 15 is one too many.
    let values: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let big = format!(
        "name = \"big\"\nrepetitions = 1000\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
         [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
         params = {{ \"m.p\" = [{}] }}\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n",
        values.join(", ")
    );
    for _ in 0..2 {
        let answer = call(&client, "POST", "/v1/runs", &toml, Some(big.as_bytes()));
        assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    }
    let small = std::fs::read(probe_matrix()).unwrap();
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(&small));
    assert_eq!(answer.status, 429, "{}", String::from_utf8_lossy(&answer.body));
    assert!(json_of(&answer)["message"].as_str().unwrap().contains("200000 results are queued or running"));
    let runs = json_of(&call(&client, "GET", "/v1/runs", &[], None));
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "no run was made for the refused matrix: {runs:?}");
    assert!(runs.iter().all(|r| r["matrix"] == "big"), "{runs:?}");
}

#[test]
fn tcp_clients_holding_every_stream_they_may_leave_the_owner_s_lab_run_its_own() {
    let test = "tcp_clients_holding_every_stream_they_may_leave_the_owner_s_lab_run_its_own";
    if !kvm_available(test) {
        return;
    }
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
    let token_file = dir.path().join("token").display().to_string();
    let daemon = Daemon::start(dir.path(), &["--listen", "127.0.0.1:0", "--token-file", &token_file]);
    let addr = daemon.tcp.clone().unwrap();
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let toml = [("content-type", "application/toml")];
    let answer = call(&daemon.client(), "POST", "/v1/runs", &toml, Some(&matrix));
    let run = json_of(&answer)["id"].as_str().unwrap().to_string();
    // A stream held open: the request sent, the head of the answer read, the rest left unread.
    let open = |stream: &mut dyn ReadWrite, bearer: bool| -> String {
        let auth = if bearer { format!("Authorization: Bearer {token}\r\n") } else { String::new() };
        let head = format!("GET /v1/runs/{run}/events HTTP/1.1\r\nHost: x\r\n{auth}Accept: text/event-stream\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let mut byte = [0u8; 1];
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            answer.push(byte[0]);
        }
        String::from_utf8_lossy(&answer).split_whitespace().nth(1).unwrap_or_default().to_string()
    };
    trait ReadWrite: Read + Write {}
    impl<T: Read + Write> ReadWrite for T {}
    // The TCP clients take every stream they may: 48.
    let mut held: Vec<Box<dyn ReadWrite>> = Vec::new();
    for _ in 0..48 {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        assert_eq!(open(&mut stream, true), "200");
        held.push(Box::new(stream));
    }
    let mut one_more = std::net::TcpStream::connect(&addr).unwrap();
    assert_eq!(open(&mut one_more, true), "429", "TCP's share is taken");
    // The owner's share: the Unix socket's 16, taken too, so that the owner's `lab run` is
    // refused a stream and follows its run's state instead.
    for _ in 0..16 {
        let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        assert_eq!(open(&mut stream, false), "200", "the owner's streams are its own");
        held.push(Box::new(stream));
    }
    let out = Command::new(driverlab())
        .args(["lab", "run", &probe_matrix(), "--socket"])
        .arg(&daemon.socket)
        .env("DRIVERLAB_DB", dir.path().join("not-used.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("no event stream to spare (429): following the run's state"), "{stderr}");
    let second = stdout.lines().next().and_then(|l| l.strip_prefix("run ")?.strip_suffix(" started")).unwrap();
    assert_eq!(stdout.lines().last().unwrap(), format!("run {second}: 3 cells, 15 passed, 0 failed, 0 errors"));
    drop(held);
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
    // repetition's is the one after: `driverlab-model aqc100 --once --socket /tmp/driverlab-model-LABPID-N/...`.
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
    // Mid-repetition: once the probe has found the device on its PCI bus (its console says so).
    let artifacts = dir.path().join("artifacts");
    let found = common::wait_until(Duration::from_secs(60), Duration::from_millis(50), || {
        let Ok(runs) = std::fs::read_dir(&artifacts) else { return false };
        runs.flatten().any(|r| {
            let serial = r.path().join("c01/rep0/serial.log");
            std::fs::read_to_string(serial).is_ok_and(|s| s.contains("{\"probe\":\"pci\""))
        })
    });
    assert!(found, "the repetition's probe reached its PCI scan within 60 s");
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

#[test]
fn the_report_page_renders_in_headless_chromium() {
    let test = "the_report_page_renders_in_headless_chromium";
    if !kvm_available(test) {
        return;
    }
    if Command::new("chromium").arg("--version").output().is_err() {
        common::skip(test, common::Lacks::Setup, "no chromium (apt-get install chromium)");
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
    let action = root.join(".github/actions/lab-shard/action.yml");
    // GitHub's schemas for workflows and actions, through check-jsonschema next to schemathesis.
    match std::env::var_os("DRIVERLAB_SCHEMATHESIS").filter(|s| !s.is_empty()) {
        Some(st) => {
            let checker = Path::new(&st).with_file_name("check-jsonschema");
            for (schema, file) in [("vendor.github-workflows", &workflow), ("vendor.github-actions", &action)] {
                let out = Command::new(&checker)
                    .args(["--builtin-schema", schema])
                    .arg(file)
                    .output()
                    .expect("check-jsonschema runs");
                assert!(
                    out.status.success(),
                    "{}: {}{}",
                    file.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        None => common::skip(
            test,
            common::Lacks::Setup,
            "its schema part: set DRIVERLAB_SCHEMATHESIS (scripts/fetch-schemathesis.sh)",
        ),
    }
    // The project's own check of what the schema cannot see: the jobs' wiring (the fan-out of
    // shards, the re-run of missing ones, the merge) and every shell step through shellcheck.
    crate::workflow::check(&workflow, &action);
    if std::env::var_os("DRIVERLAB_IMAGE_TESTS").is_none() {
        let why = "set DRIVERLAB_IMAGE_TESTS=1 with the kernel image's package reachable (scripts/test.sh does)";
        common::skip(test, common::Lacks::Setup, why);
        return;
    }
    // The workflow's image step against a daemon here: `lab pin` has the daemon build Debian's
    // kernel, seeds 000 and 001 from their patches (sent as texts) and an initramfs each, and
    // prints the matrix with their IDs.
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let socket = daemon.socket.display().to_string();
    let out = Command::new(common::driverlab())
        .args(["lab", "pin"])
        .arg(root.join("examples/hardware-matrix.toml"))
        .args(["--socket", &socket])
        .output()
        .unwrap();
    let matrix = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let recipes = |l: &str| l == "kernel = \"debian\"" || l == "initrd = \"agent\"" || l.starts_with("patches");
    assert!(!matrix.lines().any(recipes), "every recipe pinned: {matrix}");
    let initrds: Vec<&str> = matrix.lines().filter_map(|l| l.strip_prefix("initrd = \"initramfs-")).collect();
    assert_eq!(initrds.len(), 3);
    assert!(initrds[0] != initrds[1] && initrds[1] != initrds[2], "three different initramfs: {initrds:?}");
    // The same again builds nothing new: the same IDs.
    let again = Command::new(common::driverlab())
        .args(["lab", "pin"])
        .arg(root.join("examples/hardware-matrix.toml"))
        .args(["--socket", &socket])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), matrix, "{}", String::from_utf8_lossy(&again.stderr));
    // On this box the device is the model; the matrix checks out, and the host decides.
    let client = daemon.client();
    let json_body = [("content-type", "application/json")];
    let answer = call(&client, "POST", "/v1/devices", &json_body, Some(br#"{"name":"aqc100-tb","model":"aqc100"}"#));
    assert_eq!(answer.status, 201);
    // The pinned matrix, and the recipe matrix as it is with its patches as texts (what `lab run
    // --url` sends; the daemon finds its images built): each checks out, and the host decides.
    let file = root.join("examples/hardware-matrix.toml");
    let recipe = lab::recipe::inline_patches(&file, &std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(recipe.contains("text = "), "{recipe}");
    for body in [&matrix, &recipe] {
        let answer = call(&client, "POST", "/v1/runs", &[("content-type", "application/toml")], Some(body.as_bytes()));
        let virt = vm_spec::host::virtualization();
        if virt.boots_linux() && engines::peer::can_create() {
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
}

#[test]
fn a_followed_run_whose_daemon_dies_ends_with_its_interrupted_line() {
    let test = "a_followed_run_whose_daemon_dies_ends_with_its_interrupted_line";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(dir.path(), &[]);
    // Long enough that it is still running when its daemon is killed.
    let matrix = dir.path().join("long.toml");
    let text = std::fs::read_to_string(probe_matrix()).unwrap().replace("repetitions = 5", "repetitions = 200");
    std::fs::write(&matrix, text).unwrap();
    let mut follower = Command::new(driverlab())
        .args(["lab", "run"])
        .arg(&matrix)
        .arg("--socket")
        .arg(&daemon.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(follower.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let run = first.trim().strip_prefix("run ").and_then(|l| l.strip_suffix(" started")).expect(&first).to_string();
    daemon.child.kill().unwrap();
    let rest: Vec<String> = stdout.lines().map_while(Result::ok).collect();
    let status = follower.wait().unwrap();
    let last = rest.last().cloned().unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{last}");
    assert!(
        last.starts_with(&format!("run {run}: interrupted: "))
            && last.ends_with(&format!("`driverlab lab resume {run}` once the daemon is back")),
        "the contract's last line (docs/lab.md): {last}"
    );
}
