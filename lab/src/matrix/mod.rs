//! Matrix specs: a TOML file naming devices, images, driver variants (with module parameters),
//! workloads and repetitions, checked before anything runs and expanded into cells.
//!
//! ```toml
//! name = "probe-rx-strategies"
//! repetitions = 5
//! baseline = "flip"
//!
//! [[device]]
//! name = "aqc100"
//! model = "aqc100"          # a software model, fresh for each VM; or bdf = "0000:63:00.0"
//! generate = "size=1514"
//!
//! [[image]]
//! name = "probe"
//! kernel = "probe"
//!
//! [[variant]]
//! name = "flip"
//! image = "probe"
//! params = { "probe.rx" = "flip" }    # an array of values expands into one cell per value
//!
//! [[workload]]
//! name = "rx"
//! kind = "probe-rx"
//! frames = 20000
//! ```
//!
//! A cell is one variant (with one value per parameter) under one workload on one device; it runs
//! `repetitions` times. `docs/lab.md` documents every field.

mod check;
mod cmdline;
mod device;
mod plan;
pub mod series;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

pub use crate::image_ref::{InitrdRef, KernelRef, PatchRef};
pub use device::{Device, interface_name};
pub use engines::agent::Direction;
pub use engines::device::{DeviceSource, HostPeer, Wire};
pub use guest_images::initramfs_build::GuestTool;
pub use plan::{Cell, Plan};
pub use series::SeriesStep;

/// Most results (cells x repetitions) one run may have.
pub const MAX_RESULTS: usize = 100_000;
/// Most repetitions of one cell.
pub const MAX_REPETITIONS: u32 = 1000;
/// The longest name (the matrix's, a device's, image's, variant's or workload's), in bytes.
pub const MAX_NAME: usize = 128;
/// The longest description, in bytes.
pub const MAX_DESCRIPTION: usize = 4096;
/// Most cells one matrix may expand into.
pub const MAX_CELLS: usize = 10_000;

/// What kind of mistake a [`MatrixError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixErrorKind {
    /// The file cannot be read.
    Unreadable,
    /// It does not parse: TOML syntax, an unknown field, a value of the wrong type.
    Syntax,
    /// It parses and does not check out.
    Invalid,
}

/// A matrix that does not check out, with the file, line and field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {field}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct MatrixError {
    /// What kind of mistake it is.
    pub kind: MatrixErrorKind,
    /// The matrix file.
    pub file: PathBuf,
    /// The line, when known.
    pub line: Option<usize>,
    /// The field, e.g. `variant[2].image`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// The matrix as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// A name for reports.
    pub name: String,
    /// What the matrix is for.
    #[serde(default)]
    pub description: String,
    /// Runs of each cell.
    #[serde(default = "one")]
    pub repetitions: u32,
    /// The variant the others are compared against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Spanned<String>>,
    /// Seconds one repetition may take before its VM is stopped.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Seconds the guest may stay silent on its serial ports before it counts as hung.
    #[serde(default = "default_silence")]
    pub silence_s: f64,
    /// How Linux cells on driverlab's engine start: `cold` (every repetition boots) or
    /// `snapshot` (the cell's guest is booted once up to its agent's ready point and
    /// snapshotted; every repetition starts from the snapshot).
    #[serde(default, skip_serializing_if = "BootMode::is_cold")]
    pub boot: BootMode,
    /// The devices.
    #[serde(default, rename = "device")]
    pub devices: Vec<Spanned<Device>>,
    /// The images.
    #[serde(default, rename = "image")]
    pub images: Vec<Spanned<Image>>,
    /// The variants.
    #[serde(default, rename = "variant")]
    pub variants: Vec<Spanned<Variant>>,
    /// The workloads.
    #[serde(default, rename = "workload")]
    pub workloads: Vec<Spanned<Workload>>,
}

impl Matrix {
    /// Parses a matrix's TOML `text`, read from `file`: its syntax and its types, not yet what
    /// [`Plan::from_matrix`] checks.
    pub fn from_toml(file: &Path, text: &str) -> Result<Matrix, MatrixError> {
        toml::from_str(text).map_err(|e| MatrixError {
            kind: MatrixErrorKind::Syntax,
            file: file.to_path_buf(),
            line: e.span().map(|s| check::line_of(text, s)),
            field: "syntax".into(),
            message: e.message().to_string(),
        })
    }

    /// The programs its Linux images need beyond what every image carries: what its workloads
    /// need, sorted.
    pub fn guest_tools(&self) -> Vec<GuestTool> {
        let mut tools: Vec<GuestTool> =
            self.workloads.iter().flat_map(|w| w.get_ref().guest_tools().iter().copied()).collect();
        tools.sort_unstable();
        tools.dedup();
        tools
    }

