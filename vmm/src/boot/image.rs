//! Recognising and checking kernel images before anything is written to guest memory, so that a
//! bad image is a one-line error and not a loader failure half-way through.

use object::elf::{self, FileHeader64, ProgramHeader64};
use object::{LittleEndian, pod};

use crate::memory::RamLayout;

/// Offset of the setup header in a bzImage.
const SETUP_HEADER_OFFSET: usize = 0x1f1;
/// "HdrS".
const SETUP_MAGIC: u32 = 0x5372_6448;
/// The 64-bit entry point and the fields used here need boot protocol 2.12.
pub const MIN_BOOT_PROTOCOL: u16 = 0x020c;
/// `xloadflags`: the kernel has the 64-bit entry point at `code32_start + 0x200`.
const XLF_KERNEL_64: u16 = 1 << 0;
/// Where a bzImage's protected-mode kernel is loaded.
pub const BZIMAGE_LOAD_ADDR: u64 = 0x10_0000;

/// Errors found in a kernel image.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// Neither ELF nor bzImage.
    #[error("not an ELF or bzImage kernel (starts with {0})")]
    UnknownFormat(String),
    /// An ELF this VMM cannot boot.
    #[error("unsupported ELF: {0}")]
    UnsupportedElf(&'static str),
    /// The ELF ends before the data its headers describe.
    #[error("truncated ELF: {0}")]
    TruncatedElf(String),
    /// A bzImage too old for the 64-bit boot protocol or without a 64-bit entry.
    #[error("unsupported bzImage: {0}")]
    UnsupportedBzImage(String),
    /// The kernel does not fit in guest RAM.
    #[error("kernel does not fit in guest memory: {0}")]
    DoesNotFit(String),
}

/// A recognised kernel image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelImage {
    /// An ELF (vmlinux, the probe guest).
    Elf(ElfInfo),
    /// A bzImage.
    BzImage(BzImageInfo),
}

/// What the VMM needs to know about an ELF kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_entry`: the 64-bit entry point.
    pub entry: u64,
    /// End of the highest loaded segment (including its BSS).
    pub end: u64,
}

/// What the VMM needs to know about a bzImage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BzImageInfo {
    /// Boot protocol version (e.g. 0x020f).
    pub protocol: u16,
    /// Longest command line the kernel accepts, without the NUL.
    pub cmdline_max: u32,
    /// Highest address the initrd may end at (inclusive).
    pub initrd_addr_max: u32,
    /// Memory the kernel needs from its load address while decompressing.
    pub init_size: u32,
    /// Bytes of the protected-mode payload.
    pub payload: u64,
}

impl KernelImage {
    /// Recognises `data` and checks that it fits in `ram`.
    pub fn parse(data: &[u8], ram: &RamLayout) -> Result<KernelImage, ImageError> {
        KernelImage::parse_head(data, data.len() as u64, ram)
    }

    /// The same from the first bytes of an image of `len` bytes: its headers must lie in them.
    pub fn parse_head(data: &[u8], len: u64, ram: &RamLayout) -> Result<KernelImage, ImageError> {
        if data.starts_with(&elf::ELFMAG) {
            return parse_elf(data, len, ram).map(KernelImage::Elf);
        }
        if read_u32(data, SETUP_HEADER_OFFSET + 0x11) == Some(SETUP_MAGIC) {
            return parse_bzimage(data, len, ram).map(KernelImage::BzImage);
        }
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Err(ImageError::UnknownFormat(if head.is_empty() {
            "nothing: the file is empty".into()
        } else {
            head.join(" ")
        }))
    }
}

