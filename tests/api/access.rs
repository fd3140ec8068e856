//! Who may ask and what: TCP needs the token, no request makes the daemon read a host path it names, every error is JSON, the daemon leaves what is not its own alone; schemathesis against the OpenAPI document.

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
    // The scheme's name in any case (RFC 9110); the token exactly.
    for (scheme, status) in [("bearer", "200"), ("BEARER", "200"), ("Basic", "401")] {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        let head = format!(
            "GET /v1/version HTTP/1.1\r\nHost: x\r\nAuthorization: {scheme} {token}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert_eq!(answer.split_whitespace().nth(1), Some(status), "{scheme}: {answer}");
    }
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

/// A request and the status it must get: method, path, headers, body, status.
type Case<'a> = (&'a str, String, &'a [(&'a str, &'a str)], Vec<u8>, u16);

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
fn schemathesis_finds_nothing_against_a_live_daemon() {
    let test = "schemathesis_finds_nothing_against_a_live_daemon";
    let Some(st) = std::env::var_os("DRIVERLAB_SCHEMATHESIS").filter(|s| !s.is_empty()) else {
        let why = "set DRIVERLAB_SCHEMATHESIS to schemathesis's st (scripts/fetch-schemathesis.sh)";
        common::skip(test, common::Lacks::Setup, why);
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
