//! Image recipes: a matrix's `kernel = "debian"` (or `"debian:PACKAGE"`) and `initrd = "agent"`
//! with the driver built from the image's `patches`. What builds them is a [`RecipeBuilder`]:
//! this host's image store, or a daemon's (the CLI's `lab pin --url`). A built recipe is pinned:
//! the matrix then names the images by ID. And a matrix sent to a daemon carries its patches'
//! texts, never their paths ([`inline_patches`]).

use std::path::{Path, PathBuf};

use guest_images::initramfs_build::{self, GuestTool, InitramfsRequest};
use guest_images::module_build::{self, ModuleRequest, SourceSpec};
use guest_images::patches::PatchFile;
use guest_images::store::{ImageError, ImageStore};

use crate::failure::Failure;
use crate::matrix::{Image, InitrdRef, KernelRef, Matrix, PatchRef, PinnedPrefix, SeriesStep};

/// Why a recipe was not built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    /// Its own inputs are wrong: a patch that is missing or does not apply, a folder that is no
    /// driver's, a package that is no kernel.
    #[error("{0}")]
    Refused(String),
    /// The build failed: a download, a compiler, the daemon that builds.
    #[error("{0}")]
    Failed(String),
}

impl RecipeError {
    /// The same, said of `image`.
    fn of(self, image: &str) -> RecipeError {
        match self {
            RecipeError::Refused(e) => RecipeError::Refused(format!("image {image:?}: {e}")),
            RecipeError::Failed(e) => RecipeError::Failed(format!("image {image:?}: {e}")),
        }
    }
}

impl From<ImageError> for RecipeError {
    fn from(e: ImageError) -> RecipeError {
        let missing_file = matches!(&e, ImageError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        if e.is_bad_input() || missing_file {
            RecipeError::Refused(e.to_string())
        } else {
            RecipeError::Failed(e.to_string())
        }
    }
}

/// What builds a recipe's parts; each gives the ID of the image it built (or found built: the
/// builds are content-addressed) or why it could not.
pub trait RecipeBuilder {
    /// A kernel image of Debian's `package` (the newest 6.12 when none).
    fn kernel(&self, package: Option<&str>) -> Result<String, RecipeError>;
    /// A module image: a driver's folder with patches, built against a kernel image.
    fn module(&self, request: &ModuleRequest) -> Result<String, RecipeError>;
    /// An initramfs image with the agent, module images and the kernel's own drivers.
    fn initramfs(&self, request: &InitramfsRequest) -> Result<String, RecipeError>;
}

/// This host's image store builds them itself.
impl RecipeBuilder for ImageStore {
    fn kernel(&self, package: Option<&str>) -> Result<String, RecipeError> {
        Ok(guest_images::kernel_image::from_package(self, package)?.id)
    }

    fn module(&self, request: &ModuleRequest) -> Result<String, RecipeError> {
        Ok(module_build::build(self, request)?.id)
    }

