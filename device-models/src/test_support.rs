//! What the models' tests share: guest memory in a memfd, eventfds standing in for the
//! client's MSI-X vectors.

use std::fs::File;
use std::os::fd::FromRawFd;

/// Guest memory: a memfd of `size` bytes.
pub fn memfd(size: u64) -> File {
    let file = memfd::MemfdOptions::default().create("model-test").unwrap().into_file();
    file.set_len(size).unwrap();
    file
}

/// An eventfd, as a client hands one over per MSI-X vector.
pub fn eventfd() -> File {
    // SAFETY: eventfd with valid flags; checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nobody else owns.
    unsafe { File::from_raw_fd(fd) }
}

/// Reads and clears an eventfd: how many times it was signalled.
pub fn fired(fd: &File) -> u64 {
    let mut count = [0u8; 8];
    match std::io::Read::read(&mut &*fd, &mut count) {
        Ok(8) => u64::from_le_bytes(count),
        _ => 0,
    }
}
