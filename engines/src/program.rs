//! The programs the lab starts: a VMM for each VM and a device model beside it. The small
//! `driverlab-vmm` and `driverlab-model` binaries link only what a VM or a model needs; where
//! they are not installed beside `driverlab`, `driverlab vm run` and `driverlab model` do the
//! same (docs/architecture.md, "Binaries").

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A program and the words that come before its own arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    path: PathBuf,
    prefix: Vec<&'static str>,
}

impl Program {
    /// `driverlab vm run` of the `driverlab` binary at `driverlab`.
    pub fn driverlab_vm(driverlab: impl Into<PathBuf>) -> Program {
        Program { path: driverlab.into(), prefix: vec!["vm", "run"] }
    }

    /// `driverlab model` of the `driverlab` binary at `driverlab`.
    pub fn driverlab_model(driverlab: impl Into<PathBuf>) -> Program {
        Program { path: driverlab.into(), prefix: vec!["model"] }
    }

    /// A program whose own arguments come first (`driverlab-vmm`, `driverlab-model`).
    pub fn bare(path: impl Into<PathBuf>) -> Program {
        Program { path: path.into(), prefix: Vec::new() }
    }

    /// The binary.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command that runs it, with `args` after its prefix.
    pub fn command<S: AsRef<OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Command {
        let mut command = Command::new(&self.path);
        command.args(&self.prefix).args(args);
        command
    }
}

/// What runs a VM and a device model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    /// The VMM: `driverlab-vmm`, or `driverlab vm run`.
    pub vmm: Program,
    /// A device model: `driverlab-model`, or `driverlab model`.
    pub model: Program,
}

/// The VMM's small binary's name.
pub const VMM_BINARY: &str = "driverlab-vmm";
/// The device models' small binary's name.
pub const MODEL_BINARY: &str = "driverlab-model";

impl Programs {
    /// The small binaries in `driverlab`'s folder, each where it is there, else `driverlab`'s
    /// own subcommands.
    pub fn beside(driverlab: &Path) -> Programs {
        let sibling = |name: &str| driverlab.parent().map(|dir| dir.join(name)).filter(|p| p.is_file());
        Programs {
            vmm: sibling(VMM_BINARY).map_or_else(|| Program::driverlab_vm(driverlab), Program::bare),
            model: sibling(MODEL_BINARY).map_or_else(|| Program::driverlab_model(driverlab), Program::bare),
        }
    }

    /// `driverlab vm run` and `driverlab model` of one binary.
    pub fn of(driverlab: &Path) -> Programs {
        Programs { vmm: Program::driverlab_vm(driverlab), model: Program::driverlab_model(driverlab) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_binaries_are_taken_where_they_are_beside_driverlab() {
        let dir = tempfile::tempdir().unwrap();
        let driverlab = dir.path().join("driverlab");
        std::fs::write(&driverlab, b"").unwrap();
        assert_eq!(Programs::beside(&driverlab), Programs::of(&driverlab), "none there: driverlab's subcommands");
        std::fs::write(dir.path().join(VMM_BINARY), b"").unwrap();
        let programs = Programs::beside(&driverlab);
        assert_eq!(programs.vmm, Program::bare(dir.path().join(VMM_BINARY)));
        assert_eq!(programs.model, Program::driverlab_model(&driverlab));
        let command = programs.model.command(["aqc100", "--once"]);
        let args: Vec<&OsStr> = command.get_args().collect();
        assert_eq!(args, ["model", "aqc100", "--once"]);
    }
}
