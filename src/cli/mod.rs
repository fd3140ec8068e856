//! Command-line parsing and dispatch.

mod agent;
mod bench;
mod bench_restore;
mod doctor;
mod engine;
mod image;
mod jail_break;
pub mod lab;
mod model;
mod nested_box;
mod peer;
mod probe;
mod serve;
mod vm;

use clap::{Parser, Subcommand};

/// driverlab boots NIC driver variants in micro-VMs with the NIC passed through behind a virtual
/// IOMMU that counts every DMA map, and records throughput next to maps per packet.
#[derive(Parser)]
#[command(name = "driverlab", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Log filter for messages on stderr (e.g. `info`, `vmm=debug`); default `warn`, or
    /// `RUST_LOG`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Micro-VMs: boot a kernel (or the embedded probe guest) and run it to its end.
    #[command(subcommand)]
    Vm(vm::VmCommand),
    /// Guest images: write out the embedded probe, extract a vmlinux from a bzImage.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Device models served over vfio-user, for passthrough without hardware.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// The engines a lab image runs under: this VMM, or QEMU (`driverlab engine setup qemu`).
    #[command(subcommand)]
    Engine(engine::EngineCommand),
    /// The lab: run a matrix of driver variants, keep every result, report and compare them.
    #[command(subcommand)]
    Lab(lab::LabCommand),
    /// What the guest agent sent: its frames, and the Linux check's verdict over a run's logs.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Check one NIC with the probe guest (firmware, MAC, link, DMA through the vIOMMU, MSI-X) in
    /// a fresh micro-VM: a one-line verdict, then JSON. Exit code 0 healthy, 1 not.
    Probe(probe::ProbeArgs),
    /// Check this host for KVM and PCI passthrough: IOMMU, VFIO, memlock, device binding,
    /// Thunderbolt. Prints one line per check and the fix for each failure; exit code 1 if any
    /// check failed.
    Doctor(doctor::DoctorArgs),
    /// The lab daemon: the HTTP API (REST under /v1) on a Unix socket. Each VM it runs is its own
    /// `driverlab vm run` process.
    Serve(serve::ServeArgs),
    /// Send one request to a running `driverlab serve` and print the response.
    Api(serve::ApiArgs),
    /// A lab box without hardware: an L1 VM under QEMU (TCG with SVM) running `driverlab serve`,
    /// the host's device models as its PCI cards on vfio-pci (docs/nested-box.md).
    #[command(subcommand, name = "nested-box")]
    NestedBox(nested_box::NestedBoxCommand),
    /// Benchmarks that print figures, compared with a reference in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// What runs on a workload's peer: the UDP source of the xdp workload.
    #[command(subcommand)]
    Peer(peer::PeerCommand),
}

impl Command {
    /// Runs the subcommand; returns the process exit code.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            Command::Vm(cmd) => cmd.run(),
            Command::Image(cmd) => cmd.run(),
            Command::Model(cmd) => Ok(cmd.run()?),
            Command::Engine(cmd) => cmd.run(),
            Command::Lab(cmd) => cmd.run(),
            Command::Probe(args) => probe::run(args),
            Command::Agent(cmd) => cmd.run(),
            Command::Doctor(args) => doctor::run(args),
            Command::Serve(args) => serve::serve(args),
            Command::Api(args) => serve::request(args),
            Command::NestedBox(cmd) => cmd.run(),
            Command::Bench(cmd) => cmd.run(),
            Command::Peer(cmd) => cmd.run(),
        }
    }
}

/// Sets up `tracing` output on stderr.
pub fn init_logging(filter: Option<&str>) {
    let filter = filter
        .map(tracing_subscriber::EnvFilter::new)
        .or_else(|| tracing_subscriber::EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

/// An error that carries the exit code it should end the process with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CodedError {
    /// What went wrong.
    pub message: String,
    /// The process exit code.
    pub code: u8,
}

/// The exit code for an error that reached `main`: its own if it carries one, otherwise 1.
pub fn exit_code_of(error: &anyhow::Error) -> u8 {
    error.downcast_ref::<CodedError>().map_or(1, |e| e.code)
}

/// The lab of this host, as every command that runs cells or VMs sees it: [`programs`] run VMs
/// and models, images come from the image store (`$DRIVERLAB_IMAGES` or driverlab's cache), QEMU
/// from its chroot (`$DRIVERLAB_QEMU_ROOT` or driverlab's cache), when it is set up.
pub fn lab_env() -> anyhow::Result<::lab::env::LabEnv> {
    let images = guest_images::store::ImageStore::new(guest_images::store::default_root());
    Ok(::lab::env::LabEnv::detect(programs()?, images, &::engines::qemu::default_root()))
}

/// What runs VMs and device models for this binary: the small `driverlab-vmm` and
/// `driverlab-model` beside it, where they are, else its own `vm run` and `model`.
pub fn programs() -> anyhow::Result<::engines::Programs> {
    let driverlab = std::env::current_exe().map_err(|e| anyhow::anyhow!("locating the driverlab binary: {e}"))?;
    Ok(::engines::Programs::beside(&driverlab))
}
