//! The lab daemon end to end: `driverlab serve` with its own database, driven with `curl
//! --unix-socket` and the API client; runs, their event streams and reports, devices, VMs, the
//! token, refused paths, every error as JSON, and a daemon killed with -9 that resumes.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

#[path = "../common/mod.rs"]
mod common;
mod fixture;

mod access;
mod bisects;
mod bounded;
mod devices_and_vms;
mod fleet;
mod limits;
mod runs;
mod workflow;
