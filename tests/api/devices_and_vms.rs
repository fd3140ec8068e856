//! Devices and VMs over the API: registering, health checks (one at a time), VMs started, watched and stopped.

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
