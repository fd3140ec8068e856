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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;
use vm_spec::Bdf;

pub use crate::image_ref::{InitrdRef, KernelRef};
pub use engines::agent::Direction;
pub use engines::device::{DeviceSource, HostPeer, Wire};

/// Most results (cells x repetitions) one run may have.
pub const MAX_RESULTS: usize = 100_000;
/// Most repetitions of one cell.
pub const MAX_REPETITIONS: u32 = 1000;
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
            line: e.span().map(|s| line_of(text, s)),
            field: "syntax".into(),
            message: e.message().to_string(),
        })
    }

    /// The matrix as TOML text, which parses into the same matrix.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
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

/// A device the cells run on: a driverlab model (a fresh process per VM) or a host PCI device.
///
/// One type serves the matrix's TOML, the results store and the HTTP API (`POST /v1/devices`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Its name in the matrix and in results.
    pub name: String,
    /// A driverlab model (`aqc100` or `lan743x`), a fresh process per VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<vm_spec::NicKind>,
    /// The model's frame generator (`driverlab model aqc100 --generate`), e.g. `size=1514`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<String>,
    /// The model's TAP interface (`--tap`), instead of the generator (a host resource: the
    /// daemon registers it only over its Unix socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    /// A host PCI device bound to vfio-pci, `0000:63:00.0` (registered over the Unix socket only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "0000:63:00.0")]
    pub bdf: Option<Bdf>,
    /// The Linux driver that drives it in Linux images [default: the model's (`atlantic` for the
    /// AQC100, `lan743x` for the LAN7430); for a host device, `atlantic`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// A host device's traffic peer for iperf3: an SSH destination (`[user@]host`, key login)
    /// on the NIC's wire that has iperf3 (registered over the Unix socket only). A model's peer is
    /// a namespace the lab makes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The peer's IPv4 address on the wire [default: 10.77.0.1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ip: Option<String>,
    /// The guest's IPv4 address and prefix on the wire [default: 10.77.0.2/24].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ip: Option<String>,
    /// The peer's IPv6 address on the wire [default: fd77::1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ip6: Option<String>,
    /// The guest's IPv6 address and prefix on the wire [default: fd77::2/64].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ip6: Option<String>,
    /// The peer also serves the device's model counters (`driverlab model counters` over SSH):
    /// the nested lab box's cards, which are models on the host [default: false].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peer_counters: bool,
}

/// Whether `name` is a network interface name Linux takes: 1 to 15 bytes (IFNAMSIZ less its
/// NUL), none of them `/`, `:`, whitespace or control characters, and not `.` or `..`.
pub fn interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{} bytes; an interface name is 1 to 15", name.len()));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err("not an interface name: no '/', ':', spaces or control characters, not . or ..".into());
    }
    Ok(())
}

impl Device {
    /// The NIC it is, where the lab knows it: the model's kind, or the chip its Linux driver
    /// drives.
    pub fn nic(&self) -> Option<vm_spec::NicKind> {
        self.model.or_else(|| vm_spec::NicKind::from_linux_driver(&self.linux_driver()))
    }

    /// Checks the device on its own; the error is the field (after `device[i]`) and what is
    /// wrong.
    pub fn check(&self) -> Result<(), (String, String)> {
        self.source().map(drop)
    }

