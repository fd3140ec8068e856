//! Kernel images: the compressed payload of a bzImage and the ELF vmlinux inside it.

use std::io::Read;

/// Errors taking a kernel image apart.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Not a bzImage.
    #[error("not a bzImage: {0}")]
    NotBzImage(&'static str),
    /// The payload's compression is not one this tool decompresses.
    #[error(
        "the payload is {0}-compressed; driverlab decompresses gzip, zstd and lz4 (use the kernel's scripts/extract-vmlinux)"
    )]
    Unsupported(&'static str),
    /// Decompression failed.
    #[error("cannot decompress the {format} payload: {reason}")]
    Decompress {
        /// The compression.
        format: &'static str,
        /// What went wrong, in words.
        reason: String,
    },
    /// The payload did not hold an ELF.
    #[error("the decompressed payload is not an ELF vmlinux")]
    NotElf,
}

/// How a bzImage's payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Not compressed: the payload is the ELF.
    None,
    /// gzip.
    Gzip,
    /// zstd (Debian's 6.12 kernels).
    Zstd,
    /// LZ4 in the legacy frame format.
    Lz4,
    /// xz.
    Xz,
    /// lzma.
    Lzma,
    /// bzip2.
    Bzip2,
    /// lzo.
    Lzo,
}

impl Compression {
    /// Recognises the compression from the payload's first bytes.
    pub fn detect(payload: &[u8]) -> Option<Compression> {
        const MAGICS: &[(&[u8], Compression)] = &[
            (b"\x7fELF", Compression::None),
            (b"\x1f\x8b", Compression::Gzip),
            (b"\x28\xb5\x2f\xfd", Compression::Zstd),
            (b"\x02\x21\x4c\x18", Compression::Lz4),
            (b"\xfd7zXZ\x00", Compression::Xz),
            (b"\x5d\x00\x00", Compression::Lzma),
            (b"BZh", Compression::Bzip2),
            (b"\x89LZO", Compression::Lzo),
        ];
        MAGICS.iter().find(|(magic, _)| payload.starts_with(magic)).map(|&(_, c)| c)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::Xz => "xz",
            Compression::Lzma => "lzma",
            Compression::Bzip2 => "bzip2",
            Compression::Lzo => "lzo",
        }
    }
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

/// The compressed kernel inside a bzImage (setup header `payload_offset`/`payload_length`,
/// boot protocol 2.08 and later).
pub fn bzimage_payload(bzimage: &[u8]) -> Result<&[u8], KernelError> {
    if u32_at(bzimage, 0x202) != Some(0x5372_6448) {
        return Err(KernelError::NotBzImage("no HdrS setup header"));
    }
    let version = u16::from_le_bytes([bzimage[0x206], bzimage[0x207]]);
    if version < 0x0208 {
        return Err(KernelError::NotBzImage("boot protocol older than 2.08 has no payload fields"));
    }
    let setup_sects = match bzimage[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let offset = u32_at(bzimage, 0x248).ok_or(KernelError::NotBzImage("truncated setup header"))? as usize;
    let length = u32_at(bzimage, 0x24c).ok_or(KernelError::NotBzImage("truncated setup header"))? as usize;
    let start = (setup_sects + 1) * 512 + offset;
    bzimage
        .get(start..start.checked_add(length).ok_or(KernelError::NotBzImage("payload length overflows"))?)
        .ok_or(KernelError::NotBzImage("payload lies beyond the end of the file"))
}

/// The ELF vmlinux inside a bzImage (it carries the PVH note when the kernel has CONFIG_PVH).
pub fn extract_vmlinux(bzimage: &[u8]) -> Result<Vec<u8>, KernelError> {
    let payload = bzimage_payload(bzimage)?;
    let compression = Compression::detect(payload).ok_or(KernelError::Unsupported("an unknown format"))?;
    let fail = |reason: String| KernelError::Decompress { format: compression.name(), reason };
    let mut out = Vec::new();
    match compression {
        Compression::None => out.extend_from_slice(payload),
        Compression::Gzip => {
            flate2::read::GzDecoder::new(payload).read_to_end(&mut out).map_err(|e| fail(e.to_string()))?;
        }
        Compression::Zstd => {
            let mut input = payload;
            let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut input).map_err(|e| fail(e.to_string()))?;
            decoder.read_to_end(&mut out).map_err(|e| fail(e.to_string()))?;
        }
        Compression::Lz4 => out = lz4_legacy(payload).map_err(fail)?,
        other => return Err(KernelError::Unsupported(other.name())),
    }
    if !out.starts_with(b"\x7fELF") {
        return Err(KernelError::NotElf);
    }
    Ok(out)
}

