//! What `driverlab doctor` says about the jail before any VM runs: whether this host lets a
//! process take each step, and what an operator can do where it does not.

use std::path::Path;
use std::time::Duration;

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
    if root && (v1 || v2) {
        out.push(cgroup_moves(crate::cgroup::time_a_move().map_err(|e| e.to_string()), v2));
    }
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

/// A move into a cgroup slower than this is worth the operator's fix.
const SLOW_MOVE: Duration = Duration::from_millis(2);

/// What `moved` (how long the jail's way into a cgroup took here, or why it could not be timed)
/// means for the jail (`v2`: the unified hierarchy is at /sys/fs/cgroup). Without the kernel's
/// `favordynmods` (a cgroup2 mount option, global to every hierarchy), moving a process waits for
/// an RCU grace period on the cgroup threadgroup rwsem (`cgroup_attach_lock()`,
/// kernel/cgroup/cgroup.c); with it (and, from Linux 6.18, ever after it was once set), it does
/// not. On v2 the jail starts its process in its cgroup (`clone3`), which takes that lock only
/// for reading, and moves one only where the kernel refuses that clone; on v1 it moves its
/// process's one thread through `tasks`, which takes no such lock. So the option matters on v2
/// hosts whose kernel predates `CLONE_INTO_CGROUP` (5.7) only.
fn cgroup_moves(moved: Result<Duration, String>, v2: bool) -> Readiness {
    let fix = if v2 {
        "mount -o remount,favordynmods /sys/fs/cgroup (or a kernel with CONFIG_CGROUP_FAVOR_DYNMODS=y)"
    } else {
        "mount -o remount,favordynmods /sys/fs/cgroup/unified, the cgroup2 hierarchy beside the v1 ones (the option \
         holds for every hierarchy; without one: mkdir /sys/fs/cgroup/unified && mount -t cgroup2 -o favordynmods \
         none /sys/fs/cgroup/unified), or a kernel with CONFIG_CGROUP_FAVOR_DYNMODS=y"
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let result = match moved {
        Ok(took) if took <= SLOW_MOVE => Ok(format!("a process's way into its cgroup took {:.2} ms here", ms(took))),
        Ok(took) => Err((
            format!(
                "a process's way into its cgroup took {:.1} ms here (an RCU grace period): every VMM and model \
                 pays it, most of the jail's cost (docs/benchmarks.md)",
                ms(took)
            ),
            fix.to_string(),
        )),
        Err(why) => Err((format!("a move into a cgroup could not be timed: {why}"), String::new())),
    };
    Readiness { name: "jail-speed", result }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_cgroup_move_says_how_to_make_it_quick() {
        assert!(cgroup_moves(Ok(Duration::from_micros(40)), false).result.unwrap().contains("0.04 ms"));
        let (what, fix) = cgroup_moves(Ok(Duration::from_millis(11)), false).result.unwrap_err();
        assert!(what.contains("11.0 ms"), "{what}");
        assert!(fix.starts_with("mount -o remount,favordynmods /sys/fs/cgroup/unified"), "{fix}");
        let (_, fix) = cgroup_moves(Ok(Duration::from_millis(11)), true).result.unwrap_err();
        assert!(fix.starts_with("mount -o remount,favordynmods /sys/fs/cgroup "), "{fix}");
        assert!(cgroup_moves(Err("no sleep".into()), true).result.unwrap_err().0.contains("no sleep"));
    }
}
