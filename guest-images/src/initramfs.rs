//! Initramfs archives in the "newc" cpio format the kernel unpacks.

/// An initramfs being assembled.
#[derive(Default)]
pub struct Initramfs {
    data: Vec<u8>,
    next_ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

impl Initramfs {
    /// An empty archive.
    pub fn new() -> Self {
        Initramfs { data: Vec::new(), next_ino: 1 }
    }

    fn entry(&mut self, name: &str, mode: u32, body: &[u8]) {
        let ino = self.next_ino;
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [ino, mode, 0, 0, nlink, 0, body.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
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

    /// Finishes the archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.data
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
}
