//! Runs over HTTP: submitted matrices wait in a queue and run one at a time (measurements on one
//! box should not disturb each other), on one worker thread that outlives every VMM it starts.
//! Each live run has a broadcast channel its event streams subscribe to.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use lab::env::LabEnv;
use lab::images::RunPlan;
use lab::record::Record;
use lab::scheduler::Progress;
use lab::store::{RunState, Store};
use tokio::sync::broadcast;

use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::types::{Created, RunEvent, RunPhase, RunStatus};

/// Most runs that may wait at once.
pub const MAX_QUEUED: usize = 16;
/// Most results the runs queued and running may have together.
pub const MAX_QUEUED_RESULTS: usize = 200_000;

/// Runs waiting and running.
pub struct RunQueue {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    db: PathBuf,
    env: Arc<LabEnv>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<String>,
    live: HashMap<String, Live>,
    /// Places taken by requests that are creating or claiming their run.
    reserved: usize,
}

/// A place in the queue, taken before a run is created or claimed, so that a run exists only
/// once it is sure to be queued; given back when dropped unused.
struct Reservation<'a> {
    shared: &'a Shared,
    used: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.used {
            lock(&self.shared.queue).reserved -= 1;
        }
    }
}

struct Live {
    plan: RunPlan,
    running: bool,
    cancel: Arc<AtomicBool>,
    events: broadcast::Sender<RunEvent>,
    started: Option<Instant>,
    recorded_here: usize,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RunQueue {
    /// The queue, with its worker thread.
    pub fn start(db: PathBuf, env: Arc<LabEnv>) -> RunQueue {
        let shared = Arc::new(Shared { queue: Mutex::default(), wake: Condvar::new(), db, env });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("run-worker".into())
            .spawn(move || worker.work())
            .expect("the run worker thread starts");
        RunQueue { shared }
    }

    /// A place in the queue, or 429 when it is full.
    fn reserve(&self) -> Result<Reservation<'_>, Problem> {
        let mut queue = lock(&self.shared.queue);
        if queue.waiting.len() + queue.reserved >= MAX_QUEUED {
            return Err(Problem::busy(format!("{MAX_QUEUED} runs are waiting already; try again when one has run")));
        }
        queue.reserved += 1;
        Ok(Reservation { shared: &self.shared, used: false })
    }

    /// Queues `run` (created, or claimed for a resume) to execute `plan`, in the place
    /// `reservation` holds; 409 if the run is live already (two resumes at once).
    fn enqueue(&self, mut reservation: Reservation<'_>, run: &str, plan: RunPlan) -> Result<(), Problem> {
        let mut queue = lock(&self.shared.queue);
        if queue.live.contains_key(run) {
            return Err(Problem::conflict(format!("run {run} is queued or running here already")));
        }
        let results = |plan: &RunPlan| plan.plan.cells.len() * plan.plan.matrix.repetitions as usize;
        let queued: usize = queue.live.values().map(|l| results(&l.plan)).sum();
        if queued + results(&plan) > MAX_QUEUED_RESULTS {
            return Err(Problem::busy(format!(
                "{queued} results are queued or running and this run has {}; the daemon takes {MAX_QUEUED_RESULTS} at once",
                results(&plan)
            )));
        }
        reservation.used = true;
        queue.reserved -= 1;
        let (events, _) = broadcast::channel(256);
        let live = Live {
            plan,
            running: false,
            cancel: Arc::new(AtomicBool::new(false)),
            events,
            started: None,
            recorded_here: 0,
        };
        queue.live.insert(run.to_string(), live);
        queue.waiting.push_back(run.to_string());
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Cancels a live run: a running one stops after its running repetitions, a waiting one
    /// leaves the queue and its repetitions are MISS. False if it is not live.
    fn cancel(&self, run: &str) -> bool {
        let mut queue = lock(&self.shared.queue);
        let Some(live) = queue.live.get_mut(run) else { return false };
        live.cancel.store(true, Ordering::SeqCst);
        if !live.running {
            // Out of the queue, and finished at once on a thread of its own: nothing runs.
            // Marked running first, so that a second cancel meanwhile starts nothing.
            live.running = true;
            queue.waiting.retain(|r| r != run);
            drop(queue);
            let shared = self.shared.clone();
            let run = run.to_string();
            std::thread::spawn(move || shared.execute(&run));
        }
        true
    }

    /// The live part of a run's status: whether it is queued, and its ETA.
    fn live_state(&self, run: &str, results: usize, total: usize) -> Option<(RunPhase, Option<f64>)> {
        let queue = lock(&self.shared.queue);
        let live = queue.live.get(run)?;
        if !live.running {
            return Some((RunPhase::Queued, None));
        }
        let eta = live.started.filter(|_| live.recorded_here > 0).map(|started| {
            started.elapsed().as_secs_f64() / live.recorded_here as f64 * total.saturating_sub(results) as f64
        });
        Some((RunPhase::Running, eta))
    }

    /// A receiver of the run's events, if it is live.
    fn subscribe(&self, run: &str) -> Option<broadcast::Receiver<RunEvent>> {
        lock(&self.shared.queue).live.get(run).map(|l| l.events.subscribe())
    }
}

impl Shared {
    fn work(self: Arc<Shared>) {
        loop {
            let run = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(run) = queue.waiting.pop_front() {
                        break run;
                    }
                    queue = self.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.execute(&run);
        }
    }

