//! Initramfs archives in the "newc" cpio format the kernel unpacks: [`Initramfs`] writes entries
//! in the order given; [`Tree`] collects them and writes them sorted by path, every time and
//! owner fixed, so that the same contents always give the same bytes.

use std::collections::BTreeMap;
use std::io::Write;

/// An initramfs being assembled.
#[derive(Default)]
pub struct Initramfs {
    data: Vec<u8>,
    next_ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

impl Initramfs {
    /// An empty archive.
    pub fn new() -> Self {
        Initramfs { data: Vec::new(), next_ino: 1 }
    }

    fn entry(&mut self, name: &str, mode: u32, body: &[u8]) {
        self.entry_with_rdev(name, mode, body, (0, 0));
    }

    fn entry_with_rdev(&mut self, name: &str, mode: u32, body: &[u8], rdev: (u32, u32)) {
        let ino = self.next_ino;
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [ino, mode, 0, 0, nlink, 0, body.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
        self.data.extend_from_slice(b"070701");
        for field in fields {
            self.data.extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(body);
        self.pad();
    }

    fn pad(&mut self) {
        while self.data.len() % 4 != 0 {
            self.data.push(0);
        }
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str) -> &mut Self {
        self.entry(path, S_IFDIR | 0o755, &[]);
        self
    }

    /// Adds a regular file with permission bits `perm` (e.g. 0o755).
    pub fn file(&mut self, path: &str, perm: u32, contents: &[u8]) -> &mut Self {
        self.entry(path, S_IFREG | (perm & 0o7777), contents);
        self
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(path, S_IFLNK | 0o777, target.as_bytes());
        self
    }

    /// Adds a character device node (e.g. `dev/console`, 5:1), which needs no root to create
    /// in an archive.
    pub fn char_device(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> &mut Self {
        self.entry_with_rdev(path, S_IFCHR | (perm & 0o7777), &[], (major, minor));
        self
    }

    /// Finishes the archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.data
    }
}

/// One entry of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A file with its permission bits.
    File {
        /// Permission bits, e.g. 0o755.
        perm: u32,
        /// The file's bytes.
        data: Vec<u8>,
    },
    /// A symbolic link.
    Symlink(String),
    /// A character device.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
}

/// An initramfs described by path, written sorted; adding a path creates its parents.
#[derive(Debug, Default, Clone)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    fn parents(&mut self, path: &str) {
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            let dir = &path[..at + slash];
            self.nodes.entry(dir.to_string()).or_insert(Node::Dir);
            at += slash + 1;
        }
    }

    /// Adds (or replaces) `path`, a relative path like `bin/busybox`.
    pub fn add(&mut self, path: &str, node: Node) -> &mut Self {
        let path = path.trim_start_matches('/').to_string();
        self.parents(&path);
        self.nodes.insert(path, node);
        self
    }

    /// Adds a file.
    pub fn file(&mut self, path: &str, perm: u32, data: Vec<u8>) -> &mut Self {
        self.add(path, Node::File { perm, data })
    }

    /// The entries, sorted by path.
    pub fn nodes(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    /// The cpio archive: entries sorted by path, inode numbers in that order, times and owners 0.
    pub fn cpio(&self) -> Vec<u8> {
        let mut archive = Initramfs::new();
        for (path, node) in &self.nodes {
            match node {
                Node::Dir => archive.dir(path),
                Node::File { perm, data } => archive.file(path, *perm, data),
                Node::Symlink(target) => archive.symlink(path, target),
                Node::CharDevice { major, minor } => archive.char_device(path, 0o600, *major, *minor),
            };
        }
        archive.finish()
    }

    /// The archive gzip-compressed, with no name or time in the gzip header.
    pub fn cpio_gz(&self) -> Vec<u8> {
        let mut encoder = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
        encoder.write_all(&self.cpio()).expect("writing to memory");
        encoder.finish().expect("writing to memory")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout() {
        let mut archive = Initramfs::new();
        archive.dir("bin").file("init", 0o755, b"#!/bin/sh\n").symlink("sh", "bin/busybox");
        let data = archive.finish();
        assert!(data.starts_with(b"070701"));
        assert_eq!(data.len() % 4, 0);
        // The second header follows the first entry: 110 header bytes + "bin\0", aligned to 4.
        assert_eq!(&data[116..122], b"070701");
        let init = data.windows(5).position(|w| w == b"init\0").unwrap();
        let header = &data[init - 110..init];
        assert_eq!(&header[14..22], b"000081ed", "regular file 0755");
        assert_eq!(&header[54..62], b"0000000a", "file size");
        assert!(data.windows(11).any(|w| w == b"TRAILER!!!\0"));
    }

    #[test]
    fn a_tree_is_written_sorted_and_the_same_every_time() {
        let mut a = Tree::new();
        a.file("lib/modules/atlantic.ko", 0o644, b"ko".to_vec())
            .file("init", 0o755, b"#!/bin/sh\n".to_vec())
            .add("bin/sh", Node::Symlink("busybox".into()))
            .add("dev/console", Node::CharDevice { major: 5, minor: 1 });
        let mut b = Tree::new();
        b.add("dev/console", Node::CharDevice { major: 5, minor: 1 })
            .add("bin/sh", Node::Symlink("busybox".into()))
            .file("init", 0o755, b"#!/bin/sh\n".to_vec())
            .file("lib/modules/atlantic.ko", 0o644, b"ko".to_vec());
        assert_eq!(a.cpio(), b.cpio(), "insertion order does not matter");
        assert_eq!(a.cpio_gz(), b.cpio_gz());
        let paths: Vec<&str> = a.nodes().keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            ["bin", "bin/sh", "dev", "dev/console", "init", "lib", "lib/modules", "lib/modules/atlantic.ko"]
        );
        let data = a.cpio();
        let console = data.windows(12).position(|w| w == b"dev/console\0").unwrap();
        let header = &data[console - 110..console];
        assert_eq!(&header[14..22], b"00002180", "character device 0600");
        assert_eq!((&header[78..86], &header[86..94]), (&b"00000005"[..], &b"00000001"[..]), "5:1");
        let gz = a.cpio_gz();
        assert_eq!(&gz[4..8], &[0, 0, 0, 0], "no time in the gzip header");
    }
}