/// Shortens each loadable segment's bytes in the file (`p_filesz`) by the zeros that end it, and
/// returns how many bytes that takes off. A loader zero-fills a segment from `p_filesz` to
/// `p_memsz` (and fresh guest memory is zero anyway), so the kernel in guest memory is the same,
/// while every VMM reads, copies and faults in that much less: the vmlinux in Debian's bzImage
/// carries its `.bss` and `.brk`, 11 MiB of zeros at the end of its last segment. Anything but a
/// 64-bit little-endian ELF with well-formed program headers is left as it is.
pub fn trim_segment_zeros(elf: &mut [u8]) -> u64 {
    let u16_at = |d: &[u8], at: usize| d.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |d: &[u8], at: usize| d.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    if !elf.starts_with(b"\x7fELF") || elf.get(4..6) != Some(&[2, 1]) {
        return 0;
    }
    let (Some(phoff), Some(56), Some(phnum)) = (u64_at(elf, 32), u16_at(elf, 54), u16_at(elf, 56)) else {
        return 0;
    };
    let mut trimmed = 0;
    for i in 0..phnum {
        let Some(ph) = usize::try_from(phoff).ok().and_then(|p| p.checked_add(i * 56)) else { return trimmed };
        if elf.get(ph..ph + 4) != Some(&1u32.to_le_bytes()) {
            continue; // not PT_LOAD
        }
        let (Some(offset), Some(filesz)) = (u64_at(elf, ph + 8), u64_at(elf, ph + 32)) else { return trimmed };
        let Some(bytes) = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(filesz).ok())
            .and_then(|(o, n)| elf.get(o..o.checked_add(n)?))
        else {
            continue;
        };
        // Keep one byte: a segment with nothing in the file is one some loaders skip.
        let kept = bytes.iter().rposition(|&b| b != 0).map_or(1, |last| last + 1);
        let cut = (bytes.len() - kept) as u64;
        if cut > 0 {
            elf[ph + 32..ph + 40].copy_from_slice(&(filesz - cut).to_le_bytes());
            trimmed += cut;
        }
    }
    trimmed
}