    /// What the device is, from its fields, checked; the error is the field (after
    /// `device[i]`) and what is wrong.
    pub fn source(&self) -> Result<DeviceSource, (String, String)> {
        let fail = |field: &str, message: String| Err((field.to_string(), message));
        let peer = match &self.peer {
            Some(_) if self.model.is_some() => {
                return fail(
                    ".peer",
                    "a model's peer is a network namespace the lab makes; peer is for host devices".into(),
                );
            }
            Some(peer) if !ssh_destination(peer) => {
                return fail(
                    ".peer",
                    format!("{peer:?} is not an SSH destination: give [user@]host (letters, digits, . - _)"),
                );
            }
            Some(peer) => Some(peer.clone()),
            None if self.peer_counters => {
                return fail(".peer_counters", "the counters come from the device's peer: give peer too".into());
            }
            None if self.peer_ip.is_some()
                || self.guest_ip.is_some()
                || self.peer_ip6.is_some()
                || self.guest_ip6.is_some() =>
            {
                return fail("", "addresses are for a device with a peer".into());
            }
            None => None,
        };
        let checks: [AddressCheck; 4] = [
            ("peer_ip", &self.peer_ip, |a| a.parse::<std::net::Ipv4Addr>().is_ok(), "an IPv4 address"),
            ("guest_ip", &self.guest_ip, |a| with_prefix::<std::net::Ipv4Addr>(a, 32), "IPv4/prefix"),
            ("peer_ip6", &self.peer_ip6, |a| a.parse::<std::net::Ipv6Addr>().is_ok(), "an IPv6 address"),
            ("guest_ip6", &self.guest_ip6, |a| with_prefix::<std::net::Ipv6Addr>(a, 128), "IPv6/prefix"),
        ];
        for (field, value, valid, what) in checks {
            if let Some(value) = value
                && !valid(value)
            {
                return fail(&format!(".{field}"), format!("{value:?}: give {what}"));
            }
        }
        match (self.model, self.bdf) {
            (Some(_), Some(_)) | (None, None) => fail("", "give either model or bdf".into()),
            (None, Some(_)) if self.generate.is_some() || self.tap.is_some() => {
                fail("", "generate and tap are for models".into())
            }
            (None, Some(bdf)) => Ok(DeviceSource::Host {
                bdf,
                peer: peer.map(|destination| HostPeer {
                    destination,
                    addresses: self.addresses(),
                    counters: self.peer_counters,
                }),
            }),
            (Some(nic), None) => {
                let wire = match (&self.generate, &self.tap) {
                    (Some(_), Some(_)) => return fail("", "give generate or tap, not both".into()),
                    (None, Some(tap)) => match interface_name(tap) {
                        Ok(()) => Wire::Tap(tap.clone()),
                        Err(e) => return fail(".tap", format!("{tap:?}: {e}")),
                    },
                    (generate, None) => match generate.as_deref().unwrap_or_default().parse() {
                        Ok(config) => Wire::Generator(config),
                        Err(e) => return fail(".generate", format!("{:?}: {e}", generate.as_deref().unwrap_or(""))),
                    },
                };
                Ok(DeviceSource::Model { nic, wire })
            }
        }
    }

    /// What leases and quarantines a host device: `vfio=BDF`. Models have none (a fresh
    /// process per VM holds nothing).
    pub fn lease_key(&self) -> Option<String> {
        match (self.model, self.bdf) {
            (None, Some(bdf)) => Some(vm_spec::DeviceSpec::Vfio(bdf).to_string()),
            _ => None,
        }
    }

    /// The guest's and the peer's addresses: the device's, else the defaults.
    pub fn addresses(&self) -> engines::peer::Addresses {
        let default = engines::peer::Addresses::default();
        let or = |value: &Option<String>, default: String| value.clone().unwrap_or(default);
        engines::peer::Addresses {
            guest_v4: or(&self.guest_ip, default.guest_v4),
            peer_v4: or(&self.peer_ip, default.peer_v4),
            guest_v6: or(&self.guest_ip6, default.guest_v6),
            peer_v6: or(&self.peer_ip6, default.peer_v6),
        }
    }

    /// The Linux driver of the device: the one named, else the model's, else `atlantic`.
    pub fn linux_driver(&self) -> String {
        match (&self.driver, self.model) {
            (Some(driver), _) => driver.clone(),
            (None, Some(nic)) => nic.linux_driver().into(),
            (None, None) => vm_spec::NicKind::Aqc100.linux_driver().into(),
        }
    }
}

/// A device's address field: its name, its value, what makes it valid, and what it should be.
type AddressCheck<'a> = (&'static str, &'a Option<String>, fn(&str) -> bool, &'static str);

/// `[user@]host` with nothing SSH could take for an option.
fn ssh_destination(text: &str) -> bool {
    let (user, host) = text.split_once('@').unwrap_or(("", text));
    let word = |w: &str| w.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    !host.is_empty() && !host.starts_with('-') && !user.starts_with('-') && word(user) && word(host)
}

