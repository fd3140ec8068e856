//! `driverlab image initramfs`: the initramfs a Linux cell boots: static busybox, iperf3 and
//! ethtool with every shared library they load, the kernel's virtio-iommu and NIC driver modules
//! with their dependencies (a driver variant's module replacing the stock one), and the guest
//! agent as `/init`. Packed sorted with fixed times and owners, so the same inputs give the same
//! bytes; the archive's hash is its identity.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::initramfs::{Node, Tree};
use crate::kernel_image::KernelManifest;
use crate::module_build::ModuleManifest;
use crate::modules::{ModuleTree, canonical, modinfo};
use crate::patches::Patch;
use crate::store::{ImageError, ImageStore, image_id, mkdir, read, run_tool, sha256, write, write_manifest};

/// Programs every image carries besides busybox.
pub const PROGRAMS: &[&str] = &["iperf3", "ethtool"];

/// A program an image carries only when its workloads need it (from this host's Debian
/// packages, with every library it loads).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum GuestTool {
    /// `sockperf`: request/response latency (the `latency` workload).
    Sockperf,
    /// `xdp-bench` (xdp-tools): an XDP program that drops, passes or bounces frames (the `xdp`
    /// workload).
    XdpBench,
    /// The kernel's NIC selftests with Python and what they run (the `kselftest` workload;
    /// [`crate::kselftest`]).
    Kselftest,
}

impl GuestTool {
    /// Every tool.
    pub const ALL: &[GuestTool] = <GuestTool as strum::VariantArray>::VARIANTS;

    /// Its name; the program, as `PATH` finds it, for a tool that is one program.
    pub fn program(self) -> &'static str {
        self.into()
    }

    /// The Debian package that installs it.
    pub fn package(self) -> &'static str {
        match self {
            GuestTool::Sockperf => "sockperf",
            GuestTool::XdpBench => "xdp-tools",
            GuestTool::Kselftest => crate::kselftest::SOURCE_PACKAGE,
        }
    }
}
/// Where Debian's busybox-static puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// What to put in.
#[derive(Debug, Clone, Default)]
pub struct InitramfsRequest {
    /// The kernel image the modules belong to.
    pub kernel: String,
    /// Driver variants: module images (`module-...`) or `.ko` files; each replaces the kernel's
    /// module of the same name.
    pub modules: Vec<String>,
    /// Stock drivers of the kernel to include as well (default: `atlantic`, when no variant is
    /// given).
    pub drivers: Vec<String>,
    /// Programs beyond [`PROGRAMS`] the workloads need.
    pub tools: Vec<GuestTool>,
}

/// One module in the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageModule {
    /// Its name.
    pub name: String,
    /// SHA-256 of the (uncompressed) module.
    pub sha256: String,
    /// `kernel` (the kernel image's own), a module image ID, or `file PATH`.
    pub from: String,
    /// Its parameters (from `.modinfo`).
    pub params: BTreeMap<String, String>,
}

/// An initramfs image's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitramfsManifest {
    /// `initramfs-` and 16 hex digits: the archive's hash.
    pub id: String,
    /// `initramfs`.
    pub kind: String,
    /// The kernel image.
    pub kernel: String,
    /// Its release.
    pub release: String,
    /// The archive, in the image's folder.
    pub archive: String,
    /// Its size in bytes.
    pub size: u64,
    /// The drivers the agent can load (`driverlab.nic=`), each with its load group.
    pub drivers: Vec<String>,
    /// Every module, in load order per group.
    pub modules: Vec<ImageModule>,
    /// The patches behind the variant modules.
    pub patches: Vec<Patch>,
    /// The programs it carries beyond [`PROGRAMS`] (absent from older manifests).
    #[serde(default)]
    pub tools: Vec<GuestTool>,
    /// The NIC selftests' source and Python, when it carries them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kselftest: Option<crate::kselftest::SuiteFacts>,
    /// Every file: path and SHA-256 (links: `-> target`).
    pub files: BTreeMap<String, String>,
    /// The archive in two parts for a guest started from a snapshot (absent from older
    /// manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_parts: Option<SnapshotParts>,
}

impl InitramfsManifest {
    /// The archive on disk.
    pub fn archive_path(&self, store: &ImageStore) -> PathBuf {
        store.dir(&self.id).join(&self.archive)
    }
}

