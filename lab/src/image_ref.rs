//! What a matrix's image boots: its kernel ([`KernelRef`]) and its initrd ([`InitrdRef`]), each
//! one of a few kinds written as one word in TOML (`kernel = "probe"`, `"debian:PKG"`, an image
//! ID, a path), and the patches its driver is built with ([`PatchRef`]: a file here, or its name
//! and text as a matrix sent over the API carries it). Parsed once, here; the rest of the lab
//! matches on the kind.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use guest_images::store::{ImageId, ImageKind};
use serde::{Deserialize, Serialize};

/// Why a word is no kernel or initrd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    /// An empty kernel.
    #[error("give `probe`, `debian`, a kernel image's ID or a kernel path")]
    NoKernel,
    /// `debian:` without its package.
    #[error("`debian:` needs a package, e.g. debian:linux-image-6.12.48+deb13-amd64-unsigned")]
    NoPackage,
    /// An empty initrd.
    #[error("give `agent`, an initramfs image's ID or an initrd path")]
    NoInitrd,
}

/// An image's kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KernelRef {
    /// `probe`: the embedded probe guest.
    Probe,
    /// `debian` (the newest Debian 6.12 kernel package, as `driverlab image kernel` makes it) or
    /// `debian:PACKAGE`: a recipe the lab builds into the image store before the run.
    Debian {
        /// The package, when one is named.
        package: Option<String>,
    },
    /// A kernel image's ID (`kernel-` and 16 hex digits) in the image store.
    Store(ImageId),
    /// A kernel file on this host (relative paths are from the matrix file's folder).
    Path(PathBuf),
}

impl FromStr for KernelRef {
    type Err = RefError;

    fn from_str(text: &str) -> Result<KernelRef, RefError> {
        match text {
            "" => Err(RefError::NoKernel),
            "probe" => Ok(KernelRef::Probe),
            "debian" => Ok(KernelRef::Debian { package: None }),
            _ => match text.strip_prefix("debian:") {
                Some("") => Err(RefError::NoPackage),
                Some(package) => Ok(KernelRef::Debian { package: Some(package.into()) }),
                None => Ok(ImageId::of_kind(text, ImageKind::Kernel)
                    .map_or_else(|| KernelRef::Path(text.into()), KernelRef::Store)),
            },
        }
    }
}

impl fmt::Display for KernelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelRef::Probe => f.write_str("probe"),
            KernelRef::Debian { package: None } => f.write_str("debian"),
            KernelRef::Debian { package: Some(package) } => write!(f, "debian:{package}"),
            KernelRef::Store(id) => write!(f, "{id}"),
            KernelRef::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

impl TryFrom<String> for KernelRef {
    type Error = RefError;

    fn try_from(text: String) -> Result<KernelRef, RefError> {
        text.parse()
    }
}

impl From<KernelRef> for String {
    fn from(kernel: KernelRef) -> String {
        kernel.to_string()
    }
}

/// An image's initrd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum InitrdRef {
    /// `agent`: the initramfs `driverlab image initramfs` builds for the kernel, with the driver
    /// built from the image's patches when it has any.
    Agent,
    /// An initramfs image's ID (`initramfs-` and 16 hex digits) in the image store.
    Store(ImageId),
    /// An initrd file on this host (relative paths are from the matrix file's folder).
    Path(PathBuf),
}

impl FromStr for InitrdRef {
    type Err = RefError;

    fn from_str(text: &str) -> Result<InitrdRef, RefError> {
        match text {
            "" => Err(RefError::NoInitrd),
            "agent" => Ok(InitrdRef::Agent),
            _ => Ok(ImageId::of_kind(text, ImageKind::Initramfs)
                .map_or_else(|| InitrdRef::Path(text.into()), InitrdRef::Store)),
        }
    }
}

impl fmt::Display for InitrdRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitrdRef::Agent => f.write_str("agent"),
            InitrdRef::Store(id) => write!(f, "{id}"),
            InitrdRef::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

