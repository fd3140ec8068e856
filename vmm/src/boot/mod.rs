//! Loading a kernel and handing it what the boot protocols promise: the command line, the initrd,
//! the memory map and the entry state.
//!
//! - ELF with a PVH note: PVH entry (32-bit, paging off) with `hvm_start_info`.
//! - ELF without it (or `--entry linux64`): 64-bit entry at `e_entry` with a zero page.
//! - bzImage (boot protocol 2.12 or later): 64-bit entry at load address + 0x200 with a zero page.

mod image;
mod linux;
mod pvh;

use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use image::{BzImageInfo, ElfInfo, ImageError, KernelImage};

use crate::layout::{CMDLINE_ADDR, CMDLINE_SPACE, HIGH_MEMORY_START, PVH_INFO_ADDR, ZERO_PAGE_ADDR};
use crate::memory::{E820Entry, RamLayout};

/// Longest command line for kernels without a setup header to say otherwise (x86
/// `COMMAND_LINE_SIZE` is 2048 including the NUL).
pub const DEFAULT_CMDLINE_MAX: usize = 2047;
/// Initrd alignment.
const PAGE_SIZE: u64 = 4096;

pub use vm_spec::Entry as EntryProtocol;

/// How much of a kernel file is read before it is loaded: its headers (ELF header and program
/// headers, a bzImage's setup header) lie in it.
pub const KERNEL_HEAD_BYTES: usize = 64 * 1024;

/// A kernel image to load: bytes in memory (the embedded probe), or a file whose headers were
/// read and whose segments go straight from the file into guest memory, without a copy of the
/// whole image in between (a distribution's vmlinux is tens of MiB).
pub enum KernelSource<'a> {
    /// The image's bytes.
    Bytes(&'a [u8]),
    /// An open kernel file.
    File {
        /// The file.
        file: File,
        /// Its first [`KERNEL_HEAD_BYTES`] bytes (all of it, if shorter).
        head: Vec<u8>,
        /// Its length.
        len: u64,
    },
}

impl KernelSource<'_> {
    /// Opens `path`, reading its head.
    pub fn open(path: &Path) -> std::io::Result<KernelSource<'static>> {
        use std::io::Read;
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut head = Vec::with_capacity(KERNEL_HEAD_BYTES.min(len as usize));
        (&file).take(KERNEL_HEAD_BYTES as u64).read_to_end(&mut head)?;
        Ok(KernelSource::File { file, head, len })
    }

    /// The bytes the headers are read from.
    fn head(&self) -> &[u8] {
        match self {
            KernelSource::Bytes(bytes) => bytes,
            KernelSource::File { head, .. } => head,
        }
    }

    /// The image's length.
    fn len(&self) -> u64 {
        match self {
            KernelSource::Bytes(bytes) => bytes.len() as u64,
            KernelSource::File { len, .. } => *len,
        }
    }
}

/// Where and how the boot vCPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootEntry {
    /// 32-bit protected mode, paging off, `ebx` = `hvm_start_info`.
    Pvh {
        /// Entry point.
        entry: u64,
        /// `hvm_start_info` address.
        start_info: u64,
    },
    /// 64-bit long mode on identity page tables, `rsi` = zero page.
    Linux64 {
        /// Entry point.
        entry: u64,
        /// Zero page address.
        boot_params: u64,
    },
}

impl BootEntry {
    /// The protocol's name as reported in the exit line and by the probe.
    pub fn name(&self) -> &'static str {
        match self {
            BootEntry::Pvh { .. } => "pvh",
            BootEntry::Linux64 { .. } => "linux64",
        }
    }
}

/// Errors while loading the kernel and its boot data.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel image cannot be booted.
    #[error("kernel image {path}: {source}")]
    Image {
        /// What the image was called.
        path: String,
        /// What is wrong with the image.
        source: ImageError,
    },
    /// PVH was asked for but the kernel has no PVH note.
    #[error("kernel image {0}: --entry pvh asked for, but the ELF has no PVH note")]
    NoPvhNote(String),
    /// The command line is longer than the kernel accepts.
    #[error("command line is {len} bytes, the boot protocol allows at most {max}")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The command line contains a NUL byte.
    #[error("command line contains a NUL byte")]
    CmdlineNul,
    /// The initrd cannot be read or placed.
    #[error("initrd {path}: {reason}")]
    Initrd {
        /// The initrd path.
        path: PathBuf,
        /// What went wrong, in words.
        reason: String,
    },
    /// linux-loader refused the image after the checks passed.
    #[error("kernel image {path}: {reason}")]
    Load {
        /// What the image was called.
        path: String,
        /// linux-loader's reason.
        reason: String,
    },
    /// Writing boot structures to guest memory failed.
    #[error("cannot write {what} to guest memory: {reason}")]
    GuestMemory {
        /// Which structure.
        what: &'static str,
        /// What went wrong, in words.
        reason: String,
    },
}

