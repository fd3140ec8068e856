//! The hardware workflow's own check, beyond GitHub's schema: every `needs` names a job, every
//! `needs.JOB.outputs.NAME` is an output that job declares and a job it needs, the shards fan
//! out per device label and the merge job waits for the re-run of missing shards, the
//! composite action's `inputs.NAME` are declared, and every `run:` step passes shellcheck.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_norway::Value;

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn str_list(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Sequence(items) => items.iter().filter_map(|v| v.as_str().map(String::from)).collect(),
        _ => Vec::new(),
    }
}

/// Every `PREFIX.A.B` in `text` after `prefix` (`needs.` gives (job, output) pairs).
fn references(text: &str, prefix: &str) -> Vec<(String, String)> {
    let word =
        |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect::<String>();
    text.match_indices(prefix)
        .filter_map(|(i, _)| {
            let rest = &text[i + prefix.len()..];
            let job = word(rest);
            let after = rest[job.len()..].strip_prefix(".outputs.")?;
            Some((job, word(after)))
        })
        .collect()
}

/// `script` (a `run:` step, its expressions made plain words) through shellcheck as bash.
fn shellcheck(what: &str, script: &str) {
    let mut plain = String::new();
    let mut rest = script;
    while let Some(start) = rest.find("${{") {
        plain.push_str(&rest[..start]);
        let end = rest[start..].find("}}").map_or(rest.len(), |e| start + e + 2);
        plain.push_str("EXPR");
        rest = &rest[end..];
    }
    plain.push_str(rest);
    let mut child = Command::new("shellcheck")
        .args(["-s", "bash", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("shellcheck runs (apt-get install shellcheck)");
    child.stdin.take().unwrap().write_all(plain.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{what}: shellcheck:\n{}\n{plain}", String::from_utf8_lossy(&out.stdout));
}

pub fn check(workflow: &Path, action: &Path) {
    let doc = load(workflow);
    let jobs = doc["jobs"].as_mapping().expect("jobs");
    let names: Vec<String> = jobs.keys().filter_map(|k| k.as_str().map(String::from)).collect();
    let outputs: BTreeMap<String, Vec<String>> = jobs
        .iter()
        .map(|(name, job)| {
            let declared =
                job["outputs"].as_mapping().map(|m| m.keys().filter_map(|k| k.as_str().map(String::from)).collect());
            (name.as_str().unwrap().to_string(), declared.unwrap_or_default())
        })
        .collect();
    for (name, job) in jobs {
        let name = name.as_str().unwrap();
        let needs = str_list(&job["needs"]);
        for need in &needs {
            assert!(names.contains(need), "job {name} needs {need}, which is no job");
        }
        let text = serde_norway::to_string(job).unwrap();
        for (other, output) in references(&text, "needs.") {
            assert!(needs.contains(&other), "job {name} reads needs.{other} without needing it");
            assert!(
                outputs[&other].contains(&output),
                "job {name} reads {other}'s output {output}, which it does not declare"
            );
        }
        for (i, step) in job["steps"].as_sequence().into_iter().flatten().enumerate() {
            if let Some(script) = step["run"].as_str() {
                shellcheck(&format!("job {name} step {i}"), script);
            }
        }
    }
    // The shards fan out per device label, run again where missing, and merge at the end.
    let matrix = &doc["jobs"]["box"]["strategy"]["matrix"];
    assert!(matrix["shard"].as_str().is_some_and(|s| s.contains("needs.plan.outputs.shards")), "{matrix:?}");
    assert!(matrix["device"].as_str().is_some_and(|s| s.contains("needs.plan.outputs.devices")), "{matrix:?}");
    let rerun = &doc["jobs"]["rerun"]["strategy"]["matrix"]["include"];
    assert!(rerun.as_str().is_some_and(|s| s.contains("needs.missing.outputs.shards")), "{rerun:?}");
    let merge = str_list(&doc["jobs"]["fleet"]["needs"]);
    assert!(merge.contains(&"box".to_string()) && merge.contains(&"rerun".to_string()), "{merge:?}");
    let merge_text = serde_norway::to_string(&doc["jobs"]["fleet"]).unwrap();
    assert!(merge_text.contains("lab import") && merge_text.contains("lab report --fleet"), "{merge_text}");
    // The composite action: its inputs, and its shell steps.
    let action_doc = load(action);
    let declared: Vec<String> =
        action_doc["inputs"].as_mapping().unwrap().keys().filter_map(|k| k.as_str().map(String::from)).collect();
    let action_text = std::fs::read_to_string(action).unwrap();
    for (i, _) in action_text.match_indices("inputs.") {
        let name: String =
            action_text[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        assert!(declared.contains(&name), "the action reads inputs.{name}, which it does not declare");
    }
    for (i, step) in action_doc["runs"]["steps"].as_sequence().unwrap().iter().enumerate() {
        if let Some(script) = step["run"].as_str() {
            assert_eq!(step["shell"].as_str(), Some("bash"), "a composite step names its shell");
            shellcheck(&format!("action step {i}"), script);
        }
        assert!(!step["uses"].as_str().is_some_and(|u| u.starts_with("./")), "no action inside the action");
    }
    // Every job that runs the action checks the repository out first.
    for (name, job) in jobs {
        let steps = job["steps"].as_sequence().cloned().unwrap_or_default();
        if let Some(i) = steps.iter().position(|s| s["uses"].as_str() == Some("./.github/actions/lab-shard")) {
            assert!(
                steps[..i].iter().any(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/checkout"))),
                "{name:?}"
            );
        }
    }
}
