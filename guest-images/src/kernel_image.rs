//! `driverlab image kernel`: a test kernel in the image store, from a Debian kernel package
//! (fetched with `apt-get download`) or from a user's built tree, with its bzImage, the ELF
//! vmlinux inside it, its config, its modules, the config facts the lab needs and, for a Debian
//! kernel, the headers an out-of-tree driver build needs (Debian's `linux-headers-RELEASE`, its
//! `-common` part and `linux-kbuild`, unpacked into the image rather than installed on the
//! host: installing them would pull in a host kernel through their dependencies).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::store::{ImageError, ImageStore, image_id, mkdir, read, run_tool, write, write_manifest};

/// The kernel series the lab's default image comes from.
pub const DEFAULT_SERIES: &str = "6.12";

/// Config options whose values the manifest records.
pub const FACTS: &[&str] = &[
    "VIRTIO_IOMMU",
    "ACPI_VIOT",
    "AQTION",
    "LAN743X",
    "PAGE_POOL",
    "PVH",
    "DEBUG_INFO_BTF_MODULES",
    "MODULE_SIG_FORCE",
];

/// A kernel image's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelManifest {
    /// `kernel-` and 16 hex digits.
    pub id: String,
    /// `kernel`.
    pub kind: String,
    /// The kernel release (`uname -r`), e.g. `6.12.117+deb12-amd64`.
    pub release: String,
    /// Where it came from: `package NAME VERSION` or `tree PATH`.
    pub source: String,
    /// Files in the image's folder.
    pub bzimage: String,
    /// The ELF vmlinux (with its PVH note), extracted from the bzImage.
    pub vmlinux: String,
    /// The kernel's config.
    pub config: String,
    /// Its module tree (`lib/modules/RELEASE`).
    pub modules: String,
    /// `y`, `m` or `n` for each of [`FACTS`].
    pub facts: BTreeMap<String, String>,
    /// The kernel headers for out-of-tree builds, a folder in the image's (Debian kernels;
    /// absent from images made before the store kept them, until `driverlab image kernel`
    /// fetches them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
}

impl KernelManifest {
    /// Why this kernel cannot run behind a virtio-iommu, if it cannot.
    pub fn viommu_refusal(&self) -> Option<String> {
        let fact = |name: &str| self.facts.get(name).map_or("n", String::as_str);
        if fact("VIRTIO_IOMMU") == "n" {
            return Some(format!("kernel {} has no virtio-iommu driver (CONFIG_VIRTIO_IOMMU is off)", self.release));
        }
        if fact("ACPI_VIOT") != "y" {
            return Some(format!("kernel {} cannot read the ACPI VIOT table (CONFIG_ACPI_VIOT is off)", self.release));
        }
        None
    }
}

/// `y`, `m` or `n` for each of [`FACTS`] in a kernel config.
pub fn config_facts(config: &str) -> BTreeMap<String, String> {
    let mut facts: BTreeMap<String, String> = FACTS.iter().map(|f| (f.to_string(), "n".to_string())).collect();
    for line in config.lines() {
        if let Some((key, value)) = line.strip_prefix("CONFIG_").and_then(|l| l.split_once('='))
            && let Some(slot) = facts.get_mut(key)
        {
            *slot = value.trim_matches('"').to_string();
        }
    }
    facts
}

/// The newest `linux-image-SERIES.N+debNN-amd64-unsigned` package apt knows about.
pub fn newest_package(series: &str) -> Result<String, ImageError> {
    let prefix = format!("linux-image-{series}.");
    let out = run_tool(
        Command::new("apt-cache").args(["search", "--names-only", &format!("^{prefix}")]),
        "apt-cache search",
    )?;
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            n.ends_with("-amd64-unsigned") && n.contains("+deb") && !n.contains("-rt-") && !n.contains("-cloud-")
        })
        .map(String::from)
        .collect();
    names.sort_by_key(|n| patch_level(n, &prefix));
    names.pop().ok_or_else(|| {
        ImageError::Invalid(format!(
            "apt knows no {prefix}N+debNN-amd64-unsigned package: run apt-get update, or check that \
             bookworm-backports or bookworm-security is in the apt sources"
        ))
    })
}

fn patch_level(name: &str, prefix: &str) -> u64 {
    name.strip_prefix(prefix).and_then(|r| r.split('+').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The version apt would download of `package`.
fn package_version(package: &str) -> Result<String, ImageError> {
    let out = run_tool(Command::new("apt-cache").args(["show", "--no-all-versions", package]), "apt-cache show")
        .map_err(|_| ImageError::Invalid(format!("apt knows no package {package:?} (apt-cache show found nothing)")))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Version: ").map(String::from))
        .ok_or_else(|| ImageError::Invalid(format!("apt-cache show {package}: no Version")))
}

/// Downloads `package` into `dir` and unpacks it into `dir/x`; returns `dir/x`.
pub fn fetch_deb(package: &str, dir: &Path) -> Result<PathBuf, ImageError> {
    run_tool(
        Command::new("apt-get").arg("download").arg(package).current_dir(dir),
        &format!("apt-get download {package}"),
    )?;
    let deb = std::fs::read_dir(dir)
        .map_err(|source| ImageError::Io { path: dir.to_path_buf(), source })?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| ImageError::Tool {
            what: format!("apt-get download {package}"),
            detail: "no .deb arrived".into(),
        })?;
    let x = dir.join("x");
    mkdir(&x)?;
    run_tool(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x), &format!("unpacking {}", deb.display()))?;
    let _ = std::fs::remove_file(&deb);
    Ok(x)
}