    /// The matrix as TOML text, which parses into the same matrix.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }
}

/// How a matrix's Linux cells start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    /// Every repetition boots its kernel.
    #[default]
    Cold,
    /// Repetitions start from a snapshot of the cell's guest, booted once up to its agent's
    /// ready point with the NIC's slot empty (cells whose NIC sits in a Thunderbolt slot, on
    /// driverlab's engine; others boot).
    Snapshot,
}

impl BootMode {
    fn is_cold(&self) -> bool {
        *self == BootMode::Cold
    }
}

fn one() -> u32 {
    1
}

fn default_timeout() -> f64 {
    300.0
}

fn default_silence() -> f64 {
    60.0
}

fn yes() -> bool {
    true
}

/// A guest image: the probe, a kernel (and initrd) on this host or in the image store, or a
/// recipe the lab builds into the store before the run (`kernel = "debian"`, `initrd = "agent"`,
/// `patches = [...]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// Its name.
    pub name: String,
    /// `probe`; a kernel path (relative paths from the matrix file's folder); a kernel image's ID;
    /// `debian` (the newest Debian 6.12 kernel package, as `driverlab image kernel` makes it) or
    /// `debian:PACKAGE`.
    pub kernel: KernelRef,
    /// An initrd path; an initramfs image's ID; or `agent`: the initramfs `driverlab image
    /// initramfs` builds for the kernel, with the driver built from `patches` when there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<InitrdRef>,
    /// Patches to the driver (`initrd = "agent"` only): the variant's module is built with them.
    /// Files here, or (over the API) each file's name and text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<PatchRef>,
    /// A patch series on top of `patches` (`initrd = "agent"` only): the image stands for one
    /// image per prefix, the base and each patch added in turn ([`series`]). Files here (an
    /// mbox, format-patch files, a folder of them), or (over the API) each file's name and text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<PatchRef>,
    /// What `lab pin` built for each prefix of `series`, in order (the base first): the
    /// prefix's kernel and initrd images, or why it did not build (then the list ends there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<PinnedPrefix>,
    /// Where in its series the image is, for an image [`series::expand`] wrote out.
    #[serde(skip)]
    pub step: Option<SeriesStep>,
    /// Why the image did not build, for a pinned prefix [`series::expand`] wrote out.
    #[serde(skip)]
    pub unbuilt: Option<String>,
    /// The driver's folder in the kernel tree, for `patches`.
    #[serde(default = "default_driver_folder")]
    pub driver: String,
    /// The driver module the agent's initramfs carries (`initrd = "agent"`) [default: the
    /// driver folder's last part, e.g. `atlantic`; `lan743x` for `drivers/net/ethernet/microchip`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// What runs it: `driverlab` (this project's VMM) or `qemu` (the reference engine).
    #[serde(default)]
    pub engine: EngineKind,
    /// How the QEMU engine runs guest code: `tcg` (default) or `kvm`.
    #[serde(default)]
    pub accel: engines::qemu::Accel,
    /// Command line words every cell of this image gets.
    #[serde(default)]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    /// Virtual CPUs.
    #[serde(default = "one")]
    pub vcpus: u32,
    /// The device behind a virtio-iommu (the point of the lab: its maps are counted).
    #[serde(default = "yes")]
    pub iommu: bool,
}

/// A prefix of a series as `lab pin` built it: its images, or why it did not build.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PinnedPrefix {
    /// The kernel image's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelRef>,
    /// The initramfs image's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<InitrdRef>,
    /// Why it did not build (its first error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_failed: Option<String>,
}

fn default_driver_folder() -> String {
    guest_images::module_build::DEFAULT_DRIVER_FOLDER.into()
}

/// What runs an image's VMs.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::IntoStaticStr,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum EngineKind {
    /// This project's VMM (`driverlab vm run`).
    #[default]
    Driverlab,
    /// QEMU 11 from Debian forky (`driverlab engine setup qemu`).
    Qemu,
}

impl EngineKind {
    /// Its name in records and reports.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

fn default_memory() -> u64 {
    256
}

impl Image {
    /// Whether the kernel is the recipe `debian` or `debian:PACKAGE`.
    pub fn is_debian_kernel(&self) -> bool {
        matches!(self.kernel, KernelRef::Debian { .. })
    }

    /// Whether the initrd is the recipe `agent`.
    pub fn is_agent_initrd(&self) -> bool {
        self.initrd == Some(InitrdRef::Agent)
    }