fn read_u16(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn parse_elf(data: &[u8], len: u64, ram: &RamLayout) -> Result<ElfInfo, ImageError> {
    let Ok((header, _)) = pod::from_bytes::<FileHeader64<LittleEndian>>(data) else {
        return Err(ImageError::TruncatedElf(format!("{len} bytes, shorter than an ELF header")));
    };
    if header.e_ident.class != elf::ELFCLASS64 {
        return Err(ImageError::UnsupportedElf("not a 64-bit ELF"));
    }
    if header.e_ident.data != elf::ELFDATA2LSB {
        return Err(ImageError::UnsupportedElf("not little-endian"));
    }
    let le = LittleEndian;
    if header.e_machine.get(le) != elf::EM_X86_64 {
        return Err(ImageError::UnsupportedElf("not an x86-64 ELF"));
    }
    let segments = program_headers(header, data, len)?;
    let mut end = 0;
    let mut loads = 0;
    for (i, ph) in segments.iter().enumerate() {
        let (offset, paddr) = (ph.p_offset.get(le), ph.p_paddr.get(le));
        let (filesz, memsz) = (ph.p_filesz.get(le), ph.p_memsz.get(le));
        // A segment with nothing in the file (all `.bss`) still takes its memory.
        if ph.p_type.get(le) != elf::PT_LOAD || (filesz == 0 && memsz == 0) {
            continue;
        }
        loads += 1;
        if offset.checked_add(filesz).is_none_or(|e| e > len) {
            return Err(ImageError::TruncatedElf(format!(
                "segment {i} needs bytes {offset:#x}..{:#x}, file is {len} bytes",
                offset.saturating_add(filesz),
            )));
        }
        let size = memsz.max(filesz);
        if paddr < crate::layout::HIGH_MEMORY_START || !ram.contains(paddr, size) {
            return Err(ImageError::DoesNotFit(format!(
                "segment {i} at {paddr:#x}..{:#x} is outside guest RAM from 1 MiB to {}",
                paddr.saturating_add(size),
                describe_ram(ram)
            )));
        }
        end = end.max(paddr + size);
    }
    if loads == 0 {
        return Err(ImageError::UnsupportedElf("no loadable segment"));
    }
    let entry = header.e_entry.get(le);
    if entry < crate::layout::HIGH_MEMORY_START || !ram.contains(entry, 1) {
        return Err(ImageError::UnsupportedElf("entry point outside the loaded kernel"));
    }
    Ok(ElfInfo { entry, end })
}

/// The program header table of an ELF of `len` bytes whose first bytes are `data`.
fn program_headers<'a>(
    header: &FileHeader64<LittleEndian>,
    data: &'a [u8],
    len: u64,
) -> Result<&'a [ProgramHeader64<LittleEndian>], ImageError> {
    let le = LittleEndian;
    let (phoff, phnum) = (header.e_phoff.get(le), header.e_phnum.get(le) as u64);
    if header.e_phentsize.get(le) as usize != size_of::<ProgramHeader64<LittleEndian>>() {
        return Err(ImageError::UnsupportedElf("program header size is not 56"));
    }
    if phoff < size_of::<FileHeader64<LittleEndian>>() as u64 {
        return Err(ImageError::UnsupportedElf("program headers overlap the ELF header"));
    }
    let table_end =
        phnum.checked_mul(size_of::<ProgramHeader64<LittleEndian>>() as u64).and_then(|n| n.checked_add(phoff));
    if table_end.is_none_or(|end| end > len) {
        return Err(ImageError::TruncatedElf(format!(
            "{phnum} program headers at offset {phoff:#x}, file is {len} bytes"
        )));
    }
    data.get(phoff as usize..)
        .and_then(|table| pod::slice_from_bytes(table, phnum as usize).ok())
        .map(|(headers, _)| headers)
        .ok_or(ImageError::UnsupportedElf("program headers beyond the file's first 64 KiB"))
}

fn parse_bzimage(data: &[u8], len: u64, ram: &RamLayout) -> Result<BzImageInfo, ImageError> {
    let protocol = read_u16(data, 0x206).unwrap_or(0);
    if protocol < MIN_BOOT_PROTOCOL {
        return Err(ImageError::UnsupportedBzImage(format!(
            "boot protocol {}.{:02}, the 64-bit entry needs 2.12 or later",
            protocol >> 8,
            protocol & 0xff
        )));
    }
    let header_end = 0x264; // through init_size
    if data.len() < header_end {
        return Err(ImageError::UnsupportedBzImage(format!("truncated setup header ({} bytes)", data.len())));
    }
    let xloadflags = read_u16(data, 0x236).unwrap_or(0);
    if xloadflags & XLF_KERNEL_64 == 0 {
        return Err(ImageError::UnsupportedBzImage("no 64-bit entry point (XLF_KERNEL_64 clear)".into()));
    }
    let setup_sects = match data[SETUP_HEADER_OFFSET] {
        0 => 4,
        n => n as u64,
    };
    let setup_size = (setup_sects + 1) * 512;
    let payload = len.checked_sub(setup_size).filter(|&p| p > 0).ok_or_else(|| {
        ImageError::UnsupportedBzImage(format!("{len} bytes, but its setup code alone takes {setup_size}"))
    })?;
    let init_size = read_u32(data, 0x260).unwrap_or(0);
    let needed = payload.max(init_size as u64);
    if !ram.contains(BZIMAGE_LOAD_ADDR, needed) {
        return Err(ImageError::DoesNotFit(format!(
            "the bzImage needs {:#x}..{:#x} to decompress, guest RAM is {}",
            BZIMAGE_LOAD_ADDR,
            BZIMAGE_LOAD_ADDR + needed,
            describe_ram(ram)
        )));
    }
    Ok(BzImageInfo {
        protocol,
        cmdline_max: read_u32(data, 0x238).unwrap_or(255),
        initrd_addr_max: read_u32(data, 0x22c).unwrap_or(0x37ff_ffff),
        init_size,
        payload,
    })
}

