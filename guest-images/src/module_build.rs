//! `driverlab image module`: a driver variant. The driver's folder is taken from Debian's
//! `linux-source-SERIES` (or a kernel tree), patched, and built out of tree against the kernel
//! image's headers (kept in the kernel image for a Debian kernel, `--headers` for a tree's); each module's
//! vermagic must match the kernel's, and its parameters are recorded.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::kernel_image::KernelManifest;
use crate::modules::{ModInfo, ModuleTree, modinfo};
use crate::patches::{self, Patch};
use crate::store::{ImageError, ImageStore, cache_dir, image_id, mkdir, read, run_tool, sha256, write, write_manifest};

/// The driver folder a module build takes when none is named: the AQC100's `atlantic`.
pub const DEFAULT_DRIVER_FOLDER: &str = "drivers/net/ethernet/aquantia/atlantic";

/// The Debian source package a module build takes when no sources are named.
pub const DEFAULT_SOURCE_PACKAGE: &str = "linux-source-6.12";

/// Where the driver's sources come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A Debian source package with the kernel tree as a tarball in /usr/src
    /// ([`DEFAULT_SOURCE_PACKAGE`]).
    Package(String),
    /// A kernel tree.
    Tree(PathBuf),
}

impl Default for SourceSpec {
    fn default() -> SourceSpec {
        SourceSpec::Package(DEFAULT_SOURCE_PACKAGE.into())
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct ModuleRequest {
    /// The driver's folder in the kernel tree, e.g. `drivers/net/ethernet/aquantia/atlantic`.
    pub driver: String,
    /// Files of patches, applied in order.
    pub patches: Vec<patches::PatchFile>,
    /// The sources.
    pub source: SourceSpec,
    /// The kernel image to build against.
    pub kernel: String,
    /// The kernel headers; default the kernel image's own, else `/usr/src/linux-headers-RELEASE`.
    pub headers: Option<PathBuf>,
    /// Build only these modules of the folder (e.g. `lan743x` of `drivers/net/ethernet/microchip`),
    /// not everything its Makefile lists.
    pub only: Vec<String>,
}

/// One built module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltModule {
    /// Its file in the image's folder.
    pub file: String,
    /// SHA-256 of the file.
    pub sha256: String,
    /// What its `.modinfo` says.
    pub modinfo: ModInfo,
}

/// A module image's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleManifest {
    /// `module-` and 16 hex digits.
    pub id: String,
    /// `module`.
    pub kind: String,
    /// The driver's folder.
    pub driver: String,
    /// The kernel image it was built for.
    pub kernel: String,
    /// That kernel's release.
    pub release: String,
    /// Where the sources came from (`package linux-source-6.12 VERSION`, `tree PATH`).
    pub source: String,
    /// The patches applied, in order.
    pub patches: Vec<Patch>,
    /// What the patches change outside the driver's folder, which an out-of-tree build cannot
    /// carry, and why that is fine (a Kconfig `select` the kernel's config already satisfies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside: Vec<OutsideChange>,
    /// The modules built.
    pub modules: Vec<BuiltModule>,
}

/// A change a patch makes outside the driver's folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideChange {
    /// The patch's file.
    pub patch: String,
    /// The file it changes.
    pub file: String,
    /// Why the module is right without it.
    pub note: String,
}

/// Whether a change outside the driver's folder can be left out of an out-of-tree build: only
/// Kconfig lines that select or imply symbols the kernel's config already has.
fn outside_note(file: &str, section: &str, config: &str) -> Result<String, String> {
    let cannot = || {
        format!(
            "it changes {file}, outside the driver's folder, and an out-of-tree module build cannot carry that:              build a kernel tree with it (`driverlab image kernel --tree PATH`) and the module from that tree              (`--tree PATH`)"
        )
    };
    if !file.ends_with("Kconfig") {
        return Err(cannot());
    }
    let mut notes = Vec::new();
    for line in crate::patches::changed_lines(section) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let symbol = line.strip_prefix("select ").or_else(|| line.strip_prefix("imply ")).ok_or_else(cannot)?;
        let symbol = symbol.split_whitespace().next().unwrap_or_default();
        let set = config
            .lines()
            .find_map(|l| l.strip_prefix(&format!("CONFIG_{symbol}=")))
            .filter(|v| *v == "y" || *v == "m");
        match set {
            Some(value) => notes.push(format!("{line}: the kernel has CONFIG_{symbol}={value}")),
            None => {
                return Err(format!(
                    "it needs CONFIG_{symbol} ({file}: `{line}`), which the kernel's config does not set"
                ));
            }
        }
    }
    Ok(notes.join("; "))
}

