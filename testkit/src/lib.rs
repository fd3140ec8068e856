//! What driverlab's tests share across crates (a dev-dependency only): one way to skip a test
//! that cannot run here. A skip prints `SKIP test: reason`, which `scripts/test-summary.sh`
//! counts and lists; under `DRIVERLAB_REQUIRE=1` (CI on a root machine with /dev/kvm) a skip for
//! anything but hardware no CI machine has fails the test instead, so that a prerequisite that
//! did not install cannot pass quietly.

/// What a test that cannot run here lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lacks {
    /// Something this machine kind has or the test command installs (KVM, root, a package, an
    /// environment variable `scripts/test.sh` sets).
    Setup,
    /// What no CI machine has: a real NIC bound to vfio-pci, hardware virtualization for Linux
    /// under driverlab's VMM directly.
    Hardware,
}

/// Whether skips for [`Lacks::Setup`] fail (`DRIVERLAB_REQUIRE=1`).
pub fn required() -> bool {
    std::env::var("DRIVERLAB_REQUIRE").is_ok_and(|v| v == "1")
}

/// Skips the calling test `test` for `reason`; fails it instead when [`required`] and it lacks
/// only [`Lacks::Setup`].
pub fn skip(test: &str, lacks: Lacks, reason: impl std::fmt::Display) {
    eprintln!("SKIP {test}: {reason}");
    assert!(
        !(required() && lacks == Lacks::Setup),
        "{test} must run here (DRIVERLAB_REQUIRE=1) and would skip: {reason}"
    );
}

/// A filesystem a test mounted at a path: unmounted when dropped (lazily, `umount -l`: a
/// panicking test may leave a file in it open), or now by [`Mounted::unmount`].
pub struct Mounted(Option<std::path::PathBuf>);

impl Mounted {
    /// The mount at `path`, which the caller has just made.
    pub fn at(path: impl Into<std::path::PathBuf>) -> Mounted {
        Mounted(Some(path.into()))
    }

    /// Unmounts it now; whether `umount` succeeded.
    pub fn unmount(mut self) -> bool {
        let path = self.0.take().expect("mounted until now");
        std::process::Command::new("umount").arg(path).status().is_ok_and(|s| s.success())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::process::Command::new("umount").arg("-l").arg(path).status();
        }
    }
}