    /// Executes a live run to its end, then retires it.
    fn execute(self: &Arc<Shared>, run: &str) {
        let (plan, cancel) = {
            let mut queue = lock(&self.queue);
            let Some(live) = queue.live.get_mut(run) else { return };
            live.running = true;
            live.started = Some(Instant::now());
            (live.plan.clone(), live.cancel.clone())
        };
        let progress = Events { shared: self.clone(), run: run.to_string() };
        let outcome = Store::open(&self.db).map_err(lab::run::RunError::from).and_then(|store| {
            let store = Arc::new(Mutex::new(store));
            lab::run::execute(store, &self.env, &plan, run, &progress, &cancel)
        });
        if let Err(e) = outcome {
            tracing::error!("run {run}: {e}");
            progress.note(&format!("the run stopped: {e}"));
            // Resumable, rather than read as running while the daemon lives.
            if let Ok(store) = Store::open(&self.db) {
                let _ = store.finish_run(run, RunState::Interrupted);
            }
        }
        let live = lock(&self.queue).live.remove(run);
        if let (Some(live), Ok(status)) = (live, status_from_db(&self.db, run)) {
            let _ = live.events.send(RunEvent::State { status });
        }
    }

    fn send(&self, run: &str, event: RunEvent, recorded: bool) {
        let mut queue = lock(&self.queue);
        if let Some(live) = queue.live.get_mut(run) {
            live.recorded_here += usize::from(recorded);
            let _ = live.events.send(event);
        }
    }
}

/// A run's progress as events.
struct Events {
    shared: Arc<Shared>,
    run: String,
}

impl Progress for Events {
    fn recorded(&self, record: &Record, done: usize, total: usize) {
        let event = RunEvent::Recorded {
            cell: record.cell.id.clone(),
            label: record.cell.label(),
            repetition: record.repetition,
            status: record.status,
            reason: record.reason.clone().unwrap_or_default(),
            gbit_s: record.workload.gbit_s,
            maps_per_packet: record.shown_maps(),
            done,
            total,
        };
        self.shared.send(&self.run, event, true);
    }

