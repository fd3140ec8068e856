//! Kernel modules as files: decompressing what distributions ship (`.ko.xz`, `.ko.zst`,
//! `.ko.gz`), reading a module's `.modinfo` (name, vermagic, dependencies, parameters) straight
//! from its ELF, and resolving a module's dependencies in a module tree that has no
//! `modules.dep` (Debian's packages run depmod only when installed).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// Errors reading modules.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// A file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A module cannot be decompressed or is not an ELF with a `.modinfo` section.
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A module needed is neither in the tree nor built into the kernel.
    #[error("module {name} (needed by {needed_by}) is neither in {} nor built into the kernel", tree.display())]
    Missing {
        /// The module.
        name: String,
        /// Who needs it.
        needed_by: String,
        /// The tree searched.
        tree: PathBuf,
    },
}

/// A module's name as the kernel spells it: dashes are underscores.
pub fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

/// Reads a module file, decompressing it by its extension.
pub fn read(path: &Path) -> Result<Vec<u8>, ModuleError> {
    let io = |source| ModuleError::Io { path: path.to_path_buf(), source };
    let bad = |reason: String| ModuleError::Malformed { path: path.to_path_buf(), reason };
    let raw = std::fs::read(path).map_err(io)?;
    let name = path.to_string_lossy();
    if name.ends_with(".xz") {
        let mut out = Vec::new();
        lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out).map_err(|e| bad(format!("xz: {e:?}")))?;
        Ok(out)
    } else if name.ends_with(".zst") {
        let mut out = Vec::new();
        let mut input = raw.as_slice();
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut input).map_err(|e| bad(format!("zstd: {e}")))?;
        decoder.read_to_end(&mut out).map_err(|e| bad(format!("zstd: {e}")))?;
        Ok(out)
    } else if name.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice()).read_to_end(&mut out).map_err(|e| bad(format!("gzip: {e}")))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// What a module's `.modinfo` says.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModInfo {
    /// Its name.
    pub name: String,
    /// The kernel it was built for (`6.12.117+deb12-amd64 SMP preempt mod_unload modversions`).
    pub vermagic: String,
    /// The modules it needs.
    pub depends: Vec<String>,
    /// Its parameters: name and description (`parm=`), type (`parmtype=`).
    pub params: BTreeMap<String, String>,
    /// Its srcversion, a hash of its sources.
    pub srcversion: Option<String>,
}

/// Reads the `.modinfo` section of an (uncompressed) module.
pub fn modinfo(data: &[u8], path: &Path) -> Result<ModInfo, ModuleError> {
    let bad = |reason: String| ModuleError::Malformed { path: path.to_path_buf(), reason };
    let file = object::File::parse(data).map_err(|e| bad(format!("not an ELF module: {e}")))?;
    let section = file.section_by_name(".modinfo").ok_or_else(|| bad("no .modinfo section".into()))?;
    let bytes = section.data().map_err(|e| bad(e.to_string()))?;
    Ok(parse_modinfo(bytes))
}

/// Parses `.modinfo` contents: NUL-separated `key=value` strings.
pub fn parse_modinfo(bytes: &[u8]) -> ModInfo {
    let mut info = ModInfo::default();
    for entry in bytes.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let Some((key, value)) = entry.split_once('=') else { continue };
        match key {
            "name" => info.name = value.to_string(),
            "vermagic" => info.vermagic = value.trim().to_string(),
            "depends" => info.depends = value.split(',').filter(|d| !d.is_empty()).map(canonical).collect(),
            "srcversion" => info.srcversion = Some(value.to_string()),
            "parm" | "parmtype" => {
                let (param, text) = value.split_once(':').unwrap_or((value, ""));
                let slot = info.params.entry(param.to_string()).or_default();
                if key == "parmtype" {
                    slot.push_str(&format!(" ({text})"));
                } else {
                    slot.insert_str(0, text);
                }
            }
            _ => {}
        }
    }
    info
}

/// The modules of one kernel: `lib/modules/VERSION` with its `kernel/` tree.
#[derive(Debug, Clone)]
pub struct ModuleTree {
    root: PathBuf,
    by_name: BTreeMap<String, PathBuf>,
    builtin: Vec<String>,
}

