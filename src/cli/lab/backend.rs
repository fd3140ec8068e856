//! Where a `lab` command's work happens: in this process on a results database (`Local`), or
//! through a daemon (`Remote`). Both give the same types back, so that each command prints its
//! output once, whichever ran it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use api::client::Client;
use api::types::RunEvent;
use guest_images::initramfs_build::InitramfsRequest;
use guest_images::module_build::ModuleRequest;
use lab::env::LabEnv;
use lab::images::RunPlan;
use lab::matrix::Plan;
use lab::recipe::{RecipeBuilder, RecipeError};
use lab::record::Record;
use lab::results_db::ResultsDb;
use lab::run::{self, RunError, RunStatus};

use super::daemon::{coded as client_coded, runtime};
use super::output::{Console, repetition_line};
use super::{DbArgs, Format};
use crate::cli::CodedError;

/// How a run that was followed to its end ended.
pub enum Finished {
    /// It ended (done, or cancelled): its status.
    Ended(Box<RunStatus>),
    /// Its daemon went away before it ended.
    Interrupted {
        /// The run.
        run: String,
        /// Why the CLI stopped following it.
        why: String,
    },
}

/// A run and its records, for `lab show`.
pub struct Shown {
    /// Its status.
    pub status: RunStatus,
    /// Its records.
    pub records: Vec<Record>,
    /// Its artifacts folder, when it is on this host.
    pub artifacts: Option<PathBuf>,
}

/// Where the work happens.
pub enum Backend {
    /// In this process, on the results database at this path.
    Local(PathBuf),
    /// Through the daemon this client talks to.
    Remote(Client),
}

/// Ctrl-C: finish the repetitions running, record the rest as MISS, mark the run cancelled.
pub(super) static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

pub(super) fn catch_interrupt() {
    // SAFETY: installing a handler that only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t) };
}

/// How `lab run` runs its matrix.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Cells this host cannot run are SKIP rather than refused.
    pub skip_unrunnable: bool,
    /// The image recipes are built on this host (for a daemon that reads its image store).
    pub build_here: bool,
    /// A prefix check of every prefix of the series first ([`lab::matrix::series::every_prefix`]).
    pub every_prefix: bool,
    /// The box's shard of a fleet run, when the run is one.
    pub share: Option<lab::fleet::FleetShard>,
}

/// A run's error as the CLI's: 2 for the user's mistakes, 1 otherwise.
pub fn coded(e: RunError) -> anyhow::Error {
    let code = if e.is_bad_input() { 2 } else { 1 };
    CodedError { message: e.to_string(), code }.into()
}

impl Backend {
    /// The daemon `daemon` names when one answers there, else this process on `db`.
    pub fn of(daemon: &super::daemon::DaemonArgs, db: &DbArgs) -> anyhow::Result<Backend> {
        Ok(match daemon.client()? {
            Some(client) => Backend::Remote(client),
            None => Backend::Local(db.path()),
        })
    }

    fn db(path: &Path) -> anyhow::Result<ResultsDb> {
        Ok(ResultsDb::open(path)?)
    }

    /// Runs the matrix at `matrix` to its end, printing `run ID started` first and a line per
    /// repetition on stderr, as `options` ask.
    pub fn run(&self, matrix: &Path, options: &RunOptions) -> anyhow::Result<Finished> {
        let refused = |message: String| CodedError { message, code: 2 };
        let text = std::fs::read_to_string(matrix).map_err(|e| refused(format!("{}: {e}", matrix.display())))?;
        let text = if options.every_prefix { lab::matrix::series::every_prefix(&text).map_err(refused)? } else { text };
        let skip_unrunnable = options.skip_unrunnable;
        match self {
            Backend::Local(db) => {
                // The run keeps its series' texts: a resumed run has the prefixes it started with.
                let text = lab::recipe::inline_series(matrix, &text).map_err(|e| refused(e.to_string()))?;
                let plan =
                    Plan::parse(matrix, &text).map_err(|e| refused(e.to_string()))?.with_share(options.share.clone());
                let env = crate::cli::lab_env()?;
                let mut store = Backend::db(db)?;
                // Images the lab builds (recipes) come first: the first time, a download and a build.
                let (run, plan) =
                    run::create(&mut store, &env, plan, skip_unrunnable, &|line| eprintln!("{line}")).map_err(coded)?;
                println!("run {run} started");
                execute(store, &env, &plan, &run)
            }
            Backend::Remote(client) => {
                // The daemon builds the recipes (or, with `build_here`, this host does, into the
                // store the daemon reads); it is sent the patches' texts, never their paths.
                let text = if options.build_here {
                    let images = guest_images::store::ImageStore::new(guest_images::store::default_root());
                    lab::recipe::pin_recipes(matrix, &text, &images, &|line| eprintln!("built here: {line}"))
                        .map_err(|e| CodedError { message: e.to_string(), code: 1 })?
                } else {
                    lab::recipe::inline_patches(matrix, &text).map_err(|e| refused(e.to_string()))?
                };
                let runtime = runtime()?;
                let run = runtime
                    .block_on(client.submit_run(text.into_bytes(), skip_unrunnable, options.share.as_ref()))
                    .map_err(client_coded)?;
                println!("run {run} started");
                runtime.block_on(follow(client, &run, &|_, _| ()))
            }
        }
    }

