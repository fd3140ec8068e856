//! The image store: a content-addressed cache of kernels, driver modules and initramfs archives,
//! each in a folder named by its ID with a `manifest.json` that says what it is made of.
//!
//! ```text
//! ~/.cache/driverlab/images/
//!   kernel-3fa9c1d27e5b8a40/     manifest.json bzImage vmlinux config lib/modules/RELEASE/...
//!   module-8c21f0e94b1d7a66/     manifest.json atlantic.ko
//!   initramfs-5d0e7b3a9c4f1e28/  manifest.json initramfs.cpio.gz
//! ```
//!
//! An ID is the kind and the first 16 hex digits of a SHA-256 over what identifies the image
//! (the kernel's bytes, the module's sources and patches, the archive's bytes).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Errors of the image store and the image commands.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file or folder cannot be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A tool the step needs failed (apt-get, dpkg-deb, patch, make, ...).
    #[error("{what}: {detail}")]
    Tool {
        /// What was being done.
        what: String,
        /// The tool's last words.
        detail: String,
    },
    /// The input is not what the command needs (the user's to fix).
    #[error("{0}")]
    Invalid(String),
    /// No image with this ID.
    #[error("no image {0} in the image store (`driverlab image list` lists them)")]
    NoImage(String),
    /// A kernel image could not be taken apart.
    #[error(transparent)]
    Kernel(#[from] crate::kernel::KernelError),
    /// A module could not be read.
    #[error(transparent)]
    Module(#[from] crate::modules::ModuleError),
}

impl ImageError {
    /// True when the input is at fault, not the host.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, ImageError::Invalid(_) | ImageError::NoImage(_))
    }
}

/// Reads a file, naming it in the error.
pub fn read(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(|source| ImageError::Io { path: path.to_path_buf(), source })
}

/// Writes a file, naming it in the error.
pub fn write(path: &Path, data: &[u8]) -> Result<(), ImageError> {
    std::fs::write(path, data).map_err(|source| ImageError::Io { path: path.to_path_buf(), source })
}

/// Makes a folder and its parents.
pub fn mkdir(path: &Path) -> Result<(), ImageError> {
    std::fs::create_dir_all(path).map_err(|source| ImageError::Io { path: path.to_path_buf(), source })
}

/// Hex SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The kinds of image the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// A test kernel (bzImage, vmlinux, modules, headers).
    Kernel,
    /// A driver variant's modules, built out of tree.
    Module,
    /// An initramfs with the guest agent.
    Initramfs,
}

impl ImageKind {
    /// Every kind.
    pub const ALL: [ImageKind; 3] = [ImageKind::Kernel, ImageKind::Module, ImageKind::Initramfs];

    /// Its name: what an ID of its images starts with.
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::Kernel => "kernel",
            ImageKind::Module => "module",
            ImageKind::Initramfs => "initramfs",
        }
    }
}

impl std::fmt::Display for ImageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How many hex digits follow an image ID's kind.
const ID_DIGITS: usize = 16;

/// Whether `id` is an ID of an image of `kind` as [`image_id`] makes them: `KIND-` and 16
/// lowercase hex digits, so that it can name nothing but a folder of the store.
pub fn is_image_id_of(id: &str, kind: ImageKind) -> bool {
    id.strip_prefix(kind.name())
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|h| h.len() == ID_DIGITS && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
}

/// Whether `id` is an image ID of any kind.
pub fn is_image_id(id: &str) -> bool {
    ImageKind::ALL.into_iter().any(|kind| is_image_id_of(id, kind))
}

/// An image's ID, checked: `KIND-` and 16 lowercase hex digits ([`is_image_id`]), so that it
/// names nothing but a folder of the store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ImageId(String);

impl ImageId {
    /// `text` as the ID of an image of `kind`, if it is one.
    pub fn of_kind(text: &str, kind: ImageKind) -> Option<ImageId> {
        is_image_id_of(text, kind).then(|| ImageId(text.to_string()))
    }

    /// Its kind.
    pub fn kind(&self) -> ImageKind {
        ImageKind::ALL.into_iter().find(|&kind| is_image_id_of(&self.0, kind)).unwrap_or(ImageKind::Kernel)
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ImageId {
    type Err = String;

    fn from_str(text: &str) -> Result<ImageId, String> {
        ImageKind::ALL.into_iter().find_map(|kind| ImageId::of_kind(text, kind)).ok_or_else(|| {
            let kinds = ImageKind::ALL.map(ImageKind::name).join(", ");
            format!("{text:?} is no image ID: give KIND- and {ID_DIGITS} lowercase hex digits, KIND one of {kinds}")
        })
    }
}

impl std::fmt::Display for ImageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An ID from the parts that identify an image: `KIND-` and 16 hex digits.
pub fn image_id(kind: ImageKind, parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    format!("{kind}-{}", &hex(&hasher.finalize())[..ID_DIGITS])
}

/// The image store.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

/// The default store: `$DRIVERLAB_IMAGES`, else `images` in driverlab's cache folder
/// (`$DRIVERLAB_CACHE`, `$XDG_CACHE_HOME/driverlab`, `~/.cache/driverlab`).
pub fn default_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("DRIVERLAB_IMAGES") {
        return PathBuf::from(dir);
    }
    cache_dir().join("images")
}

/// driverlab's cache folder, shared with the scripts.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DRIVERLAB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("driverlab");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("driverlab")
}

