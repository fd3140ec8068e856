//! `driverlab nested-box up|status|down`: a lab box without hardware (docs/nested-box.md), and
//! the two commands its processes run (`supervise`, `gate`), hidden from the help.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use nested_box::{self, BoxDir, BoxError, BoxOptions};
use vm_spec::NicKind;

use super::CodedError;

/// The nested lab box.
#[derive(Subcommand)]
pub enum NestedBoxCommand {
    /// Start a nested lab box (root; about a minute under TCG) and wait until its daemon answers.
    /// Last line: `box URL TOKEN_FILE`.
    Up(UpArgs),
    /// Whether a box is up: its URL, token file, cards, and its daemon's answer.
    Status(DirArgs),
    /// Stop the box: QEMU, the models, the peers' sshd, the namespaces (its disk stays).
    Down(DirArgs),
    /// The box's supervisor (started by `up`).
    #[command(hide = true)]
    Supervise(DirArgs),
    /// A card's SSH gate (the forced command of the card's key on the host).
    #[command(hide = true)]
    Gate(GateArgs),
}

/// Where the box lives.
#[derive(Args)]
pub struct DirArgs {
    /// The box's folder (state, token, disk, logs) [default: nested-box in driverlab's cache].
    #[arg(long, value_name = "DIR", env = "DRIVERLAB_NESTED_BOX")]
    pub dir: Option<PathBuf>,
}

impl DirArgs {
    fn dir(&self) -> BoxDir {
        BoxDir::new(self.dir.clone().unwrap_or_else(BoxDir::default_root))
    }
}

/// Options of `nested-box up`.
#[derive(Args)]
pub struct UpArgs {
    /// A card: a device model on the host that the box binds to vfio-pci (repeat for more)
    /// [default: aqc100].
    #[arg(long = "card", value_name = "NIC", value_parser = parse_nic)]
    pub cards: Vec<NicKind>,
    /// The box's memory.
    #[arg(long, value_name = "MiB", default_value_t = 4096)]
    pub memory: u64,
    /// The box's vCPUs.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub cpus: u32,
    /// The host port (on 127.0.0.1) for the box's daemon [default: a free one].
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub port: u16,
    /// Start with an empty disk: no results of earlier boxes.
    #[arg(long)]
    pub fresh: bool,
    /// How long to wait for the box's daemon.
    #[arg(long, value_name = "S", default_value_t = 600)]
    pub timeout: u64,
    /// The box's CPU model under TCG; it must have SVM with nested paging.
    #[arg(long, value_name = "MODEL", default_value = "max")]
    pub cpu: String,
    /// Whether the box's KVM uses nested paging for its VMs (`off`: shadow page tables).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub nested_paging: bool,
    /// How TCG runs the box's vCPUs: `multi` (a host thread each) or `single` (one thread for all).
    #[arg(long, value_name = "multi|single", default_value = "multi", value_parser = parse_threads, action = clap::ArgAction::Set)]
    pub tcg_threads: bool,
    /// The box's folder.
    #[command(flatten)]
    pub dir: DirArgs,
}

/// Options of `nested-box gate`.
#[derive(Args)]
pub struct GateArgs {
    /// The card's wire namespace.
    #[arg(long)]
    pub netns: String,
    /// The card model's control socket.
    #[arg(long)]
    pub control: PathBuf,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: say on or off")),
    }
}

/// `single` is true.
fn parse_threads(s: &str) -> Result<bool, String> {
    match s {
        "single" => Ok(true),
        "multi" => Ok(false),
        _ => Err(format!("{s:?}: say multi or single")),
    }
}

fn parse_nic(s: &str) -> Result<NicKind, String> {
    s.parse::<NicKind>().map_err(|e| e.to_string())
}

fn coded(error: BoxError) -> anyhow::Error {
    let code = match error {
        BoxError::AlreadyUp { .. } | BoxError::NotUp(_) => 2,
        _ => 1,
    };
    CodedError { message: error.to_string(), code }.into()
}

impl NestedBoxCommand {
    /// Runs the subcommand; returns the exit code.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            NestedBoxCommand::Up(args) => {
                let options = BoxOptions {
                    cards: if args.cards.is_empty() { vec![NicKind::Aqc100] } else { args.cards },
                    memory_mib: args.memory,
                    cpus: args.cpus,
                    port: args.port,
                    fresh: args.fresh,
                    boot_timeout_s: args.timeout,
                    cpu: args.cpu,
                    nested_paging: args.nested_paging,
                    tcg_single_thread: args.tcg_threads,
                };
                let driverlab = std::env::current_exe()?;
                let note = |line: &str| eprintln!("{line}");
                let up = nested_box::up(&args.dir.dir(), &options, &driverlab, &note).map_err(coded)?;
                for card in &up.state.cards {
                    eprintln!("card {}: peer {} (namespace {})", card.name, card.peer, card.netns);
                }
                println!("box {} {}", up.url, up.token_file.display());
                Ok(0)
            }
            NestedBoxCommand::Status(args) => {
                let dir = args.dir();
                let Some(state) = dir.running() else {
                    let last = dir.read_state().and_then(|s| s.ended).map(|e| format!(" (the last one: {e})"));
                    println!("no nested box is up in {}{}", dir.root().display(), last.unwrap_or_default());
                    return Ok(1);
                };
                let cards: Vec<String> = state.cards.iter().map(|c| c.name.clone()).collect();
                let token = nested_box::read_token(&state.token_file).unwrap_or_default();
                let port = state.url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let answer = nested_box::supervisor::http_status(port, "/v1/version", &token)
                    .map_or("does not answer".to_string(), |s| format!("answers {s}"));
                println!(
                    "box {} {}: {}, since {}, cards {}, its daemon {answer}",
                    state.url,
                    state.token_file.display(),
                    state.phase,
                    state.started_at,
                    cards.join(", ")
                );
                Ok(0)
            }
            NestedBoxCommand::Down(args) => {
                let state = nested_box::down(&args.dir(), nested_box::supervisor::CLEAN_STOP + Duration::from_secs(15))
                    .map_err(coded)?;
                println!("box {} down: {}", state.url, state.ended.unwrap_or_else(|| "stopped".into()));
                Ok(0)
            }
            NestedBoxCommand::Supervise(args) => {
                nested_box::supervisor::supervise(&args.dir()).map_err(coded)?;
                Ok(0)
            }
            NestedBoxCommand::Gate(args) => Ok(nested_box::gate::run(&args.netns, &args.control) as u8),
        }
    }
}