    /// The driver module of the agent's initramfs: the one named, else the driver folder's
    /// last part, the LAN7430's for Microchip's folder (which holds several drivers).
    pub fn module_name(&self) -> String {
        self.module.clone().unwrap_or_else(|| match self.driver.trim_end_matches('/').rsplit('/').next() {
            Some("microchip") => vm_spec::NicKind::Lan743x.linux_driver().into(),
            Some(last) if !last.is_empty() => last.into(),
            _ => vm_spec::NicKind::Aqc100.linux_driver().into(),
        })
    }

    /// Whether this is the embedded probe guest.
    pub fn is_probe(&self) -> bool {
        self.kernel == KernelRef::Probe
    }
}

/// A driver variant: module parameters and command-line words on one image.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Its name.
    pub name: String,
    /// The image it runs on.
    pub image: Spanned<String>,
    /// Extra command-line words.
    #[serde(default)]
    pub cmdline: String,
    /// Module parameters, `module.param = value` (on the kernel command line); an array of
    /// values expands into one cell per value.
    #[serde(default)]
    pub params: BTreeMap<String, ParamValues>,
    /// The IOMMU domain the guest gives the device (Linux images): `lazy` turns an untrusted
    /// (Thunderbolt) device's strict domain into a lazy one once its driver bound, so that
    /// the cost of strict unmaps can be told from the cost of bouncing, which stays [default:
    /// what the guest's kernel picks].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_domain: Option<IommuDomainChoice>,
    /// Where in its series the variant's image is, for a variant [`series::expand`] wrote out.
    #[serde(skip)]
    pub step: Option<SeriesStep>,
}

/// A domain a variant asks the guest for.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IommuDomainChoice {
    /// `DMA-FQ`: unmaps flushed in batches.
    Lazy,
}

/// One parameter's value, or the values to try.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ParamValues {
    /// One value.
    One(ParamValue),
    /// Values to expand over.
    Many(Vec<ParamValue>),
}

/// A parameter value as TOML gives it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ParamValue {
    /// A boolean (written 1 or 0, as the kernel takes it for module parameters, `Y`/`N`).
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A word.
    Text(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Bool(b) => write!(f, "{}", if *b { "1" } else { "0" }),
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::Text(s) => write!(f, "{s}"),
        }
    }
}