/// An initramfs split for snapshots ([`snapshot_split`]): the base a snapshot's guest boots,
/// the same for every driver variant of one kernel and tool set, and the payload the agent
/// unpacks after the restore (in the image's folder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotParts {
    /// The base archive (gzip-compressed cpio).
    pub base: String,
    /// Its SHA-256: the same for images that share it.
    pub base_sha256: String,
    /// The payload archive (cpio, uncompressed).
    pub payload: String,
    /// Its size in bytes.
    pub payload_bytes: u64,
    /// Its SHA-256.
    pub payload_sha256: String,
}

/// An image's tree in two: the payload is what the agent's `load` step reads, which a guest
/// started from a snapshot taken before that step gets after its restore: each driver group's
/// load list (`etc/driverlab/modules.DRIVER`) and its modules but those the `iommu` group loads
/// before the snapshot; the base is the rest.
pub fn snapshot_split(tree: &Tree) -> (Tree, Tree) {
    let modules_of = |data: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(data).lines().filter(|l| !l.is_empty()).map(|m| format!("lib/modules/{m}.ko")).collect()
    };
    let (mut before, mut after) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for (path, node) in tree.nodes() {
        if let (Some(group), Node::File { data, .. }) = (path.strip_prefix("etc/driverlab/modules."), node) {
            if group == "iommu" {
                before.extend(modules_of(data));
            } else {
                after.insert(path.clone());
                after.extend(modules_of(data));
            }
        }
    }
    let (mut base, mut payload) = (Tree::new(), Tree::new());
    for (path, node) in tree.nodes() {
        let part = if after.contains(path) && !before.contains(path) { &mut payload } else { &mut base };
        part.add(path, node.clone());
    }
    (base, payload)
}

/// A program on this host's `PATH`, from the Debian package `package`.
pub(crate) fn which(program: &str, package: &str) -> Result<PathBuf, ImageError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| ImageError::Invalid(format!("{program} is not installed (apt-get install {package})")))
}

/// The shared libraries `ldd` says `binary` loads, loader included.
pub fn libraries(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = run_tool(Command::new("ldd").arg(binary), &format!("ldd {}", binary.display()))?;
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

/// Paths in `ldd` output: `name => /path (addr)` and `/path (addr)` lines.
pub fn parse_ldd(text: &str) -> Vec<PathBuf> {
    let mut libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => Some(PathBuf::from(path)),
                [path, ..] if path.starts_with('/') => Some(PathBuf::from(path)),
                _ => None,
            }
        })
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// Builds the initramfs `request` asks for (or finds it, if the same bytes are in the store).
pub fn build(store: &ImageStore, request: &InitramfsRequest) -> Result<InitramfsManifest, ImageError> {
    let kernel: KernelManifest = store.manifest(&request.kernel)?;
    let tree_index = ModuleTree::open(&kernel.modules_dir(store))?;
    let mut tree = Tree::new();
    for dir in ["dev", "etc/driverlab", "lib/modules", "proc", "run", "sys", "tmp"] {
        tree.add(dir, Node::Dir);
    }
    tree.add("dev/console", Node::CharDevice { major: 5, minor: 1 });
    tree.file("init", 0o755, crate::AGENT.as_bytes().to_vec());
    add_busybox(&mut tree)?;
    let mut tools = request.tools.clone();
    tools.sort_unstable();
    tools.dedup();
    let programs = PROGRAMS
        .iter()
        .map(|p| (*p, *p))
        .chain(tools.iter().filter(|t| **t != GuestTool::Kselftest).map(|t| (t.program(), t.package())));
    for (program, package) in programs {
        add_program(&mut tree, program, package)?;
    }
    let kselftest = if tools.contains(&GuestTool::Kselftest) { Some(crate::kselftest::add(&mut tree)?) } else { None };
    let variants = Variants::of(store, &kernel, request)?;
    let modules = add_modules(&mut tree, &tree_index, &variants)?;
    let archive = tree.cpio_gz();
    let id = image_id(crate::store::ImageKind::Initramfs, &[&archive]);
    let files = tree
        .nodes()
        .iter()
        .filter_map(|(path, node)| match node {
            Node::File { data, .. } => Some((path.clone(), sha256(data))),
            Node::Symlink(target) => Some((path.clone(), format!("-> {target}"))),
            _ => None,
        })
        .collect();
    let manifest = InitramfsManifest {
        id: id.clone(),
        kind: "initramfs".into(),
        kernel: kernel.id.clone(),
        release: kernel.release.clone(),
        archive: "initramfs.cpio.gz".into(),
        size: archive.len() as u64,
        drivers: variants.drivers,
        modules,
        patches: variants.patches,
        tools,
        kselftest,
        files,
        snapshot_parts: None,
    };
    if let Ok(stored) = store.manifest::<InitramfsManifest>(&id) {
        return Ok(stored);
    }
    let scratch = store.scratch("initramfs")?;
    mkdir(&scratch)?;
    write(&scratch.join(&manifest.archive), &archive)?;
    let manifest = InitramfsManifest { snapshot_parts: Some(write_snapshot_parts(&scratch, &tree)?), ..manifest };
    write_manifest(&scratch, &manifest)?;
    store.commit(&scratch, &id)?;
    Ok(manifest)
}