impl ModuleManifest {
    /// The module the driver is named after (the folder's last part, or the only one built).
    pub fn main_module(&self) -> Option<&BuiltModule> {
        if self.modules.len() == 1 {
            return self.modules.first();
        }
        let name = self.driver.rsplit('/').next().unwrap_or_default();
        self.modules.iter().find(|m| m.modinfo.name == name)
    }
}

/// The driver folder from `source`, copied to `dest/DRIVER`; returns a description of the source.
fn copy_sources(source: &SourceSpec, driver: &str, dest: &Path) -> Result<String, ImageError> {
    let target = dest.join(driver);
    mkdir(target.parent().expect("a driver path has a parent"))?;
    match source {
        SourceSpec::Tree(tree) => {
            let from = tree.join(driver);
            if !from.is_dir() {
                return Err(ImageError::Invalid(format!("{} has no {driver}", tree.display())));
            }
            run_tool(Command::new("cp").arg("-a").arg(&from).arg(&target), "copying the driver's sources")?;
            Ok(format!("tree {}", tree.display()))
        }
        SourceSpec::Package(package) => {
            let series = package.strip_prefix("linux-source-").unwrap_or(package);
            let tarball = PathBuf::from(format!("/usr/src/linux-source-{series}.tar.xz"));
            if !tarball.exists() {
                return Err(ImageError::Invalid(format!(
                    "{} is missing: install Debian's {package} (apt-get install {package})",
                    tarball.display()
                )));
            }
            let version = installed_version(package).unwrap_or_else(|| "unknown".into());
            // Unpack each driver folder once per source version; later builds copy it.
            let cache = cache_dir().join("sources").join(format!("{package}-{version}"));
            let unpacked = cache.join(driver);
            if !cache.join(format!("{}.complete", driver.replace('/', "_"))).exists() {
                mkdir(&cache)?;
                let member = format!("linux-source-{series}/{driver}");
                unpack_source(&tarball, &cache, &[member], &format!("unpacking {driver} from {}", tarball.display()))
                    .map_err(|e| ImageError::Invalid(format!("{}: no {driver} in it? {e}", tarball.display())))?;
                write(&cache.join(format!("{}.complete", driver.replace('/', "_"))), b"")?;
            }
            run_tool(Command::new("cp").arg("-a").arg(&unpacked).arg(&target), "copying the driver's sources")?;
            Ok(format!("package {package} {version}"))
        }
    }
}

/// Unpacks `members` (paths below the tarball's top folder, which is stripped) of a Debian
/// `linux-source` tarball into `dest`.
pub(crate) fn unpack_source(
    tarball: &Path,
    dest: &Path,
    members: &[String],
    what: &str,
) -> Result<std::process::Output, ImageError> {
    run_tool(
        Command::new("tar").arg("-xJf").arg(tarball).arg("-C").arg(dest).arg("--strip-components=1").args(members),
        what,
    )
}

/// The installed version of Debian package `package`.
pub(crate) fn installed_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Version}", package]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A hash over every file below `dir` (relative path and contents, in path order).
fn hash_dir(dir: &Path) -> Result<String, ImageError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).map_err(|source| ImageError::Io { path: at.clone(), source })?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut all = Vec::new();
    for file in files {
        all.extend_from_slice(file.strip_prefix(dir).unwrap_or(&file).to_string_lossy().as_bytes());
        all.push(0);
        all.extend_from_slice(sha256(&read(&file)?).as_bytes());
    }
    Ok(sha256(&all))
}