/// What runs in the guest once it is up.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Workload {
    /// The probe guest's RX test: it receives `frames` frames from the device's wire with the RX
    /// buffer strategy its variant picks (`probe.rx`).
    ProbeRx {
        /// Its name.
        name: String,
        /// Frames to receive.
        #[serde(default = "default_frames")]
        frames: u32,
    },
    /// iperf3 between the guest and the peer on the device's wire (Linux images).
    Iperf3 {
        /// Its name.
        name: String,
        /// `rx` (the guest receives: `iperf3 -R`), `tx`, or `bidir`.
        #[serde(default)]
        direction: Direction,
        /// Seconds of traffic.
        #[serde(default = "default_duration")]
        duration_s: f64,
        /// 4 or 6.
        #[serde(default = "default_ip")]
        ip: u8,
        /// The interface MTU.
        #[serde(default = "default_mtu")]
        mtu: u32,
        /// Parallel streams (`-P`).
        #[serde(default = "one")]
        streams: u32,
        /// `tcp` or `udp`.
        #[serde(default)]
        protocol: Protocol,
        /// The sender's rate in Mbit/s (`-b`; 0, the default: as fast as it can, which for UDP
        /// mostly measures loss).
        #[serde(default)]
        bitrate_mbit: u32,
        /// The `surprise-unplug` check: this many seconds into the traffic the device is pulled
        /// out of its Thunderbolt slot without notice (a cable pulled); the guest must unbind
        /// the driver without an oops or a warning, keep answering, and leave no IOMMU mapping
        /// once the driver is unloaded. Devices in a Thunderbolt slot only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        surprise_unplug_after_s: Option<f64>,
        /// The `orderly-unplug` check: this many seconds into the traffic the Thunderbolt slot's
        /// attention button is pressed, as a user asks to remove the device; the guest's pciehp
        /// unbinds the driver under the traffic (after its 5 s grace) and powers the slot off,
        /// and the device goes. The same requirements as the surprise check; at most one of
        /// the two.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        orderly_unplug_after_s: Option<f64>,
        /// A series' prefix check (`lab run --every-prefix` adds one): each cell runs once,
        /// before every other cell of the run, so that each prefix is seen to load, pass
        /// traffic and unload cleanly before any long workload.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        prefix_check: bool,
    },
    /// UDP frames of one size at a given rate, or as fast as the sender can, between the guest
    /// and the peer on the device's wire (Linux images): the packets per second delivered to
    /// the receiving socket, and the drops counted where they happen (the NIC, the stack, the
    /// socket). iperf3 sends them (on the peer for `rx`, in the guest for `tx`).
    PacketRate {
        /// Its name.
        name: String,
        /// `rx` (the peer sends, the guest receives), `tx`, or `bidir`.
        #[serde(default)]
        direction: Direction,
        /// The Ethernet frame's length on the wire, FCS included (64, 128, 512, 1518, or up to
        /// the MTU's frame for jumbo frames).
        #[serde(default = "default_frame_bytes")]
        frame_bytes: u32,
        /// Frames per second each way (0, the default: as fast as the sender can).
        #[serde(default)]
        rate_pps: u64,
        /// Seconds of traffic.
        #[serde(default = "default_duration")]
        duration_s: f64,
        /// 4 or 6.
        #[serde(default = "default_ip")]
        ip: u8,
        /// The interface MTU.
        #[serde(default = "default_mtu")]
        mtu: u32,
        /// Parallel senders (`-P`); a rate is shared among them.
        #[serde(default = "one")]
        streams: u32,
    },
    /// Request/response latency between the guest and the peer on the device's wire (Linux
    /// images): `sockperf ping-pong` from the guest against `sockperf server` on the peer, one
    /// message in flight, round-trip times' mean and percentiles.
    Latency {
        /// Its name.
        name: String,
        /// `udp` (the default) or `tcp`.
        #[serde(default = "udp")]
        protocol: Protocol,
        /// The message's size in bytes (sockperf's `-m`).
        #[serde(default = "default_message_bytes")]
        message_bytes: u32,
        /// Messages per second (sockperf's `--mps`; 0, the default: the next as soon as the
        /// reply is in).
        #[serde(default)]
        rate_mps: u32,
        /// Seconds of messages (over IPv4: Debian's sockperf 3.7 has no IPv6).
        #[serde(default = "default_duration")]
        duration_s: f64,
        /// The interface MTU.
        #[serde(default = "default_mtu")]
        mtu: u32,
    },
    /// An XDP program attached to the guest's NIC in native mode (`xdp-bench drop|pass|tx`)
    /// under a load of UDP frames of one size from the peer (`driverlab peer udp-source`, which
    /// needs no connection back): frames per second the program handled, the driver's XDP
    /// counters. A driver without native XDP fails the cell saying so.
    Xdp {
        /// Its name.
        name: String,
        /// `drop`, `pass` or `tx`.
        #[serde(default)]
        action: XdpAction,
        /// The load's frames on the wire, FCS included.
        #[serde(default = "default_frame_bytes")]
        frame_bytes: u32,
        /// The load's frames per second (0, the default: as fast as the peer sends).
        #[serde(default)]
        rate_pps: u64,
        /// Seconds the program runs under the load.
        #[serde(default = "default_duration")]
        duration_s: f64,
        /// The interface MTU.
        #[serde(default = "default_mtu")]
        mtu: u32,
    },
    /// The kernel's own NIC selftests (tools/testing/selftests/drivers/net, from the kernel
    /// source the image was built from) in the guest, with the peer on the device's wire as
    /// their remote (`REMOTE_TYPE=ssh`; Linux images): each test's KTAP, one result per subtest.
    Kselftest {
        /// Its name.
        name: String,
        /// The tests to run, in order: paths below drivers/net (`ping.py`, `hw/csum.py`).
        tests: Vec<SelftestName>,
        /// Seconds each test may take before it is stopped and fails (`# TIMEOUT`).
        #[serde(default = "default_selftest_timeout")]
        timeout_s: u32,
        /// The interface MTU.
        #[serde(default = "default_mtu")]
        mtu: u32,
    },
}

/// A test of the kernel's NIC selftests: one of [`guest_images::kselftest::TESTS`], checked
/// when the matrix is read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct SelftestName(String);

impl TryFrom<String> for SelftestName {
    type Error = String;

    fn try_from(name: String) -> Result<SelftestName, String> {
        let known = guest_images::kselftest::TESTS;
        if known.contains(&name.as_str()) {
            return Ok(SelftestName(name));
        }
        Err(format!(
            "{name:?} is not one of the NIC selftests images carry (tools/testing/selftests/drivers/net of {}): {}",
            guest_images::kselftest::SOURCE_PACKAGE,
            known.join(", ")
        ))
    }
}

impl From<SelftestName> for String {
    fn from(name: SelftestName) -> String {
        name.0
    }
}

