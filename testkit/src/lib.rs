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