/// Decodes the legacy LZ4 frame format the kernel uses: a magic number, then blocks of up to
/// 8 MiB, each preceded by its compressed size; the kernel build appends the uncompressed size.
fn lz4_legacy(payload: &[u8]) -> Result<Vec<u8>, String> {
    const MAGIC: u32 = 0x184c_2102;
    const BLOCK_MAX: usize = 8 << 20;
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(size) = u32_at(payload, at) {
        at += 4;
        if size == MAGIC {
            continue;
        }
        let size = size as usize;
        let Some(block) = payload.get(at..at + size) else {
            // The trailing uncompressed-size word, not a block.
            break;
        };
        let start = out.len();
        out.resize(start + BLOCK_MAX, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..]).map_err(|e| e.to_string())?;
        out.truncate(start + n);
        at += size;
    }
    if out.is_empty() {
        return Err("no LZ4 block".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn trailing_zeros_of_loadable_segments_leave_the_file_but_not_memory() {
        // An ELF64 header, two PT_LOAD program headers and a PT_NOTE, then the segments' bytes.
        let mut elf = vec![0u8; 0x1000];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&3u16.to_le_bytes());
        let phdr = |elf: &mut Vec<u8>, i: usize, kind: u32, offset: u64, filesz: u64| {
            let ph = 64 + i * 56;
            elf[ph..ph + 4].copy_from_slice(&kind.to_le_bytes());
            elf[ph + 8..ph + 16].copy_from_slice(&offset.to_le_bytes());
            elf[ph + 32..ph + 40].copy_from_slice(&filesz.to_le_bytes());
            elf[ph + 40..ph + 48].copy_from_slice(&filesz.to_le_bytes());
        };
        phdr(&mut elf, 0, 1, 0x400, 0x100); // data to its end
        phdr(&mut elf, 1, 1, 0x500, 0x300); // 0x10 bytes of data, then zeros
        phdr(&mut elf, 2, 4, 0x900, 0x100); // a note: never touched
        elf[0x400..0x500].fill(0xaa);
        elf[0x500..0x510].fill(0xbb);
        let filesz =
            |elf: &[u8], i: usize| u64::from_le_bytes(elf[64 + i * 56 + 32..64 + i * 56 + 40].try_into().unwrap());
        let memsz =
            |elf: &[u8], i: usize| u64::from_le_bytes(elf[64 + i * 56 + 40..64 + i * 56 + 48].try_into().unwrap());
        assert_eq!(trim_segment_zeros(&mut elf), 0x2f0);
        assert_eq!((filesz(&elf, 0), filesz(&elf, 1), filesz(&elf, 2)), (0x100, 0x10, 0x100));
        assert_eq!((memsz(&elf, 1), memsz(&elf, 2)), (0x300, 0x100), "memory sizes stay");
        assert_eq!(trim_segment_zeros(&mut elf), 0, "a second pass finds nothing");
        // An all-zero segment keeps one byte; a non-ELF and a broken one are left alone.
        elf[0x500..0x510].fill(0);
        assert_eq!((trim_segment_zeros(&mut elf), filesz(&elf, 1)), (0xf, 1));
        let mut text = b"#!/bin/sh".to_vec();
        assert_eq!(trim_segment_zeros(&mut text), 0);
        let mut cut = elf[..70].to_vec();
        assert_eq!(trim_segment_zeros(&mut cut), 0);
    }

    fn fake_vmlinux() -> Vec<u8> {
        let mut elf = b"\x7fELF".to_vec();
        elf.extend((0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()));
        elf
    }

    fn bzimage_with(payload: &[u8]) -> Vec<u8> {
        let setup_sects = 4usize;
        let mut bz = vec![0u8; (setup_sects + 1) * 512];
        bz[0x1f1] = setup_sects as u8;
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        bz[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        bz[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        bz.extend_from_slice(&[0u8; 16]);
        bz.extend_from_slice(payload);
        bz.extend_from_slice(&[0u8; 64]);
        bz
    }

    fn with_size_trailer(mut payload: Vec<u8>, size: usize) -> Vec<u8> {
        payload.extend_from_slice(&(size as u32).to_le_bytes());
        payload
    }

    #[test]
    fn extracts_gzip_zstd_and_lz4_payloads() {
        let vmlinux = fake_vmlinux();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&vmlinux).unwrap();
        let zstd = ruzstd::encoding::compress_to_vec(&vmlinux[..], ruzstd::encoding::CompressionLevel::Fastest);
        let mut lz4 = 0x184c_2102u32.to_le_bytes().to_vec();
        for chunk in vmlinux.chunks(300_000) {
            let block = lz4_flex::block::compress(chunk);
            lz4.extend_from_slice(&(block.len() as u32).to_le_bytes());
            lz4.extend_from_slice(&block);
        }
        for payload in [gz.finish().unwrap(), zstd, lz4] {
            let bz = bzimage_with(&with_size_trailer(payload, vmlinux.len()));
            assert_eq!(extract_vmlinux(&bz).unwrap(), vmlinux);
        }
    }

    #[test]
    fn reports_what_it_cannot_do() {
        assert!(matches!(extract_vmlinux(b"not a kernel at all, clearly"), Err(KernelError::NotBzImage(_))));
        assert!(matches!(extract_vmlinux(&bzimage_with(b"\xfd7zXZ\x00rest")), Err(KernelError::Unsupported("xz"))));
        assert!(matches!(extract_vmlinux(&bzimage_with(b"\x1f\x8bgarbage")), Err(KernelError::Decompress { .. })));
        let mut bz = bzimage_with(b"\x7fELF");
        bz.truncate(bz.len() - 70);
        assert!(matches!(extract_vmlinux(&bz), Err(KernelError::NotBzImage(_))));
        assert!(matches!(extract_vmlinux(&bzimage_with(b"\x7fELF")), Ok(v) if v == b"\x7fELF"));
    }
}