impl TryFrom<String> for InitrdRef {
    type Error = RefError;

    fn try_from(text: String) -> Result<InitrdRef, RefError> {
        text.parse()
    }
}

impl From<InitrdRef> for String {
    fn from(initrd: InitrdRef) -> String {
        initrd.to_string()
    }
}

/// A patch file of an image's driver (`patches = [...]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PatchRef {
    /// A file on this host (relative paths are from the matrix file's folder).
    Path(PathBuf),
    /// The file's name and text (`{ name = "...", text = "..." }`): what the CLI sends a daemon
    /// in place of a path, and all a daemon takes.
    Text(guest_images::patches::PatchFile),
}

impl PatchRef {
    /// Its file name.
    pub fn name(&self) -> String {
        match self {
            PatchRef::Path(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            PatchRef::Text(file) => file.name.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_parses_and_prints_back() {
        let id = "kernel-0123456789abcdef";
        for (text, kernel) in [
            ("probe", KernelRef::Probe),
            ("debian", KernelRef::Debian { package: None }),
            ("debian:linux-image-x", KernelRef::Debian { package: Some("linux-image-x".into()) }),
            (id, KernelRef::Store(id.parse().unwrap())),
            ("vmlinux", KernelRef::Path("vmlinux".into())),
            // Not quite an ID (15 digits, upper case, another kind): a path.
            ("kernel-0123456789abcde", KernelRef::Path("kernel-0123456789abcde".into())),
            ("kernel-0123456789ABCDEF", KernelRef::Path("kernel-0123456789ABCDEF".into())),
            ("initramfs-0123456789abcdef", KernelRef::Path("initramfs-0123456789abcdef".into())),
        ] {
            assert_eq!(text.parse::<KernelRef>(), Ok(kernel.clone()), "{text}");
            assert_eq!(kernel.to_string(), text);
        }
        assert!("".parse::<KernelRef>().is_err());
        assert!("debian:".parse::<KernelRef>().is_err());
        let id = "initramfs-0123456789abcdef";
        for (text, initrd) in [
            ("agent", InitrdRef::Agent),
            (id, InitrdRef::Store(id.parse().unwrap())),
            ("../initrd.img", InitrdRef::Path("../initrd.img".into())),
        ] {
            assert_eq!(text.parse::<InitrdRef>(), Ok(initrd.clone()), "{text}");
            assert_eq!(initrd.to_string(), text);
        }
        assert!("".parse::<InitrdRef>().is_err());
    }

    #[test]
    fn serde_takes_and_gives_the_word() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Image {
            kernel: KernelRef,
            initrd: Option<InitrdRef>,
        }
        let image: Image = toml::from_str("kernel = \"debian\"\ninitrd = \"agent\"").unwrap();
        assert_eq!(image, Image { kernel: KernelRef::Debian { package: None }, initrd: Some(InitrdRef::Agent) });
        assert_eq!(toml::to_string(&image).unwrap(), "kernel = \"debian\"\ninitrd = \"agent\"\n");
        let err = toml::from_str::<Image>("kernel = \"\"").unwrap_err();
        assert!(err.message().contains("give `probe`"), "{err}");
    }

    #[test]
    fn a_patch_is_a_path_or_its_name_and_text() {
        #[derive(Debug, Deserialize, Serialize)]
        struct Image {
            patches: Vec<PatchRef>,
        }
        let image: Image =
            toml::from_str("patches = [\"p/000.patch\", { name = \"001.patch\", text = \"Subject: x\" }]").unwrap();
        assert_eq!(image.patches[0], PatchRef::Path("p/000.patch".into()));
        assert_eq!(image.patches[1].name(), "001.patch");
        assert!(matches!(&image.patches[1], PatchRef::Text(f) if f.text == "Subject: x"));
        assert!(toml::from_str::<Image>("patches = [{ name = \"x\" }]").is_err(), "a text is needed");
        let back: Image = toml::from_str(&toml::to_string(&image).unwrap()).unwrap();
        assert_eq!(back.patches, image.patches);
    }
}
