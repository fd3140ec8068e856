//! `driverlab serve` and `driverlab api`: the lab daemon's HTTP API and a client for it.

use std::path::PathBuf;

use anyhow::Context;
use api::client::Client;
use api::daemon::{Config, Daemon};
use api::server;
use clap::Args;

/// Options of `driverlab serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Unix socket to serve on, created 0600 [default: $XDG_RUNTIME_DIR/driverlab.sock, else /tmp/driverlab-UID.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Also serve on TCP at ADDR (e.g. 127.0.0.1:8700); needs --token-file.
    #[arg(long, value_name = "ADDR", requires = "token_file")]
    pub listen: Option<String>,
    /// The bearer token TCP clients must send, the file's first line (16 characters or more).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The results database [default: $DRIVERLAB_DB, else ~/.local/share/driverlab/lab.db].
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Keep the newest N ended runs: older ones, with their results and artifacts, are deleted
    /// at start and whenever a run ends (runs queued or running are never touched) [default:
    /// keep every run].
    #[arg(long, value_name = "N")]
    pub keep_runs: Option<usize>,
    /// Print the OpenAPI document (docs/openapi.json) and exit.
    #[arg(long)]
    pub openapi: bool,
    /// The first uid of the range jailed VMMs and models run as: each gets BASE plus its PID
    /// (docs/vmm.md, "The jail") [default: 100000000].
    #[arg(long, value_name = "BASE", env = jail::UID_BASE_ENV, value_parser = jail::parse_uid_base)]
    pub jail_uid_base: Option<u32>,
    /// The cgroup, relative to the daemon's own, under which each jailed VMM and model gets its
    /// cgroup [default: driverlab].
    #[arg(long, value_name = "PATH", env = jail::CGROUP_PARENT_ENV, value_parser = jail::parse_cgroup_parent)]
    pub jail_cgroup_parent: Option<String>,
}

/// Options of `driverlab api`.
#[derive(Args)]
pub struct ApiArgs {
    /// HTTP method.
    #[arg(value_name = "METHOD", value_parser = ["GET", "POST", "PUT", "DELETE", "get", "post", "put", "delete"])]
    pub method: String,
    /// Path, e.g. /v1/host.
    #[arg(value_name = "PATH")]
    pub path: String,
    /// JSON request body.
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// The server's socket [default: as for `serve`].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
    tracing::info!("shutting down");
}

/// Raises the soft limit of open files to the hard one.
fn raise_open_files() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Runs the daemon until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<u8> {
    if args.openapi {
        println!("{}", server::openapi_json());
        return Ok(0);
    }
    // The VMMs and models the daemon starts read the jail's settings from their environment.
    // SAFETY: the process has one thread here (the runtime is built below), so nothing reads
    // the environment while it changes.
    unsafe {
        if let Some(base) = args.jail_uid_base {
            std::env::set_var(jail::UID_BASE_ENV, base.to_string());
        }
        if let Some(parent) = &args.jail_cgroup_parent {
            std::env::set_var(jail::CGROUP_PARENT_ENV, parent);
        }
    }
    let socket = args.socket.unwrap_or_else(server::default_socket);
    // Connections are bounded by the daemon's own caps, well below the hard limit of open files.
    raise_open_files();
    // What lab and daemon processes killed with -9 left in the temporary directory.
    for dir in engines::runtime_dirs::remove_stale() {
        tracing::info!("removed {}, left by a process that is gone", dir.display());
    }
    let vm_dir = api::vm_table::default_dir();
    std::fs::create_dir_all(&vm_dir).with_context(|| format!("creating {}", vm_dir.display()))?;
    std::fs::set_permissions(&vm_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("making {} private", vm_dir.display()))?;
    let config = Config {
        db: args.db.unwrap_or_else(lab::results_db::default_path),
        vm_dir: vm_dir.clone(),
        keep_runs: args.keep_runs,
    };
    let env = super::lab_env()?;
    // The database opens (and migrates) before the daemon answers anything.
    lab::results_db::ResultsDb::open(&config.db)?;
    if let Some(keep) = config.keep_runs {
        api::run_queue::prune(&config.db, keep);
    }
    let token = match &args.token_file {
        Some(file) => Some(api::auth::read_token(file).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let runtime = runtime()?;
    let result = runtime.block_on(async {
        let tcp = match (&args.listen, token) {
            (Some(addr), Some(token)) => {
                let listener =
                    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
                eprintln!("driverlab API on tcp://{} (bearer token)", listener.local_addr()?);
                Some((listener, token))
            }
            (None, Some(_)) => anyhow::bail!("--token-file is for --listen"),
            _ => None,
        };
        eprintln!("driverlab API on {}", socket.display());
        let daemon = Daemon::new(config, env);
        let requeued = daemon.runs.requeue_orphans();
        if !requeued.is_empty() {
            eprintln!(
                "driverlab: queued again {} run(s) an earlier daemon queued and never started: {}",
                requeued.len(),
                requeued.join(" ")
            );
        }
        server::serve(daemon, &socket, tcp, shutdown_signal()).await?;
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&vm_dir);
    result.map(|()| 0)
}

/// Sends one request and prints the response body; exit code 1 for HTTP errors.
pub fn request(args: ApiArgs) -> anyhow::Result<u8> {
    let socket = args.socket.unwrap_or_else(server::default_socket);
    let client = Client::new(&socket);
    let method = args.method.to_uppercase();
    let (status, body) = runtime()?
        .block_on(client.request(&method, &args.path, args.data.map(String::into_bytes)))
        .with_context(|| format!("is `driverlab serve --socket {}` running?", socket.display()))?;
    println!("{}", String::from_utf8_lossy(&body));
    Ok(u8::from(status >= 400))
}
