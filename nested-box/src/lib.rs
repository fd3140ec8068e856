//! The nested lab box: a lab box without hardware, for driverlab's own engine end to end
//! (docs/nested-box.md).
//!
//! An L1 VM under the QEMU engine's QEMU (TCG, `-cpu max`, which gives the guest AMD SVM with
//! nested paging; q35 with a virtio-iommu) boots Debian's 6.12 kernel with the box's initramfs
//! (`guest_images::box_image`): `kvm_amd`, VFIO, and `driverlab serve` on TCP with a bearer
//! token, its port forwarded to the host's loopback. Its PCI cards are the host's device models
//! as `vfio-user-pci` devices, which the box binds to `vfio-pci` as a lab box binds its NIC and
//! registers as lab devices named after their model. Each card's wire is a TAP in a network
//! namespace of the host; the box reaches that namespace as a lab box reaches a real NIC's peer,
//! over SSH (a private `sshd` on the host's loopback whose keys allow only the card's
//! [`gate`]).
//!
//! ```text
//! host                                           L1 (QEMU TCG, -cpu max)        L2 (driverlab vm run)
//! driverlab nested-box supervise                 /init (guest-images/box/init)
//!   model aqc100 (netns dlbox-aqc100, TAP) <-vfio-user-> vfio-pci <-kernel VFIO-> atlantic
//!   sshd 127.0.0.1:P -> gate -> iperf3 -s -1  <-ssh-  driverlab serve :8750   <-wire-> iperf3 -c
//!   127.0.0.1:PORT  ----hostfwd---------------->  (token, lab.db on /dev/vda, images over 9p)
//! ```
//!
//! `up` prepares the box's folder, starts the supervisor (`driverlab nested-box supervise`, a
//! process of its own that outlives `up` and owns every other one), and waits until the box's
//! daemon answers; `status` and `down` find it through the folder's `state.json`.

pub mod gate;
mod qemu_args;
pub mod supervisor;

use std::io::{BufRead, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vm_spec::NicKind;

pub use qemu_args::box_args;

/// The box daemon's port inside the box.
pub const BOX_PORT: u16 = 8750;
/// The host as the box sees it (QEMU's user network forwards it to the host's loopback).
pub const HOST_FROM_BOX: &str = "10.0.2.2";
/// How large the box's disk is (sparse; it holds the results database and the artifacts).
const DISK_BYTES: u64 = 4 << 30;

/// Errors of the nested box.
#[derive(Debug, thiserror::Error)]
pub enum BoxError {
    /// A box runs already in this folder.
    #[error("a nested box is already up ({url}, folder {dir}): `driverlab nested-box down` first", dir = dir.display())]
    AlreadyUp {
        /// Its URL.
        url: String,
        /// Its folder.
        dir: PathBuf,
    },
    /// No box runs in this folder.
    #[error("no nested box is up in {}", .0.display())]
    NotUp(PathBuf),
    /// QEMU is missing or cannot run the box.
    #[error("{0}")]
    Qemu(String),
    /// The box's TCG gives no SVM.
    #[error("this QEMU's TCG gives its guests no SVM (`-cpu max` has no svm flag): {0}")]
    NoSvm(String),
    /// A host tool the box needs is missing or failed.
    #[error("{what}: {detail}")]
    Tool {
        /// What was being done.
        what: String,
        /// Why it failed.
        detail: String,
    },
    /// An image could not be built.
    #[error(transparent)]
    Image(#[from] guest_images::store::ImageError),
    /// A file of the box's folder.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The box did not come up.
    #[error("the nested box did not come up: {0}")]
    Boot(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BoxError + '_ {
    move |source| BoxError::Io { path: path.to_path_buf(), source }
}

/// What `up` asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BoxOptions {
    /// The cards, one model each (at most one of each kind).
    pub cards: Vec<NicKind>,
    /// The box's memory in MiB.
    pub memory_mib: u64,
    /// The box's vCPUs.
    pub cpus: u32,
    /// The host's port for the box's daemon (0: any free one).
    pub port: u16,
    /// Start with an empty disk (no results from earlier boxes).
    pub fresh: bool,
    /// How long to wait for the box's daemon.
    pub boot_timeout_s: u64,
    /// The box's CPU model under TCG (it must have SVM with nested paging).
    #[serde(default = "default_cpu")]
    pub cpu: String,
    /// Whether the box's KVM gives its VMs nested paging (`kvm_amd npt`); off, it shadows their
    /// page tables instead.
    #[serde(default = "default_nested_paging")]
    pub nested_paging: bool,
    /// Whether TCG runs the box's vCPUs on one host thread (`-accel tcg,thread=single`) rather
    /// than one thread each.
    #[serde(default)]
    pub tcg_single_thread: bool,
}

fn default_nested_paging() -> bool {
    true
}

fn default_cpu() -> String {
    "max".into()
}

impl Default for BoxOptions {
    fn default() -> BoxOptions {
        BoxOptions {
            cards: vec![NicKind::Aqc100],
            memory_mib: 4096,
            cpus: 2,
            port: 0,
            fresh: false,
            boot_timeout_s: 600,
            cpu: default_cpu(),
            nested_paging: default_nested_paging(),
            tcg_single_thread: false,
        }
    }
}

/// Everything the supervisor needs, written by `up` into the folder as `plan.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BoxPlan {
    /// What was asked.
    pub options: BoxOptions,
    /// The driverlab binary (the host's models and the SSH gate run it; the box carries it).
    pub driverlab: PathBuf,
    /// The QEMU chroot.
    pub qemu_root: PathBuf,
    /// The image store the box reads.
    pub images: PathBuf,
    /// The kernel's bzImage.
    pub bzimage: PathBuf,
    /// The port on the host's loopback forwarded to the box's daemon.
    pub port: u16,
    /// The port of the peers' sshd on the host's loopback.
    pub ssh_port: u16,
    /// The cards.
    pub cards: Vec<Card>,
}

/// One card: a model on the host, its wire's namespace and how the box reaches its peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Card {
    /// The NIC.
    pub kind: NicKind,
    /// Its lab device name in the box (the model's name).
    pub name: String,
    /// The network namespace of its wire on the host.
    pub netns: String,
    /// The model's vfio-user socket.
    pub socket: PathBuf,
    /// The model's control socket.
    pub control: PathBuf,
    /// The SSH host alias the box's lab names as the device's peer.
    pub peer: String,
}

