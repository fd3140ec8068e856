//! The boot benchmark's initramfs: static busybox and an `/init` that prints one line and powers
//! the VM off at once, so that a boot's time is the kernel's and the VMM's, not an init
//! system's (`driverlab bench boot --linux`).

use std::path::Path;

use crate::initramfs::{Node, Tree};
use crate::initramfs_build::BUSYBOX;
use crate::store::{ImageError, read};

/// The line `/init` prints first: a boot has reached user space when the console shows it.
pub const INIT_LINE: &str = "driverlab-boot: init";

/// `/init`: one line on the console, then power off without any shutdown work. The line goes
/// through the kernel's log at alert level (`/dev/kmsg`), which writes it to the console at once
/// and past `quiet`: a line written to the console's tty would wait in its buffer for the UART's
/// interrupts, and the poweroff right after could beat it.
fn init_script() -> String {
    format!("#!/bin/busybox sh\n/bin/busybox echo '<1>{INIT_LINE}' >/dev/kmsg\n/bin/busybox poweroff -f\n")
}

/// Whether a console line is the init's line (the kernel's log puts its timestamp first).
pub fn is_init_line(line: &str) -> bool {
    line.trim_end().ends_with(INIT_LINE)
}

/// The kernel's timestamp on a console line of its log (`[    4.321000] ...`), in seconds: for
/// the init's line, how long the guest itself took to reach user space by its own clock.
pub fn kernel_timestamp(line: &str) -> Option<f64> {
    let stamp = line.trim_start().strip_prefix('[')?.split_once(']')?.0.trim();
    stamp.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)
}

/// The archive (gzip-compressed newc cpio): `/init`, `/bin/busybox`, `/dev/console`,
/// `/dev/kmsg`. The same
/// busybox gives the same bytes.
pub fn build() -> Result<Vec<u8>, ImageError> {
    let busybox = read(Path::new(BUSYBOX))
        .map_err(|_| ImageError::Invalid(format!("no {BUSYBOX}: apt-get install busybox-static")))?;
    Ok(archive(busybox))
}

fn archive(busybox: Vec<u8>) -> Vec<u8> {
    let mut tree = Tree::new();
    tree.add("dev/console", Node::CharDevice { major: 5, minor: 1 });
    tree.add("dev/kmsg", Node::CharDevice { major: 1, minor: 11 });
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
        assert_eq!(
            lines,
            ["#!/bin/busybox sh", "/bin/busybox echo '<1>driverlab-boot: init' >/dev/kmsg", "/bin/busybox poweroff -f"]
        );
        assert!(is_init_line("[    1.234567] driverlab-boot: init") && is_init_line("driverlab-boot: init\r"));
        assert!(!is_init_line("driverlab-boot: init done"));
        assert_eq!(kernel_timestamp("[    1.234567] driverlab-boot: init"), Some(1.234567));
        assert_eq!(kernel_timestamp("driverlab-boot: init"), None);
        assert_eq!(kernel_timestamp("[ nan] x"), None);
        let a = archive(b"\x7fELF busybox".to_vec());
        assert_eq!(a, archive(b"\x7fELF busybox".to_vec()), "same inputs, same bytes");
        assert_eq!(&a[..2], &[0x1f, 0x8b], "gzip");
        let mut cpio = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&a[..]), &mut cpio).unwrap();
        for name in ["init", "bin/busybox", "dev/console", "dev/kmsg"] {
            assert!(cpio.windows(name.len() + 1).any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0));
        }
    }
}
