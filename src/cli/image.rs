//! `driverlab image ...`: guest images. Each command that makes an image ends with one line on
//! stdout naming what it made (`kernel`: the image ID; `module`: the built `.ko`'s path;
//! `initramfs`: the archive's path), so that scripts and CI jobs can chain them.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use guest_images::patches::PatchFile;
use guest_images::store::{ImageError, ImageId, ImageKind, ImageStore};
use guest_images::{initramfs_build, kernel_image, module_build};

use super::CodedError;

/// Guest image commands.
#[derive(Subcommand)]
pub enum ImageCommand {
    /// A test kernel in the image store, from a Debian kernel package (default: the newest
    /// linux-image-6.12.N+debNN-amd64-unsigned) or a built tree. Prints its ID last.
    Kernel(KernelArgs),
    /// A driver variant: the driver's folder from linux-source (or a tree), patched, built out of
    /// tree against the kernel's headers, vermagic checked. Prints the built .ko's path last.
    Module(ModuleArgs),
    /// The initramfs a Linux cell boots: busybox, iperf3 and ethtool with their libraries, the
    /// virtio-iommu and NIC driver modules with their dependencies, the guest agent as /init.
    /// The same inputs give the same bytes. Prints the archive's path last.
    Initramfs(InitramfsArgs),
    /// The images in the store, one line each.
    List(StoreArgs),
    /// The path of an image's folder, or of a file in it (`bzImage`, `vmlinux`,
    /// `initramfs.cpio.gz`, ...).
    Path {
        /// The image ID.
        id: String,
        /// A file in the image.
        file: Option<String>,
        /// The store.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// One image's manifest.
    Show {
        /// The image ID.
        id: String,
        /// The store.
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write the embedded probe guest (an ELF with a PVH note) to a file, e.g. to boot it under
    /// QEMU with `-kernel`.
    Probe {
        /// Where to write it.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Write the boot benchmark's initramfs (static busybox; an /init that prints
    /// `driverlab-boot: init` and powers off at once) to a file, to time a boot under any VMM.
    BootInitramfs {
        /// Where to write it.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Extract the ELF vmlinux (with its PVH note) from a bzImage such as Debian's
    /// /boot/vmlinuz-*.
    Vmlinux {
        /// The bzImage.
        #[arg(long, value_name = "BZIMAGE")]
        from: PathBuf,
        /// Where to write the vmlinux.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

/// The image store.
#[derive(Args, Clone)]
pub struct StoreArgs {
    /// The image store [default: $DRIVERLAB_IMAGES, else ~/.cache/driverlab/images].
    #[arg(long, value_name = "DIR")]
    pub images: Option<PathBuf>,
}

impl StoreArgs {
    fn store(&self) -> ImageStore {
        ImageStore::new(self.images.clone().unwrap_or_else(guest_images::store::default_root))
    }
}

/// Options of `image kernel`.
#[derive(Args)]
pub struct KernelArgs {
    /// A Debian kernel package, e.g. linux-image-6.12.117+deb12-amd64-unsigned.
    #[arg(long, value_name = "NAME", conflicts_with = "tree")]
    pub package: Option<String>,
    /// A built kernel tree (arch/x86/boot/bzImage, .config, include/config/kernel.release).
    #[arg(long, value_name = "PATH")]
    pub tree: Option<PathBuf>,
    /// With --tree: where its modules are installed [default: TREE/lib/modules/RELEASE].
    #[arg(long, value_name = "DIR", requires = "tree")]
    pub modules: Option<PathBuf>,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Options of `image module`.
#[derive(Args)]
pub struct ModuleArgs {
    /// The driver's folder in the kernel tree.
    #[arg(long, value_name = "PATH", default_value = module_build::DEFAULT_DRIVER_FOLDER)]
    pub driver: String,
    /// Patch files (git format-patch output, mails or mboxes), applied in order without fuzz.
    #[arg(long = "patch", value_name = "FILE")]
    pub patches: Vec<PathBuf>,
    /// The sources: a Debian package whose tarball is in /usr/src [default: linux-source-6.12].
    #[arg(long, value_name = "PKG", conflicts_with = "tree")]
    pub source: Option<String>,
    /// The sources: a kernel tree.
    #[arg(long, value_name = "PATH")]
    pub tree: Option<PathBuf>,
    /// The kernel image to build against.
    #[arg(long, value_name = "IMAGE")]
    pub kernel: String,
    /// The kernel headers [default: the kernel image's own (Debian kernels), else
    /// /usr/src/linux-headers-RELEASE].
    #[arg(long, value_name = "DIR")]
    pub headers: Option<PathBuf>,
    /// Build only this module of the folder (e.g. lan743x of drivers/net/ethernet/microchip);
    /// repeatable.
    #[arg(long = "only", value_name = "NAME")]
    pub only: Vec<String>,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Options of `image initramfs`.
#[derive(Args)]
pub struct InitramfsArgs {
    /// The kernel image.
    #[arg(long, value_name = "IMAGE")]
    pub kernel: String,
    /// A driver variant (a module image ID or a .ko file), replacing the kernel's own; repeatable.
    #[arg(long = "module", value_name = "IMAGE|KO")]
    pub modules: Vec<String>,
    /// A stock driver of the kernel to include (default: atlantic, when no --module is given);
    /// repeatable.
    #[arg(long = "driver", value_name = "NAME")]
    pub drivers: Vec<String>,
    /// A program the workloads need beyond iperf3 and ethtool (`sockperf` for `latency`,
    /// `xdp-bench` for `xdp`, `kselftest` for the NIC selftests with Python and what they run),
    /// taken from this host with its libraries; repeatable.
    #[arg(long = "tool", value_name = "TOOL")]
    pub tools: Vec<initramfs_build::GuestTool>,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

fn image_error(e: ImageError) -> anyhow::Error {
    let code = if e.is_bad_input() { 2 } else { 1 };
    CodedError { message: e.to_string(), code }.into()
}

impl ImageCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ImageCommand::Kernel(args) => kernel(args)?,
            ImageCommand::Module(args) => module(args)?,
            ImageCommand::Initramfs(args) => initramfs(args)?,
            ImageCommand::List(args) => list(&args.store())?,
            ImageCommand::Path { id, file, store } => path(&store.store(), &id, file.as_deref())?,
            ImageCommand::Show { id, store } => {
                let manifest: serde_json::Value = store.store().manifest(&id).map_err(image_error)?;
                println!("{}", serde_json::to_string_pretty(&manifest)?);
            }
            ImageCommand::Probe { out } => {
                std::fs::write(&out, guest_images::PROBE_ELF).with_context(|| format!("writing {}", out.display()))?;
                println!("{}: probe guest, {} bytes", out.display(), guest_images::PROBE_ELF.len());
            }
            ImageCommand::BootInitramfs { out } => {
                let archive = guest_images::boot_initramfs::build()?;
                std::fs::write(&out, &archive).with_context(|| format!("writing {}", out.display()))?;
                println!("{}: boot benchmark initramfs, {} bytes", out.display(), archive.len());
            }
            ImageCommand::Vmlinux { from, out } => {
                let bzimage = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
                let vmlinux =
                    guest_images::kernel::extract_vmlinux(&bzimage).with_context(|| from.display().to_string())?;
                std::fs::write(&out, &vmlinux).with_context(|| format!("writing {}", out.display()))?;
                println!("{}: vmlinux, {} bytes", out.display(), vmlinux.len());
            }
        }
        Ok(0)
    }
}

/// `image kernel`: its facts on stderr, its ID last.
fn kernel(args: KernelArgs) -> anyhow::Result<()> {
    let store = args.store.store();
    eprintln!("image store {}", store.root().display());
    let manifest = match &args.tree {
        Some(tree) => kernel_image::from_tree(&store, tree, args.modules.as_deref()),
        None => kernel_image::from_package(&store, args.package.as_deref()),
    }
    .map_err(image_error)?;
    let facts: Vec<String> = manifest.facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("kernel {} from {}: {}", manifest.release, manifest.source, facts.join(" "));
    if let Some(refusal) = manifest.viommu_refusal() {
        eprintln!("note: {refusal}; cells behind the virtio-iommu will refuse it");
    }
    println!("{}", manifest.id);
    Ok(())
}

/// `image module`: its patches and modules on stderr, the driver's `.ko` last.
fn module(args: ModuleArgs) -> anyhow::Result<()> {
    let store = args.store.store();
    let patches = args.patches.iter().map(|p| PatchFile::read(p)).collect::<Result<_, _>>().map_err(image_error)?;
    let request = module_build::ModuleRequest {
        driver: args.driver,
        patches,
        source: match (args.tree, args.source) {
            (Some(tree), _) => module_build::SourceSpec::Tree(tree),
            (None, Some(source)) => module_build::SourceSpec::Package(source),
            (None, None) => module_build::SourceSpec::default(),
        },
        kernel: args.kernel,
        headers: args.headers,
        only: args.only,
    };
    let manifest = module_build::build(&store, &request).map_err(image_error)?;
    for patch in &manifest.patches {
        eprintln!("patch {}: {}", patch.file, patch.subject);
    }
    for m in &manifest.modules {
        let params: Vec<&str> = m.modinfo.params.keys().map(String::as_str).collect();
        eprintln!("{} vermagic {:?} params {}", m.file, m.modinfo.vermagic, params.join(","));
    }
    eprintln!("module image {}", manifest.id);
    let main = manifest.main_module().context("the build gave no module named after the driver")?;
    println!("{}", store.dir(&manifest.id).join(&main.file).display());
    Ok(())
}

/// `image initramfs`: its modules on stderr, the archive's path last.
fn initramfs(args: InitramfsArgs) -> anyhow::Result<()> {
    let store = args.store.store();
    let request = initramfs_build::InitramfsRequest {
        kernel: args.kernel,
        modules: args.modules,
        drivers: args.drivers,
        tools: args.tools,
    };
    let manifest = initramfs_build::build(&store, &request).map_err(image_error)?;
    let modules: Vec<String> = manifest.modules.iter().map(|m| format!("{} ({})", m.name, m.from)).collect();
    eprintln!("initramfs {}: {} bytes, modules {}", manifest.id, manifest.size, modules.join(", "));
    println!("{}", manifest.archive_path(&store).display());
    Ok(())
}

/// `image list`: one line per image, its ID and what it is.
fn list(store: &ImageStore) -> anyhow::Result<()> {
    for (id, manifest) in store.list().map_err(image_error)? {
        let Ok(image) = id.parse::<ImageId>() else { continue };
        let text = |key: &str| manifest[key].as_str().unwrap_or("?").to_string();
        let what = match image.kind() {
            ImageKind::Kernel => format!("{} ({})", text("release"), text("source")),
            ImageKind::Module => format!(
                "{} for {}, {} patch(es)",
                text("driver"),
                text("release"),
                manifest["patches"].as_array().map_or(0, Vec::len)
            ),
            ImageKind::Initramfs => {
                let drivers = manifest["drivers"].as_array().map(|d| d.iter().filter_map(|v| v.as_str()).collect());
                format!("for {}, drivers {}", text("release"), drivers.unwrap_or_else(Vec::new).join(","))
            }
        };
        println!("{id:<28} {what}");
    }
    Ok(())
}

/// `image path`: the image's folder, or one of its files.
fn path(store: &ImageStore, id: &str, file: Option<&str>) -> anyhow::Result<()> {
    let _: serde_json::Value = store.manifest(id).map_err(image_error)?;
    let mut path = store.dir(id);
    if let Some(file) = file {
        if file.contains('/') || file.starts_with('.') || !path.join(file).exists() {
            return Err(image_error(ImageError::Invalid(format!("image {id} has no file {file:?}"))));
        }
        path = path.join(file);
    }
    println!("{}", path.display());
    Ok(())
}