/// Builds the driver variant `request` asks for (or returns it, if the store has it).
pub fn build(store: &ImageStore, request: &ModuleRequest) -> Result<ModuleManifest, ImageError> {
    let kernel: KernelManifest = store.manifest(&request.kernel)?;
    let driver = request.driver.trim_matches('/').to_string();
    if driver.is_empty() || driver.split('/').any(|p| p == ".." || p.is_empty()) {
        return Err(ImageError::Invalid(format!("--driver {:?}: give a folder of the kernel tree", request.driver)));
    }
    let headers = headers(store, &kernel, request)?;
    let series = read_series(&request.patches)?;
    let config = String::from_utf8_lossy(&read(&store.dir(&kernel.id).join(&kernel.config))?).into_owned();
    let (cut, outside) = cut_to_driver(&series, &driver, &config)?;
    let scratch = store.scratch("module")?;
    let tree = scratch.join("src");
    let source = copy_sources(&request.source, &driver, &tree)?;
    for patch in cut.iter().filter(|p| !p.diff.is_empty()) {
        patches::apply(patch, &tree)?;
    }
    let dir = tree.join(&driver);
    // The identity: the kernel, the driver and its patched sources. The same again is reused.
    let sources = hash_dir(&dir)?;
    let only = request.only.join(",");
    let id = image_id(
        crate::store::ImageKind::Module,
        &[kernel.id.as_bytes(), driver.as_bytes(), sources.as_bytes(), only.as_bytes()],
    );
    if let Ok(existing) = store.manifest::<ModuleManifest>(&id) {
        let _ = std::fs::remove_dir_all(&scratch);
        return Ok(existing);
    }
    let built = make_modules(&headers, &dir, &driver, &request.only)?;
    let image = scratch.join("image");
    mkdir(&image)?;
    let modules = keep_modules(store, &kernel, &built, &image)?;
    let manifest = ModuleManifest {
        id: id.clone(),
        kind: "module".into(),
        driver,
        kernel: kernel.id.clone(),
        release: kernel.release.clone(),
        source,
        patches: series,
        outside,
        modules,
    };
    write_manifest(&image, &manifest)?;
    store.commit(&image, &id)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(manifest)
}

/// The headers to build against: the request's, else the kernel image's own, else Debian's
/// installed ones; refused when they are not there.
fn headers(store: &ImageStore, kernel: &KernelManifest, request: &ModuleRequest) -> Result<PathBuf, ImageError> {
    let headers = request
        .headers
        .clone()
        .or_else(|| kernel.headers_dir(store))
        .unwrap_or_else(|| PathBuf::from(format!("/usr/src/linux-headers-{}", kernel.release)));
    if !headers.join("Makefile").exists() {
        return Err(ImageError::Invalid(format!(
            "no kernel headers at {}: `driverlab image kernel` keeps a Debian kernel's headers in its image \
             (run it again for an image made before it did); for a kernel built from a tree, give --headers TREE",
            headers.display(),
        )));
    }
    Ok(headers)
}

/// The patches of the files `patches` (each a patch, a mail or an mbox), in order.
fn read_series(files: &[patches::PatchFile]) -> Result<Vec<patches::Patch>, ImageError> {
    let mut series = Vec::new();
    for file in files {
        series.extend(file.parse()?);
    }
    Ok(series)
}

/// Each patch cut to the driver's folder, and what it changes outside it (each with why that
/// is fine for the kernel's `config`, or the refusal).
fn cut_to_driver(
    series: &[patches::Patch],
    driver: &str,
    config: &str,
) -> Result<(Vec<patches::Patch>, Vec<OutsideChange>), ImageError> {
    let mut outside = Vec::new();
    let mut cut = Vec::new();
    for patch in series {
        let (inside, changes) = patches::split(patch, driver);
        for (file, section) in changes {
            let note = outside_note(&file, &section, config)
                .map_err(|why| ImageError::Invalid(format!("{} ({}): {why}", patch.file, patch.subject)))?;
            outside.push(OutsideChange { patch: patch.file.clone(), file, note });
        }
        cut.push(inside);
    }
    Ok((cut, outside))
}

