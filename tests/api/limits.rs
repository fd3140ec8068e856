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
    ];
    for (method, path, headers, body, status, says) in cases {
        let answer = call(&client, method, path, headers, Some(body.as_bytes()));
        let text = String::from_utf8_lossy(&answer.body).to_string();
        assert_eq!(answer.status, status, "{method} {path} {body}: {text}");
        assert!(text.contains(says), "{method} {path} {body}: {text}");
    }
}