/// The archive's [`snapshot_split`] parts, written into the image's folder `dir`.
fn write_snapshot_parts(dir: &Path, tree: &Tree) -> Result<SnapshotParts, ImageError> {
    let (base, payload) = snapshot_split(tree);
    let (base, payload) = (base.cpio_gz(), payload.cpio());
    let parts = SnapshotParts {
        base: "snapshot-base.cpio.gz".into(),
        base_sha256: sha256(&base),
        payload: "snapshot-payload.cpio".into(),
        payload_bytes: payload.len() as u64,
        payload_sha256: sha256(&payload),
    };
    write(&dir.join(&parts.base), &base)?;
    write(&dir.join(&parts.payload), &payload)?;
    Ok(parts)
}

/// This host's `program` (of the Debian package `package`) at `bin/PROGRAM`, with every library
/// it loads.
fn add_program(tree: &mut Tree, program: &str, package: &str) -> Result<(), ImageError> {
    let path = which(program, package)?;
    tree.file(&format!("bin/{program}"), 0o755, read(&path)?);
    add_libraries(tree, &path)
}

/// Every library `binary` loads, at its path on this host.
pub(crate) fn add_libraries(tree: &mut Tree, binary: &Path) -> Result<(), ImageError> {
    for lib in libraries(binary)? {
        let data = read(&lib)?;
        tree.file(&lib.to_string_lossy(), 0o755, data);
    }
    Ok(())
}

/// Static busybox at `bin/busybox`, with a link per applet.
pub(crate) fn add_busybox(tree: &mut Tree) -> Result<(), ImageError> {
    let busybox = read(Path::new(BUSYBOX))
        .map_err(|_| ImageError::Invalid(format!("no {BUSYBOX}: apt-get install busybox-static")))?;
    let applets = run_tool(Command::new(BUSYBOX).arg("--list"), "busybox --list")?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
        tree.add(&format!("bin/{applet}"), Node::Symlink("busybox".into()));
    }
    tree.file("bin/busybox", 0o755, busybox);
    Ok(())
}

/// The drivers an initramfs loads and the variant modules that replace the kernel's own.
struct Variants {
    /// The drivers to load, by module name.
    drivers: Vec<String>,
    /// The variants' modules, by name.
    modules: BTreeMap<String, Vec<u8>>,
    /// Where each variant came from (its module image, or its file).
    from: BTreeMap<String, String>,
    /// The variants' patches.
    patches: Vec<crate::patches::Patch>,
}

impl Variants {
    /// The request's drivers and variant modules (module images built for `kernel`, or files).
    fn of(store: &ImageStore, kernel: &KernelManifest, request: &InitramfsRequest) -> Result<Variants, ImageError> {
        let mut variants = Variants {
            drivers: request.drivers.iter().map(|d| canonical(d)).collect(),
            modules: BTreeMap::new(),
            from: BTreeMap::new(),
            patches: Vec::new(),
        };
        for module in &request.modules {
            let (name, data, source) = if module.starts_with("module-") {
                let manifest: ModuleManifest = store.manifest(module)?;
                if manifest.kernel != kernel.id {
                    return Err(ImageError::Invalid(format!(
                        "{module} was built for {} ({}), not {} ({})",
                        manifest.kernel, manifest.release, kernel.id, kernel.release
                    )));
                }
                let main = manifest
                    .main_module()
                    .ok_or_else(|| ImageError::Invalid(format!("{module}: which of its modules is the driver?")))?;
                variants.patches.extend(manifest.patches.clone());
                let data = read(&store.dir(module).join(&main.file))?;
                (main.modinfo.name.clone(), data, module.clone())
            } else {
                let path = PathBuf::from(module);
                let data = crate::modules::read(&path)?;
                let info = modinfo(&data, &path)?;
                (info.name, data, format!("file {}", path.display()))
            };
            variants.from.insert(name.clone(), source);
            variants.modules.insert(name.clone(), data);
            if !variants.drivers.contains(&name) {
                variants.drivers.push(name);
            }
        }
        if variants.drivers.is_empty() {
            // The default driver folder's driver (the AQC100's atlantic).
            let default = crate::module_build::DEFAULT_DRIVER_FOLDER.rsplit('/').next().unwrap_or_default();
            variants.drivers.push(default.into());
        }
        Ok(variants)
    }
}

