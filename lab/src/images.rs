//! What a matrix's `[[image]]` boots: the probe, a kernel and initrd by path, or images from the
//! image store by ID (`kernel = "kernel-…"`, `initrd = "initramfs-…"`, from `driverlab image`).

use std::path::{Path, PathBuf};

use guest_images::initramfs_build::InitramfsManifest;
use guest_images::kernel_image::KernelManifest;
use guest_images::store::ImageStore;

use crate::matrix::{Image, Plan};

/// An image's files, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The kernel file (for a kernel image: its ELF vmlinux, booted through PVH).
    pub kernel: PathBuf,
    /// The initrd file.
    pub initrd: Option<PathBuf>,
    /// The kernel image's manifest, when the kernel is one.
    pub manifest: Option<KernelManifest>,
}

/// Whether `name` names a store image of `kind` rather than a file.
fn is_id(name: &str, kind: &str) -> bool {
    name.strip_prefix(kind)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Resolves a Linux image of `plan` (not the probe).
pub fn resolve(plan: &Plan, image: &Image, store: &ImageStore) -> Result<Resolved, String> {
    let (kernel, manifest) = if is_id(&image.kernel, "kernel") {
        let manifest: KernelManifest =
            store.manifest(&image.kernel).map_err(|e| format!("image {:?}: {e}", image.name))?;
        (store.dir(&manifest.id).join(&manifest.vmlinux), Some(manifest))
    } else {
        (plan.resolve(Path::new(&image.kernel)), None)
    };
    let initrd = match &image.initrd {
        None => None,
        Some(initrd) => {
            let name = initrd.to_string_lossy();
            if is_id(&name, "initramfs") {
                let manifest: InitramfsManifest =
                    store.manifest(&name).map_err(|e| format!("image {:?}: {e}", image.name))?;
                if let Some(kernel) = &manifest_kernel(&manifest)
                    && manifest_is_other(kernel, image)
                {
                    return Err(format!(
                        "image {:?}: initrd {} was built for {kernel}, not {}",
                        image.name, manifest.id, image.kernel
                    ));
                }
                Some(manifest.archive_path(store))
            } else {
                Some(plan.resolve(initrd))
            }
        }
    };
    for path in std::iter::once(&kernel).chain(initrd.as_ref()) {
        if !path.exists() {
            return Err(format!("{}: image {:?}: {} does not exist", plan.file.display(), image.name, path.display()));
        }
    }
    Ok(Resolved { kernel, initrd, manifest })
}

fn manifest_kernel(manifest: &InitramfsManifest) -> Option<String> {
    Some(manifest.kernel.clone()).filter(|k| !k.is_empty())
}

fn manifest_is_other(kernel: &str, image: &Image) -> bool {
    is_id(&image.kernel, "kernel") && kernel != image.kernel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_told_from_paths() {
        assert!(is_id("kernel-b4ecf741a5956628", "kernel"));
        assert!(!is_id("kernel-", "kernel"));
        assert!(!is_id("./kernel-b4ec", "kernel"));
        assert!(!is_id("/boot/vmlinuz", "kernel"));
        assert!(is_id("initramfs-0146cab9f2596029", "initramfs"));
    }
}
