//! What a matrix's `[[image]]` boots: the probe, a kernel and initrd by path, images from the
//! image store by ID (`kernel = "kernel-…"`, `initrd = "initramfs-…"`, from `driverlab image`),
//! or recipes built into the store on first use (`kernel = "debian"`, `initrd = "agent"` with the
//! driver patched by `patches`): the builds are content-addressed, so a second run reuses them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use guest_images::initramfs_build::InitramfsManifest;
use guest_images::kernel_image::KernelManifest;
use guest_images::store::ImageStore;

use crate::failure::Failure;
use crate::matrix::{Cell, Image, InitrdRef, KernelRef, Plan, SeriesStep};
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
    /// The initrd in two parts for a guest started from a snapshot, when it is a store image
    /// that has them.
    pub split: Option<SplitInitrd>,
}

/// An initramfs image's parts for snapshots (`guest_images::initramfs_build::SnapshotParts`):
/// the base the snapshot's guest boots, shared by the driver variants of one kernel, and the
/// payload each restored guest gets in its payload window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitInitrd {
    /// The base archive.
    pub base: PathBuf,
    /// Its SHA-256, which names it in a snapshot's key (the same for every image that shares it).
    pub base_sha256: String,
    /// The payload archive.
    pub payload: PathBuf,
    /// Its size.
    pub payload_bytes: u64,
    /// Its SHA-256, which the guest agent checks.
    pub payload_sha256: String,
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
    /// The prefixes of series that were not built, by image name: why their cells do not run.
    unbuilt: BTreeMap<String, Failure>,
}

impl RunPlan {
    /// Builds what `plan`'s recipes ask for (those not built yet: a download and a build can
    /// take minutes the first time), saying what it does through `note`, and resolves every
    /// Linux image's files. A prefix of a series that does not build is no error of the run:
    /// its cells are its BUILD-FAIL, and those of the later prefixes are skipped.
    pub fn prepare(plan: Plan, store: &ImageStore, note: &dyn Fn(&str)) -> Result<RunPlan, ImagesError> {
        let images = plan.matrix.images.iter().map(|i| i.get_ref());
        let (files, unbuilt) = resolve_all(images, &mut |image| resolve(&plan, image, store, note))?;
        Ok(RunPlan { plan, files, unbuilt })
    }

    /// The files of the Linux image named `image`.
    pub fn files(&self, image: &str) -> Option<&Resolved> {
        self.files.get(image)
    }

    /// The cells whose image was not built, with why: what the run records for them at once.
    pub fn unbuilt(&self) -> Vec<(Cell, Failure)> {
        let why = |cell: &Cell| self.unbuilt.get(&cell.image).map(|f| (cell.clone(), f.clone()));
        self.plan.cells.iter().filter_map(why).collect()
    }
}

/// Each Linux image of `images` resolved by `resolve`, in order; a series' prefix past its base
/// that does not build is set aside with its BUILD-FAIL, and its series' later prefixes with
/// the reason they were not built.
type Resolution = (BTreeMap<String, Resolved>, BTreeMap<String, Failure>);

