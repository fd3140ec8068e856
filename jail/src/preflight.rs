//! What `driverlab doctor` says about the jail before any VM runs: whether this host lets a
//! process take each step, and what an operator can do where it does not.

use std::path::Path;

/// Whether a part of the jail will hold here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The part (`jail`, `jail-cgroup`, `jail-landlock`).
    pub name: &'static str,
    /// `Ok(what holds)` or `Err((what will not, what to do))`.
    pub result: Result<String, (String, String)>,
}

/// Checks root (namespaces, uid, the empty root), the cgroup hierarchy, and Landlock.
pub fn preflight() -> Vec<Readiness> {
    let root = crate::identity::is_root();
    let mut out = vec![Readiness {
        name: "jail",
        result: if root {
            Ok("root: each VMM gets its own namespaces, empty root and uid (docs/vmm.md, \"The jail\")".into())
        } else {
            Err((
                "not root: VMMs run without namespaces, an empty root or a uid of their own".into(),
                "run the lab daemon as root (as a lab box does); no_new_privs, rlimits and Landlock hold either way"
                    .into(),
            ))
        },
    }];
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let v1 = ["memory", "pids"].iter().all(|c| Path::new("/sys/fs/cgroup").join(c).is_dir());
    out.push(Readiness {
        name: "jail-cgroup",
        result: match (v2, v1, root) {
            (true, _, true) => Ok("cgroup v2 at /sys/fs/cgroup: each VMM gets a memory and pids limit".into()),
            (false, true, true) => Ok("cgroup v1 memory and pids: each VMM gets a memory and pids limit".into()),
            (_, _, false) if v1 || v2 => Err((
                "not root: VMMs get no cgroup of their own".into(),
                "run the lab daemon as root, or in a cgroup delegated to its user".into(),
            )),
            _ => Err((
                "no cgroup hierarchy at /sys/fs/cgroup: VMMs get no memory or pids limit".into(),
                "mount -t cgroup2 cgroup2 /sys/fs/cgroup".into(),
            )),
        },
    });
    out.push(Readiness {
        name: "jail-landlock",
        result: match crate::ruleset::abi_version() {
            Some(abi) => Ok(format!("Landlock ABI {abi}: VMMs get no filesystem access")),
            None => Err((
                "this kernel has no Landlock: VMMs rely on their empty root and uid alone".into(),
                "boot a kernel with CONFIG_SECURITY_LANDLOCK and `lsm=...,landlock`".into(),
            )),
        },
    });
    out
}
