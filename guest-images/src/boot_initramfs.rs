//! The boot benchmark's initramfs: static busybox and an `/init` that prints one line and powers
//! the VM off at once, so that a boot's time is the kernel's and the VMM's, not an init
//! system's (`driverlab bench boot --linux`).

use std::path::Path;

use crate::initramfs::{Node, Tree};
use crate::initramfs_build::BUSYBOX;
use crate::store::{ImageError, read};

/// The line `/init` prints first: a boot has reached user space when the console shows it.
pub const INIT_LINE: &str = "driverlab-boot: init";

/// `/init`: one line on the console, then power off without any shutdown work.
fn init_script() -> String {
    format!("#!/bin/busybox sh\n/bin/busybox echo {INIT_LINE}\n/bin/busybox poweroff -f\n")
}

/// The archive (gzip-compressed newc cpio): `/init`, `/bin/busybox`, `/dev/console`. The same
/// busybox gives the same bytes.
pub fn build() -> Result<Vec<u8>, ImageError> {
    let busybox = read(Path::new(BUSYBOX))
        .map_err(|_| ImageError::Invalid(format!("no {BUSYBOX}: apt-get install busybox-static")))?;
    Ok(archive(busybox))
}

fn archive(busybox: Vec<u8>) -> Vec<u8> {
    let mut tree = Tree::new();
    tree.add("dev/console", Node::CharDevice { major: 5, minor: 1 });
    tree.add("proc", Node::Dir);
    tree.file("init", 0o755, init_script().into_bytes());
    tree.file("bin/busybox", 0o755, busybox);
    tree.cpio_gz()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_prints_its_line_then_powers_off_and_the_archive_is_reproducible() {
        let script = init_script();
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines, ["#!/bin/busybox sh", "/bin/busybox echo driverlab-boot: init", "/bin/busybox poweroff -f"]);
        let a = archive(b"\x7fELF busybox".to_vec());
        assert_eq!(a, archive(b"\x7fELF busybox".to_vec()), "same inputs, same bytes");
        assert_eq!(&a[..2], &[0x1f, 0x8b], "gzip");
        let mut cpio = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&a[..]), &mut cpio).unwrap();
        for name in ["init", "bin/busybox", "dev/console"] {
            assert!(cpio.windows(name.len() + 1).any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0));
        }
    }
}