fn only_entry(dir: &Path, prefix: &str) -> Result<PathBuf, ImageError> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| ImageError::Io { path: dir.to_path_buf(), source })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(ImageError::Invalid(format!("{}: {n} entries named {prefix}*, expected one", dir.display()))),
    }
}

/// A kernel's files, as a package or a tree gives them.
struct Parts<'a> {
    bzimage: &'a Path,
    config: &'a Path,
    modules: &'a Path,
    /// Whether its Debian header packages belong in the image.
    headers: bool,
}

/// Assembles a kernel image in `scratch` from its parts and commits it.
fn assemble(
    store: &ImageStore,
    scratch: &Path,
    release: &str,
    source: String,
    parts: &Parts<'_>,
) -> Result<KernelManifest, ImageError> {
    let Parts { bzimage, config, modules, headers } = *parts;
    let image_dir = scratch.join("image");
    mkdir(&image_dir.join("lib/modules"))?;
    let bz = read(bzimage)?;
    let config_text = read(config)?;
    let mut vmlinux = crate::kernel::extract_vmlinux(&bz)?;
    crate::kernel::trim_segment_zeros(&mut vmlinux);
    write(&image_dir.join("bzImage"), &bz)?;
    write(&image_dir.join("vmlinux"), &vmlinux)?;
    write(&image_dir.join("config"), &config_text)?;
    let target = image_dir.join("lib/modules").join(release);
    let copied = Command::new("cp").arg("-a").arg(modules).arg(&target).status();
    if !copied.is_ok_and(|s| s.success()) {
        return Err(ImageError::Tool { what: format!("copying {}", modules.display()), detail: "cp -a failed".into() });
    }
    let id = image_id(crate::store::ImageKind::Kernel, &[&bz, &config_text]);
    let manifest = KernelManifest {
        id: id.clone(),
        kind: "kernel".into(),
        release: release.to_string(),
        source,
        bzimage: "bzImage".into(),
        vmlinux: "vmlinux".into(),
        config: "config".into(),
        modules: format!("lib/modules/{release}"),
        facts: config_facts(&String::from_utf8_lossy(&config_text)),
        headers: if headers { Some(unpack_headers(release, &image_dir)?) } else { None },
    };
    write_manifest(&image_dir, &manifest)?;
    store.commit(&image_dir, &id)?;
    let _ = std::fs::remove_dir_all(scratch);
    Ok(manifest)
}

/// A kernel image from Debian's `package` (default: the newest 6.12 generic kernel). An image
/// of the same package version already in the store is returned without downloading again.
pub fn from_package(store: &ImageStore, package: Option<&str>) -> Result<KernelManifest, ImageError> {
    let package = match package {
        Some(p) => p.to_string(),
        None => newest_package(DEFAULT_SERIES)?,
    };
    let version = package_version(&package)?;
    let source = format!("package {package} {version}");
    for (id, manifest) in store.list()? {
        if manifest["kind"] == "kernel" && manifest["source"] == source.as_str() {
            let mut manifest: KernelManifest = store.manifest(&id)?;
            if manifest.headers.is_none() {
                // An image from before the store kept headers: they join it now.
                let dir = store.dir(&id);
                manifest.headers = Some(unpack_headers(&manifest.release, &dir)?);
                write_manifest(&dir, &manifest)?;
            }
            return Ok(manifest);
        }
    }
    let scratch = store.scratch("kernel")?;
    let x = fetch_deb(&package, &scratch)?;
    let bzimage = only_entry(&x.join("boot"), "vmlinuz-")?;
    let config = only_entry(&x.join("boot"), "config-")?;
    let module_root = if x.join("lib/modules").is_dir() { x.join("lib/modules") } else { x.join("usr/lib/modules") };
    let modules = only_entry(&module_root, "")?;
    let release = modules.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let parts = Parts { bzimage: &bzimage, config: &config, modules: &modules, headers: true };
    assemble(store, &scratch, &release, source, &parts)
}

/// The Debian packages of `release`'s headers: the flavour's, the common part and kbuild.
fn header_packages(release: &str) -> Result<[String; 3], ImageError> {
    let base = release.strip_suffix("-amd64").ok_or_else(|| {
        ImageError::Invalid(format!("kernel release {release:?} is not a Debian amd64 release: give --headers"))
    })?;
    Ok([format!("linux-headers-{release}"), format!("linux-headers-{base}-common"), format!("linux-kbuild-{base}")])
}