impl Card {
    fn new(kind: NicKind, run: &Path) -> Card {
        Card {
            kind,
            name: kind.name().to_string(),
            netns: format!("dlbox-{kind}"),
            socket: run.join(format!("{kind}.sock")),
            control: run.join(format!("{kind}.control")),
            peer: format!("{kind}-peer"),
        }
    }

    /// The box's kernel command line word for it: `NAME:VENDOR:DEVICE:DRIVER`.
    pub fn cmdline_word(&self) -> String {
        let (vendor, device) = self.kind.pci_id();
        format!("{}:{vendor:04x}:{device:04x}:{}", self.name, self.kind.linux_driver())
    }
}

/// What the supervisor says of the box, in the folder's `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoxState {
    /// `starting`, `up` (the daemon answers) or `ended`.
    pub phase: String,
    /// The box daemon's URL on the host.
    pub url: String,
    /// The bearer token's file.
    pub token_file: PathBuf,
    /// The supervisor's PID.
    pub supervisor: u32,
    /// QEMU's PID, once it runs.
    pub qemu: Option<u32>,
    /// The cards.
    pub cards: Vec<Card>,
    /// The box's console.
    pub console: PathBuf,
    /// When the supervisor started (RFC 3339).
    pub started_at: String,
    /// Why it ended, once it has.
    pub ended: Option<String>,
}

/// The folder's files.
#[derive(Debug, Clone)]
pub struct BoxDir {
    root: PathBuf,
}

impl BoxDir {
    /// The folder at `root`.
    pub fn new(root: impl Into<PathBuf>) -> BoxDir {
        BoxDir { root: root.into() }
    }