/// `ADDRESS/PREFIX`, the prefix at most `max`.
fn with_prefix<A: std::str::FromStr>(text: &str, max: u8) -> bool {
    text.split_once('/').is_some_and(|(a, p)| a.parse::<A>().is_ok() && p.parse::<u8>().is_ok_and(|p| p <= max))
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
    #[serde(default)]
    pub patches: Vec<PathBuf>,
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
    /// vCPUs.
    #[serde(default = "one")]
    pub vcpus: u32,
    /// The device behind a virtio-iommu (the point of the lab: its maps are counted).
    #[serde(default = "yes")]
    pub iommu: bool,
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
    },
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
            Workload::ProbeRx { name, .. } | Workload::Iperf3 { name, .. } => name,
        }
    }
}

/// One cell: a variant with one value per parameter, under one workload, on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Position in the expansion, from 0.
    pub index: usize,
    /// `c01`, `c02`, ...: its name in the run.
    pub id: String,
    /// The image.
    pub image: String,
    /// The variant.
    pub variant: String,
    /// Its parameters, one value each.
    pub params: BTreeMap<String, String>,
    /// The workload.
    pub workload: String,
    /// The device.
    pub device: String,
}

impl Cell {
    /// What identifies the cell across runs: image, variant, parameters, workload, device.
    pub fn key(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}/{}[{}]/{}/{}", self.image, self.variant, params.join(","), self.workload, self.device)
    }

    /// A short label for tables and charts: the variant and its parameters.
    pub fn label(&self) -> String {
        let variant = &self.variant;
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if params.is_empty() { variant.clone() } else { format!("{variant} {}", params.join(" ")) }
    }
}

/// A matrix that checked out, its file and its cells.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The file it came from.
    pub file: PathBuf,
    /// Its text, as stored with the run.
    pub text: String,
    /// The matrix.
    pub matrix: Matrix,
    /// Its cells, in order.
    pub cells: Vec<Cell>,
    /// Its devices' typed forms, by name: checked once, used by every repetition.
    sources: BTreeMap<String, DeviceSource>,
}

impl Plan {
    /// Reads, checks and expands the matrix at `path`.
    pub fn load(path: &Path) -> Result<Plan, MatrixError> {
        let text = std::fs::read_to_string(path).map_err(|e| MatrixError {
            kind: MatrixErrorKind::Unreadable,
            file: path.to_path_buf(),
            line: None,
            field: "file".into(),
            message: e.to_string(),
        })?;
        Plan::parse(path, &text)
    }

    /// Checks and expands `text`, read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Plan, MatrixError> {
        let matrix = Matrix::from_toml(file, text)?;
        Plan::from_matrix(file, matrix, text.to_string(), Some(text))
    }

    /// Checks and expands `matrix`, from `file`; `text` is what the run stores (TOML that parses
    /// into `matrix`), `spans_in` the text its spans point into, for the lines of errors.
    pub fn from_matrix(file: &Path, matrix: Matrix, text: String, spans_in: Option<&str>) -> Result<Plan, MatrixError> {
        let checker = Checker { file, text: spans_in };
        let sources = checker.check(&matrix)?;
        // Counted from the matrix's shape before anything is expanded: twelve parameters of
        // ten values are 10^12 cells, which must be refused, not built.
        let count = count_cells(&matrix);
        if count > MAX_CELLS as u128 {
            return Err(checker.error(None, "matrix", format!("{count} cells; at most {MAX_CELLS}")));
        }
        let results = count * u128::from(matrix.repetitions);
        if results > MAX_RESULTS as u128 {
            return Err(checker.error(
                None,
                "matrix",
                format!(
                    "{count} cells x {} repetitions = {results} results; at most {MAX_RESULTS}",
                    matrix.repetitions
                ),
            ));
        }
        let cells = expand(&matrix);
        Ok(Plan { file: file.to_path_buf(), text, matrix, cells, sources })
    }

    /// The image named `name`.
    pub fn image(&self, name: &str) -> Option<&Image> {
        self.matrix.images.iter().map(|i| i.get_ref()).find(|i| i.name == name)
    }

    /// The variant named `name`.
    pub fn variant(&self, name: &str) -> Option<&Variant> {
        self.matrix.variants.iter().map(|v| v.get_ref()).find(|v| v.name == name)
    }

    /// The workload named `name`.
    pub fn workload(&self, name: &str) -> Option<&Workload> {
        self.matrix.workloads.iter().map(|w| w.get_ref()).find(|w| w.name() == name)
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.matrix.devices.iter().map(|d| d.get_ref()).find(|d| d.name == name)
    }

    /// What the device named `name` is.
    pub fn source(&self, name: &str) -> Option<&DeviceSource> {
        self.sources.get(name)
    }

    /// The baseline variant, if one is named.
    pub fn baseline(&self) -> Option<&str> {
        self.matrix.baseline.as_ref().map(|b| b.get_ref().as_str())
    }

    /// A kernel or initrd path as the VMM gets it: relative paths are from the matrix's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            return path.to_path_buf();
        }
        self.file.parent().unwrap_or(Path::new(".")).join(path)
    }
}