impl SelftestName {
    /// The path below drivers/net.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The longest a selftest may be given.
pub const MAX_SELFTEST_TIMEOUT: u32 = 3600;

fn default_selftest_timeout() -> u32 {
    // kselftest's own default is 45 s (runner.sh); Python's start under TCG takes seconds of it.
    300
}

/// What an XDP program does with every frame.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, strum::Display, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum XdpAction {
    /// `XDP_DROP`: the driver recycles the buffer at once.
    #[default]
    Drop,
    /// `XDP_PASS`: the frame goes on to the stack.
    Pass,
    /// `XDP_TX`: the frame goes back out of the NIC, its MACs swapped.
    Tx,
}

/// The smallest message sockperf sends (its header).
pub const MIN_MESSAGE: u32 = 14;
/// The largest message sockperf sends.
pub const MAX_MESSAGE: u32 = 65_000;

fn default_message_bytes() -> u32 {
    64
}

fn udp() -> Protocol {
    Protocol::Udp
}

/// Bytes an Ethernet frame carries around its IP packet: its header and its FCS.
pub const ETHERNET_OVERHEAD: u32 = 18;
/// The shortest Ethernet frame, FCS included.
pub const MIN_FRAME: u32 = 64;
/// The shortest UDP payload iperf3 sends (its sequence header with 64-bit counters).
pub const MIN_IPERF_PAYLOAD: u32 = 16;

/// The UDP payload of a `frame_bytes` frame over IP version `ip`, when there is room for one.
pub fn udp_payload(frame_bytes: u32, ip: u8) -> Option<u32> {
    let ip_header = if ip == 6 { 40 } else { 20 };
    frame_bytes.checked_sub(ETHERNET_OVERHEAD + ip_header + 8)
}

fn default_frame_bytes() -> u32 {
    MIN_FRAME
}

impl Workload {
    /// Whether it is a series' prefix check: run once per cell, before the others.
    pub fn is_prefix_check(&self) -> bool {
        matches!(self, Workload::Iperf3 { prefix_check: true, .. })
    }

    /// The unplug check the workload asks for: when (seconds into the traffic) and how.
    pub fn unplug(&self) -> Option<(f64, engines::UnplugKind)> {
        match self {
            Workload::Iperf3 { surprise_unplug_after_s: Some(after), .. } => {
                Some((*after, engines::UnplugKind::Surprise))
            }
            Workload::Iperf3 { orderly_unplug_after_s: Some(after), .. } => {
                Some((*after, engines::UnplugKind::Orderly))
            }
            _ => None,
        }
    }

    /// The field that asks for [`Workload::unplug`], for errors.
    fn unplug_field(&self) -> &'static str {
        match self.unplug() {
            Some((_, engines::UnplugKind::Orderly)) => "orderly_unplug_after_s",
            _ => "surprise_unplug_after_s",
        }
    }
}

fn default_frames() -> u32 {
    20_000
}

fn default_duration() -> f64 {
    10.0
}

fn default_ip() -> u8 {
    4
}

fn default_mtu() -> u32 {
    1500
}

/// Transport protocol.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

impl Workload {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Workload::ProbeRx { name, .. }
            | Workload::Iperf3 { name, .. }
            | Workload::PacketRate { name, .. }
            | Workload::Latency { name, .. }
            | Workload::Xdp { name, .. }
            | Workload::Kselftest { name, .. } => name,
        }
    }

    /// Whether it runs traffic against the peer on the device's wire (which the lab starts).
    pub fn needs_peer(&self) -> bool {
        self.peer_server().is_some()
    }

    /// The server its peer runs, when it has one.
    pub fn peer_server(&self) -> Option<engines::peer::PeerServer> {
        match self {
            Workload::ProbeRx { .. } => None,
            Workload::Iperf3 { .. } | Workload::PacketRate { .. } => Some(engines::peer::PeerServer::Iperf3),
            Workload::Latency { protocol, .. } => {
                Some(engines::peer::PeerServer::Sockperf { tcp: *protocol == Protocol::Tcp })
            }
            Workload::Xdp { .. } => Some(engines::peer::PeerServer::UdpSource),
            Workload::Kselftest { .. } => Some(engines::peer::PeerServer::SshRemote),
        }
    }

    /// The programs the guest needs for it beyond what every image carries.
    pub fn guest_tools(&self) -> &'static [GuestTool] {
        match self {
            Workload::Latency { .. } => &[GuestTool::Sockperf],
            Workload::Xdp { .. } => &[GuestTool::XdpBench],
            Workload::Kselftest { .. } => &[GuestTool::Kselftest],
            _ => &[],
        }
    }
}
