//! Guest images for driverlab.
//!
//! - [`PROBE_ELF`]: the probe guest, built from `probe/` for x86_64-unknown-none as part of the
//!   normal build and embedded here (`driverlab vm run --kernel probe`).
//! - [`kernel`]: taking kernels apart, e.g. the ELF vmlinux (with its PVH note) out of a
//!   distribution bzImage.

pub mod boot_initramfs;
pub mod box_image;
pub mod initramfs;
pub mod initramfs_build;
pub mod kernel;
pub mod kernel_image;
pub mod kselftest;
pub mod module_build;
pub mod modules;
pub mod patches;
pub mod store;

/// The guest agent: the initramfs's `/init`, a POSIX sh script (`agent/init`).
pub static AGENT: &str = include_str!("../agent/init");

/// The probe guest: an x86-64 ELF with a PVH note, loaded at 1 MiB.
pub static PROBE_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.elf"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_a_small_x86_64_elf_with_a_pvh_note() {
        assert_eq!(&PROBE_ELF[..4], b"\x7fELF");
        assert_eq!(PROBE_ELF[4], 2, "64-bit");
        assert_eq!(u16::from_le_bytes([PROBE_ELF[18], PROBE_ELF[19]]), 62, "x86-64");
        assert!(PROBE_ELF.len() < 256 * 1024, "tens of KiB, got {}", PROBE_ELF.len());
        let note = PROBE_ELF.windows(4).position(|w| w == b"Xen\0").expect("PVH note name");
        let note_type = u32::from_le_bytes(PROBE_ELF[note - 4..note].try_into().unwrap());
        assert_eq!(note_type, 18, "XEN_ELFNOTE_PHYS32_ENTRY");
    }
}
