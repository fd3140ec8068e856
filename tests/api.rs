//! The HTTP API end to end: `driverlab serve` on a Unix socket, one call boots the probe guest.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use api::client::Client;
use api::types::{ErrorBody, VmResult};
use common::{driverlab, kvm_available};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(socket: &std::path::Path) -> Server {
    let child =
        Command::new(driverlab()).args(["serve", "--socket"]).arg(socket).spawn().expect("driverlab serve starts");
    for _ in 0..500 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(socket.exists(), "the server created its socket");
    Server(child)
}

#[tokio::test]
async fn one_http_call_boots_the_probe() {
    if !kvm_available("one_http_call_boots_the_probe") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let _server = start_server(&socket);
    let client = Client::new(&socket);

    let body = br#"{"kernel":"probe","vcpus":2,"memory_mib":128,"cmdline":"probe.echo=1","timeout_s":30}"#.to_vec();
    let (status, body) = client.request("POST", "/v1/vms", Some(body)).await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let result: VmResult = serde_json::from_slice(&body).unwrap();
    assert_eq!(result.exit_code, Some(0));
    let exit = result.exit.expect("exit line");
    assert_eq!((exit.reason.as_str(), exit.vcpus, exit.memory_mib), ("poweroff", 2, 128));
    let names: Vec<&str> = result.probe.iter().map(|s| s["probe"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["boot", "acpi", "cpus", "pci", "options", "done"]);
    assert_eq!(result.probe[5]["ok"], true);

    let (status, body) =
        client.request("POST", "/v1/vms", Some(br#"{"kernel":"/nonexistent/vmlinux"}"#.to_vec())).await.unwrap();
    assert_eq!(status, 422);
    let err: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert!(err.error.contains("/nonexistent/vmlinux"), "{}", err.error);
}