    fn initramfs(&self, request: &InitramfsRequest) -> Result<String, RecipeError> {
        Ok(initramfs_build::build(self, request)?.id)
    }
}

/// Whether the lab builds `image` (a `debian` kernel or the `agent` initramfs).
pub fn is_recipe(image: &Image) -> bool {
    image.is_debian_kernel() || image.is_agent_initrd()
}

/// Builds an image's recipe with `builder`: the image's kernel and initrd with a recipe replaced
/// by the ID of what it built (the image's own for one that is no recipe). `resolve` turns the
/// matrix's relative paths (patches) into paths.
pub fn build(
    resolve: &dyn Fn(&Path) -> PathBuf,
    tools: &[GuestTool],
    image: &Image,
    builder: &dyn RecipeBuilder,
) -> Result<(KernelRef, Option<InitrdRef>), RecipeError> {
    if !is_recipe(image) {
        return Ok((image.kernel.clone(), image.initrd.clone()));
    }
    let of_image = |e: RecipeError| e.of(&image.name);
    // What a builder gave back is an image ID, or the builder is broken.
    let built = |e: String| RecipeError::Failed(format!("image {:?}: the builder gave {e}", image.name));
    let kernel = match &image.kernel {
        KernelRef::Debian { package } => {
            let package = package.as_deref();
            tracing::info!("image {:?}: the Debian kernel {}", image.name, package.unwrap_or("(newest 6.12)"));
            builder.kernel(package).map_err(of_image)?
        }
        KernelRef::Store(id) => id.to_string(),
        other => {
            let why = format!("initrd = \"agent\" is built for a kernel image, not {other}");
            return Err(RecipeError::Refused(why).of(&image.name));
        }
    };
    let initrd = if image.is_agent_initrd() {
        let id = agent_initramfs(resolve, tools, image, &kernel, builder).map_err(of_image)?;
        Some(InitrdRef::Store(id.parse().map_err(built)?))
    } else {
        image.initrd.clone()
    };
    Ok((KernelRef::Store(kernel.parse().map_err(built)?), initrd))
}

/// The agent's initramfs for `kernel`: with the driver built from the image's patches, or the
/// kernel's own driver when there are none, and the programs `tools` beyond every image's.
fn agent_initramfs(
    resolve: &dyn Fn(&Path) -> PathBuf,
    tools: &[GuestTool],
    image: &Image,
    kernel: &str,
    builder: &dyn RecipeBuilder,
) -> Result<String, RecipeError> {
    let module = image.module_name();
    let patches = patch_files(image, resolve)?;
    let mut modules = Vec::new();
    if !patches.is_empty() {
        tracing::info!("image {:?}: building {} with {} patch(es)", image.name, image.driver, patches.len());
        let request = ModuleRequest {
            driver: image.driver.clone(),
            patches,
            source: SourceSpec::default(),
            kernel: kernel.to_string(),
            headers: None,
            // The folder's own module builds as the folder; another one alone.
            only: if image.driver.ends_with(&format!("/{module}")) { Vec::new() } else { vec![module.clone()] },
        };
        modules.push(builder.module(&request)?);
    }
    let drivers = if modules.is_empty() { vec![module] } else { Vec::new() };
    builder.initramfs(&InitramfsRequest { kernel: kernel.to_string(), modules, drivers, tools: tools.to_vec() })
}

/// The files of an image's patches: read here (paths through `resolve`), or as the matrix
/// carries them.
pub fn patch_files(image: &Image, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<Vec<PatchFile>, ImageError> {
    read_patches(&image.patches, resolve)
}

/// The files `refs` name: read here (paths through `resolve`; a folder gives its files in name
/// order, as `git format-patch` numbers them), or as the matrix carries them.
pub fn read_patches(refs: &[PatchRef], resolve: &dyn Fn(&Path) -> PathBuf) -> Result<Vec<PatchFile>, ImageError> {
    let mut files = Vec::new();
    for patch in refs {
        match patch {
            PatchRef::Text(file) => files.push(file.clone()),
            PatchRef::Path(path) => {
                let path = resolve(path);
                if !path.is_dir() {
                    files.push(PatchFile::read(&path)?);
                    continue;
                }
                let io = |source| ImageError::Io { path: path.clone(), source };
                let mut inside: Vec<PathBuf> =
                    std::fs::read_dir(&path).map_err(io)?.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
                inside.sort();
                if inside.is_empty() {
                    return Err(ImageError::Invalid(format!("{}: an empty folder: no patch in it", path.display())));
                }
                for file in inside {
                    files.push(PatchFile::read(&file)?);
                }
            }
        }
    }
    Ok(files)
}

/// The matrix `text` (read from `file`) with every recipe image built by `builder` and named by
/// its image IDs instead (`kernel`, `initrd`; `patches`, `driver` and `module` gone): what
/// `driverlab lab pin` prints, and what a daemon that reads this host's image store but builds
/// nothing (the nested lab box) is sent. Progress through `note`. The rest of the matrix is left
/// as it is, for the daemon to check with its own devices.
pub fn pin_recipes(
    file: &Path,
    text: &str,
    builder: &dyn RecipeBuilder,
    note: &dyn Fn(&str),
) -> Result<String, RecipeError> {
    let resolve = beside(file);
    let tools = tools_of(text);
    edit_images(text, &mut |image, fields| {
        if !is_recipe(&image) {
            return Ok(false);
        }
        if !image.series.is_empty() {
            pin_series(&resolve, &tools, image, fields, builder, note)?;
            return Ok(true);
        }
        let (kernel, initrd) = build(&resolve, &tools, &image, builder)?;
        pin(fields, &kernel, initrd.as_ref());
        let initrd = initrd.map(|i| format!(", initrd {i}")).unwrap_or_default();
        note(&format!("image {}: kernel {kernel}{initrd}", image.name));
        Ok(true)
    })
}

/// A series' image table with its files' texts and what each prefix built (`pinned`): the
/// prefixes in order until one does not build, which is pinned as its first error (the
/// daemon records its BUILD-FAIL and skips the rest); the base not building is the error.
fn pin_series(
    resolve: &dyn Fn(&Path) -> PathBuf,
    tools: &[GuestTool],
    mut image: Image,
    fields: &mut toml::Table,
    builder: &dyn RecipeBuilder,
    note: &dyn Fn(&str),
) -> Result<(), RecipeError> {
    let name = image.name.clone();
    let of_image = |e: RecipeError| e.of(&name);
    let files = read_patches(&image.series, resolve).map_err(|e| of_image(e.into()))?;
    image.series = files.iter().cloned().map(PatchRef::Text).collect();
    let prefixes = crate::matrix::series::prefix_images(&image).map_err(|e| of_image(RecipeError::Refused(e)))?;
    let mut pinned = Vec::new();
    for prefix in &prefixes {
        let position = prefix.step.as_ref().map(SeriesStep::position).unwrap_or_default();
        match build(resolve, tools, prefix, builder) {
            Ok((kernel, initrd)) => {
                note(&format!("image {name} {position}: kernel {kernel}{}", initrd_words(initrd.as_ref())));
                pinned.push(PinnedPrefix { kernel: Some(kernel), initrd, build_failed: None });
            }
            Err(e) if prefix.step.as_ref().is_some_and(|s| s.index > 0) => {
                note(&format!("image {name} {position}: did not build: {e}"));
                let first_error = match Failure::build_failed(e.to_string()) {
                    Failure::BuildFailed { first_error, .. } => first_error,
                    other => other.to_string(),
                };
                pinned.push(PinnedPrefix { build_failed: Some(first_error), ..PinnedPrefix::default() });
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let texts = toml::Value::try_from(files).map_err(|e| RecipeError::Failed(e.to_string()))?;
    let pins = toml::Value::try_from(pinned).map_err(|e| RecipeError::Failed(e.to_string()))?;
    fields.insert("series".into(), texts);
    fields.insert("pinned".into(), pins);
    // The base's patches go as texts too: a daemon opens no file a matrix names.
    if !image.patches.is_empty() {
        let base = patch_files(&image, resolve).map_err(|e| of_image(e.into()))?;
        fields.insert("patches".into(), toml::Value::try_from(base).map_err(|e| RecipeError::Failed(e.to_string()))?);
    }
    Ok(())
}

fn initrd_words(initrd: Option<&InitrdRef>) -> String {
    initrd.map(|i| format!(", initrd {i}")).unwrap_or_default()
}

/// An image's table with its recipe replaced by what it built.
fn pin(fields: &mut toml::Table, kernel: &KernelRef, initrd: Option<&InitrdRef>) {
    fields.insert("kernel".into(), toml::Value::String(kernel.to_string()));
    match initrd {
        Some(initrd) => fields.insert("initrd".into(), toml::Value::String(initrd.to_string())),
        None => fields.remove("initrd"),
    };
    for key in ["patches", "driver", "module"] {
        fields.remove(key);
    }
}

/// The matrix `text` (read from `file`) with each patch file an image names replaced by its
/// name and text (`{ name = "...", text = "..." }`): what a daemon is sent, since it opens no
/// file a request names.
pub fn inline_patches(file: &Path, text: &str) -> Result<String, RecipeError> {
    inline(file, text, &["patches", "series"])
}

/// The matrix `text` (read from `file`) with each file of an image's `series` replaced by its
/// name and text, a folder by its files: what a run stores, so that its prefixes are the same
/// when it is resumed or reported, whatever becomes of the files.
pub fn inline_series(file: &Path, text: &str) -> Result<String, RecipeError> {
    inline(file, text, &["series"])
}

/// The matrix `text` with the patch files of the image fields `which` inlined.
fn inline(file: &Path, text: &str, which: &[&str]) -> Result<String, RecipeError> {
    let resolve = beside(file);
    edit_images(text, &mut |image, fields| {
        let mut changed = false;
        for (field, refs) in [("patches", &image.patches), ("series", &image.series)] {
            if !which.contains(&field) || refs.iter().all(|p| matches!(p, PatchRef::Text(_))) {
                continue;
            }
            let files = read_patches(refs, &resolve).map_err(|e| RecipeError::from(e).of(&image.name))?;
            let texts = toml::Value::try_from(files).map_err(|e| RecipeError::Failed(e.to_string()))?;
            fields.insert(field.into(), texts);
            changed = true;
        }
        Ok(changed)
    })
}

/// The programs the workloads of the matrix `text` need in its images (none where it does not
/// parse: the matrix's own check refuses it later, with its line).
fn tools_of(text: &str) -> Vec<GuestTool> {
    Matrix::from_toml(Path::new("matrix"), text).map(|m| m.guest_tools()).unwrap_or_default()
}

/// Relative paths of the matrix at `file` resolved from its folder.
fn beside(file: &Path) -> impl Fn(&Path) -> PathBuf {
    let base = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    move |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) }
}

/// The matrix `text` with `edit` applied to each `[[image]]` table, given the image it parses
/// into (`edit` says whether it changed the table); the text as it was, comments and all, when no
/// table changed. An image that does not parse is left for the matrix's own check to refuse,
/// with its line.
fn edit_images<E: From<String>>(
    text: &str,
    edit: &mut dyn FnMut(Image, &mut toml::Table) -> Result<bool, E>,
) -> Result<String, E> {
    let Ok(mut table) = text.parse::<toml::Table>() else { return Ok(text.to_string()) };
    let Some(toml::Value::Array(images)) = table.get_mut("image") else { return Ok(text.to_string()) };
    let mut changed = false;
    for entry in images.iter_mut() {
        let Ok(image) = entry.clone().try_into::<Image>() else { continue };
        if let toml::Value::Table(fields) = entry {
            changed |= edit(image, fields)?;
        }
    }
    if !changed {
        return Ok(text.to_string());
    }
    toml::to_string(&table).map_err(|e| E::from(e.to_string()))
}

impl From<String> for RecipeError {
    fn from(e: String) -> RecipeError {
        RecipeError::Failed(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A builder that builds nothing and says what it was asked.
    #[derive(Default)]
    struct Asked(RefCell<Vec<String>>);

    impl RecipeBuilder for Asked {
        fn kernel(&self, package: Option<&str>) -> Result<String, RecipeError> {
            self.0.borrow_mut().push(format!("kernel {package:?}"));
            Ok("kernel-00000000000000aa".into())
        }
        fn module(&self, request: &ModuleRequest) -> Result<String, RecipeError> {
            let names: Vec<&str> = request.patches.iter().map(|p| p.name.as_str()).collect();
            self.0
                .borrow_mut()
                .push(format!("module {} {} {names:?} {:?}", request.kernel, request.driver, request.only));
            Ok("module-00000000000000bb".into())
        }
        fn initramfs(&self, request: &InitramfsRequest) -> Result<String, RecipeError> {
            self.0
                .borrow_mut()
                .push(format!("initramfs {} {:?} {:?}", request.kernel, request.modules, request.drivers));
            Ok("initramfs-00000000000000cc".into())
        }
    }

    const MATRIX: &str = "# a comment\nname = \"m\"\n\n[[image]]\nname = \"stock\"\nkernel = \"debian\"\ninitrd = \"agent\"\n\n\
                          [[image]]\nname = \"patched\"\nkernel = \"debian\"\ninitrd = \"agent\"\npatches = [\"p/000.patch\"]\n\n\
                          [[image]]\nname = \"probe\"\nkernel = \"probe\"\n";

    #[test]
    fn pinning_builds_each_recipe_and_names_its_images() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("p")).unwrap();
        std::fs::write(dir.path().join("p/000.patch"), "Subject: [PATCH] x\n").unwrap();
        let asked = Asked::default();
        let pinned = pin_recipes(&dir.path().join("m.toml"), MATRIX, &asked, &|_| ()).unwrap();
        let table: toml::Table = pinned.parse().unwrap();
        let images = table["image"].as_array().unwrap();
        for image in &images[..2] {
            assert_eq!(image["kernel"].as_str(), Some("kernel-00000000000000aa"));
            assert_eq!(image["initrd"].as_str(), Some("initramfs-00000000000000cc"));
            assert!(image.get("patches").is_none(), "{image}");
        }
        assert_eq!(images[2]["kernel"].as_str(), Some("probe"), "no recipe, as it was");
        let asked = asked.0.into_inner();
        assert_eq!(asked[1], "initramfs kernel-00000000000000aa [] [\"atlantic\"]", "stock: the kernel's own driver");
        assert_eq!(
            asked[3], "module kernel-00000000000000aa drivers/net/ethernet/aquantia/atlantic [\"000.patch\"] []",
            "the patched driver"
        );
        assert_eq!(asked[4], "initramfs kernel-00000000000000aa [\"module-00000000000000bb\"] []");
    }

    /// A builder whose module builds fail from the `fails_at`th patch on.
    struct FailsAt(usize);

    impl RecipeBuilder for FailsAt {
        fn kernel(&self, _: Option<&str>) -> Result<String, RecipeError> {
            Ok("kernel-00000000000000aa".into())
        }
        fn module(&self, request: &ModuleRequest) -> Result<String, RecipeError> {
            match request.patches.len() >= self.0 {
                true => Err(RecipeError::Failed("building atlantic\na.c:2:1: error: expected ';'".into())),
                false => Ok(format!("module-00000000000000{:02x}", request.patches.len())),
            }
        }
        fn initramfs(&self, request: &InitramfsRequest) -> Result<String, RecipeError> {
            Ok(format!("initramfs-00000000000000{:02x}", request.modules.len() + 0xc0))
        }
    }

    #[test]
    fn a_series_is_pinned_prefix_by_prefix_until_one_does_not_build() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("s")).unwrap();
        for n in 1..=3 {
            let patch = format!(
                "Subject: [PATCH {n}/3] p{n}\n\ndiff --git a/drivers/net/ethernet/aquantia/atlantic/a.c \
                 b/drivers/net/ethernet/aquantia/atlantic/a.c\n--- a/drivers/net/ethernet/aquantia/atlantic/a.c\n\
                 +++ b/drivers/net/ethernet/aquantia/atlantic/a.c\n@@ -1 +1,2 @@\n one\n+two\n"
            );
            std::fs::write(dir.path().join(format!("s/000{n}.patch")), patch).unwrap();
        }
        let text = "name = \"m\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"atl\"\n\
                    kernel = \"debian\"\ninitrd = \"agent\"\nseries = [\"s\"]\n[[variant]]\nname = \"v\"\nimage = \"atl\"\n\
                    [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n";
        let file = dir.path().join("m.toml");
        let noted = RefCell::new(Vec::new());
        let pinned = pin_recipes(&file, text, &FailsAt(2), &|line| noted.borrow_mut().push(line.to_string())).unwrap();
        let table: toml::Table = pinned.parse().unwrap();
        let pins = table["image"][0]["pinned"].as_array().unwrap();
        assert_eq!(pins.len(), 3, "the base, 1/3, and 2/3 which did not build: {pinned}");
        assert_eq!(pins[1]["initrd"].as_str(), Some("initramfs-00000000000000c1"));
        assert_eq!(pins[2]["build_failed"].as_str(), Some("a.c:2:1: error: expected ';'"));
        assert!(table["image"][0]["series"][0]["text"].as_str().unwrap().contains("p1"), "the series' texts go along");
        assert!(noted.borrow().iter().any(|l| l.contains("2/3: did not build")), "{:?}", noted.borrow());
        // The daemon's side: pinned prefixes are image IDs, 2/3 its BUILD-FAIL, 3/3 never built.
        let plan = crate::matrix::Plan::parse(&dir.path().join("elsewhere.toml"), &pinned).unwrap();
        let image = |name: &str| plan.image(name).unwrap().clone();
        assert_eq!(image("atl@1").kernel.to_string(), "kernel-00000000000000aa");
        assert!(!is_recipe(&image("atl@1")) && image("atl@1").patches.is_empty());
        assert_eq!(image("atl@2").unbuilt.as_deref(), Some("a.c:2:1: error: expected ';'"));
        assert_eq!(plan.cells.len(), 4);
        // A pinned list that does not fit its series is refused.
        let short = pinned.replace("build_failed = \"a.c:2:1: error: expected ';'\"", "");
        let e = crate::matrix::Plan::parse(&file, &short).unwrap_err();
        assert!(e.to_string().contains("image[0].pinned"), "{e}");
    }

    #[test]
    fn a_matrix_for_a_daemon_carries_its_patches_texts_and_is_otherwise_as_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("p")).unwrap();
        std::fs::write(dir.path().join("p/000.patch"), "Subject: [PATCH] x\n").unwrap();
        let file = dir.path().join("m.toml");
        let sent = inline_patches(&file, MATRIX).unwrap();
        let table: toml::Table = sent.parse().unwrap();
        let patch = &table["image"][1]["patches"][0];
        assert_eq!((patch["name"].as_str(), patch["text"].as_str()), (Some("000.patch"), Some("Subject: [PATCH] x\n")));
        let image: Image = table["image"][1].clone().try_into().unwrap();
        assert!(matches!(&image.patches[0], PatchRef::Text(f) if f.name == "000.patch"));
        let plain = MATRIX.replace("patches = [\"p/000.patch\"]\n", "");
        assert_eq!(inline_patches(&file, &plain).unwrap(), plain, "nothing to send: the text as written");
        let missing = inline_patches(&dir.path().join("elsewhere/m.toml"), MATRIX).unwrap_err();
        assert!(matches!(&missing, RecipeError::Refused(e) if e.contains("patched")), "{missing}");
    }
}