/// Builds the folder `dir` out of tree against `headers` (`only` these modules, when given);
/// the `.ko` files made, in order.
fn make_modules(headers: &Path, dir: &Path, driver: &str, only: &[String]) -> Result<Vec<PathBuf>, ImageError> {
    let mut make = Command::new("make");
    make.arg("-C").arg(headers).arg(format!("M={}", dir.display())).arg("-j2");
    if only.is_empty() {
        make.arg("modules");
    } else {
        // Kbuild's single targets: just these modules of the folder.
        make.args(only.iter().map(|m| format!("{m}.ko")));
    }
    run_tool(&mut make, &format!("building {driver} against {}", headers.display()))?;
    let mut built: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| ImageError::Io { path: dir.to_path_buf(), source })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ko"))
        .filter(|p| only.is_empty() || p.file_stem().is_some_and(|s| only.iter().any(|o| *o == s.to_string_lossy())))
        .collect();
    built.sort();
    if built.is_empty() {
        return Err(ImageError::Tool { what: format!("building {driver}"), detail: "make built no .ko".into() });
    }
    Ok(built)
}

/// The built modules stripped of debug information (BTF stays, as in Debian's) into `image`,
/// each checked to carry the kernel's vermagic.
fn keep_modules(
    store: &ImageStore,
    kernel: &KernelManifest,
    built: &[PathBuf],
    image: &Path,
) -> Result<Vec<BuiltModule>, ImageError> {
    // The kernel's own vermagic, from any module of its tree.
    let tree_index = ModuleTree::open(&kernel.modules_dir(store))?;
    let first = built.first().and_then(|ko| ko.file_stem()).map(|s| s.to_string_lossy().into_owned());
    let reference = tree_index
        .path(first.unwrap_or_default().as_str())
        .or_else(|| tree_index.path("virtio_iommu"))
        .map(Path::to_path_buf);
    let kernel_vermagic = match &reference {
        Some(path) => Some(modinfo(&crate::modules::read(path)?, path)?.vermagic),
        None => None,
    };
    let mut modules = Vec::new();
    for ko in built {
        run_tool(Command::new("strip").arg("--strip-debug").arg(ko), "stripping the module")?;
        let data = read(ko)?;
        let info = modinfo(&data, ko)?;
        if let Some(expected) = &kernel_vermagic
            && info.vermagic != *expected
        {
            return Err(ImageError::Invalid(format!(
                "{}: vermagic {:?}, but kernel {} wants {:?}: the headers do not match the kernel",
                ko.display(),
                info.vermagic,
                kernel.release,
                expected
            )));
        }
        let file = ko.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        write(&image.join(&file), &data)?;
        modules.push(BuiltModule { file, sha256: sha256(&data), modinfo: info });
    }
    Ok(modules)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KCONFIG: &str = "diff --git a/d/Kconfig b/d/Kconfig\n--- a/d/Kconfig\n+++ b/d/Kconfig\n@@ -1,2 +1,3 @@\n \
                           config AQTION\n \tdepends on PCI\n+\tselect PAGE_POOL\n";

    #[test]
    fn kconfig_selects_the_kernel_has_are_left_out_with_a_note() {
        let note = outside_note("d/Kconfig", KCONFIG, "CONFIG_PCI=y\nCONFIG_PAGE_POOL=y\n").unwrap();
        assert_eq!(note, "select PAGE_POOL: the kernel has CONFIG_PAGE_POOL=y");
    }

    #[test]
    fn other_changes_outside_the_folder_are_refused_with_what_to_do() {
        let missing = outside_note("d/Kconfig", KCONFIG, "CONFIG_PCI=y\n# CONFIG_PAGE_POOL is not set\n").unwrap_err();
        assert!(missing.contains("needs CONFIG_PAGE_POOL"), "{missing}");
        let depends = KCONFIG.replace("select PAGE_POOL", "depends on NET");
        assert!(outside_note("d/Kconfig", &depends, "CONFIG_NET=y\n").unwrap_err().contains("--tree"));
        let header = KCONFIG.replace("d/Kconfig", "include/linux/skbuff.h");
        assert!(
            outside_note("include/linux/skbuff.h", &header, "").unwrap_err().contains("outside the driver's folder")
        );
    }
}
