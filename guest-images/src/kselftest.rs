//! The kernel's NIC selftests in a guest image, for the `kselftest` workload: the Python tests of
//! tools/testing/selftests/drivers/net (and its `hw/`) with their libraries, YNL and the netlink
//! specs, in the kernel tree's own layout below [`GUEST_TREE`] (the libraries find YNL and the
//! specs by it: tools/testing/selftests/net/lib/py/ynl.py), from Debian's `linux-source-6.12`;
//! and what they run: Python (this host's Debian python3 with the standard library the suite
//! imports and PyYAML, precompiled so that a guest under TCG does not compile it at every
//! start), iproute2's `ip` (the suite reads `ip -j`), iputils' `ping`, `socat`, and OpenSSH's
//! client, by which the suite reaches its remote (`REMOTE_TYPE=ssh`,
//! drivers/net/lib/py/remote_ssh.py).
//!
//! Both trees are prepared once per package version in driverlab's cache folder; an image build
//! reads them from there.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::initramfs::{Node, Tree};
use crate::initramfs_build::{add_libraries, which};
use crate::store::{ImageError, cache_dir, mkdir, read, run_tool, write};

/// The tests a matrix may name: the Python tests of 6.12's drivers/net and drivers/net/hw, as
/// their Makefiles list them. (The shell tests need bash and the forwarding library of
/// tools/testing/selftests/net, which images do not carry.)
pub const TESTS: &[&str] = &[
    "ping.py",
    "queues.py",
    "stats.py",
    "hw/csum.py",
    "hw/devlink_port_split.py",
    "hw/pp_alloc_fail.py",
    "hw/rss_ctx.py",
];

/// The Debian package the suite comes from.
pub const SOURCE_PACKAGE: &str = "linux-source-6.12";

/// The kernel tree in the guest (the suite is at `GUEST_TREE/tools/testing/selftests/drivers/net`).
pub const GUEST_TREE: &str = "usr/src/linux";

/// The kernel tree's folders the suite reads.
const SUITE_FOLDERS: &[&str] = &[
    "tools/testing/selftests/drivers/net",
    "tools/testing/selftests/net/lib/py",
    "tools/net/ynl/lib",
    "Documentation/netlink/specs",
];

/// Where Debian's python3 is.
const PYTHON: &str = "/usr/bin/python3";

/// Standard library folders the suite never imports (tests, build configuration, installers,
/// GUI and 2to3): 11 MiB left out.
const STDLIB_LEFT_OUT: &[&str] =
    &["test", "ensurepip", "lib2to3", "pydoc_data", "distutils", "idlelib", "tkinter", "turtledemo", "venv"];

/// The programs the suite runs, with their Debian packages; and dash, the `/bin/sh` its commands
/// run under (busybox's shell runs its own applets before any program of the same name, so
/// `ip -j` would be busybox's).
const PROGRAMS: &[(&str, &str)] = &[
    ("dash", "dash"),
    ("ip", "iproute2"),
    ("ping", "iputils-ping"),
    ("socat", "socat"),
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
];

/// What a guest image with the suite says about it (its manifest's `kselftest`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SuiteFacts {
    /// Where the suite came from: `package linux-source-6.12 VERSION`.
    pub source: String,
    /// The Python it runs on: `python3.11 VERSION` (Debian's).
    pub python: String,
}

/// Adds the suite, Python and the programs to `tree`.
pub fn add(tree: &mut Tree) -> Result<SuiteFacts, ImageError> {
    let (suite, source) = suite_tree()?;
    add_folder(tree, &suite, GUEST_TREE)?;
    let python = add_python(tree)?;
    for (program, package) in PROGRAMS {
        let path = which(program, package)?;
        tree.file(&format!("usr/bin/{program}"), 0o755, read(&path)?);
        add_libraries(tree, &path)?;
    }
    // OpenSSH's client needs its user in the password database, and a home for its keys.
    tree.file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n".to_vec());
    tree.file("etc/group", 0o644, b"root:x:0:\n".to_vec());
    tree.add("root", Node::Dir);
    Ok(SuiteFacts { source, python })
}

/// Every file below `dir` into `tree` at `at` (symbolic links followed), in path order.
fn add_folder(tree: &mut Tree, dir: &Path, at: &str) -> Result<(), ImageError> {
    for path in files_below(dir)? {
        let relative = path.strip_prefix(dir).unwrap_or(&path).to_string_lossy().into_owned();
        let perm = if relative.ends_with(".so") { 0o755 } else { 0o644 };
        tree.file(&format!("{at}/{relative}"), perm, read(&path)?);
    }
    Ok(())
}

