//! The nested lab box's initramfs: what an L1 VM needs to be a lab box without hardware
//! (`driverlab nested-box up`). Static busybox; the `driverlab` binary that runs there and the
//! OpenSSH client that reaches each card's peer, each with every shared library it loads; the
//! kernel's modules for KVM on AMD (`kvm_amd`), VFIO (`vfio_pci`, `vfio_iommu_type1`), the
//! virtio-iommu, virtio-net, 9p and ext4, with their dependencies; and the box's `/init`
//! (`box/init`). Packed like every initramfs of the store (sorted, fixed times and owners), so
//! the same binary and kernel give the same bytes.

use std::path::Path;

use crate::initramfs::{Node, Tree};
use crate::initramfs_build::{libraries, which};
use crate::kernel_image::KernelManifest;
use crate::modules::ModuleTree;
use crate::store::{ImageError, ImageStore, read, sha256};

/// The box's `/init`, a POSIX sh script.
pub static INIT: &str = include_str!("../box/init");

/// The modules the box loads, in this order, each after its dependencies: the IOMMU first (the
/// cards join its groups as they are found), then KVM, VFIO, the network, the shares and the
/// disk.
pub const MODULES: &[&str] = &[
    "virtio_iommu",
    "kvm_amd",
    "vfio_iommu_type1",
    "vfio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "virtio_blk",
    // ext4 asks the crypto API for crc32c by name, not as a module dependency.
    "crc32c_generic",
    "ext4",
];

/// Programs of this host the box carries besides busybox (`driverlab` comes from the caller).
pub const PROGRAMS: &[&str] = &["ssh"];

/// A built box initramfs.
#[derive(Debug, Clone)]
pub struct BoxImage {
    /// The archive (gzip-compressed newc cpio).
    pub archive: Vec<u8>,
    /// SHA-256 of the archive.
    pub sha256: String,
    /// The modules, in load order.
    pub modules: Vec<String>,
}

/// The VMM's small binary, carried beside `driverlab` when it is installed there.
const VMM_BINARY: &str = "driverlab-vmm";

/// Builds the box's initramfs for `kernel` with the `driverlab` binary at `driverlab` (and the
/// small `driverlab-vmm` beside it, when it is there).
pub fn build(store: &ImageStore, kernel: &KernelManifest, driverlab: &Path) -> Result<BoxImage, ImageError> {
    let tree_index = ModuleTree::open(&kernel.modules_dir(store))?;
    let mut tree = Tree::new();
    for dir in ["dev", "etc/driverlab", "lib/modules", "proc", "root", "run", "sys", "tmp", "var/lib"] {
        tree.add(dir, Node::Dir);
    }
    tree.add("dev/console", Node::CharDevice { major: 5, minor: 1 });
    tree.file("init", 0o755, INIT.as_bytes().to_vec());

    crate::initramfs_build::add_busybox(&mut tree)?;

    let mut programs = vec![("driverlab".to_string(), driverlab.to_path_buf())];
    // The small VMM binary beside it, when it is there: what the box's lab starts for each VM.
    if let Some(vmm) = driverlab.parent().map(|dir| dir.join(VMM_BINARY)).filter(|p| p.is_file()) {
        programs.push((VMM_BINARY.to_string(), vmm));
    }
    for program in PROGRAMS {
        let path = which(program, program)?;
        programs.push((program.to_string(), path));
    }
    for (name, path) in programs {
        tree.file(&format!("usr/bin/{name}"), 0o755, without_debug_info(&path)?);
        for lib in libraries(&path)? {
            let data = read(&lib)?;
            tree.file(&lib.to_string_lossy(), 0o755, data);
        }
    }

    let roots: Vec<String> = MODULES.iter().map(|m| m.to_string()).collect();
    let order = tree_index.closure(&roots, &Default::default())?;
    let mut list = String::new();
    let mut modules = Vec::new();
    for (name, data) in order {
        list.push_str(&name);
        list.push('\n');
        tree.file(&format!("lib/modules/{name}.ko"), 0o644, data);
        modules.push(name);
    }
    tree.file("etc/driverlab/modules.box", 0o644, list.into_bytes());

    let archive = tree.cpio_gz();
    Ok(BoxImage { sha256: sha256(&archive), archive, modules })
}

/// The program at `path` without its debug information (`strip --strip-debug`, binutils): the
/// box unpacks its initramfs under TCG, where every megabyte counts. The program as it is when
/// there is no `strip`.
fn without_debug_info(path: &Path) -> Result<Vec<u8>, ImageError> {
    let scratch = tempfile::tempdir().map_err(|source| ImageError::Io { path: std::env::temp_dir(), source })?;
    let out = scratch.path().join("stripped");
    let stripped = std::process::Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(path).status();
    match stripped {
        Ok(status) if status.success() => read(&out),
        _ => read(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_loads_the_listed_modules_and_says_when_it_is_ready() {
        assert!(INIT.starts_with("#!/bin/sh\n"));
        assert!(INIT.contains("/etc/driverlab/modules.box"));
        assert!(INIT.contains("allow_unsafe_interrupts=1"), "VFIO behind virtio-iommu needs it");
        assert!(
            INIT.contains("echo advise >/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
            "huge pages for guest RAM"
        );
        assert!(INIT.contains("say \"ready:"), "the host waits for the ready line");
        assert!(INIT.contains("driver_override"), "cards bind to vfio-pci by override, not new_id");
    }
}
