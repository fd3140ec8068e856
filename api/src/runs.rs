//! Runs over HTTP: submit (into the daemon's [`crate::run_queue`]), list, show, cancel, resume,
//! follow their events, and their reports.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast;

use crate::auth::Transport;
use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::query::{Params, ReportParams, RunsParams, SubmitParams};
use crate::run_queue::{Work, status_from_db};
use crate::types::{Created, RunEvent, RunStatus};

/// A run's status, live state included.
fn status(daemon: &Daemon, run: &str) -> Result<RunStatus, Problem> {
    let mut status = status_from_db(&daemon.config.db, run)?;
    if let Some((state, eta)) = daemon.runs.live_state(run, status.results, status.results_total) {
        status.state = state;
        status.eta_s = eta;
    }
    Ok(status)
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

/// The matrix in a request body: TOML (`application/toml`, `text/toml`) or JSON
/// (`application/json`, no key given twice), as its `Content-Type` says; anything else, or no
/// type, is 415 rather than a guess.
fn matrix_request(payload: &Payload) -> Result<lab::request::Request, Problem> {
    let refuse = matrix_problem;
    match payload.content_type.as_str() {
        "application/toml" | "text/toml" => {
            let text =
                std::str::from_utf8(&payload.bytes).map_err(|_| Problem::bad_request("a TOML matrix is UTF-8 text"))?;
            lab::request::from_toml(text).map_err(refuse)
        }
        "application/json" => {
            let crate::payload::UniqueKeys(value) = payload.json()?;
            lab::request::from_json(value).map_err(refuse)
        }
        "" => Err(Problem::unsupported_media_type(
            "a matrix without a Content-Type: give application/toml or application/json",
        )),
        other => Err(Problem::unsupported_media_type(format!(
            "a {other:?} body; a matrix is application/toml or application/json"
        ))),
    }
}

/// `POST /v1/runs`: checks a matrix and queues its run.
#[utoipa::path(post, path = "/v1/runs", tag = "runs",
    params(SubmitParams),
    request_body(content((String = "application/toml"), (Object = "application/json")),
        description = "A matrix (docs/lab.md): images are `probe`, image IDs or recipes the daemon builds (`kernel = \"debian\"`, `initrd = \"agent\"`, patches as `{name, text}`), devices a model on its generator or a registered device by name alone"),
    responses(
        (status = 201, description = "The run, queued", body = Created),
        (status = 400, description = "A malformed body or query", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Neither TOML nor JSON", body = crate::types::ErrorBody),
        (status = 422, description = "The matrix does not check out, or names cells this host cannot run", body = crate::types::ErrorBody),
        (status = 429, description = "The queue is full, or the matrix's recipes need a build while another runs", body = crate::types::ErrorBody),
        (status = 507, description = "The daemon's disk is too full for a run's results and artifacts", body = crate::types::ErrorBody),
    ))]
pub async fn submit(
    State(daemon): State<Arc<Daemon>>,
    Params(params): Params<SubmitParams>,
    payload: Payload,
) -> Response {
    let share = match params.share() {
        Ok(share) => share,
        Err(problem) => return problem.into_response(),
    };
    let skip_unrunnable = params.skip_unrunnable;
    // A shard holds its share of the results.
    let shard = share.as_ref().map(|s| s.shard);
    let results = move |plan: &lab::matrix::Plan| {
        Ok(shard.map_or_else(|| plan.results(), |s| s.share(plan.cells.len(), plan.matrix.repetitions)))
    };
    let created = create_queued(daemon, &payload, results, move |store, env, plan| {
        let note = |line: &str| tracing::info!("{line}");
        let plan = plan.with_share(share);
        let (run, plan) = lab::run::create(store, env, plan, skip_unrunnable, &note)?;
        Ok((run, Work::Run(plan)))
    })
    .await;
    created_at("/v1/runs", created)
}

/// Checks the matrix of `payload`, makes its run with `make` and queues it: a place in the
/// queue first (a run that could not be queued is never made), room on the disk, the results
/// the run will have (`results` of its plan), and the daemon's one build at a time when its
/// recipes need one.
pub(crate) async fn create_queued(
    daemon: Arc<Daemon>,
    payload: &Payload,
    results: impl FnOnce(&lab::matrix::Plan) -> Result<usize, Problem> + Send + 'static,
    make: impl FnOnce(
        &mut lab::results_db::ResultsDb,
        &lab::env::LabEnv,
        lab::matrix::Plan,
    ) -> Result<(String, Work), Problem>
    + Send
    + 'static,
) -> Result<String, Problem> {
    let request = matrix_request(payload)?;
    blocking(move || {
        let mut place = daemon.runs.reserve()?;
        // The run's results and artifacts need room: a full disk is said now, not found by
        // each repetition.
        lab::disk::check_room(&daemon.config.db).map_err(|e| Problem::insufficient_storage(e.to_string()))?;
        let mut store = daemon.store()?;
        let registered = |name: &str| store.device(name).ok().flatten();
        let plan = lab::request::plan(request, &registered).map_err(matrix_problem)?;
        // Held before anything is built or made: a refusal leaves nothing behind.
        place.hold_results(results(&plan)?)?;
        // Recipes are built now, one build at a time (the same images again are found built).
        let recipes = plan.matrix.images.iter().any(|i| lab::recipe::is_recipe(i.get_ref()));
        let _only = match recipes {
            true => Some(daemon.builds.try_lock().map_err(|_| {
                Problem::busy("an image build is running and this matrix's recipes need one; try again after it")
            })?),
            false => None,
        };
        let (run, work) = make(&mut store, &daemon.env, plan)?;
        store.set_queued(&run, true)?;
        daemon.runs.enqueue(place, &run, work)?;
        Ok(run)
    })
    .await
}