impl BootError {
    /// True when the error is in what the user supplied (exit code 2), not in the VMM.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, BootError::GuestMemory { .. })
    }
}

/// What to boot.
pub struct BootRequest<'a> {
    /// Name of the kernel for messages (a path, or "probe").
    pub kernel_name: &'a str,
    /// The kernel image.
    pub kernel: KernelSource<'a>,
    /// An initrd to load, if any.
    pub initrd: Option<&'a Path>,
    /// The command line.
    pub cmdline: &'a str,
    /// Which entry to use.
    pub protocol: EntryProtocol,
    /// Where the ACPI RSDP is, to hand over in the boot information.
    pub rsdp: Option<u64>,
}

/// Loads the kernel, the command line and the initrd into `mem` and writes the boot information
/// for the chosen protocol. Returns how to start the boot vCPU.
pub fn load(
    request: &BootRequest,
    mem: &GuestMemoryMmap,
    ram: &RamLayout,
    e820: &[E820Entry],
) -> Result<BootEntry, BootError> {
    let image = KernelImage::parse_head(request.kernel.head(), request.kernel.len(), ram)
        .map_err(|source| BootError::Image { path: request.kernel_name.to_string(), source })?;
    let load_error = |e: linux_loader::loader::Error| BootError::Load {
        path: request.kernel_name.to_string(),
        reason: e.to_string(),
    };
    let highmem = Some(GuestAddress(HIGH_MEMORY_START));
    match &image {
        KernelImage::Elf(elf) => {
            let loaded = match &request.kernel {
                KernelSource::Bytes(bytes) => Elf::load(mem, None, &mut Cursor::new(bytes), highmem),
                KernelSource::File { file, .. } => Elf::load(mem, None, &mut &*file, highmem),
            }
            .map_err(load_error)?;
            let pvh = match loaded.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(addr) => Some(addr.0),
                _ => None,
            };
            let use_pvh = match (request.protocol, pvh) {
                (EntryProtocol::Linux64, _) | (EntryProtocol::Auto, None) => false,
                (EntryProtocol::Auto | EntryProtocol::Pvh, Some(_)) => true,
                (EntryProtocol::Pvh, None) => {
                    return Err(BootError::NoPvhNote(request.kernel_name.to_string()));
                }
            };
            write_cmdline(mem, request.cmdline, DEFAULT_CMDLINE_MAX)?;
            let initrd = load_initrd(mem, ram, request.initrd, elf.end, u32::MAX as u64)?;
            match (use_pvh, pvh) {
                (true, Some(entry)) => {
                    pvh::write_start_info(mem, request.cmdline, initrd, request.rsdp, e820)?;
                    Ok(BootEntry::Pvh { entry, start_info: PVH_INFO_ADDR })
                }
                _ => {
                    linux::write_zero_page(mem, None, request.cmdline, initrd, request.rsdp, e820)?;
                    Ok(BootEntry::Linux64 { entry: elf.entry, boot_params: ZERO_PAGE_ADDR })
                }
            }
        }
        KernelImage::BzImage(bz) => {
            if request.protocol == EntryProtocol::Pvh {
                return Err(BootError::NoPvhNote(request.kernel_name.to_string()));
            }
            let loaded = match &request.kernel {
                KernelSource::Bytes(bytes) => BzImage::load(mem, None, &mut Cursor::new(bytes), highmem),
                KernelSource::File { file, .. } => BzImage::load(mem, None, &mut &*file, highmem),
            }
            .map_err(load_error)?;
            write_cmdline(mem, request.cmdline, bz.cmdline_max as usize)?;
            let kernel_end = loaded.kernel_load.0 + bz.payload.max(bz.init_size as u64);
            let initrd = load_initrd(mem, ram, request.initrd, kernel_end, bz.initrd_addr_max as u64)?;
            linux::write_zero_page(mem, loaded.setup_header, request.cmdline, initrd, request.rsdp, e820)?;
            Ok(BootEntry::Linux64 { entry: loaded.kernel_load.0 + 0x200, boot_params: ZERO_PAGE_ADDR })
        }
    }
}

fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str, max: usize) -> Result<(), BootError> {
    let max = max.min(CMDLINE_SPACE as usize - 1);
    if cmdline.len() > max {
        return Err(BootError::CmdlineTooLong { len: cmdline.len(), max });
    }
    if cmdline.contains('\0') {
        return Err(BootError::CmdlineNul);
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(|e| BootError::GuestMemory { what: "the command line", reason: e.to_string() })
}

/// A loaded initrd: guest address and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initrd {
    /// Guest-physical address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Places the initrd as high as possible below the hole (and the payload window) and
/// `addr_max`, above the kernel.
fn initrd_placement(ram: &RamLayout, size: u64, kernel_end: u64, addr_max: u64) -> Option<u64> {
    let top = ram.initrd_top().min(addr_max.saturating_add(1));
    let addr = top.checked_sub(size)? & !(PAGE_SIZE - 1);
    (addr >= kernel_end.max(HIGH_MEMORY_START)).then_some(addr)
}

fn load_initrd(
    mem: &GuestMemoryMmap,
    ram: &RamLayout,
    path: Option<&Path>,
    kernel_end: u64,
    addr_max: u64,
) -> Result<Option<Initrd>, BootError> {
    let Some(path) = path else { return Ok(None) };
    let fail = |reason: String| BootError::Initrd { path: path.to_path_buf(), reason };
    let mut file = File::open(path).map_err(|e| fail(e.to_string()))?;
    let size = file.metadata().map_err(|e| fail(e.to_string()))?.len();
    if size == 0 {
        return Err(fail("the file is empty".into()));
    }
    let addr = initrd_placement(ram, size, kernel_end, addr_max).ok_or_else(|| {
        fail(format!(
            "{} KiB does not fit between the kernel's end at {kernel_end:#x} and {:#x} in {} MiB of guest memory",
            size.div_ceil(1024),
            ram.initrd_top().min(addr_max.saturating_add(1)),
            ram.size() >> 20
        ))
    })?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
        .map_err(|e| fail(format!("cannot read it into guest memory: {e}")))?;
    Ok(Some(Initrd { addr, size }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GuestRam, MIB};

    fn guest(mib: u64) -> GuestRam {
        GuestRam::new(RamLayout::new(mib * MIB)).unwrap()
    }

    fn request<'a>(kernel: &'a [u8], cmdline: &'a str, protocol: EntryProtocol) -> BootRequest<'a> {
        let kernel = KernelSource::Bytes(kernel);
        BootRequest { kernel_name: "test", kernel, initrd: None, cmdline, protocol, rsdp: Some(0xe0000) }
    }

    #[test]
    fn a_kernel_file_loads_straight_into_guest_memory_as_its_bytes_would() {
        let mut kernel = image::tests::elf(0x20_0000, 0x3000, 0x3000);
        for (i, byte) in kernel[0x1000..].iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmlinux");
        std::fs::write(&path, &kernel).unwrap();
        let (from_bytes, from_file) = (guest(16), guest(16));
        let e820 = from_bytes.layout.e820();
        let a = load(&request(&kernel, "x", EntryProtocol::Auto), &from_bytes.memory, &from_bytes.layout, &e820);
        let source = KernelSource::open(&path).unwrap();
        assert!(matches!(&source, KernelSource::File { len: 0x4000, head, .. } if head.len() == 0x4000));
        let file_request = BootRequest { kernel: source, ..request(&kernel, "x", EntryProtocol::Auto) };
        let b = load(&file_request, &from_file.memory, &from_file.layout, &e820);
        assert_eq!(a.unwrap(), b.unwrap());
        let (mut x, mut y) = (vec![0u8; 0x3000], vec![0u8; 0x3000]);
        from_bytes.memory.read_slice(&mut x, GuestAddress(0x20_0000)).unwrap();
        from_file.memory.read_slice(&mut y, GuestAddress(0x20_0000)).unwrap();
        assert!(x == y && x == kernel[0x1000..], "the segment, byte for byte");

        // A file cut short after its headers is refused from its length, before any load.
        std::fs::write(&path, &kernel[..0x2000]).unwrap();
        let cut =
            BootRequest { kernel: KernelSource::open(&path).unwrap(), ..request(&kernel, "x", EntryProtocol::Auto) };
        let err = load(&cut, &from_file.memory, &from_file.layout, &e820).unwrap_err();
        assert!(err.to_string().contains("file is 8192 bytes"), "{err}");
    }

    #[test]
    fn elf_without_pvh_note_takes_the_64_bit_entry() {
        let ram = guest(16);
        let kernel = image::tests::elf(0x20_0000, 0x10, 0x10);
        let entry =
            load(&request(&kernel, "x", EntryProtocol::Auto), &ram.memory, &ram.layout, &ram.layout.e820()).unwrap();
        assert_eq!(entry, BootEntry::Linux64 { entry: 0x20_0000, boot_params: ZERO_PAGE_ADDR });
        let err = load(&request(&kernel, "x", EntryProtocol::Pvh), &ram.memory, &ram.layout, &[]).unwrap_err();
        assert!(matches!(err, BootError::NoPvhNote(_)) && err.is_bad_input());
    }

    #[test]
    fn bzimage_enters_at_load_address_plus_0x200() {
        let ram = guest(32);
        let kernel = image::tests::bzimage(0x020f, 8192, 0x40_0000);
        let entry =
            load(&request(&kernel, "console=ttyS0", EntryProtocol::Auto), &ram.memory, &ram.layout, &ram.layout.e820())
                .unwrap();
        assert_eq!(entry, BootEntry::Linux64 { entry: 0x10_0200, boot_params: ZERO_PAGE_ADDR });
    }

    #[test]
    fn command_line_limits() {
        let ram = guest(16);
        let kernel = image::tests::bzimage(0x020f, 8192, 0);
        let long = "a".repeat(2048);
        let err = load(&request(&kernel, &long, EntryProtocol::Auto), &ram.memory, &ram.layout, &[]).unwrap_err();
        assert!(matches!(err, BootError::CmdlineTooLong { len: 2048, max: 2047 }), "{err}");
        let err = load(&request(&kernel, "a\0b", EntryProtocol::Auto), &ram.memory, &ram.layout, &[]).unwrap_err();
        assert!(matches!(err, BootError::CmdlineNul));
    }

    #[test]
    fn initrd_goes_high_and_must_fit() {
        let layout = RamLayout::new(64 * MIB);
        assert_eq!(initrd_placement(&layout, 4 * MIB + 1, 0x20_0000, u64::MAX), Some(60 * MIB - PAGE_SIZE));
        assert_eq!(initrd_placement(&layout, MIB, 0x20_0000, 32 * MIB - 1), Some(31 * MIB));
        assert_eq!(initrd_placement(&layout, 63 * MIB, 2 * MIB, u64::MAX), None);
        assert_eq!(initrd_placement(&layout, 128 * MIB, 0, u64::MAX), None);
    }

    #[test]
    fn initrd_is_loaded_or_refused_clearly() {
        let ram = guest(16);
        let kernel = image::tests::elf(0x20_0000, 0x10, 0x10);
        let dir = std::env::temp_dir().join(format!("driverlab-initrd-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small");
        std::fs::write(&small, b"initrd!").unwrap();
        let mut req = request(&kernel, "", EntryProtocol::Linux64);
        req.initrd = Some(&small);
        load(&req, &ram.memory, &ram.layout, &[]).unwrap();
        let params: linux_loader::loader::bootparam::boot_params =
            ram.memory.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        let (addr, size) = (params.hdr.ramdisk_image as u64, params.hdr.ramdisk_size as u64);
        assert_eq!(size, 7);
        let mut back = [0u8; 7];
        ram.memory.read_slice(&mut back, GuestAddress(addr)).unwrap();
        assert_eq!(&back, b"initrd!");

        let big = dir.join("big");
        std::fs::write(&big, vec![0u8; 20 << 20]).unwrap();
        req.initrd = Some(&big);
        let err = load(&req, &ram.memory, &ram.layout, &[]).unwrap_err();
        assert!(matches!(err, BootError::Initrd { .. }) && err.to_string().contains("does not fit"), "{err}");
        let missing = dir.join("missing");
        req.initrd = Some(&missing);
        assert!(matches!(load(&req, &ram.memory, &ram.layout, &[]), Err(BootError::Initrd { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
