//! The process's identity: a uid and gid of its own, no supplementary groups, no capabilities
//! (not even in the bounding set), and `no_new_privs`.

use crate::error::{JailError, check};

/// Whether the process runs as root.
pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Becomes uid and gid `id`: empties the capability bounding set first (so nothing can come
/// back through an exec), then the groups, the gid and the uid. Leaving uid 0 for good clears
/// the permitted, effective and ambient capabilities; that is checked.
pub(crate) fn drop_to(id: u32) -> Result<(), JailError> {
    // SAFETY: prctl, setgroups, setresgid, setresuid and capget with integer arguments or live
    // buffers; they change only this process's credentials.
    unsafe {
        let mut cap = 0;
        while libc::prctl(libc::PR_CAPBSET_READ, cap) >= 0 {
            check("dropping a bounding capability", libc::prctl(libc::PR_CAPBSET_DROP, cap))?;
            cap += 1;
        }
        check("setgroups", libc::setgroups(0, std::ptr::null()))?;
        check("setresgid", libc::setresgid(id, id, id))?;
        check("setresuid", libc::setresuid(id, id, id))?;
    }
    let effective = effective_capabilities()?;
    if effective != 0 {
        return Err(JailError::Host(format!("capabilities {effective:#x} are still effective after the uid change")));
    }
    Ok(())
}

/// The effective capability set, from capget(2).
fn effective_capabilities() -> Result<u64, JailError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget reads the header and writes two data structs, both live here.
    check("capget", unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) as libc::c_int })?;
    Ok(data[0].effective as u64 | (data[1].effective as u64) << 32)
}

/// Sets `no_new_privs`: no exec can ever grant privileges again (set-uid, file capabilities).
pub(crate) fn no_new_privs() -> Result<(), JailError> {
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| JailError::Call { call: "PR_SET_NO_NEW_PRIVS", source: e.into() })
}