/// Unpacks `release`'s header packages into `image/headers` (as a root: `usr/src/...`,
/// `usr/lib/linux-kbuild-...`, their relative links intact) and points the flavour's Makefile
/// at the common part there; returns the headers' folder, relative to `image`.
fn unpack_headers(release: &str, image: &Path) -> Result<String, ImageError> {
    let root = image.join("headers");
    let _ = std::fs::remove_dir_all(&root);
    mkdir(&root)?;
    for package in header_packages(release)? {
        let download = image.join(".download");
        let _ = std::fs::remove_dir_all(&download);
        mkdir(&download)?;
        let x = fetch_deb(&package, &download)?;
        let copied = Command::new("cp").arg("-a").arg(format!("{}/.", x.display())).arg(&root).status();
        let _ = std::fs::remove_dir_all(&download);
        if !copied.is_ok_and(|s| s.success()) {
            return Err(ImageError::Tool { what: format!("unpacking {package}"), detail: "cp -a failed".into() });
        }
    }
    let relative = format!("headers/usr/src/linux-headers-{release}");
    let makefile = image.join(&relative).join("Makefile");
    let text = String::from_utf8_lossy(&read(&makefile)?).into_owned();
    // Debian's flavour Makefile includes the common part by its installed path; make runs in
    // the flavour's folder (`make -C`), so the sibling is found relative to it.
    let common = text.replace("include /usr/src/", "include ../");
    write(&makefile, common.as_bytes())?;
    Ok(relative)
}

/// A kernel image from a built tree: `TREE/arch/x86/boot/bzImage`, `TREE/.config`, the release
/// in `TREE/include/config/kernel.release`, and its modules installed in `modules` (default
/// `TREE/lib/modules/RELEASE`, as `make INSTALL_MOD_PATH=TREE modules_install` leaves them).
pub fn from_tree(store: &ImageStore, tree: &Path, modules: Option<&Path>) -> Result<KernelManifest, ImageError> {
    let release_file = tree.join("include/config/kernel.release");
    let release = std::fs::read_to_string(&release_file)
        .map_err(|_| {
            ImageError::Invalid(format!(
                "{} is not a built kernel tree (no {})",
                tree.display(),
                release_file.display()
            ))
        })?
        .trim()
        .to_string();
    let modules = modules.map(Path::to_path_buf).unwrap_or_else(|| tree.join("lib/modules").join(&release));
    if !modules.join("kernel").is_dir() {
        return Err(ImageError::Invalid(format!(
            "{} holds no installed modules: run `make INSTALL_MOD_PATH={} modules_install` or give --modules",
            modules.display(),
            tree.display()
        )));
    }
    let scratch = store.scratch("kernel")?;
    let source = format!("tree {}", tree.display());
    let (bzimage, config) = (tree.join("arch/x86/boot/bzImage"), tree.join(".config"));
    let parts = Parts { bzimage: &bzimage, config: &config, modules: &modules, headers: false };
    assemble(store, &scratch, &release, source, &parts)
}

impl KernelManifest {
    /// The image's module tree on disk.
    pub fn modules_dir(&self, store: &ImageStore) -> PathBuf {
        store.dir(&self.id).join(&self.modules)
    }

    /// The image's kernel headers on disk, when it keeps them.
    pub fn headers_dir(&self, store: &ImageStore) -> Option<PathBuf> {
        self.headers.as_ref().map(|h| store.dir(&self.id).join(h))
    }

    /// The image's ELF vmlinux on disk (what driverlab and the boot benchmark boot).
    pub fn vmlinux_path(&self, store: &ImageStore) -> PathBuf {
        store.dir(&self.id).join(&self.vmlinux)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_facts_are_read_and_viommu_support_judged() {
        let config = "CONFIG_VIRTIO_IOMMU=m\nCONFIG_ACPI_VIOT=y\nCONFIG_AQTION=m\n# CONFIG_LAN743X is not set\nCONFIG_PAGE_POOL=y\n";
        let facts = config_facts(config);
        assert_eq!((facts["VIRTIO_IOMMU"].as_str(), facts["LAN743X"].as_str()), ("m", "n"));
        let mut manifest = KernelManifest {
            id: "kernel-0".into(),
            kind: "kernel".into(),
            release: "6.1.0".into(),
            source: "tree /x".into(),
            bzimage: "bzImage".into(),
            vmlinux: "vmlinux".into(),
            config: "config".into(),
            modules: "lib/modules/6.1.0".into(),
            facts,
            headers: None,
        };
        assert_eq!(manifest.viommu_refusal(), None);
        manifest.facts.insert("VIRTIO_IOMMU".into(), "n".into());
        assert!(manifest.viommu_refusal().unwrap().contains("CONFIG_VIRTIO_IOMMU is off"));
        assert_eq!(patch_level("linux-image-6.12.117+deb12-amd64-unsigned", "linux-image-6.12."), 117);
        assert_eq!(
            header_packages("6.12.117+deb12-amd64").unwrap(),
            [
                "linux-headers-6.12.117+deb12-amd64",
                "linux-headers-6.12.117+deb12-common",
                "linux-kbuild-6.12.117+deb12"
            ]
        );
        assert!(header_packages("6.12.0-rc1").is_err(), "a tree's kernel has no Debian headers");
    }
}