/// 201 with the new run's `Location` under `collection`, or the problem.
pub(crate) fn created_at(collection: &str, created: Result<String, Problem>) -> Response {
    match created {
        Ok(id) => {
            let location = format!("{collection}/{id}");
            (StatusCode::CREATED, [(header::LOCATION, location)], Json(Created { id })).into_response()
        }
        Err(problem) => problem.into_response(),
    }
}

/// The most runs one page of `GET /v1/runs` holds, and its default.
pub const MAX_RUNS_PAGE: usize = 1000;
const DEFAULT_RUNS_PAGE: usize = 100;

/// `GET /v1/runs`: the runs, newest first, a page at a time.
#[utoipa::path(get, path = "/v1/runs", tag = "runs",
    params(RunsParams),
    responses(
        (status = 200, description = "A page of the runs, newest first", body = Vec<RunStatus>),
        (status = 400, description = "A bad offset or limit", body = crate::types::ErrorBody),
    ))]
pub async fn list(State(daemon): State<Arc<Daemon>>, Params(params): Params<RunsParams>) -> Response {
    let (offset, limit) = (params.offset.unwrap_or(0), params.limit.unwrap_or(DEFAULT_RUNS_PAGE));
    if !(1..=MAX_RUNS_PAGE).contains(&limit) {
        return Problem::bad_request(format!("limit={limit}: give 1 to {MAX_RUNS_PAGE} runs per page")).into_response();
    }
    let result = blocking(move || {
        let store = daemon.store()?;
        let runs = store.runs_page(offset, limit)?;
        let more = offset.saturating_add(runs.len()) < store.run_count()?;
        let page = runs.iter().map(|r| status(&daemon, &r.id)).collect::<Result<Vec<_>, _>>()?;
        Ok((page, more))
    })
    .await;
    match result {
        Ok((page, more)) => {
            let mut response = Json(page).into_response();
            let next = RunsParams { offset: Some(offset + limit), ..params };
            let link = format!("</v1/runs?{}>; rel=\"next\"", serde_urlencoded::to_string(&next).unwrap_or_default());
            if let (true, Ok(link)) = (more, header::HeaderValue::from_str(&link)) {
                response.headers_mut().insert(header::LINK, link);
            }
            response
        }
        Err(p) => p.into_response(),
    }
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
        let mut place = daemon.runs.reserve()?;
        let plan = lab::run::resumable(&store, &daemon.env, &id, &|line| tracing::info!("{line}"))?;
        // Every refusal before the claim: a refused resume leaves the run as it was.
        place.hold_results(plan.plan.results())?;
        lab::run::claim(&mut store, &id, &plan)?;
        store.set_queued(&id, true)?;
        daemon.runs.enqueue(place, &id, Work::Run(plan))?;
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
pub async fn events(
    State(daemon): State<Arc<Daemon>>,
    transport: Option<Extension<Transport>>,
    Path(id): Path<String>,
) -> Response {
    let transport = transport.map_or(Transport::Tcp, |Extension(t)| t);
    let slot = match daemon.open_stream(transport) {
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
    params(("id" = String, Path, description = "The run"), ReportParams),
    responses(
        (status = 200, description = "The report", content(
            (Object = "application/json"), (String = "text/markdown"), (String = "text/csv"),
            (String = "image/svg+xml"), (String = "text/html"))),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
        (status = 406, description = "None of the report's formats is acceptable", body = crate::types::ErrorBody),
        (status = 429, description = "As many reports, exports and copies are being made as the daemon makes at once (`Retry-After`)", body = crate::types::ErrorBody),
    ))]
pub async fn report(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    Params(ReportParams { baseline }): Params<ReportParams>,
    headers: HeaderMap,
) -> Response {
    serve_report(daemon, &headers, move |store| Ok(lab::run::report(store, &id, baseline.as_deref())?)).await
}

/// The report `make` makes from the daemon's database, rendered as `headers` ask: one of the
/// heavy reads the daemon makes at once, off the async threads.
pub(crate) async fn serve_report(
    daemon: Arc<Daemon>,
    headers: &HeaderMap,
    make: impl FnOnce(&lab::results_db::ResultsDb) -> Result<lab::report::Report, Problem> + Send + 'static,
) -> Response {
    let result = async {
        let format = report_format(headers)?;
        let permit = daemon.heavy_read()?;
        blocking(move || {
            let _permit = permit;
            let store = daemon.store()?;
            let report = make(&store)?;
            Ok((format, rendered(&report, format)?))
        })
        .await
    }
    .await;
    report_response(result)
}

/// `report` in `format` (one of [`report_format`]'s).
fn rendered(report: &lab::report::Report, format: &str) -> Result<String, Problem> {
    let chart = || lab::chart::svg(report).map_err(|e| Problem::internal(format!("the chart: {e}")));
    Ok(match format {
        "application/json" => report.to_json(),
        "text/markdown" => report.to_markdown(),
        "text/csv" => report.to_csv(),
        "image/svg+xml" => chart()?,
        _ => report.to_html(&chart()?),
    })
}

/// A rendered report (its format and body) as the answer, or the problem.
fn report_response(result: Result<(&'static str, String), Problem>) -> Response {
    match result {
        Ok((format, body)) => {
            let content_type =
                if format.starts_with("text/") { format!("{format}; charset=utf-8") } else { format.into() };
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(p) => p.into_response(),
    }
}
