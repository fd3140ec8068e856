//! The daemon's bounds: half-sent requests and trickled bodies, limits checked before the work they limit, careless input refused with the status the docs give.

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
fn a_flood_of_half_sent_requests_starves_neither_token_holders_nor_the_unix_socket() {
    use std::io::{Read, Write};
    let test = "a_flood_of_half_sent_requests_starves_neither_token_holders_nor_the_unix_socket";
    if raise_open_files() < 4096 {
        common::skip(test, common::Lacks::Setup, "this process may open fewer than 4096 files (ulimit -Hn)");
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
    // The VM limits `/v1/vms` has (vm-spec's, within a lab's), in a matrix too: on an image's
    // memory, and on a variant's command line.
    let big_vm = huge
        .replace(&format!("params = {{ {} }}", params.join(", ")), "")
        .replace("kernel = \"probe\"", "kernel = \"probe\"\nmemory_mib = 16385");
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(big_vm.as_bytes()));
    assert_eq!(answer.status, 422);
    assert!(json_of(&answer)["message"].as_str().unwrap().contains("at most 16384 MiB"));
    let vms = call(
        &client,
        "POST",
        "/v1/vms",
        &[("content-type", "application/json")],
        Some(br#"{"kernel":"probe","memory_mib":16385}"#),
    );
    assert_eq!(vms.status, 422);
    assert!(json_of(&vms)["message"].as_str().unwrap().contains("at most 16384 MiB"), "the same words");
    let nul = huge.replace(&format!("params = {{ {} }}", params.join(", ")), "cmdline = \"a\\u0000b\"");
    let answer = call(&client, "POST", "/v1/runs", &toml, Some(nul.as_bytes()));
    assert_eq!(answer.status, 422, "{}", String::from_utf8_lossy(&answer.body));
    let message = json_of(&answer)["message"].as_str().unwrap().to_string();
    assert!(message.contains("variant[0]") && message.contains("NUL byte"), "{message}");
    assert!(json_of(&call(&client, "GET", "/v1/runs", &[], None)).as_array().unwrap().is_empty(), "no run was created");
    assert_eq!(call(&client, "GET", "/v1/version", &[], None).status, 200, "the daemon lives");
}

/// Method, path, headers, body, the status expected, and what its message must say.
type CarelessCase<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], String, u16, &'a str);

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
        // A matrix says what it is: no guess from text/plain or from nothing.
        (
            "POST",
            "/v1/runs",
            &[("content-type", "text/plain")],
            "name = \"m\"\n".into(),
            415,
            "application/toml or application/json",
        ),
        ("POST", "/v1/runs", &[("content-type", "")], "name = \"m\"\n".into(), 415, "without a Content-Type"),
        // A key given twice is refused, not the last one taken.
        ("POST", "/v1/runs", &json, r#"{"name":"m","repetitions":1,"repetitions":900}"#.into(), 400, "given twice"),
    ];
    // A registered model named forty times: more devices than the bus has slots, refused
    // before the VM is made (a model becomes a device only when it runs).
    let registered = call(&client, "POST", "/v1/devices", &json, Some(br#"{"name":"aq","model":"aqc100"}"#));
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    let forty = format!(r#"{{"kernel":"probe","devices":[{}]}}"#, vec!["\"aq\""; 40].join(","));
    let cases: Vec<CarelessCase> = cases
        .into_iter()
        .chain([("POST", "/v1/vms", &json[..], forty, 422, "40 given, at most 30 fit on the bus")])
        .collect();
    for (method, path, headers, body, status, says) in cases {
        let answer = call(&client, method, path, headers, Some(body.as_bytes()));
        let text = String::from_utf8_lossy(&answer.body).to_string();
        assert_eq!(answer.status, status, "{method} {path} {body}: {text}");
        assert!(text.contains(says), "{method} {path} {body}: {text}");
    }
}

#[test]
fn a_database_moved_under_the_daemon_stops_its_work_and_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let json = [("content-type", "application/json")];
    let answer = call(&client, "POST", "/v1/devices", &json, Some(br#"{"name":"aq","model":"aqc100"}"#));
    assert_eq!(answer.status, 201);
    for suffix in ["", "-wal", "-shm"] {
        let from = dir.path().join(format!("lab.db{suffix}"));
        if from.exists() {
            std::fs::rename(&from, dir.path().join(format!("moved.db{suffix}"))).unwrap();
        }
    }
    for (method, path, body) in
        [("GET", "/v1/runs", None), ("POST", "/v1/devices", Some(&br#"{"name":"b","model":"aqc100"}"#[..]))]
    {
        let answer = call(&client, method, path, &json, body);
        assert_eq!(answer.status, 500, "{method} {path}");
        let message = json_of(&answer)["message"].as_str().unwrap().to_string();
        assert!(message.contains("was moved, deleted or replaced under the daemon"), "{message}");
    }
    assert!(!dir.path().join("lab.db").exists(), "no empty database was made in its place");
    assert_eq!(call(&client, "GET", "/v1/version", &[], None).status, 200, "the daemon lives and says why");
}

#[test]
fn an_oversized_head_and_an_over_limit_length_are_refused_at_once() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let ask = |raw: Vec<u8>| {
        let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(&raw).unwrap();
        // Until the answer's head and what came with it: the connection may stay open a moment.
        let (mut answer, mut chunk) = (Vec::new(), [0u8; 65536]);
        let started = Instant::now();
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
        let took = started.elapsed();
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = stream.read_to_end(&mut answer);
        (String::from_utf8_lossy(&answer).into_owned(), took)
    };
    for size in [70_000, 100_000] {
        let head =
            format!("GET /v1/version HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: {}\r\n\r\n", "a".repeat(size));
        let (answer, _) = ask(head.into_bytes());
        assert!(answer.starts_with("HTTP/1.1 431"), "{size}: {}", &answer[..answer.len().min(200)]);
        assert!(answer.contains("head_too_large"), "a JSON problem: {answer}");
    }
    let head = "GET /v1/version HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Fine: aaaa\r\n\r\n";
    assert!(ask(head.as_bytes().to_vec()).0.starts_with("HTTP/1.1 200"));
    // Two megabytes declared, two bytes sent, the connection kept open: 413 at once.
    let short =
        b"POST /v1/devices HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n{}";
    let (answer, took) = ask(short.to_vec());
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(took < Duration::from_secs(5), "not waited for: {took:?}");
}

#[test]
fn a_run_on_a_full_disk_is_refused_with_507_saying_so() {
    let test = "a_run_on_a_full_disk_is_refused_with_507_saying_so";
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        common::skip(test, common::Lacks::Setup, "a small filesystem to fill takes root (mount -t tmpfs)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"]).arg(&small).status().unwrap();
    assert!(mounted.success(), "mount -t tmpfs");
    let _unmount = testkit::Mounted::at(&small);
    let daemon = Daemon::start(&small, &[]);
    let matrix = std::fs::read(probe_matrix()).unwrap();
    let answer = call(&daemon.client(), "POST", "/v1/runs", &[("content-type", "application/toml")], Some(&matrix));
    assert_eq!(answer.status, 507, "{}", String::from_utf8_lossy(&answer.body));
    let message = json_of(&answer)["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("no space left") && message.contains("ENOSPC") && message.contains("MiB free"),
        "{message}"
    );
    assert!(json_of(&call(&daemon.client(), "GET", "/v1/runs", &[], None)).as_array().unwrap().is_empty());
    drop(daemon);
}