impl ModuleTree {
    /// Indexes the tree at `root` (`.../lib/modules/VERSION`).
    pub fn open(root: &Path) -> Result<ModuleTree, ModuleError> {
        let mut by_name = BTreeMap::new();
        let mut stack = vec![root.join("kernel")];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|source| ModuleError::Io { path: dir.clone(), source })?;
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Some(name) = module_name(&path) {
                    by_name.insert(name, path);
                }
            }
        }
        let builtin = std::fs::read_to_string(root.join("modules.builtin"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| module_name(Path::new(l)))
            .collect();
        Ok(ModuleTree { root: root.to_path_buf(), by_name, builtin })
    }

    /// The kernel release the tree belongs to (its folder's name).
    pub fn release(&self) -> String {
        self.root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// The file of module `name`.
    pub fn path(&self, name: &str) -> Option<&Path> {
        self.by_name.get(&canonical(name)).map(PathBuf::as_path)
    }

    /// Whether `name` is built into the kernel.
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&canonical(name))
    }

    /// The modules to load for `roots`, each after what it depends on, each once; modules given
    /// in `extra` (name -> contents, e.g. a driver variant just built) replace the tree's.
    /// Returns (name, uncompressed contents) in load order.
    pub fn closure(
        &self,
        roots: &[String],
        extra: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Vec<(String, Vec<u8>)>, ModuleError> {
        let mut order: Vec<(String, Vec<u8>)> = Vec::new();
        for root in roots {
            self.visit(&canonical(root), "the image", extra, &mut order, &mut Vec::new())?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        needed_by: &str,
        extra: &BTreeMap<String, Vec<u8>>,
        order: &mut Vec<(String, Vec<u8>)>,
        path: &mut Vec<String>,
    ) -> Result<(), ModuleError> {
        if order.iter().any(|(n, _)| n == name) || path.iter().any(|n| n == name) {
            return Ok(());
        }
        let (data, file) = match (extra.get(name), self.path(name)) {
            (Some(data), _) => (data.clone(), PathBuf::from(name)),
            (None, Some(file)) => (read(file)?, file.to_path_buf()),
            (None, None) if self.is_builtin(name) => return Ok(()),
            (None, None) => {
                return Err(ModuleError::Missing {
                    name: name.to_string(),
                    needed_by: needed_by.to_string(),
                    tree: self.root.clone(),
                });
            }
        };
        let info = modinfo(&data, &file)?;
        path.push(name.to_string());
        for dep in &info.depends {
            self.visit(dep, name, extra, order, path)?;
        }
        path.pop();
        order.push((name.to_string(), data));
        Ok(())
    }
}

/// `atlantic` for `.../atlantic.ko.xz`.
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = ["ko.xz", "ko.zst", "ko.gz", "ko"].iter().find_map(|ext| file.strip_suffix(&format!(".{ext}")))?;
    Some(canonical(stem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_strings_are_read() {
        let raw = b"license=GPL\0parm=rxpageorder:RX page order\0parmtype=rxpageorder:uint\0\
                    depends=macsec,foo-bar\0name=atlantic\0vermagic=6.12.117+deb12-amd64 SMP preempt mod_unload \0\
                    srcversion=ABC\0";
        let info = parse_modinfo(raw);
        assert_eq!((info.name.as_str(), info.srcversion.as_deref()), ("atlantic", Some("ABC")));
        assert_eq!(info.vermagic, "6.12.117+deb12-amd64 SMP preempt mod_unload");
        assert_eq!(info.depends, ["macsec", "foo_bar"]);
        assert_eq!(info.params["rxpageorder"], "RX page order (uint)");
        assert_eq!(parse_modinfo(b"depends=\0").depends, Vec::<String>::new());
    }

    #[test]
    fn module_names_drop_their_extension() {
        assert_eq!(module_name(Path::new("/x/virtio-iommu.ko.xz")).as_deref(), Some("virtio_iommu"));
        assert_eq!(module_name(Path::new("kernel/net/macsec.ko")).as_deref(), Some("macsec"));
        assert_eq!(module_name(Path::new("README")), None);
    }

    /// Debian's 6.12 modules, when the tests have fetched them (`DRIVERLAB_TEST_MODULES`).
    #[test]
    fn atlantic_needs_macsec_in_debian_s_tree() {
        let Some(root) = std::env::var_os("DRIVERLAB_TEST_MODULES") else {
            let why = "set DRIVERLAB_TEST_MODULES (scripts/test.sh does)";
            testkit::skip("atlantic_needs_macsec_in_debian_s_tree", testkit::Lacks::Setup, why);
            return;
        };
        let tree = ModuleTree::open(Path::new(&root)).unwrap();
        let order = tree.closure(&["atlantic".into(), "virtio_iommu".into()], &BTreeMap::new()).unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        let (macsec, atlantic) =
            (names.iter().position(|n| *n == "macsec"), names.iter().position(|n| *n == "atlantic"));
        assert!(macsec.unwrap() < atlantic.unwrap(), "{names:?}");
        let info = modinfo(&order[atlantic.unwrap()].1, Path::new("atlantic")).unwrap();
        assert!(info.vermagic.starts_with(&tree.release()), "{} vs {}", info.vermagic, tree.release());
        assert!(matches!(tree.closure(&["no_such_module".into()], &BTreeMap::new()), Err(ModuleError::Missing { .. })));
    }
}
