//! `driverlab engine setup qemu`: the QEMU engine's chroot, Debian forky minbase with
//! `qemu-system-x86` (QEMU 11: a vfio-user client, which bookworm's 7.2 lacks), made once with
//! debootstrap in driverlab's cache and kept. [`crate::qemu::Qemu::find`] takes a chroot only
//! once it is complete: its marker file names the package list it was made with; an interrupted
//! set-up leaves a `.partial` folder that the next one removes and redoes.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::qemu::{MARKER, PACKAGES, Qemu};

/// The devices the lab's QEMU command lines use: a chroot whose QEMU lacks one is refused now,
/// not in the middle of a check.
const NEEDED_DEVICES: [&str; 3] = ["vfio-user-pci", "virtio-iommu-pci", "e1000e"];
/// Bookworm's debootstrap has no script named forky; forky is a testing suite like sid, so sid's
/// script fits (bookworm's keyring verifies forky's Release file).
const DEBOOTSTRAP_SCRIPT: &str = "/usr/share/debootstrap/scripts/sid";
/// The mirror when the host's apt sources name none.
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Why the chroot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Making it takes root (debootstrap, apt).
    #[error("setting QEMU up needs root (debootstrap): run `sudo driverlab engine setup qemu`")]
    NotRoot,
    /// A file or folder of the cache.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A folder to delete has something mounted below it: deleting it would delete the host's
    /// files through the mount.
    #[error("refusing to delete {dir}: {mounts} mounted below it; unmount (umount -R PATH) and run again", dir = dir.display())]
    Mounted {
        /// The folder.
        dir: PathBuf,
        /// What is mounted there.
        mounts: String,
    },
    /// A command failed.
    #[error("{command} failed: {detail}")]
    Command {
        /// The command.
        command: String,
        /// What it said, or what to do.
        detail: String,
    },
    /// The chroot's QEMU lacks a device the lab uses.
    #[error("the chroot's QEMU ({version}) has no {device} device; is forky's qemu-system-x86 older than 11?")]
    MissingDevice {
        /// Its version line.
        version: String,
        /// The device.
        device: &'static str,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SetupError {
    let what = what.into();
    move |source| SetupError::Io { what, source }
}

/// Makes the chroot at `root` unless a complete one is there; progress through `note`. Returns
/// the QEMU in it. `mirror` is the Debian mirror (default: the host's, see [`host_mirror`]).
pub fn set_up(root: &Path, mirror: Option<&str>, note: &dyn Fn(&str)) -> Result<Qemu, SetupError> {
    if let Ok(qemu) = Qemu::find(root) {
        return Ok(qemu);
    }
    if !rustix::process::geteuid().is_root() {
        return Err(SetupError::NotRoot);
    }
    let parent = root.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    // Two set-ups at once must not debootstrap into the same folder.
    let lock_path = root.with_extension("lock");
    let lock = File::create(&lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io(format!("locking {}", lock_path.display()))(e.into()))?;
    // Another set-up may have finished while this one waited.
    if let Ok(qemu) = Qemu::find(root) {
        return Ok(qemu);
    }
    let partial = root.with_extension("partial");
    for (dir, why) in [(root, "stale or incomplete; recreating it"), (&partial, "the remains of an interrupted set-up")]
    {
        if dir.exists() {
            note(&format!("removing {}: {why}", dir.display()));
            remove_unmounted(dir)?;
        }
    }
    if !Path::new(DEBOOTSTRAP_SCRIPT).exists() {
        note("installing debootstrap");
        apt_install("debootstrap")?;
    }
    let mirror = mirror.map_or_else(host_mirror, str::to_string);
    note(&format!("debootstrap forky ({PACKAGES}) from {mirror} into {} (about 75 s and 410 MB)", partial.display()));
    let start = Instant::now();
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={}", PACKAGES.replace(' ', ","))])
        .args(["forky".as_ref(), partial.as_os_str(), mirror.as_ref(), DEBOOTSTRAP_SCRIPT.as_ref()])
        // Its progress on the caller's stderr; stdout stays for the chroot's path.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(io("running debootstrap"))?;
    if !status.success() {
        return Err(SetupError::Command {
            command: "debootstrap".into(),
            detail: format!(
                "see {}/debootstrap/debootstrap.log; check that {mirror} is reachable (or set DRIVERLAB_DEBIAN_MIRROR), then run again",
                partial.display()
            ),
        });
    }
    check_devices(&partial)?;
    let mut marker = File::create(partial.join(MARKER)).map_err(io("writing the marker"))?;
    writeln!(marker, "{PACKAGES}").map_err(io("writing the marker"))?;
    std::fs::rename(&partial, root).map_err(io(format!("moving the chroot to {}", root.display())))?;
    note(&format!("forky chroot ready in {:.0} s", start.elapsed().as_secs_f64()));
    Qemu::find(root).map_err(|e| SetupError::Command { command: "the new chroot".into(), detail: e.to_string() })
}

