//! Bisections over HTTP: `POST /v1/bisects` checks a matrix of one series and queues its
//! bisection as a run (its events, cancel and report are the run's, with a `step` event per
//! prefix judged); `GET /v1/bisects/{id}` gives the run and what the bisection decided.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::Response;
use lab::bisect::run::{BisectError, BisectOptions, BisectRun};

use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::query::{BisectParams, Params};
use crate::run_queue::{Work, status_from_db};
use crate::runs::{create_queued, created_at};
use crate::types::BisectStatus;

/// A bisection's refusal or failure as an answer.
fn problem(e: BisectError) -> Problem {
    match e {
        BisectError::Refused(why) => Problem::unprocessable(why),
        BisectError::Run(e) => Problem::from(e),
        BisectError::ResultsDb(e) => Problem::from(e),
        other => Problem::internal(other.to_string()),
    }
}

/// The options a query asks for, checked.
fn options(params: &BisectParams) -> Result<BisectOptions, Problem> {
    let metric = params.metric.parse().map_err(|_| {
        let names: Vec<&str> = lab::metric::Metric::ALL.iter().map(|m| m.name()).collect();
        Problem::bad_request(format!("metric {:?}: give one of the report's: {}", params.metric, names.join(", ")))
    })?;
    let direction = match params.direction.as_deref() {
        None => lab::bisect::Direction::Any,
        Some(d) => d.parse().map_err(|_| Problem::bad_request(format!("direction {d:?}: give up, down or any")))?,
    };
    Ok(BisectOptions { metric, direction, threshold_pct: params.threshold, budget: params.budget })
}

/// `POST /v1/bisects`: checks a matrix of one series, one workload and one device and queues
/// its bisection.
#[utoipa::path(post, path = "/v1/bisects", tag = "runs",
    params(BisectParams),
    request_body(content((String = "application/toml"), (Object = "application/json")),
        description = "A matrix (docs/lab.md) with one image with `series` (its files as `{name, text}`), one variant on it, one workload, one device"),
    responses(
        (status = 201, description = "The bisection's run, queued", body = crate::types::Created),
        (status = 400, description = "A malformed body or query (an unknown metric or direction)", body = crate::types::ErrorBody),
        (status = 415, description = "Neither TOML nor JSON", body = crate::types::ErrorBody),
        (status = 422, description = "The matrix makes no bisection, does not check out, or names cells this host cannot run", body = crate::types::ErrorBody),
        (status = 429, description = "The queue is full, or a build is running", body = crate::types::ErrorBody),
        (status = 507, description = "The daemon's disk is too full", body = crate::types::ErrorBody),
    ))]
pub async fn submit(
    State(daemon): State<Arc<Daemon>>,
    Params(params): Params<BisectParams>,
    payload: Payload,
) -> Response {
    let options = match options(&params) {
        Ok(options) => options,
        Err(p) => return created_at("/v1/bisects", Err(p)),
    };
    // A bisection's run has the budget's repetitions of every prefix: held before it is made.
    let results = move |plan: &lab::matrix::Plan| {
        let goal = lab::bisect::run::goal(&options, plan.matrix.repetitions).map_err(problem)?;
        Ok(plan.cells.len() * goal.budget as usize)
    };
    let created = create_queued(daemon, &payload, results, move |store, env, plan| {
        let note = |line: &str| tracing::info!("{line}");
        let made = BisectRun::create(store, env, plan, &options, &note).map_err(problem)?;
        Ok((made.run.clone(), Work::Bisect(made)))
    })
    .await;
    created_at("/v1/bisects", created)
}

/// `GET /v1/bisects/{id}`: the bisection's run and what it decided (`outcome` null until it
/// ends).
#[utoipa::path(get, path = "/v1/bisects/{id}", tag = "runs",
    params(("id" = String, Path, description = "The bisection's run")),
    responses(
        (status = 200, description = "The run and the bisection", body = BisectStatus),
        (status = 404, description = "No such run, or it is no bisection", body = crate::types::ErrorBody),
    ))]
pub async fn show(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Result<Json<BisectStatus>, Problem> {
    blocking(move || {
        let store = daemon.store()?;
        store.run(&id)?;
        let bisection = lab::bisect::run::stored(&store, &id)
            .ok_or_else(|| Problem::not_found(format!("run {id} is no bisection (GET /v1/runs/{id})")))?;
        let mut run = status_from_db(&daemon.config.db, &id)?;
        if let Some((state, eta)) = daemon.runs.live_state(&id, run.results, run.results_total) {
            run.state = state;
            run.eta_s = eta;
        }
        Ok(Json(BisectStatus { run, bisection }))
    })
    .await
}