impl ImageStore {
    /// The store at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ImageStore { root: root.into() }
    }

    /// Its folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of image `id`.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// A scratch folder inside the store, for building an image before it gets its ID.
    pub fn scratch(&self, what: &str) -> Result<PathBuf, ImageError> {
        let dir = self.root.join(format!(".build-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        mkdir(&dir)?;
        Ok(dir)
    }

    /// Moves a built folder into place as image `id`, unless the image exists already (the same
    /// ID is the same content). Returns the image's folder.
    pub fn commit(&self, scratch: &Path, id: &str) -> Result<PathBuf, ImageError> {
        let dir = self.dir(id);
        if dir.join("manifest.json").exists() {
            let _ = std::fs::remove_dir_all(scratch);
            return Ok(dir);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(scratch, &dir).map_err(|source| ImageError::Io { path: dir.clone(), source })?;
        Ok(dir)
    }

    /// Reads image `id`'s manifest.
    pub fn manifest<T: DeserializeOwned>(&self, id: &str) -> Result<T, ImageError> {
        if id.is_empty() || id.contains(['/', '.']) {
            return Err(ImageError::Invalid(format!("{id:?} is not an image ID")));
        }
        let path = self.dir(id).join("manifest.json");
        if !path.exists() {
            return Err(ImageError::NoImage(id.to_string()));
        }
        let text = read(&path)?;
        serde_json::from_slice(&text).map_err(|e| ImageError::Invalid(format!("{}: {e}", path.display())))
    }

    /// Every image: ID and manifest as JSON.
    pub fn list(&self) -> Result<Vec<(String, serde_json::Value)>, ImageError> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Ok(out) };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if let Ok(value) = self.manifest::<serde_json::Value>(&name) {
                out.push((name, value));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Writes `manifest` as `dir/manifest.json`.
pub fn write_manifest<T: Serialize>(dir: &Path, manifest: &T) -> Result<(), ImageError> {
    let text = serde_json::to_vec_pretty(manifest).expect("a manifest always serializes");
    write(&dir.join("manifest.json"), &text)
}

/// Runs a tool, failing with its last lines of output.
pub fn run_tool(command: &mut std::process::Command, what: &str) -> Result<std::process::Output, ImageError> {
    let out = command.output().map_err(|e| ImageError::Tool {
        what: what.to_string(),
        detail: format!("cannot run {:?}: {e}", command.get_program()),
    })?;
    if !out.status.success() {
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(12)..];
        // A compiler's first error is what to fix; it comes before the tail when errors pile up.
        let first_error = lines.iter().position(|l| l.contains("error:"));
        let detail = match first_error {
            Some(i) if i < lines.len().saturating_sub(12) => format!("{}\n...\n{}", lines[i], tail.join("\n")),
            _ => tail.join("\n"),
        };
        return Err(ImageError::Tool { what: what.to_string(), detail });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_id_is_checked_once_and_knows_its_kind() {
        let id: ImageId = "initramfs-0146cab9f2596029".parse().unwrap();
        assert_eq!((id.kind(), id.as_str()), (ImageKind::Initramfs, "initramfs-0146cab9f2596029"));
        assert_eq!(ImageId::of_kind("initramfs-0146cab9f2596029", ImageKind::Kernel), None);
        for bad in ["kernel-", "kernel-0146CAB9F2596029", "kernel-0146cab9f25960290", "../kernel-0146cab9f2596029"] {
            assert!(bad.parse::<ImageId>().unwrap_err().contains("no image ID"), "{bad}");
        }
    }

    #[test]
    fn ids_depend_on_every_part_and_its_boundaries() {
        let a = image_id(ImageKind::Module, &[b"ab", b"c"]);
        assert_eq!(a.len(), "module-".len() + 16);
        assert_ne!(a, image_id(ImageKind::Module, &[b"a", b"bc"]));
        assert_eq!(a, image_id(ImageKind::Module, &[b"ab", b"c"]));
        assert!(is_image_id(&a) && is_image_id_of(&a, ImageKind::Module) && !is_image_id_of(&a, ImageKind::Kernel));
        for bad in ["module-", "module-0", "module-../../etc/x", "modules-0123456789abcdef", "kernel-0123456789ABCDEF"]
        {
            assert!(!is_image_id(bad), "{bad}");
        }
        assert_eq!(sha256(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn commit_keeps_the_first_copy_and_manifests_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::new(dir.path());
        let scratch = store.scratch("t").unwrap();
        write_manifest(&scratch, &serde_json::json!({"id": "x-1"})).unwrap();
        let committed = store.commit(&scratch, "x-1").unwrap();
        assert!(committed.join("manifest.json").exists() && !scratch.exists());
        let again = store.scratch("t").unwrap();
        store.commit(&again, "x-1").unwrap();
        assert!(!again.exists());
        assert_eq!(store.list().unwrap().len(), 1);
        assert!(matches!(store.manifest::<serde_json::Value>("x-2"), Err(ImageError::NoImage(_))));
        assert!(matches!(store.manifest::<serde_json::Value>("../etc"), Err(ImageError::Invalid(_))));
    }
}