fn line_of(text: &str, span: Range<usize>) -> usize {
    text[..span.start.min(text.len())].matches('\n').count() + 1
}

struct Checker<'a> {
    file: &'a Path,
    /// The text the matrix's spans point into, when errors can give lines.
    text: Option<&'a str>,
}

impl Checker<'_> {
    fn error(&self, span: Option<Range<usize>>, field: impl Into<String>, message: impl Into<String>) -> MatrixError {
        MatrixError {
            kind: MatrixErrorKind::Invalid,
            file: self.file.to_path_buf(),
            line: span.zip(self.text).map(|(s, text)| line_of(text, s)),
            field: field.into(),
            message: message.into(),
        }
    }

    fn unique<'n>(
        &self,
        what: &str,
        names: impl Iterator<Item = (&'n str, Range<usize>)>,
    ) -> Result<BTreeSet<&'n str>, MatrixError> {
        let mut seen = BTreeSet::new();
        for (i, (name, span)) in names.enumerate() {
            if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '/' || c == '[') {
                return Err(self.error(Some(span), format!("{what}[{i}].name"), "a name is one word without / or ["));
            }
            if !seen.insert(name) {
                return Err(self.error(Some(span), format!("{what}[{i}].name"), format!("{name:?} is used twice")));
            }
        }
        Ok(seen)
    }

    /// Checks `m`; its devices' typed forms, by name.
    fn check(&self, m: &Matrix) -> Result<BTreeMap<String, DeviceSource>, MatrixError> {
        if m.name.trim().is_empty() {
            return Err(self.error(None, "name", "give the matrix a name"));
        }
        if m.repetitions == 0 || m.repetitions > MAX_REPETITIONS {
            return Err(self.error(None, "repetitions", format!("must be between 1 and {MAX_REPETITIONS}")));
        }
        for (field, value) in [("timeout_s", m.timeout_s), ("silence_s", m.silence_s)] {
            if !(value.is_finite() && value > 0.0 && value <= vm_spec::spec::MAX_TIMEOUT_S) {
                return Err(self.error(None, field, "must be a positive number of seconds"));
            }
        }
        for (what, empty) in [
            ("device", m.devices.is_empty()),
            ("image", m.images.is_empty()),
            ("variant", m.variants.is_empty()),
            ("workload", m.workloads.is_empty()),
        ] {
            if empty {
                return Err(self.error(None, what, format!("at least one [[{what}]] is needed")));
            }
        }
        self.unique("device", m.devices.iter().map(|d| (d.get_ref().name.as_str(), d.span())))?;
        let images = self.unique("image", m.images.iter().map(|i| (i.get_ref().name.as_str(), i.span())))?;
        let variants = self.unique("variant", m.variants.iter().map(|v| (v.get_ref().name.as_str(), v.span())))?;
        self.unique("workload", m.workloads.iter().map(|w| (w.get_ref().name(), w.span())))?;

        let mut sources = BTreeMap::new();
        for (i, d) in m.devices.iter().enumerate() {
            match d.get_ref().source() {
                Ok(source) => sources.insert(d.get_ref().name.clone(), source),
                Err((field, message)) => {
                    return Err(self.error(Some(d.span()), format!("device[{i}]{field}"), message));
                }
            };
        }
        for (i, image) in m.images.iter().enumerate() {
            let (span, image) = (image.span(), image.get_ref());
            // The VM limits every VM has (vm-spec's), on what the image fixes.
            let probe = vm_spec::VmSpec {
                memory_mib: image.memory_mib,
                vcpus: image.vcpus,
                cmdline: image.cmdline.clone(),
                ..vm_spec::VmSpec::new(vm_spec::Kernel::Probe)
            };
            if let Err(e) = probe.validate() {
                return Err(self.error(Some(span), format!("image[{i}]"), e.to_string()));
            }
            if image.is_probe() && image.initrd.is_some() {
                return Err(self.error(Some(span), format!("image[{i}].initrd"), "the probe takes no initrd"));
            }
            let agent = image.is_agent_initrd();
            if !image.patches.is_empty() && !agent {
                return Err(self.error(
                    Some(span),
                    format!("image[{i}].patches"),
                    "patches build the driver into the initramfs the lab makes: give initrd = \"agent\"",
                ));
            }
            if agent && !matches!(image.kernel, KernelRef::Debian { .. } | KernelRef::Store(_)) {
                return Err(self.error(
                    Some(span),
                    format!("image[{i}].initrd"),
                    "initrd = \"agent\" is built for a kernel image: give kernel = \"debian\" or a kernel image's ID",
                ));
            }
            if image.engine == EngineKind::Driverlab && image.accel != engines::qemu::Accel::Tcg {
                return Err(self.error(Some(span), format!("image[{i}].accel"), "accel is for engine = \"qemu\""));
            }
        }
        for (i, v) in m.variants.iter().enumerate() {
            let v = v.get_ref();
            if !images.contains(v.image.get_ref().as_str()) {
                return Err(self.error(
                    Some(v.image.span()),
                    format!("variant[{i}].image"),
                    format!("no image is called {:?}", v.image.get_ref()),
                ));
            }
            for (key, values) in &v.params {
                let field = format!("variant[{i}].params.{key}");
                if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '=') {
                    return Err(self.error(None, field, "a parameter is module.name, without spaces or ="));
                }
                let list = match values {
                    ParamValues::One(v) => std::slice::from_ref(v),
                    ParamValues::Many(list) if list.is_empty() => {
                        return Err(self.error(None, field, "an empty list of values"));
                    }
                    ParamValues::Many(list) => list.as_slice(),
                };
                if list.iter().any(|value| value.to_string().contains(char::is_whitespace)) {
                    return Err(self.error(None, field, "a value is one word"));
                }
            }
        }
        if let Some(baseline) = &m.baseline
            && !variants.contains(baseline.get_ref().as_str())
        {
            return Err(self.error(
                Some(baseline.span()),
                "baseline",
                format!("no variant is called {:?}", baseline.get_ref()),
            ));
        }
        for (i, w) in m.workloads.iter().enumerate() {
            let (span, w) = (w.span(), w.get_ref());
            match w {
                Workload::ProbeRx { frames, .. } if *frames == 0 => {
                    return Err(self.error(Some(span), format!("workload[{i}].frames"), "at least one frame"));
                }
                Workload::Iperf3 { ip, duration_s, streams, mtu, .. } => {
                    if *ip != 4 && *ip != 6 {
                        return Err(self.error(Some(span), format!("workload[{i}].ip"), "4 or 6"));
                    }
                    if !(duration_s.is_finite() && *duration_s > 0.0 && *duration_s <= 3600.0) {
                        return Err(self.error(Some(span), format!("workload[{i}].duration_s"), "0 to 3600 seconds"));
                    }
                    if *streams == 0 || *streams > 128 {
                        return Err(self.error(Some(span), format!("workload[{i}].streams"), "1 to 128"));
                    }
                    if !(68..=16_000).contains(mtu) {
                        return Err(self.error(Some(span), format!("workload[{i}].mtu"), "68 to 16000"));
                    }
                }
                _ => {}
            }
        }
        // Every variant must run under some workload: a probe image takes probe workloads, a
        // Linux image the others.
        for (i, v) in m.variants.iter().enumerate() {
            let v = v.get_ref();
            let image = m.images.iter().map(|i| i.get_ref()).find(|i| i.name == *v.image.get_ref());
            let probe = image.is_some_and(Image::is_probe);
            if !m.workloads.iter().any(|w| matches!(w.get_ref(), Workload::ProbeRx { .. }) == probe) {
                let wanted = if probe { "a probe-rx workload" } else { "an iperf3 workload" };
                return Err(self.error(
                    Some(v.image.span()),
                    format!("variant[{i}]"),
                    format!("its image {:?} needs {wanted}, and the matrix has none", v.image.get_ref()),
                ));
            }
        }
        // The probe drives only the NICs driverlab knows, and a probe-rx cell runs on every device.
        let probe_cells = m.variants.iter().any(|v| {
            m.images.iter().any(|i| i.get_ref().name == *v.get_ref().image.get_ref() && i.get_ref().is_probe())
        });
        if probe_cells && let Some((i, d)) = m.devices.iter().enumerate().find(|(_, d)| d.get_ref().nic().is_none()) {
            return Err(self.error(
                Some(d.span()),
                format!("device[{i}].driver"),
                format!(
                    "the probe guest drives {} ({}), not a {:?} device: run Linux images on it",
                    vm_spec::NicKind::names(),
                    vm_spec::NicKind::ALL.map(vm_spec::NicKind::linux_driver).join(", "),
                    d.get_ref().linux_driver()
                ),
            ));
        }
        Ok(sources)
    }
}

