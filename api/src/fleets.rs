//! Fleet runs over HTTP: `GET /v1/fleets/{id}/report` reports the shards of a fleet run that
//! this daemon's database holds (its own, and those `lab import` merged into it) as one run,
//! in the formats of a run's report; the JSON adds `boxes` and, per cell, `box_effect`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use lab::fleet::{FleetError, FleetId};

use crate::daemon::Daemon;
use crate::problem::Problem;
use crate::query::{Params, ReportParams};
use crate::runs::serve_report;

/// A fleet report's refusal or failure as an answer.
fn problem(e: FleetError) -> Problem {
    match e {
        FleetError::ResultsDb(e) => Problem::from(e),
        FleetError::NoFleet(_) => Problem::not_found(e.to_string()),
        e => Problem::conflict(e.to_string()),
    }
}

/// `GET /v1/fleets/{id}/report`: the fleet run's report, as `Accept` asks (as a run's).
#[utoipa::path(get, path = "/v1/fleets/{id}/report", tag = "runs",
    params(("id" = String, Path, description = "The fleet run's ID, as its shards were given"), ReportParams),
    responses(
        (status = 200, description = "The report: a run's, with `boxes` and, per cell, `box_effect`", content(
            (Object = "application/json"), (String = "text/markdown"), (String = "text/csv"),
            (String = "image/svg+xml"), (String = "text/html"))),
        (status = 400, description = "Not a fleet run's ID", body = crate::types::ErrorBody),
        (status = 404, description = "No shard of that fleet run here", body = crate::types::ErrorBody),
        (status = 406, description = "None of the report's formats is acceptable", body = crate::types::ErrorBody),
        (status = 409, description = "Its shards do not belong together (different matrices, one shard twice)", body = crate::types::ErrorBody),
        (status = 429, description = "As many reports, exports and copies are being made as the daemon makes at once (`Retry-After`)", body = crate::types::ErrorBody),
    ))]
pub async fn report(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
    Params(ReportParams { baseline }): Params<ReportParams>,
    headers: HeaderMap,
) -> Response {
    let fleet: FleetId = match id.parse() {
        Ok(fleet) => fleet,
        Err(e) => return Problem::bad_request(format!("{e}")).into_response(),
    };
    serve_report(daemon, &headers, move |store| {
        lab::fleet::fleet_report(store, &fleet, baseline.as_deref()).map_err(problem)
    })
    .await
}