fn files_below(dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let entries = std::fs::read_dir(&at).map_err(|source| ImageError::Io { path: at.clone(), source })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The suite's folders, unpacked from Debian's kernel source once per version and precompiled.
fn suite_tree() -> Result<(PathBuf, String), ImageError> {
    let tarball = PathBuf::from(format!("/usr/src/{SOURCE_PACKAGE}.tar.xz"));
    if !tarball.exists() {
        return Err(ImageError::Invalid(format!(
            "{} is missing: the kselftest workload takes the suite from it (apt-get install {SOURCE_PACKAGE})",
            tarball.display()
        )));
    }
    let version = crate::module_build::installed_version(SOURCE_PACKAGE).unwrap_or_else(|| "unknown".into());
    let cache = cache_dir().join("sources").join(format!("kselftest-{SOURCE_PACKAGE}-{version}"));
    if !cache.join(".complete").exists() {
        let _ = std::fs::remove_dir_all(&cache);
        mkdir(&cache)?;
        let top = SOURCE_PACKAGE;
        let members: Vec<String> = SUITE_FOLDERS.iter().map(|f| format!("{top}/{f}")).collect();
        let what = format!("unpacking the NIC selftests from {}", tarball.display());
        crate::module_build::unpack_source(&tarball, &cache, &members, &what)?;
        compile(&cache)?;
        write(&cache.join(".complete"), b"")?;
    }
    Ok((cache, format!("package {SOURCE_PACKAGE} {version}")))
}

/// Byte-compiles every module below `dir` into `__pycache__`, checked by hash rather than by
/// the source's time (an initramfs gives every file the same time, which would make timestamp
/// pycs stale and have the guest compile them again).
fn compile(dir: &Path) -> Result<(), ImageError> {
    run_tool(
        Command::new(PYTHON)
            .args(["-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash"])
            .arg(dir),
        &format!("compiling {}", dir.display()),
    )?;
    Ok(())
}

/// Python: the interpreter at `usr/bin/python3.X` (with `bin/python3`), its standard library
/// without [`STDLIB_LEFT_OUT`], its extension modules' libraries, and PyYAML.
fn add_python(tree: &mut Tree) -> Result<String, ImageError> {
    let real = std::fs::canonicalize(PYTHON)
        .map_err(|_| ImageError::Invalid(format!("no {PYTHON}: apt-get install python3")))?;
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let version =
        crate::module_build::installed_version(&format!("{name}-minimal")).unwrap_or_else(|| "unknown".into());
    let stdlib = python_tree(&real, &name, &version)?;
    tree.file(&format!("usr/bin/{name}"), 0o755, read(&real)?);
    add_libraries(tree, &real)?;
    tree.add("usr/bin/python3", Node::Symlink(name.clone()));
    tree.add("bin/python3", Node::Symlink(format!("/usr/bin/{name}")));
    add_folder(tree, &stdlib.join("lib"), &format!("usr/lib/{name}"))?;
    add_folder(tree, &stdlib.join("dist-packages"), "usr/lib/python3/dist-packages")?;
    for module in files_below(&stdlib.join("lib").join("lib-dynload"))? {
        add_libraries(tree, &module)?;
    }
    Ok(format!("{name} {version}"))
}

/// The standard library and PyYAML, copied once per Python version and precompiled.
fn python_tree(real: &Path, name: &str, version: &str) -> Result<PathBuf, ImageError> {
    let cache = cache_dir().join("sources").join(format!("{name}-{version}"));
    if cache.join(".complete").exists() {
        return Ok(cache);
    }
    let _ = std::fs::remove_dir_all(&cache);
    let lib = cache.join("lib");
    mkdir(&lib)?;
    let stdlib = real.parent().and_then(Path::parent).unwrap_or(Path::new("/usr")).join("lib").join(name);
    let entries = std::fs::read_dir(&stdlib).map_err(|source| ImageError::Io { path: stdlib.clone(), source })?;
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if STDLIB_LEFT_OUT.contains(&file.as_str()) || file.starts_with("config-") || file == "__pycache__" {
            continue;
        }
        run_tool(Command::new("cp").arg("-rL").arg(entry.path()).arg(&lib), &format!("copying {file}"))?;
    }
    let packages = cache.join("dist-packages");
    mkdir(&packages)?;
    let yaml = Path::new("/usr/lib/python3/dist-packages/yaml");
    if !yaml.is_dir() {
        return Err(ImageError::Invalid(
            "PyYAML is not installed: the suite's YNL needs it (apt-get install python3-yaml)".into(),
        ));
    }
    run_tool(Command::new("cp").arg("-rL").arg(yaml).arg(&packages), "copying PyYAML")?;
    // The copies' stale timestamp pycs go; compile() makes hash-checked ones.
    run_tool(
        Command::new("find").arg(&cache).args([
            "-name",
            "__pycache__",
            "-type",
            "d",
            "-prune",
            "-exec",
            "rm",
            "-rf",
            "{}",
            "+",
        ]),
        "removing stale pycs",
    )?;
    compile(&cache)?;
    write(&cache.join(".complete"), b"")?;
    Ok(cache)
}