/// How many cells [`expand`] would make, without making them (saturating).
fn count_cells(m: &Matrix) -> u128 {
    let devices = m.devices.len() as u128;
    m.variants
        .iter()
        .map(|v| v.get_ref())
        .map(|variant| {
            let probe = m.images.iter().any(|i| i.get_ref().name == *variant.image.get_ref() && i.get_ref().is_probe());
            let workloads =
                m.workloads.iter().filter(|w| matches!(w.get_ref(), Workload::ProbeRx { .. }) == probe).count() as u128;
            let combinations = variant.params.values().fold(1u128, |n, values| {
                let k = match values {
                    ParamValues::One(_) => 1,
                    ParamValues::Many(list) => list.len() as u128,
                };
                n.saturating_mul(k)
            });
            combinations.saturating_mul(workloads).saturating_mul(devices)
        })
        .fold(0u128, u128::saturating_add)
}

/// The cells of a checked matrix: variants (each parameter list expanded) x compatible workloads
/// x devices.
fn expand(m: &Matrix) -> Vec<Cell> {
    let mut cells = Vec::new();
    for variant in m.variants.iter().map(|v| v.get_ref()) {
        let image_name = variant.image.get_ref();
        let probe = m.images.iter().any(|i| i.get_ref().name == *image_name && i.get_ref().is_probe());
        for params in param_combinations(&variant.params) {
            for workload in m.workloads.iter().map(|w| w.get_ref()) {
                if matches!(workload, Workload::ProbeRx { .. }) != probe {
                    continue;
                }
                for device in m.devices.iter().map(|d| d.get_ref()) {
                    let index = cells.len();
                    cells.push(Cell {
                        index,
                        id: format!("c{:02}", index + 1),
                        image: image_name.clone(),
                        variant: variant.name.clone(),
                        params: params.clone(),
                        workload: workload.name().to_string(),
                        device: device.name.clone(),
                    });
                }
            }
        }
    }
    cells
}