/// Deletes `dir`, unless something is mounted below it (a crashed check's bind mount of /dev).
fn remove_unmounted(dir: &Path) -> Result<(), SetupError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(io("reading /proc/self/mounts"))?;
    let below = mounted_below(&mounts, dir);
    if !below.is_empty() {
        return Err(SetupError::Mounted { dir: dir.to_path_buf(), mounts: below.join(", ") });
    }
    std::fs::remove_dir_all(dir).map_err(io(format!("removing {}", dir.display())))
}

/// The mount points of `mounts` (/proc/self/mounts) at or below `dir`.
fn mounted_below(mounts: &str, dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display().to_string().trim_end_matches('/'));
    mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .filter(|point| format!("{point}/").starts_with(&prefix))
        .map(String::from)
        .collect()
}

/// The chroot's QEMU has every device the lab uses.
fn check_devices(chroot: &Path) -> Result<(), SetupError> {
    let run = |args: &[&str]| -> Result<String, SetupError> {
        let out = Command::new("chroot")
            .arg(chroot)
            .arg("qemu-system-x86_64")
            .args(args)
            .output()
            .map_err(io("running the chroot's QEMU"))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let version = run(&["--version"])?.lines().next().unwrap_or("unknown version").to_string();
    let devices = run(&["-device", "help"])?;
    match NEEDED_DEVICES.into_iter().find(|d| !devices.contains(&format!("\"{d}\""))) {
        Some(device) => Err(SetupError::MissingDevice { version, device }),
        None => Ok(()),
    }
}

/// Installs Debian package `package` with apt.
fn apt_install(package: &str) -> Result<(), SetupError> {
    for args in [&["update", "-qq"][..], &["install", "-y", "-qq", package][..]] {
        let status = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(io("running apt-get"))?;
        if !status.success() {
            return Err(SetupError::Command {
                command: format!("apt-get {}", args.join(" ")),
                detail: format!("install {package} by hand, then run again"),
            });
        }
    }
    Ok(())
}

/// The Debian mirror this host's apt sources name (only Debian mirrors are reachable from the
/// machines the project runs on, and the host's sources name one that works): `$DRIVERLAB_DEBIAN_MIRROR`,
/// else deb822 sources, else the one-line format, else deb.debian.org. The security archive has
/// no forky suite, so only the main archive's entry counts.
pub fn host_mirror() -> String {
    if let Some(mirror) = std::env::var("DRIVERLAB_DEBIAN_MIRROR").ok().filter(|m| !m.is_empty()) {
        return mirror;
    }
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    mirror_of_deb822(&read("/etc/apt/sources.list.d/debian.sources"))
        .or_else(|| mirror_of_list(&read("/etc/apt/sources.list")))
        .unwrap_or_else(|| DEFAULT_MIRROR.into())
}

/// The URI of the first deb822 stanza with type `deb` and a suite other than `*-security`.
fn mirror_of_deb822(text: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim().eq_ignore_ascii_case(name).then(|| value.split_whitespace().map(String::from).collect())
            })
        };
        let types: Vec<String> = field("types")?;
        let suites: Vec<String> = field("suites")?;
        let uris: Vec<String> = field("uris")?;
        let main = suites.iter().any(|s| !s.ends_with("-security"));
        (types.iter().any(|t| t == "deb") && main).then(|| uris.first().cloned()).flatten()
    })
}

/// The URI of the first `deb [options] URI suite components` line whose suite is not `*-security`.
fn mirror_of_list(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut uri = words.next()?;
        if uri.starts_with('[') {
            // The options block, up to its closing bracket.
            let mut word = uri;
            while !word.ends_with(']') {
                word = words.next()?;
            }
            uri = words.next()?;
        }
        let suite = words.next()?;
        (!suite.ends_with("-security")).then(|| uri.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_mirror_is_read_from_either_format_and_security_is_skipped() {
        let deb822 = "Types: deb\nURIs: http://security.debian.org/debian-security\nSuites: bookworm-security\n\
                      Components: main\n\nTypes: deb deb-src\nURIs: http://mirror.example/debian\n\
                      Suites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(mirror_of_deb822(deb822).as_deref(), Some("http://mirror.example/debian"));
        assert_eq!(mirror_of_deb822("Types: deb-src\nURIs: http://x/\nSuites: bookworm\n"), None);
        let list = "# comment\ndeb http://security.debian.org/ bookworm-security main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n";
        assert_eq!(mirror_of_list(list).as_deref(), Some("http://mirror.example/debian"));
        assert_eq!(mirror_of_list("deb-src http://x/ bookworm main\n"), None);
    }

    #[test]
    fn a_folder_with_a_mount_below_is_not_deleted() {
        let mounts = "proc /proc proc rw 0 0\ntmpfs /cache/forky-qemu.partial/dev tmpfs rw 0 0\n\
                      tmpfs /cache/forky-qemu-other tmpfs rw 0 0\n";
        assert_eq!(mounted_below(mounts, Path::new("/cache/forky-qemu.partial")), ["/cache/forky-qemu.partial/dev"]);
        assert!(mounted_below(mounts, Path::new("/cache/forky-qemu")).is_empty(), "a sibling is not below");
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("x");
        std::fs::create_dir(&inside).unwrap();
        remove_unmounted(&inside).unwrap();
        assert!(!inside.exists());
    }
}