    fn note(&self, line: &str) {
        self.shared.send(&self.run, RunEvent::Note { line: line.into() }, false);
    }
}

/// A run's status from the database alone.
fn status_from_db(db: &std::path::Path, run: &str) -> Result<RunStatus, Problem> {
    let store = Store::open(db)?;
    let info = store.run(run)?;
    // Counted by the database, per cell and status: the cost of a status is the run's cells,
    // not its stored records.
    let counted = store.result_counts(run)?;
    let per_cell = &counted.per_cell;
    let repetitions = info.repetitions as usize;
    let counts = counted.by_status.clone();
    Ok(RunStatus {
        id: info.id.clone(),
        matrix: info.matrix.clone(),
        matrix_file: info.matrix_file.clone(),
        repetitions: info.repetitions,
        host: info.host.clone(),
        state: info.state.into(),
        cells_done: per_cell.values().filter(|&&n| n >= repetitions).count(),
        cells_total: info.cells_total,
        results: counted.total(),
        results_total: info.cells_total * repetitions,
        eta_s: None,
        counts,
        created_at: info.created_at.clone(),
        finished_at: info.finished_at.clone(),
    })
}

/// A run's status, live state included.
fn status(daemon: &Daemon, run: &str) -> Result<RunStatus, Problem> {
    let mut status = status_from_db(&daemon.config.db, run)?;
    if let Some((state, eta)) = daemon.runs.live_state(run, status.results, status.results_total) {
        status.state = state;
        status.eta_s = eta;
    }
    Ok(status)
}

/// The query's `key=value` pairs.
pub fn query(raw: Option<String>) -> Vec<(String, String)> {
    raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// A query flag: absent, `true` or `false`.
fn flag(pairs: &[(String, String)], name: &str) -> Result<bool, Problem> {
    match pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Problem::bad_request(format!("{name}={other:?}: give true or false"))),
    }
}

/// A matrix's mistake as an answer: 400 for one that does not parse (TOML or JSON syntax, an
/// unknown or mistyped field), 422 for one that parses and does not check out.
fn matrix_problem(e: lab::matrix::MatrixError) -> Problem {
    match e.kind {
        lab::matrix::MatrixErrorKind::Syntax => Problem::bad_request(e.to_string()),
        lab::matrix::MatrixErrorKind::Unreadable | lab::matrix::MatrixErrorKind::Invalid => {
            Problem::unprocessable(e.to_string())
        }
    }
}

/// The matrix in a request body: TOML (`application/toml`, `text/toml`, `text/plain`) or JSON.
fn matrix_request(payload: &Payload) -> Result<lab::request::Request, Problem> {
    let refuse = matrix_problem;
    match payload.content_type.as_str() {
        "application/toml" | "text/toml" | "text/plain" => {
            let text =
                std::str::from_utf8(&payload.bytes).map_err(|_| Problem::bad_request("a TOML matrix is UTF-8 text"))?;
            lab::request::from_toml(text).map_err(refuse)
        }
        "application/json" | "" => {
            let value: serde_json::Value = payload.json()?;
            lab::request::from_json(value).map_err(refuse)
        }
        other => Err(Problem::unsupported_media_type(format!(
            "a {other:?} body; a matrix is application/toml or application/json"
        ))),
    }
}

/// `POST /v1/runs`: checks a matrix and queues its run.
#[utoipa::path(post, path = "/v1/runs", tag = "runs",
    params(("skip_unrunnable" = Option<bool>, Query, description = "record cells this host cannot run as SKIP instead of refusing the matrix")),
    request_body(content((String = "application/toml"), (Object = "application/json")),
        description = "A matrix (docs/lab.md): images are `probe` or image IDs, devices a model on its generator or a registered device by name alone"),
    responses(
        (status = 201, description = "The run, queued", body = Created),
        (status = 400, description = "A malformed body or query", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Neither TOML nor JSON", body = crate::types::ErrorBody),
        (status = 422, description = "The matrix does not check out, or names cells this host cannot run", body = crate::types::ErrorBody),
        (status = 429, description = "The queue is full", body = crate::types::ErrorBody),
    ))]
