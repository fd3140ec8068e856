//! The lab: the layer between requests (CLI, HTTP) and VMM processes.
//!
//! Every micro-VM is its own `driverlab vm run` process (the Firecracker model: a crashed or
//! seccomp-killed VMM takes down one VM, never the lab). [`vm_process`] starts such a process,
//! bounds it in time and collects its serial output and exit line, and [`vm_control`] talks to
//! its control socket while it runs; [`model_process`] runs a device
//! model for it to pass through; [`probe_report`] reads what
//! the probe guest reported on the serial port; [`mod@bench`] holds the benchmarks and [`stats`]
//! their summaries.

pub mod agent;
pub mod bench;
pub mod bus;
pub mod chart;
pub mod crash;
pub mod engine;
pub mod env;
pub mod failure;
pub mod file_watch;
pub mod health;
pub mod image_ref;
pub mod images;
pub mod kcidb;
pub mod matrix;
pub mod metric;
pub mod model_process;
pub mod nested_box;
pub mod peer;
pub mod probe_report;
pub mod qemu;
pub mod qemu_setup;
pub mod record;
pub mod report;
pub mod request;
pub mod run;
pub mod runner;
pub mod runtime_dirs;
pub mod scheduler;
pub mod stats;
pub mod store;
pub mod vm_control;
pub mod vm_process;

pub use model_process::{ModelError, ModelProcess};
pub use probe_report::ProbeReport;
pub use vm_control::ControlClient;
pub use vm_process::{Launch, RunningVm, VmOutcome, VmProcess};