    /// The default folder: `nested-box` in driverlab's cache folder.
    pub fn default_root() -> PathBuf {
        guest_images::store::cache_dir().join("nested-box")
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    /// The supervisor's lock: held while a box runs.
    pub fn lock(&self) -> PathBuf {
        self.path("lock")
    }
    /// `plan.json`.
    pub fn plan(&self) -> PathBuf {
        self.path("plan.json")
    }
    /// `state.json`.
    pub fn state(&self) -> PathBuf {
        self.path("state.json")
    }
    /// The box's share (9p tag `box`): token, SSH key and configuration.
    pub fn share(&self) -> PathBuf {
        self.path("share")
    }
    /// The bearer token (also in the share).
    pub fn token(&self) -> PathBuf {
        self.share().join("token")
    }
    /// The file in the share that asks the box to stop cleanly (its init watches for it).
    pub fn stop_request(&self) -> PathBuf {
        self.share().join("stop")
    }
    /// The peers' sshd: configuration, host key, authorized keys.
    pub fn sshd(&self) -> PathBuf {
        self.path("sshd")
    }
    /// The box's disk.
    pub fn disk(&self) -> PathBuf {
        self.path("disk.img")
    }
    /// The box's initramfs.
    pub fn initramfs(&self) -> PathBuf {
        self.path("box-initramfs.cpio.gz")
    }
    /// The box's console (COM1).
    pub fn console(&self) -> PathBuf {
        self.path("console.log")
    }
    /// QEMU's own messages.
    pub fn qemu_log(&self) -> PathBuf {
        self.path("qemu.log")
    }
    /// The supervisor's log.
    pub fn supervisor_log(&self) -> PathBuf {
        self.path("supervisor.log")
    }
    /// Sockets of the models.
    pub fn run(&self) -> PathBuf {
        self.path("run")
    }

    /// The state the supervisor last wrote.
    pub fn read_state(&self) -> Option<BoxState> {
        serde_json::from_slice(&std::fs::read(self.state()).ok()?).ok()
    }

    /// Writes `state` (whole, by rename).
    pub fn write_state(&self, state: &BoxState) -> Result<(), BoxError> {
        let tmp = self.path("state.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(state).expect("serializable")).map_err(io(&tmp))?;
        std::fs::rename(&tmp, self.state()).map_err(io(&self.state()))
    }

    /// Whether a supervisor holds the folder's lock now.
    pub fn locked(&self) -> bool {
        match Lock::try_take(&self.lock()) {
            Ok(Some(_)) => false,
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// The running box's state, if a supervisor holds the lock.
    pub fn running(&self) -> Option<BoxState> {
        self.locked().then(|| self.read_state()).flatten()
    }
}

/// An exclusive `flock` on a file, released when dropped (or when the process ends).
pub struct Lock {
    _file: std::fs::File,
}

impl Lock {
    /// Takes the lock, or `None` when another process holds it.
    pub fn try_take(path: &Path) -> Result<Option<Lock>, BoxError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(io(path))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Lock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(io(path)(e.into())),
        }
    }
}

/// What `up` reports once the box answers.
#[derive(Debug, Clone)]
pub struct Up {
    /// The daemon's URL.
    pub url: String,
    /// The token's file.
    pub token_file: PathBuf,
    /// The state.
    pub state: BoxState,
}

/// Brings a box up in `dir` and waits until its daemon answers with every card registered.
/// Progress lines go to `note`.
pub fn up(dir: &BoxDir, options: &BoxOptions, driverlab: &Path, note: &dyn Fn(&str)) -> Result<Up, BoxError> {
    if options.cards.is_empty() {
        return Err(BoxError::Boot("a box needs at least one card (--card aqc100|lan743x)".into()));
    }
    let mut kinds = options.cards.clone();
    kinds.sort();
    kinds.dedup();
    if kinds.len() != options.cards.len() {
        return Err(BoxError::Boot("each card kind at most once".into()));
    }
    std::fs::create_dir_all(dir.root()).map_err(io(dir.root()))?;
    let _ = std::fs::set_permissions(dir.root(), std::fs::Permissions::from_mode(0o700));
    if let Some(state) = dir.running() {
        return Err(BoxError::AlreadyUp { url: state.url, dir: dir.root().to_path_buf() });
    }
    if !engines::peer::can_create() {
        return Err(BoxError::Boot(
            "the box's cards need network namespaces and their peers an sshd: run as root".into(),
        ));
    }
    let qemu = engines::qemu::Qemu::find(&engines::qemu::default_root()).map_err(|e| BoxError::Qemu(e.to_string()))?;
    note(&format!("qemu: {}", qemu.version().map_err(|e| BoxError::Qemu(e.to_string()))?));
    check_svm(&qemu)?;
    for (tool, package) in [("/usr/sbin/sshd", "openssh-server"), ("ssh-keygen", "openssh-client")] {
        let found =
            Path::new(tool).is_absolute() && Path::new(tool).exists() || Command::new(tool).arg("-?").output().is_ok();
        if !found {
            return Err(BoxError::Tool {
                what: format!("the box's peers need {tool}"),
                detail: format!("apt-get install {package}"),
            });
        }
    }

    let store = guest_images::store::ImageStore::new(guest_images::store::default_root());
    note("kernel: Debian's newest 6.12 (downloaded into the image store the first time)");
    let kernel = guest_images::kernel_image::from_package(&store, None)?;
    note(&format!("kernel: {} ({})", kernel.id, kernel.release));
    let image = guest_images::box_image::build(&store, &kernel, driverlab)?;
    std::fs::write(dir.initramfs(), &image.archive).map_err(io(&dir.initramfs()))?;
    note(&format!(
        "initramfs: {} ({} MiB, {} modules)",
        dir.initramfs().display(),
        image.archive.len() >> 20,
        image.modules.len()
    ));

    let port = if options.port == 0 { free_port()? } else { options.port };
    let ssh_port = free_port()?;
    let run = dir.run();
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).map_err(io(&run))?;
    let cards: Vec<Card> = options.cards.iter().map(|&k| Card::new(k, &run)).collect();
    prepare_share(dir, &cards, ssh_port, driverlab)?;
    prepare_disk(dir, options.fresh, note)?;
    let plan = BoxPlan {
        options: options.clone(),
        driverlab: driverlab.to_path_buf(),
        qemu_root: qemu.root().to_path_buf(),
        images: store.root().to_path_buf(),
        bzimage: store.dir(&kernel.id).join(&kernel.bzimage),
        port,
        ssh_port,
        cards,
    };
    std::fs::write(dir.plan(), serde_json::to_vec_pretty(&plan).expect("serializable")).map_err(io(&dir.plan()))?;
    let _ = std::fs::remove_file(dir.state());
    let _ = std::fs::remove_file(dir.console());

    let child = supervisor::spawn(driverlab, dir)?;
    note(&format!("box: booting (supervisor {child}, console {})", dir.console().display()));
    wait_up(dir, &plan, child, Duration::from_secs(options.boot_timeout_s), note)
}

/// Waits until the supervisor says the box is up, or why it is not.
fn wait_up(
    dir: &BoxDir,
    plan: &BoxPlan,
    supervisor: u32,
    limit: Duration,
    note: &dyn Fn(&str),
) -> Result<Up, BoxError> {
    let start = Instant::now();
    let mut said = 0usize;
    loop {
        let console = std::fs::read_to_string(dir.console()).unwrap_or_default();
        for line in console.lines().filter(|l| l.starts_with("dlbox: ")).skip(said) {
            said += 1;
            note(&format!("box: {}", &line["dlbox: ".len()..]));
        }
        if let Some(error) = console.lines().find_map(|l| l.strip_prefix("dlbox: error: ")) {
            let _ = down(dir, Duration::from_secs(10));
            return Err(BoxError::Boot(error.to_string()));
        }
        let state = dir.read_state();
        match &state {
            Some(s) if s.phase == "up" => {
                return Ok(Up { url: s.url.clone(), token_file: s.token_file.clone(), state: s.clone() });
            }
            Some(s) if s.phase == "ended" => {
                return Err(BoxError::Boot(s.ended.clone().unwrap_or_else(|| "the supervisor ended".into())));
            }
            _ => {}
        }
        if !alive(supervisor) && state.as_ref().is_none_or(|s| s.phase != "up") {
            let log = std::fs::read_to_string(dir.supervisor_log()).unwrap_or_default();
            let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("it wrote nothing").to_string();
            return Err(BoxError::Boot(format!("the supervisor ended: {last}")));
        }
        if start.elapsed() > limit {
            let _ = down(dir, Duration::from_secs(10));
            let tail = console.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("nothing").to_string();
            return Err(BoxError::Boot(format!(
                "its daemon did not answer on port {} within {} s; the console's last line: {tail}",
                plan.port,
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether process `pid` exists (and this process may signal it).
pub fn alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

/// Sends `signal` to process `pid`, if there is one.
pub(crate) fn signal(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Stops the box in `dir`: SIGTERM to its supervisor, which stops QEMU, the models and the
/// sshd and removes the namespaces; SIGKILL after `grace`. Returns the state it ended with.
pub fn down(dir: &BoxDir, grace: Duration) -> Result<BoxState, BoxError> {
    let Some(state) = dir.read_state() else { return Err(BoxError::NotUp(dir.root().to_path_buf())) };
    if !dir.locked() {
        return Err(BoxError::NotUp(dir.root().to_path_buf()));
    }
    // The supervisor's PID, which holds the folder's lock.
    signal(state.supervisor, rustix::process::Signal::TERM);
    let start = Instant::now();
    while dir.locked() && start.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(100));
    }
    if dir.locked() {
        signal(state.supervisor, rustix::process::Signal::KILL);
        while dir.locked() && start.elapsed() < grace + Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(dir.read_state().unwrap_or(state))
}

/// Asks a QEMU with `-machine none` whether TCG's `max` CPU has SVM.
fn check_svm(qemu: &engines::qemu::Qemu) -> Result<(), BoxError> {
    let mut child = qemu
        .command(
            &["-machine", "none", "-accel", "tcg", "-nodefaults", "-display", "none", "-qmp", "stdio"]
                .map(String::from),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| BoxError::Qemu(format!("starting QEMU to ask for SVM: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped");
    let _ = stdin.write_all(
        b"{\"execute\":\"qmp_capabilities\"}\n\
          {\"execute\":\"query-cpu-model-expansion\",\"arguments\":{\"type\":\"full\",\"model\":{\"name\":\"max\"}}}\n\
          {\"execute\":\"quit\"}\n",
    );
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| BoxError::Qemu(e.to_string()))?;
    let svm = std::io::BufReader::new(&out.stdout[..])
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .find_map(|v| v["return"]["model"]["props"]["svm"].as_bool());
    match svm {
        Some(true) => Ok(()),
        Some(false) => Err(BoxError::NoSvm("QEMU says svm=false for the max CPU".into())),
        None => Err(BoxError::NoSvm(format!(
            "QEMU did not answer query-cpu-model-expansion: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("no message")
        ))),
    }
}

/// A free TCP port on the host's loopback.
fn free_port() -> Result<u16, BoxError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BoxError::Tool { what: "finding a free port on 127.0.0.1".into(), detail: e.to_string() })?;
    Ok(listener.local_addr().map(|a| a.port()).unwrap_or(0))
}

fn run_tool(command: &mut Command, what: &str) -> Result<(), BoxError> {
    let out = command.output().map_err(|e| BoxError::Tool { what: what.into(), detail: e.to_string() })?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(BoxError::Tool {
            what: what.into(),
            detail: said.trim().lines().last().unwrap_or("failed").into(),
        });
    }
    Ok(())
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), BoxError> {
    let mut file =
        std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(path).map_err(io(path))?;
    file.write_all(data).map_err(io(path))
}

/// A fresh random token: 32 hex digits from the kernel's generator.
fn token() -> Result<String, BoxError> {
    let mut bytes = [0u8; 16];
    let mut urandom = std::fs::File::open("/dev/urandom").map_err(io(Path::new("/dev/urandom")))?;
    std::io::Read::read_exact(&mut urandom, &mut bytes).map_err(io(Path::new("/dev/urandom")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The box's share and the sshd's folder: a new token, the sshd's host key, a key per card whose
/// only use is the card's gate, the box's SSH configuration with a host alias per card.
fn prepare_share(dir: &BoxDir, cards: &[Card], ssh_port: u16, driverlab: &Path) -> Result<(), BoxError> {
    let share = dir.share();
    let ssh = share.join("ssh");
    let sshd = dir.sshd();
    for folder in [&share, &ssh, &sshd] {
        let _ = std::fs::remove_dir_all(folder);
        std::fs::create_dir_all(folder).map_err(io(folder))?;
        let _ = std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700));
    }
    write_private(&dir.token(), format!("{}\n", token()?).as_bytes())?;
    let keygen = |file: &Path, comment: &str| {
        run_tool(
            Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"]).arg(file),
            "ssh-keygen",
        )
    };
    let host_key = sshd.join("host_key");
    keygen(&host_key, "driverlab nested box peer")?;
    let host_pub = std::fs::read_to_string(host_key.with_extension("pub")).map_err(io(&host_key))?;
    let mut config = String::from("# The cards' peers: the host's sshd, each key allowed only its card's gate.\n");
    let mut authorized = String::new();
    let mut known = String::new();
    let user = current_user();
    for card in cards {
        let key = ssh.join(format!("id_{}", card.name));
        keygen(&key, &format!("driverlab nested box {}", card.name))?;
        let public = std::fs::read_to_string(key.with_extension("pub")).map_err(io(&key))?;
        let gate = format!(
            "{} nested-box gate --netns {} --control {}",
            driverlab.display(),
            card.netns,
            card.control.display()
        );
        authorized.push_str(&format!("command=\"{gate}\",restrict {}", public.trim()));
        authorized.push('\n');
        config.push_str(&format!(
            "Host {}\n  HostName {HOST_FROM_BOX}\n  Port {ssh_port}\n  User {user}\n  IdentityFile ~/.ssh/id_{}\n  IdentitiesOnly yes\n",
            card.peer, card.name
        ));
    }
    config.push_str("Host *\n  StrictHostKeyChecking yes\n  UserKnownHostsFile ~/.ssh/known_hosts\n  LogLevel ERROR\n");
    known.push_str(&format!("[{HOST_FROM_BOX}]:{ssh_port} {}", host_pub.trim()));
    known.push('\n');
    let _ = std::fs::remove_file(ssh.join("id_unused"));
    for entry in std::fs::read_dir(&ssh).map_err(io(&ssh))?.flatten() {
        if entry.path().extension().is_some_and(|e| e == "pub") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    write_private(&ssh.join("config"), config.as_bytes())?;
    write_private(&ssh.join("known_hosts"), known.as_bytes())?;
    write_private(&sshd.join("authorized_keys"), authorized.as_bytes())?;
    let sshd_config = format!(
        "# The nested box's peers: only the cards' keys, each forced to its gate.\n\
         ListenAddress 127.0.0.1:{ssh_port}\n\
         HostKey {host}\n\
         AuthorizedKeysFile {keys}\n\
         PidFile {pid}\n\
         AllowUsers {user}\n\
         PermitRootLogin forced-commands-only\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         StrictModes no\n\
         PrintMotd no\n\
         AllowTcpForwarding no\n\
         X11Forwarding no\n\
         MaxStartups 32\n",
        host = host_key.display(),
        keys = sshd.join("authorized_keys").display(),
        pid = sshd.join("sshd.pid").display(),
    );
    write_private(&sshd.join("sshd_config"), sshd_config.as_bytes())
}

fn current_user() -> String {
    // SAFETY: getuid has no preconditions; getpwuid returns a pointer into static storage that
    // is read at once, on this thread.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if pw.is_null() || (*pw).pw_name.is_null() {
            return "root".into();
        }
        std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned()
    }
}

/// The box's disk: an ext4 file system in a sparse file, made once (again with `fresh`).
fn prepare_disk(dir: &BoxDir, fresh: bool, note: &dyn Fn(&str)) -> Result<(), BoxError> {
    let disk = dir.disk();
    if disk.exists() && !fresh {
        note(&format!("disk: {} (the results of earlier boxes)", disk.display()));
        return Ok(());
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&disk)
        .map_err(io(&disk))?;
    file.set_len(DISK_BYTES).map_err(io(&disk))?;
    drop(file);
    run_tool(
        Command::new("mkfs.ext4").args(["-q", "-F", "-L", "driverlab"]).arg(&disk),
        "mkfs.ext4 (apt-get install e2fsprogs)",
    )?;
    note(&format!("disk: {} (new, {} GiB)", disk.display(), DISK_BYTES >> 30));
    Ok(())
}

/// The token in `file`, its first line.
pub fn read_token(file: &Path) -> Result<String, BoxError> {
    let text = std::fs::read_to_string(file).map_err(io(file))?;
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_names_its_namespace_peer_and_pci_identity() {
        let card = Card::new(NicKind::Lan743x, Path::new("/box/run"));
        assert_eq!(
            (card.name.as_str(), card.netns.as_str(), card.peer.as_str()),
            ("lan743x", "dlbox-lan743x", "lan743x-peer")
        );
        assert_eq!(card.cmdline_word(), "lan743x:1055:7430:lan743x");
        assert_eq!(card.socket, Path::new("/box/run/lan743x.sock"));
    }

    #[test]
    fn the_lock_is_exclusive_and_released_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = Lock::try_take(&path).unwrap().expect("free");
        let dir_view = BoxDir::new(dir.path());
        assert!(dir_view.locked());
        assert!(Lock::try_take(&path).unwrap().is_none(), "a second holder is refused");
        drop(held);
        assert!(!dir_view.locked());
        assert!(dir_view.running().is_none());
    }

    #[test]
    fn tokens_are_new_each_time() {
        let (a, b) = (token().unwrap(), token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