pub async fn submit(State(daemon): State<Arc<Daemon>>, RawQuery(raw): RawQuery, payload: Payload) -> Response {
    let result = async {
        let skip_unrunnable = flag(&query(raw), "skip_unrunnable")?;
        let request = matrix_request(&payload)?;
        let daemon = daemon.clone();
        blocking(move || {
            // The place first: a run that could not be queued is never created.
            let place = daemon.runs.reserve()?;
            let mut store = daemon.store()?;
            let registered = |name: &str| store.device(name).ok().flatten();
            let plan = lab::request::plan(request, &registered).map_err(matrix_problem)?;
            let note = |line: &str| tracing::info!("{line}");
            let (run, plan) = lab::run::create(&mut store, &daemon.env, plan, skip_unrunnable, &note)?;
            daemon.runs.enqueue(place, &run, plan)?;
            Ok(run)
        })
        .await
    }
    .await;
    match result {
        Ok(id) => {
            let location = format!("/v1/runs/{id}");
            (StatusCode::CREATED, [(header::LOCATION, location)], Json(Created { id })).into_response()
        }
        Err(problem) => problem.into_response(),
    }
}

/// `GET /v1/runs`: every run, newest first.
#[utoipa::path(get, path = "/v1/runs", tag = "runs",
    responses((status = 200, description = "Every run, newest first", body = Vec<RunStatus>)))]
pub async fn list(State(daemon): State<Arc<Daemon>>) -> Result<Json<Vec<RunStatus>>, Problem> {
    blocking(move || {
        let runs = daemon.store()?.runs()?;
        runs.iter().map(|r| status(&daemon, &r.id)).collect::<Result<Vec<_>, _>>().map(Json)
    })
    .await
}

/// `GET /v1/runs/{id}`.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run")),
    responses(
        (status = 200, description = "The run's state and progress", body = RunStatus),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
    ))]
pub async fn show(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Result<Json<RunStatus>, Problem> {
    blocking(move || status(&daemon, &id).map(Json)).await
}

/// `POST /v1/runs/{id}/cancel`.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run")),
    responses(
        (status = 202, description = "Cancelling: running repetitions finish, the rest are MISS", body = RunStatus),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
        (status = 409, description = "The run is not queued or running here", body = crate::types::ErrorBody),
    ))]
pub async fn cancel(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let result = blocking(move || {
        let status = status(&daemon, &id)?;
        if !daemon.runs.cancel(&id) {
            return Err(Problem::conflict(format!("run {id} is {}, not queued or running here", status.state)));
        }
        Ok(status)
    })
    .await;
    match result {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `POST /v1/runs/{id}/resume`.
#[utoipa::path(post, path = "/v1/runs/{id}/resume", tag = "runs",
    params(("id" = String, Path, description = "The run")),
    responses(
        (status = 202, description = "Queued again: the repetitions without a result will run", body = RunStatus),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
        (status = 409, description = "The run is done, or still running", body = crate::types::ErrorBody),
        (status = 429, description = "The queue is full", body = crate::types::ErrorBody),
    ))]
pub async fn resume(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let result = blocking(move || {
        let mut store = daemon.store()?;
        store.run(&id)?;
        if daemon.runs.live_state(&id, 0, 0).is_some() {
            return Err(Problem::conflict(format!("run {id} is queued or running here already")));
        }
        let place = daemon.runs.reserve()?;
        let plan = lab::run::resumable(&store, &daemon.env, &id, &|line| tracing::info!("{line}"))?;
        store.claim_run(&id)?;
        daemon.runs.enqueue(place, &id, plan)?;
        status(&daemon, &id)
    })
    .await;
    match result {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `GET /v1/runs/{id}/events`: server-sent events, one JSON [`RunEvent`] each; the first and
/// the last are the run's state. A run that is not live gets its state and the stream ends.
#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = "The run")),
    responses(
        (status = 200, description = "An event stream: `data:` lines of RunEvent JSON", content_type = "text/event-stream", body = RunEvent),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
        (status = 429, description = "As many streams are open as the daemon takes", body = crate::types::ErrorBody),
    ))]