    /// The matrix at `matrix` with its image recipes built (in this host's image store, or by
    /// the daemon) and named by their image IDs: `lab pin`. Progress on stderr.
    pub fn pin(&self, matrix: &Path) -> anyhow::Result<String> {
        let text = std::fs::read_to_string(matrix)
            .map_err(|e| CodedError { message: format!("{}: {e}", matrix.display()), code: 2 })?;
        let note = |line: &str| eprintln!("{line}");
        let pinned = match self {
            Backend::Local(_) => {
                let images = crate::cli::lab_env()?.images;
                lab::recipe::pin_recipes(matrix, &text, &images, &note)
            }
            Backend::Remote(client) => {
                let runtime = runtime()?;
                eprintln!("building the recipes on the daemon (the first time, a download and builds: minutes)");
                lab::recipe::pin_recipes(matrix, &text, &DaemonBuilder { client, runtime: &runtime }, &note)
            }
        };
        pinned.map_err(|e| {
            let code = if matches!(e, RecipeError::Refused(_)) { 2 } else { 1 };
            CodedError { message: e.to_string(), code }.into()
        })
    }

    /// Runs what `run` has left to run, printing `run ID resumed` first.
    pub fn resume(&self, run: &str) -> anyhow::Result<Finished> {
        match self {
            Backend::Local(db) => {
                let env = crate::cli::lab_env()?;
                let mut store = Backend::db(db)?;
                let plan = run::resumable(&store, &env, run, &|line| eprintln!("{line}")).map_err(coded)?;
                run::claim(&mut store, run, &plan).map_err(coded)?;
                println!("run {run} resumed");
                execute(store, &env, &plan, run)
            }
            Backend::Remote(client) => {
                let runtime = runtime()?;
                runtime.block_on(client.resume_run(run)).map_err(client_coded)?;
                println!("run {run} resumed");
                runtime.block_on(follow(client, run, &|_, _| ()))
            }
        }
    }

    /// Every run, newest first.
    pub fn list(&self) -> anyhow::Result<Vec<RunStatus>> {
        match self {
            Backend::Local(db) => {
                let store = Backend::db(db)?;
                let runs = store.runs()?;
                Ok(runs.iter().map(|r| run::status(&store, &r.id)).collect::<Result<_, _>>()?)
            }
            Backend::Remote(client) => runtime()?.block_on(client.runs()).map_err(client_coded),
        }
    }

    /// A run and its records.
    pub fn show(&self, run: &str) -> anyhow::Result<Shown> {
        match self {
            Backend::Local(db) => {
                let store = Backend::db(db)?;
                let status = run::status(&store, run)?;
                let records = store.records(run)?;
                Ok(Shown { status, records, artifacts: Some(store.artifacts(run)) })
            }
            Backend::Remote(client) => {
                let runtime = runtime()?;
                let status = runtime.block_on(client.run_status(run)).map_err(client_coded)?;
                let records = runtime.block_on(client.records(run)).map_err(client_coded)?;
                Ok(Shown { status, records, artifacts: None })
            }
        }
    }

    /// A run's report in `format`, judged against `baseline` (the matrix's own when none).
    pub fn report(&self, run: &str, baseline: Option<&str>, format: Format) -> anyhow::Result<String> {
        match self {
            Backend::Local(db) => {
                let store = Backend::db(db)?;
                let report = run::report(&store, run, baseline).map_err(coded)?;
                super::render(&report, format)
            }
            Backend::Remote(client) => {
                runtime()?.block_on(client.report(run, baseline, format.media_type())).map_err(client_coded)
            }
        }
    }

    /// Fleet run `fleet`'s report in `format`, judged against `baseline` (the matrix's own when
    /// none).
    pub fn fleet_report(
        &self,
        fleet: &lab::fleet::FleetId,
        baseline: Option<&str>,
        format: Format,
    ) -> anyhow::Result<String> {
        match self {
            Backend::Local(db) => {
                let store = Backend::db(db)?;
                let report = lab::fleet::fleet_report(&store, fleet, baseline).map_err(|e| {
                    let code = if e.is_bad_input() { 2 } else { 1 };
                    anyhow::Error::from(CodedError { message: e.to_string(), code })
                })?;
                super::render(&report, format)
            }
            Backend::Remote(client) => runtime()?
                .block_on(client.fleet_report(fleet.as_str(), baseline, format.media_type()))
                .map_err(client_coded),
        }
    }
}

