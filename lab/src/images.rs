//! What a matrix's `[[image]]` boots: the probe, a kernel and initrd by path, images from the
//! image store by ID (`kernel = "kernel-…"`, `initrd = "initramfs-…"`, from `driverlab image`),
//! or recipes built into the store on first use (`kernel = "debian"`, `initrd = "agent"` with the
//! driver patched by `patches`): the builds are content-addressed, so a second run reuses them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use guest_images::initramfs_build::InitramfsManifest;
use guest_images::kernel_image::KernelManifest;
use guest_images::store::ImageStore;

use crate::matrix::{Image, InitrdRef, KernelRef, Plan};
use crate::recipe;

/// An image's files, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The kernel file (for a kernel image: its ELF vmlinux, booted through PVH).
    pub kernel: PathBuf,
    /// The kernel image's bzImage, when it is one (what QEMU boots).
    pub bzimage: Option<PathBuf>,
    /// The initrd file.
    pub initrd: Option<PathBuf>,
    /// The kernel image's manifest, when the kernel is one.
    pub manifest: Option<KernelManifest>,
}

/// Why a matrix's images cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImagesError {
    /// Building a recipe failed (a download, a compiler), or its inputs are wrong (a patch that
    /// does not apply).
    #[error(transparent)]
    Build(#[from] crate::recipe::RecipeError),
    /// A file or image the matrix names is missing, or does not fit its kernel.
    #[error("{0}")]
    Missing(String),
}

/// A checked plan with its images' files resolved, recipes built into the store: what a run
/// executes. Made once per run; every repetition takes its files from it.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The checked matrix and its cells.
    pub plan: Plan,
    /// Each Linux image's files, by the image's name (the probe has none).
    files: BTreeMap<String, Resolved>,
}

impl RunPlan {
    /// Builds what `plan`'s recipes ask for (those not built yet: a download and a build can
    /// take minutes the first time), saying what it does through `note`, and resolves every
    /// Linux image's files.
    pub fn prepare(plan: Plan, store: &ImageStore, note: &dyn Fn(&str)) -> Result<RunPlan, ImagesError> {
        let mut files = BTreeMap::new();
        for image in plan.matrix.images.iter().map(|i| i.get_ref()).filter(|i| !i.is_probe()) {
            files.insert(image.name.clone(), resolve(&plan, image, store, note)?);
        }
        Ok(RunPlan { plan, files })
    }

    /// The files of the Linux image named `image`.
    pub fn files(&self, image: &str) -> Option<&Resolved> {
        self.files.get(image)
    }
}

/// Resolves a Linux image of `plan` (not the probe), building what its recipe asks for.
fn resolve(plan: &Plan, image: &Image, store: &ImageStore, note: &dyn Fn(&str)) -> Result<Resolved, ImagesError> {
    let (kernel_ref, initrd_ref) = if recipe::is_recipe(image) {
        let what = match image.patches.len() {
            0 => String::new(),
            n => format!(", {} built with {n} patch(es)", image.driver.rsplit('/').next().unwrap_or_default()),
        };
        note(&format!("image {}: kernel {}, initrd {}{what}", image.name, image.kernel, initrd_name(image)));
        let (kernel, initrd) = recipe::build(&|p| plan.resolve(p), &plan.matrix.guest_tools(), image, store)?;
        let built = initrd.as_ref().map(|i| format!(", {i}")).unwrap_or_default();
        note(&format!("image {}: {kernel}{built}", image.name));
        (kernel, initrd)
    } else {
        (image.kernel.clone(), image.initrd.clone())
    };
    let (kernel, manifest) = match &kernel_ref {
        KernelRef::Store(id) => {
            let manifest: KernelManifest = store
                .manifest(id.as_str())
                .map_err(|e| ImagesError::Missing(format!("image {:?}: {e}", image.name)))?;
            (manifest.vmlinux_path(store), Some(manifest))
        }
        KernelRef::Path(path) => (plan.resolve(path), None),
        KernelRef::Probe | KernelRef::Debian { .. } => {
            return Err(ImagesError::Missing(format!(
                "image {:?}: kernel {kernel_ref} is no Linux kernel file",
                image.name
            )));
        }
    };
    let initrd = resolve_initrd(plan, image, store, &kernel_ref, initrd_ref.as_ref()).map_err(ImagesError::Missing)?;
    for path in std::iter::once(&kernel).chain(initrd.as_ref()) {
        if !path.exists() {
            return Err(ImagesError::Missing(format!(
                "{}: image {:?}: {} does not exist",
                plan.file.display(),
                image.name,
                path.display()
            )));
        }
    }
    let bzimage = manifest.as_ref().map(|m| store.dir(&m.id).join(&m.bzimage));
    Ok(Resolved { kernel, bzimage, initrd, manifest })
}

/// An image's initrd file, checked against its kernel when both are store images.
fn resolve_initrd(
    plan: &Plan,
    image: &Image,
    store: &ImageStore,
    kernel_ref: &KernelRef,
    initrd_ref: Option<&InitrdRef>,
) -> Result<Option<PathBuf>, String> {
    match initrd_ref {
        None => Ok(None),
        Some(InitrdRef::Store(id)) => {
            let manifest: InitramfsManifest =
                store.manifest(id.as_str()).map_err(|e| format!("image {:?}: {e}", image.name))?;
            if let (Some(built_for), KernelRef::Store(kernel_id)) = (manifest_kernel(&manifest), kernel_ref)
                && built_for != kernel_id.as_str()
            {
                return Err(format!(
                    "image {:?}: initrd {} was built for {built_for}, not {kernel_id}",
                    image.name, manifest.id
                ));
            }
            Ok(Some(manifest.archive_path(store)))
        }
        Some(InitrdRef::Path(path)) => Ok(Some(plan.resolve(path))),
        Some(InitrdRef::Agent) => Err(format!("image {:?}: the agent's initramfs was not built", image.name)),
    }
}

fn initrd_name(image: &Image) -> String {
    image.initrd.as_ref().map_or("none".into(), InitrdRef::to_string)
}

fn manifest_kernel(manifest: &InitramfsManifest) -> Option<String> {
    Some(manifest.kernel.clone()).filter(|k| !k.is_empty())
}