/// The virtio-iommu's and each driver's modules with their dependencies into `tree`, the
/// variants in place of the kernel's own, and a load list per group (`modules.iommu`,
/// `modules.DRIVER`); each module once.
fn add_modules(tree: &mut Tree, tree_index: &ModuleTree, variants: &Variants) -> Result<Vec<ImageModule>, ImageError> {
    let mut modules = Vec::new();
    let mut groups: Vec<(String, Vec<String>)> = vec![("iommu".into(), vec!["virtio_iommu".into()])];
    groups.extend(variants.drivers.iter().map(|d| (d.clone(), vec![d.clone()])));
    for (group, roots) in groups {
        let order = tree_index.closure(&roots, &variants.modules)?;
        let mut list = String::new();
        for (name, data) in order {
            list.push_str(&name);
            list.push('\n');
            if modules.iter().any(|m: &ImageModule| m.name == name) {
                continue;
            }
            let info = modinfo(&data, Path::new(&name))?;
            modules.push(ImageModule {
                name: name.clone(),
                sha256: sha256(&data),
                from: variants.from.get(&name).cloned().unwrap_or_else(|| "kernel".into()),
                params: info.params,
            });
            tree.file(&format!("lib/modules/{name}.ko"), 0o644, data);
        }
        tree.file(&format!("etc/driverlab/modules.{group}"), 0o644, list.into_bytes());
    }
    Ok(modules)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree as `build` makes it, with `driver`'s module holding `bytes`.
    fn image(bytes: &[u8]) -> Tree {
        let mut tree = Tree::new();
        tree.file("init", 0o755, b"agent".to_vec());
        tree.file("lib/modules/virtio_iommu.ko", 0o644, b"iommu".to_vec());
        tree.file("lib/modules/shared.ko", 0o644, b"both".to_vec());
        tree.file("lib/modules/atlantic.ko", 0o644, bytes.to_vec());
        tree.file("lib/modules/macsec.ko", 0o644, b"dep".to_vec());
        tree.file("etc/driverlab/modules.iommu", 0o644, b"shared\nvirtio_iommu\n".to_vec());
        tree.file("etc/driverlab/modules.atlantic", 0o644, b"shared\nmacsec\natlantic\n".to_vec());
        tree
    }

    #[test]
    fn the_snapshot_split_moves_what_load_reads_and_keeps_one_base_for_every_variant() {
        let (base, payload) = snapshot_split(&image(b"stock"));
        let files = |t: &Tree| {
            t.nodes().iter().filter(|(_, n)| !matches!(n, Node::Dir)).map(|(p, _)| p.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            files(&payload),
            ["etc/driverlab/modules.atlantic", "lib/modules/atlantic.ko", "lib/modules/macsec.ko"]
        );
        assert_eq!(
            files(&base),
            ["etc/driverlab/modules.iommu", "init", "lib/modules/shared.ko", "lib/modules/virtio_iommu.ko"]
        );
        let (variant_base, variant_payload) = snapshot_split(&image(b"patched"));
        assert_eq!(variant_base.cpio_gz(), base.cpio_gz(), "one base");
        assert_ne!(variant_payload.cpio(), payload.cpio());
    }

    #[test]
    fn ldd_output_gives_library_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibiperf.so.0 => /lib/x86_64-linux-gnu/libiperf.so.0 (0x7f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        let libs = parse_ldd(text);
        assert_eq!(libs.len(), 3);
        assert!(libs.contains(&PathBuf::from("/lib64/ld-linux-x86-64.so.2")));
        assert!(!libs.iter().any(|l| l.to_string_lossy().contains("vdso")));
    }
}
