//! How a VMM or model process is confined (its jail), as the exit line, `vm.info` and the lab's
//! records report it: one entry per step, done or not and why, so that a step the host could not
//! take is never silent.

use serde::{Deserialize, Serialize};

/// The steps of the jail, in the order they are taken.
pub const STEPS: [&str; 7] = ["namespaces", "cgroup", "rlimits", "root", "identity", "no_new_privs", "landlock"];

/// One step of the jail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfinementStep {
    /// Its name, one of [`STEPS`].
    pub step: String,
    /// Whether it was taken.
    pub done: bool,
    /// What it did, or why it was not taken.
    pub detail: String,
}

/// How a process is confined.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// False when the jail was turned off (`--no-jail`, the spec's `jail: false`).
    pub jailed: bool,
    /// The confined process's ID on the host (it is PID 1 in its own PID namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<u32>,
    /// The uid and gid it runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Its cgroup (as in `/proc/PID/cgroup`), when it has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The steps, in order.
    pub steps: Vec<ConfinementStep>,
}

impl Confinement {
    /// A process the jail was turned off for.
    pub fn off() -> Confinement {
        Confinement::default()
    }

    /// Records a step taken.
    pub fn done(&mut self, step: &str, detail: impl Into<String>) {
        self.steps.push(ConfinementStep { step: step.into(), done: true, detail: detail.into() });
    }

    /// Records a step not taken, and why.
    pub fn missed(&mut self, step: &str, why: impl Into<String>) {
        self.steps.push(ConfinementStep { step: step.into(), done: false, detail: why.into() });
    }

    /// The steps not taken, as `step: why` lines.
    pub fn missing(&self) -> Vec<String> {
        self.steps.iter().filter(|s| !s.done).map(|s| format!("{}: {}", s.step, s.detail)).collect()
    }

    /// One line for people: `jailed (7 of 7 steps)`, `jailed (5 of 7 steps; landlock: ...)` or
    /// `not jailed (--no-jail)`.
    pub fn summary(&self) -> String {
        if !self.jailed {
            return "not jailed (--no-jail)".into();
        }
        let done = self.steps.iter().filter(|s| s.done).count();
        let missing = self.missing();
        if missing.is_empty() {
            format!("jailed ({done} of {} steps)", self.steps.len())
        } else {
            format!("jailed ({done} of {} steps; {})", self.steps.len(), missing.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_every_missed_step() {
        let mut c = Confinement { jailed: true, ..Confinement::default() };
        c.done("namespaces", "mount, pid, ipc, uts, net");
        c.missed("landlock", "the kernel has no Landlock");
        assert_eq!(c.summary(), "jailed (1 of 2 steps; landlock: the kernel has no Landlock)");
        assert_eq!(Confinement::off().summary(), "not jailed (--no-jail)");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Confinement>(&json).unwrap(), c);
    }
}
