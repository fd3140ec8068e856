//! An empty root: a fresh tmpfs made the root, the host's tree unmounted, the new root made
//! read-only. Nothing of the host is mounted in the jail; what the process uses it opened
//! before.
//!
//! `pivot_root` does it, except where the current root is the initramfs (rootfs, which cannot
//! be pivoted away: a box that runs from its initramfs, like the nested lab box). There every
//! other mount is detached, the tmpfs is moved over `/` and the process chroots into it, as
//! `switch_root` does; the initramfs stays underneath, out of reach of a process without
//! capabilities.

use std::ffi::CString;

fn c(path: &str) -> CString {
    CString::new(path).expect("no NUL in a path")
}

use crate::error::{JailError, check};

/// The mount points of this namespace, deepest first.
fn mount_points() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = text.lines().filter_map(|l| l.split(' ').nth(4)).map(str::to_string).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// Makes an empty read-only tmpfs this process's root; says how.
pub(crate) fn pivot_to_empty_root(name: &str) -> Result<&'static str, JailError> {
    let none = std::ptr::null::<libc::c_char>();
    let root = c("/");
    // The mount point for the new root: /tmp exists on every Linux host driverlab runs on;
    // mounting over it changes nothing outside this namespace.
    let new_root = c("/tmp");
    let source = c(&format!("driverlab-{name}"));
    let tmpfs = c("tmpfs");
    let options = c("size=16k,nr_inodes=16,mode=0755");
    let old = c("/tmp/old-root");
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let how;
    // SAFETY: mount(2), mkdir(2), rmdir(2), chdir(2), chroot(2),
    // pivot_root(2) and umount2(2) on NUL-terminated paths that live until the calls return;
    // they change only this process's mount namespace and root.
    unsafe {
        // No mount event reaches the host (or comes from it).
        check(
            "making mounts private",
            libc::mount(none, root.as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, none.cast()),
        )?;
        check(
            "mounting the tmpfs",
            libc::mount(source.as_ptr(), new_root.as_ptr(), tmpfs.as_ptr(), flags, options.as_ptr().cast()),
        )?;
        check("creating the old root's mount point", libc::mkdir(old.as_ptr(), 0o700))?;
        if libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), old.as_ptr()) == 0 {
            check("chdir /", libc::chdir(root.as_ptr()))?;
            let old_inside = c("/old-root");
            check("unmounting the host's tree", libc::umount2(old_inside.as_ptr(), libc::MNT_DETACH))?;
            check("removing the old root's mount point", libc::rmdir(old_inside.as_ptr()))?;
            how = "an empty read-only tmpfs (pivot_root); the host's tree is unmounted";
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            check("removing the old root's mount point", libc::rmdir(old.as_ptr()))?;
            for point in mount_points().iter().filter(|p| *p != "/" && *p != "/tmp") {
                // Mounts below a detached one are gone with it: their errors do not matter.
                libc::umount2(c(point).as_ptr(), libc::MNT_DETACH);
            }
            check("chdir to the tmpfs", libc::chdir(new_root.as_ptr()))?;
            check(
                "moving the tmpfs over /",
                libc::mount(c(".").as_ptr(), root.as_ptr(), none, libc::MS_MOVE, none.cast()),
            )?;
            check("chroot", libc::chroot(c(".").as_ptr()))?;
            check("chdir /", libc::chdir(root.as_ptr()))?;
            how = "an empty read-only tmpfs moved over the initramfs root (which cannot be pivoted away); every other mount is detached";
        } else {
            return Err(JailError::last("pivot_root"));
        }
    }
    // SAFETY: as above.
    unsafe {
        check(
            "making the root read-only",
            libc::mount(
                none,
                root.as_ptr(),
                none,
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
                none.cast(),
            ),
        )?;
    }
    Ok(how)
}