fn describe_ram(ram: &RamLayout) -> String {
    format!("{} MiB", ram.size() >> 20)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::memory::MIB;

    /// A minimal x86-64 ELF with one PT_LOAD segment of `filesz` bytes at `paddr`.
    pub(crate) fn elf(paddr: u64, filesz: u64, memsz: u64) -> Vec<u8> {
        let mut d = vec![0u8; 0x1000 + filesz as usize];
        d[..4].copy_from_slice(&elf::ELFMAG);
        d[4] = elf::ELFCLASS64;
        d[5] = elf::ELFDATA2LSB;
        d[6] = 1;
        d[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        d[18..20].copy_from_slice(&elf::EM_X86_64.to_le_bytes());
        d[24..32].copy_from_slice(&paddr.to_le_bytes());
        d[32..40].copy_from_slice(&64u64.to_le_bytes());
        d[52..54].copy_from_slice(&64u16.to_le_bytes());
        d[54..56].copy_from_slice(&56u16.to_le_bytes());
        d[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = 64;
        d[ph..ph + 4].copy_from_slice(&elf::PT_LOAD.to_le_bytes());
        d[ph + 8..ph + 16].copy_from_slice(&0x1000u64.to_le_bytes());
        d[ph + 16..ph + 24].copy_from_slice(&paddr.to_le_bytes());
        d[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
        d[ph + 32..ph + 40].copy_from_slice(&filesz.to_le_bytes());
        d[ph + 40..ph + 48].copy_from_slice(&memsz.to_le_bytes());
        d
    }

    /// A bzImage header of boot protocol `protocol` followed by `payload` bytes.
    pub(crate) fn bzimage(protocol: u16, payload: usize, init_size: u32) -> Vec<u8> {
        let setup_sects = 4u8;
        let mut d = vec![0u8; (setup_sects as usize + 1) * 512 + payload];
        d[SETUP_HEADER_OFFSET] = setup_sects;
        d[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        d[0x202..0x206].copy_from_slice(&SETUP_MAGIC.to_le_bytes());
        d[0x206..0x208].copy_from_slice(&protocol.to_le_bytes());
        d[0x211] = 0x01; // loadflags: LOADED_HIGH
        d[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
        d[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        d[0x236..0x238].copy_from_slice(&XLF_KERNEL_64.to_le_bytes());
        d[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
        d[0x260..0x264].copy_from_slice(&init_size.to_le_bytes());
        d
    }

    fn ram(mib: u64) -> RamLayout {
        RamLayout::new(mib * MIB)
    }

    #[test]
    fn recognises_elf_and_bzimage() {
        let info = KernelImage::parse(&elf(0x10_0000, 0x100, 0x2000), &ram(16)).unwrap();
        assert_eq!(info, KernelImage::Elf(ElfInfo { entry: 0x10_0000, end: 0x10_2000 }));
        let KernelImage::BzImage(bz) = KernelImage::parse(&bzimage(0x020f, 4096, 0x10000), &ram(16)).unwrap() else {
            panic!("not a bzImage")
        };
        assert_eq!((bz.protocol, bz.cmdline_max, bz.payload), (0x020f, 2047, 4096));
    }

    #[test]
    fn rejects_what_it_cannot_boot() {
        let r = ram(16);
        assert!(matches!(KernelImage::parse(b"", &r), Err(ImageError::UnknownFormat(_))));
        assert!(matches!(KernelImage::parse(b"#!/bin/sh\necho", &r), Err(ImageError::UnknownFormat(_))));
        let whole = elf(0x10_0000, 0x100, 0x100);
        assert!(matches!(KernelImage::parse(&whole[..40], &r), Err(ImageError::TruncatedElf(_))));
        assert!(matches!(KernelImage::parse(&whole[..0x1050], &r), Err(ImageError::TruncatedElf(_))));
        let mut class32 = whole.clone();
        class32[4] = 1;
        assert!(matches!(KernelImage::parse(&class32, &r), Err(ImageError::UnsupportedElf(_))));
        assert!(matches!(KernelImage::parse(&elf(0x10_0000, 0x100, 32 * MIB), &r), Err(ImageError::DoesNotFit(_))));
        assert!(matches!(KernelImage::parse(&elf(0x1000, 0x100, 0x100), &r), Err(ImageError::DoesNotFit(_))));
        assert!(matches!(KernelImage::parse(&bzimage(0x0206, 4096, 0), &r), Err(ImageError::UnsupportedBzImage(_))));
        assert!(matches!(KernelImage::parse(&bzimage(0x020f, 4096, 64 << 20), &r), Err(ImageError::DoesNotFit(_))));
        let mut no64 = bzimage(0x020f, 4096, 0);
        no64[0x236] = 0;
        assert!(matches!(KernelImage::parse(&no64, &r), Err(ImageError::UnsupportedBzImage(_))));
    }
}
