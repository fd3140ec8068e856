//! The hidden `driverlab vm jail-break`: the VMM's jail entered by the VMM's own code path
//! (`jail::enter_namespaces`, `jail::confine`, the same [`jail::JailSpec`]), then what a guest
//! that broke out of a device emulation would try next. tests/jail.rs asserts that each
//! attempt fails.

use std::io::ErrorKind;

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

/// Options of the hidden `driverlab vm jail-break`.
#[derive(Args)]
pub struct JailBreakArgs {
    /// A Unix socket to try to connect to (the daemon's).
    #[arg(long)]
    pub socket: PathBuf,
    /// A process to try to ptrace and to signal (another VMM).
    #[arg(long)]
    pub pid: i32,
    /// A TCP port on 127.0.0.1 to try to connect to.
    #[arg(long)]
    pub port: u16,
    /// Guest memory the jail is sized for, MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u64,
}

/// Threads tried for the fork bomb: far past the jail's limit.
const FORK_BOMB: usize = 500;

#[derive(Serialize)]
struct Attempt {
    attempt: &'static str,
    blocked: bool,
    outcome: String,
}

fn attempt(name: &'static str, result: std::io::Result<()>) -> Attempt {
    match result {
        Ok(()) => Attempt { attempt: name, blocked: false, outcome: "succeeded".into() },
        Err(e) => Attempt { attempt: name, blocked: true, outcome: e.to_string() },
    }
}

fn check(result: libc::c_long) -> std::io::Result<()> {
    if result < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Runs the attempts; prints `{"confinement":...,"attempts":[...]}`.
pub fn run(args: &JailBreakArgs) -> u8 {
    let mut confinement = jail::Confinement { jailed: true, ..jail::Confinement::default() };
    let spec = jail::JailSpec::new("vm", args.memory_mib << 20, 1, 1);
    let namespaces = jail::enter_namespaces(&mut confinement, &[], jail::Signals::EndBoth, &spec);
    jail::confine(&spec, &namespaces, &mut confinement);
    let pid = args.pid;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace with integer arguments and null pointers it does not follow for ATTACH.
    let ptraced = check(unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, null, null) });
    // SAFETY: kill with integer arguments; signal 0 only checks that a signal could be sent.
    let signalled = check(unsafe { libc::kill(pid, 0) } as libc::c_long);
    let mut attempts = vec![
        attempt("read /etc/shadow", std::fs::read("/etc/shadow").map(drop)),
        attempt("read /proc/1/environ", std::fs::read("/proc/1/environ").map(drop)),
        attempt("write under /", std::fs::write("/escaped", b"out")),
        attempt("connect to the daemon's socket", std::os::unix::net::UnixStream::connect(&args.socket).map(drop)),
        attempt("ptrace another VMM", ptraced),
        attempt("signal another VMM", signalled),
        attempt("connect to the network", std::net::TcpStream::connect(("127.0.0.1", args.port)).map(drop)),
    ];
    let mut started = 0;
    let bomb = loop {
        if started == FORK_BOMB {
            break Ok(());
        }
        match std::thread::Builder::new().stack_size(64 << 10).spawn(std::thread::park) {
            Ok(_) => started += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EAGAIN) => {
                break Err(std::io::Error::other(format!("stopped after {started} threads: {e}")));
            }
            Err(e) => break Err(e),
        }
    };
    attempts.push(attempt("fork past the pids limit", bomb));
    let report = serde_json::json!({ "confinement": confinement, "attempts": attempts });
    println!("{report}");
    0
}