fn resolve_all<'a>(
    images: impl Iterator<Item = &'a Image>,
    resolve: &mut dyn FnMut(&Image) -> Result<Resolved, ImagesError>,
) -> Result<Resolution, ImagesError> {
    let (mut files, mut unbuilt) = (BTreeMap::new(), BTreeMap::new());
    let mut broken: BTreeMap<&str, &SeriesStep> = BTreeMap::new();
    for image in images.filter(|i| !i.is_probe()) {
        let step = image.step.as_ref().filter(|s| s.index > 0);
        if let Some(failed) = step.and_then(|s| broken.get(s.series.as_str())) {
            let why = format!("not built: the series' prefix {} did not build", failed.label());
            unbuilt.insert(image.name.clone(), Failure::Unrunnable { why });
            continue;
        }
        // A prefix `lab pin` could not build is its BUILD-FAIL as one built here would be.
        let resolved = match &image.unbuilt {
            Some(why) => Err(ImagesError::Build(crate::recipe::RecipeError::Refused(why.clone()))),
            None => resolve(image),
        };
        match (resolved, step) {
            (Ok(resolved), _) => {
                files.insert(image.name.clone(), resolved);
            }
            (Err(ImagesError::Build(e)), Some(step)) => {
                tracing::info!("image {:?}: {} did not build: {e}", image.name, step.label());
                unbuilt.insert(image.name.clone(), Failure::build_failed(e.to_string()));
                broken.insert(&step.series, step);
            }
            (Err(e), _) => return Err(e),
        }
    }
    Ok((files, unbuilt))
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
    let (initrd, split) =
        resolve_initrd(plan, image, store, &kernel_ref, initrd_ref.as_ref()).map_err(ImagesError::Missing)?;
    let split_files = split.iter().flat_map(|s| [&s.base, &s.payload]);
    for path in std::iter::once(&kernel).chain(initrd.as_ref()).chain(split_files) {
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
    Ok(Resolved { kernel, bzimage, initrd, manifest, split })
}

/// An image's initrd file (and its parts for snapshots, when a store image has them), checked
/// against its kernel when both are store images.
fn resolve_initrd(
    plan: &Plan,
    image: &Image,
    store: &ImageStore,
    kernel_ref: &KernelRef,
    initrd_ref: Option<&InitrdRef>,
) -> Result<(Option<PathBuf>, Option<SplitInitrd>), String> {
    match initrd_ref {
        None => Ok((None, None)),
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
            let dir = store.dir(&manifest.id);
            let split = manifest.snapshot_parts.as_ref().map(|parts| SplitInitrd {
                base: dir.join(&parts.base),
                base_sha256: parts.base_sha256.clone(),
                payload: dir.join(&parts.payload),
                payload_bytes: parts.payload_bytes,
                payload_sha256: parts.payload_sha256.clone(),
            });
            Ok((Some(manifest.archive_path(store)), split))
        }
        Some(InitrdRef::Path(path)) => Ok((Some(plan.resolve(path)), None)),
        Some(InitrdRef::Agent) => Err(format!("image {:?}: the agent's initramfs was not built", image.name)),
    }
}

fn initrd_name(image: &Image) -> String {
    image.initrd.as_ref().map_or("none".into(), InitrdRef::to_string)
}

fn manifest_kernel(manifest: &InitramfsManifest) -> Option<String> {
    Some(manifest.kernel.clone()).filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::RecipeError;

    #[test]
    fn a_prefix_that_does_not_build_is_its_build_fail_and_the_later_ones_are_not_built() {
        let patch = |n: usize| {
            format!(
                "From x Mon Sep 17 00:00:00 2001\nSubject: [PATCH {n}/3] p{n}\n\n\
                 diff --git a/drivers/net/ethernet/aquantia/atlantic/a.c b/drivers/net/ethernet/aquantia/atlantic/a.c\n\
                 --- a/drivers/net/ethernet/aquantia/atlantic/a.c\n+++ b/drivers/net/ethernet/aquantia/atlantic/a.c\n\
                 @@ -1 +1,2 @@\n one\n+two\n"
            )
        };
        let series = toml::Value::String((1..=3).map(patch).collect());
        let text = format!(
            "name = \"s\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"atl\"\nkernel = \"debian\"\n\
             initrd = \"agent\"\nseries = [{{ name = \"s\", text = {series} }}]\n[[variant]]\nname = \"v\"\nimage = \"atl\"\n\
             [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n"
        );
        let plan = Plan::parse(std::path::Path::new("s.toml"), &text).unwrap();
        let resolved =
            || Resolved { kernel: "vmlinux".into(), bzimage: None, initrd: None, manifest: None, split: None };
        let mut asked = Vec::new();
        let images = plan.matrix.images.iter().map(|i| i.get_ref());
        let (files, unbuilt) = resolve_all(images, &mut |image| {
            asked.push(image.name.clone());
            match image.name.as_str() {
                "atl@2" => Err(ImagesError::Build(RecipeError::Refused(
                    "building atlantic\n  CC a.o\na.c:2:1: error: expected ';'".into(),
                ))),
                _ => Ok(resolved()),
            }
        })
        .unwrap();
        assert_eq!(asked, ["atl@0", "atl@1", "atl@2"], "nothing is built after the prefix that did not build");
        assert_eq!(files.keys().collect::<Vec<_>>(), ["atl@0", "atl@1"]);
        assert!(
            matches!(&unbuilt["atl@2"], Failure::BuildFailed { first_error, .. } if first_error == "a.c:2:1: error: expected ';'"),
            "{unbuilt:?}"
        );
        assert_eq!(unbuilt["atl@3"].to_string(), "not built: the series' prefix 2/3 p2 did not build");
        assert_eq!(unbuilt["atl@3"].status(), crate::record::Status::Skip);
        // The base not building is the run's error: nothing of the series can be measured.
        let images = plan.matrix.images.iter().map(|i| i.get_ref());
        let base = resolve_all(images, &mut |_| Err(ImagesError::Missing("no kernel".into())));
        assert!(matches!(base, Err(ImagesError::Missing(_))));
    }
}