/// Every combination of one value per parameter, in key order.
fn param_combinations(params: &BTreeMap<String, ParamValues>) -> Vec<BTreeMap<String, String>> {
    let mut combinations = vec![BTreeMap::new()];
    for (key, values) in params {
        let values: Vec<String> = match values {
            ParamValues::One(v) => vec![v.to_string()],
            ParamValues::Many(list) => list.iter().map(ToString::to_string).collect(),
        };
        combinations = combinations
            .into_iter()
            .flat_map(|done| {
                values.iter().map(move |v| {
                    let mut next = done.clone();
                    next.insert(key.clone(), v.clone());
                    next
                })
            })
            .collect();
    }
    combinations
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "m"
repetitions = 3
baseline = "stock"

[[device]]
name = "aq"
model = "aqc100"

[[image]]
name = "probe"
kernel = "probe"

[[image]]
name = "linux"
kernel = "/boot/vmlinux"

[[variant]]
name = "stock"
image = "probe"
params = { "probe.rx" = "flip" }

[[variant]]
name = "order"
image = "linux"
params = { "atlantic.rxpageorder" = [0, 1, 2, 3], "atlantic.aq_itr" = 0 }

[[workload]]
name = "rx"
kind = "probe-rx"
frames = 1000

[[workload]]
name = "iperf"
kind = "iperf3"
ip = 6
"#;

    fn parse(text: &str) -> Result<Plan, MatrixError> {
        Plan::parse(Path::new("m.toml"), text)
    }

    #[test]
    fn cells_cross_variants_parameters_workloads_and_devices() {
        let plan = parse(GOOD).unwrap();
        let keys: Vec<String> = plan.cells.iter().map(Cell::key).collect();
        assert_eq!(keys[0], "probe/stock[probe.rx=flip]/rx/aq");
        assert_eq!(keys.len(), 5, "{keys:?}");
        assert_eq!(keys[1], "linux/order[atlantic.aq_itr=0,atlantic.rxpageorder=0]/iperf/aq");
        assert_eq!(keys[4], "linux/order[atlantic.aq_itr=0,atlantic.rxpageorder=3]/iperf/aq");
        assert_eq!(plan.cells[4].id, "c05");
        assert_eq!(plan.baseline(), Some("stock"));
        assert!(matches!(plan.workload("iperf"), Some(Workload::Iperf3 { ip: 6, mtu: 1500, .. })));
    }

    #[test]
    fn cells_and_results_are_counted_before_anything_is_expanded() {
        let plan = parse(GOOD).unwrap();
        assert_eq!(count_cells(&plan.matrix), plan.cells.len() as u128);
        // Twelve parameters of ten values each: 10^12 cells, refused from the shape alone (an
        // expansion would not finish, nor fit in memory).
        let params: Vec<String> = (0..12).map(|i| format!("\"m.p{i}\" = [0,1,2,3,4,5,6,7,8,9]")).collect();
        let huge =
            GOOD.replace("params = { \"probe.rx\" = \"flip\" }", &format!("params = {{ {} }}", params.join(", ")));
        assert_ne!(huge, GOOD);
        let start = std::time::Instant::now();
        let error = parse(&huge).unwrap_err();
        assert_eq!(error.field, "matrix");
        assert!(error.message.starts_with("1000000000004 cells; at most 10000"), "{error}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "refused without expanding");
        // Few cells, too many results.
        let many = GOOD.replace("repetitions = 3", "repetitions = 1000");
        let cells = parse(&GOOD.replace("repetitions = 3", "repetitions = 1")).unwrap().cells.len();
        if cells * 1000 > MAX_RESULTS {
            assert!(parse(&many).unwrap_err().message.contains("results; at most"));
        } else {
            let wide = many.replace("\"atlantic.rxpageorder\" = [0, 1, 2, 3]", "\"atlantic.rxpageorder\" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99]");
            assert_ne!(wide, many, "the test matrix has the order list");
            let error = parse(&wide).unwrap_err();
            assert!(error.message.contains("results; at most 100000"), "{error}");
        }
    }

    #[test]
    fn mistakes_name_file_line_and_field() {
        let cases = [
            (
                GOOD.replace("image = \"linux\"", "image = \"linx\""),
                25,
                "variant[1].image",
                "no image is called \"linx\"",
            ),
            (GOOD.replace("baseline = \"stock\"", "baseline = \"stok\""), 4, "baseline", "no variant"),
            (GOOD.replace("model = \"aqc100\"", "model = \"e1000\""), 8, "syntax", "unknown variant `e1000`"),
            (
                GOOD.replace("model = \"aqc100\"", "bdf = \"0000:63:00.0\"\ndriver = \"igb\""),
                6,
                "device[0].driver",
                "the probe guest drives aqc100, lan743x (atlantic, lan743x), not a \"igb\" device",
            ),
            (GOOD.replace("repetitions = 3", "repetitions = 0"), 0, "repetitions", "between 1"),
            (GOOD.replace("ip = 6", "ip = 5"), 33, "workload[1].ip", "4 or 6"),
            (GOOD.replace("frames = 1000", "frames = 0"), 28, "workload[0].frames", "at least one"),
            (GOOD.replace("name = \"linux\"", "name = \"probe\""), 14, "image[1].name", "used twice"),
            (GOOD.replace("kind = \"iperf3\"", "kind = \"netperf\""), 35, "syntax", "netperf"),
            (GOOD.replace("frames = 1000", "frames = 1000\ncolour = 1"), 28, "syntax", "colour"),
            (GOOD.replace("repetitions = 3", "repetitions = \"3\""), 3, "syntax", "invalid type"),
        ];
        for (text, line, field, message) in cases {
            let err = parse(&text).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.message.contains(message), "{err}");
            if line > 0 {
                assert_eq!(err.line, Some(line), "{err}");
            }
            assert!(err.to_string().starts_with("m.toml:"), "{err}");
        }
        let host = |extra: &str| GOOD.replace("model = \"aqc100\"", &format!("bdf = \"0000:63:00.0\"\n{extra}"));
        for (text, field, message) in [
            (host("peer = \"-oProxyCommand=x\""), "device[0].peer", "not an SSH destination"),
            (host("peer = \"lab@peer box\""), "device[0].peer", "not an SSH destination"),
            (host("peer = \"lab@peer\"\npeer_ip = \"10.0.0.300\""), "device[0].peer_ip", "an IPv4 address"),
            (host("peer = \"lab@peer\"\nguest_ip = \"10.0.0.2\""), "device[0].guest_ip", "IPv4/prefix"),
            (host("peer = \"peer\"\nguest_ip6 = \"fd00::2/129\""), "device[0].guest_ip6", "IPv6/prefix"),
            (host("peer_ip = \"10.0.0.1\""), "device[0]", "addresses are for a device with a peer"),
            (GOOD.replace("model = \"aqc100\"", "model = \"aqc100\"\npeer = \"lab@x\""), "device[0].peer", "namespace"),
        ] {
            let err = parse(&text).unwrap_err();
            assert_eq!((err.field.as_str(), err.message.contains(message)), (field, true), "{err}");
        }
        let plan = parse(&host("peer = \"lab@peer-1.lan\"\npeer_ip = \"192.168.7.1\"\nguest_ip = \"192.168.7.2/24\""))
            .unwrap();
        let addresses = plan.device("aq").unwrap().addresses();
        assert_eq!((addresses.peer_v4.as_str(), addresses.guest_v6.as_str()), ("192.168.7.1", "fd77::2/64"));

        let no_probe_workload = GOOD.replace("kind = \"probe-rx\"\nframes = 1000", "kind = \"iperf3\"");
        assert!(parse(&no_probe_workload).unwrap_err().message.contains("needs a probe-rx workload"));
    }

    proptest::proptest! {
        #[test]
        fn the_cell_count_is_the_product_of_the_dimensions(
            values in proptest::collection::vec(0u8..10, 1..5),
            devices in 1usize..4,
            workloads in 1usize..4,
        ) {
            let mut text = String::from("name = \"p\"\n");
            for d in 0..devices {
                text += &format!("[[device]]\nname = \"d{d}\"\nmodel = \"aqc100\"\n");
            }
            text += "[[image]]\nname = \"probe\"\nkernel = \"probe\"\n";
            let list: Vec<String> = values.iter().map(u8::to_string).collect();
            text += &format!("[[variant]]\nname = \"v\"\nimage = \"probe\"\nparams = {{ \"probe.x\" = [{}] }}\n", list.join(", "));
            for w in 0..workloads {
                text += &format!("[[workload]]\nname = \"w{w}\"\nkind = \"probe-rx\"\n");
            }
            let plan = parse(&text).unwrap();
            proptest::prop_assert_eq!(plan.cells.len(), values.len() * devices * workloads);
            let ids: BTreeSet<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
            proptest::prop_assert_eq!(ids.len(), plan.cells.len());
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }
    }
}