pub async fn events(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Response {
    let slot = match daemon.open_stream() {
        Ok(slot) => slot,
        Err(p) => return p.into_response(),
    };
    let subscribed = {
        let daemon = daemon.clone();
        let id = id.clone();
        blocking(move || {
            // Subscribe first, then read the state: no event falls between the two.
            let receiver = daemon.runs.subscribe(&id);
            status(&daemon, &id).map(|s| (s, receiver))
        })
        .await
    };
    let (first, receiver) = match subscribed {
        Ok(x) => x,
        Err(p) => return p.into_response(),
    };
    let data = |event: &RunEvent| Event::default().data(serde_json::to_string(event).expect("events serialize"));
    let first = data(&RunEvent::State { status: first });
    let stream =
        futures_util::stream::unfold((Some(first), receiver, false), move |(first, mut receiver, ended)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, std::convert::Infallible>(first), (None, receiver, false)));
            }
            if ended {
                return None;
            }
            let rx = receiver.as_mut()?;
            loop {
                match rx.recv().await {
                    Ok(event) => {
                        let last = matches!(event, RunEvent::State { .. });
                        return Some((Ok(data(&event)), (None, receiver, last)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
    // The slot goes when the stream does.
    let stream = futures_util::StreamExt::map(stream, move |event| {
        let _open = &slot;
        event
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// What `Accept` asks for, of the report's formats.
fn report_format(headers: &HeaderMap) -> Result<&'static str, Problem> {
    const FORMATS: [&str; 5] = ["application/json", "text/markdown", "text/csv", "image/svg+xml", "text/html"];
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    for wanted in accept.split(',').map(|p| p.split(';').next().unwrap_or_default().trim()) {
        if let Some(format) = FORMATS.iter().find(|f| **f == wanted) {
            return Ok(format);
        }
        if wanted == "*/*" || wanted == "application/*" {
            return Ok("application/json");
        }
        if wanted == "text/*" {
            return Ok("text/markdown");
        }
    }
    Err(Problem::not_acceptable(format!("the report is {}", FORMATS.join(", "))))
}

/// `GET /v1/runs/{id}/report`: the lab's report, as `Accept` asks: JSON (the contract of
/// `docs/lab.md`), markdown, CSV, an SVG chart, or an HTML page with the table and the chart.
#[utoipa::path(get, path = "/v1/runs/{id}/report", tag = "runs",
    params(("id" = String, Path, description = "The run"),
        ("baseline" = Option<String>, Query, description = "judge against this variant instead of the matrix's baseline")),
    responses(
        (status = 200, description = "The report", content(
            (Object = "application/json"), (String = "text/markdown"), (String = "text/csv"),
            (String = "image/svg+xml"), (String = "text/html"))),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
        (status = 406, description = "None of the report's formats is acceptable", body = crate::types::ErrorBody),
    ))]
pub async fn report(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let format = report_format(&headers)?;
        let baseline = query(raw).into_iter().find(|(k, _)| k == "baseline").map(|(_, v)| v);
        blocking(move || {
            let store = daemon.store()?;
            let report = lab::run::report(&store, &id, baseline.as_deref())?;
            let chart = || lab::chart::svg(&report).map_err(|e| Problem::internal(format!("the chart: {e}")));
            let body = match format {
                "application/json" => report.to_json(),
                "text/markdown" => report.to_markdown(),
                "text/csv" => report.to_csv(),
                "image/svg+xml" => chart()?,
                _ => report.to_html(&chart()?),
            };
            Ok((format, body))
        })
        .await
    }
    .await;
    match result {
        Ok((format, body)) => {
            let content_type =
                if format.starts_with("text/") { format!("{format}; charset=utf-8") } else { format.into() };
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(p) => p.into_response(),
    }
}