/// Executes `run` in this process (Ctrl-C cancels it), progress on stderr.
fn execute(store: ResultsDb, env: &LabEnv, plan: &RunPlan, run: &str) -> anyhow::Result<Finished> {
    let done = store.done(run)?.len();
    let total = plan.plan.results();
    let store = Arc::new(Mutex::new(store));
    let console = Console::new(total, done);
    catch_interrupt();
    run::execute(store.clone(), env, plan, run, &console, &CANCEL).map_err(coded)?;
    console.finish();
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Finished::Ended(Box::new(run::status(&store, run)?)))
}

/// Follows a daemon's run to its end (Ctrl-C cancels it), a line per repetition on stderr, and
/// a bisection's steps to `on_step`.
pub(super) async fn follow(
    client: &Client,
    run: &str,
    on_step: &(dyn Fn(&lab::matrix::SeriesStep, &lab::bisect::Step) + Sync),
) -> anyhow::Result<Finished> {
    let canceller = client.clone();
    let cancelled = run.to_string();
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("cancelling: the repetitions running finish, the rest are MISS");
            let _ = canceller.cancel_run(&cancelled).await;
        }
    });
    let console = Console::plain();
    let mut last: Option<RunStatus> = None;
    let followed = client
        .run_events(run, |event| match event {
            RunEvent::Recorded { cell, label, repetition, status, reason, gbit_s, maps_per_packet, done, total } => {
                let reason = (!reason.is_empty()).then_some(reason.as_str());
                let line = repetition_line(
                    (done, total),
                    (&cell, &label, repetition),
                    status,
                    reason,
                    (gbit_s, maps_per_packet),
                );
                console.repetition(&line, done, &format!("{cell} {status}"));
                true
            }
            RunEvent::Note { line } => {
                console.line(&line);
                true
            }
            RunEvent::Step { at, step } => {
                on_step(&at, &step);
                true
            }
            RunEvent::State { status } => {
                let ended = status.state.ended();
                last = Some(status);
                !ended
            }
        })
        .await;
    ctrl_c.abort();
    console.finish();
    match followed {
        Err(api::client::ClientError::Transport(e)) => {
            return Ok(Finished::Interrupted { run: run.to_string(), why: e.to_string() });
        }
        Err(e) => return Err(client_coded(e)),
        Ok(()) => {}
    }
    Ok(match last.filter(|s| s.state.ended()) {
        Some(status) => Finished::Ended(Box::new(status)),
        None => Finished::Interrupted {
            run: run.to_string(),
            why: "the daemon closed the run's event stream before the run ended".into(),
        },
    })
}

/// A daemon builds a matrix's recipes through its image endpoints.
struct DaemonBuilder<'a> {
    client: &'a Client,
    runtime: &'a tokio::runtime::Runtime,
}

impl RecipeBuilder for DaemonBuilder<'_> {
    fn kernel(&self, package: Option<&str>) -> Result<String, RecipeError> {
        let request = api::types::BuildKernel { package: package.map(String::from) };
        self.runtime.block_on(self.client.build_kernel(&request)).map(|i| i.id).map_err(recipe_error)
    }

    fn module(&self, request: &ModuleRequest) -> Result<String, RecipeError> {
        let request = api::types::BuildModule {
            kernel: request.kernel.clone(),
            driver: Some(request.driver.clone()),
            patches: request.patches.iter().map(|p| p.text.clone()).collect(),
            only: request.only.clone(),
        };
        self.runtime.block_on(self.client.build_module(&request)).map(|i| i.id).map_err(recipe_error)
    }

    fn initramfs(&self, request: &InitramfsRequest) -> Result<String, RecipeError> {
        let request = api::types::BuildInitramfs {
            kernel: request.kernel.clone(),
            modules: request.modules.clone(),
            drivers: request.drivers.clone(),
            tools: request.tools.iter().map(|t| t.program().to_string()).collect(),
        };
        self.runtime.block_on(self.client.build_initramfs(&request)).map(|i| i.id).map_err(recipe_error)
    }
}

/// A daemon's refusal of the build's inputs (404, 422) as the recipe's; anything else failed.
fn recipe_error(e: api::client::ClientError) -> RecipeError {
    match e {
        api::client::ClientError::Refused { status: 404 | 422, .. } => RecipeError::Refused(e.to_string()),
        e => RecipeError::Failed(e.to_string()),
    }
}
