//! Results: the records of runs, filtered, as JSON, CSV or a KCIDB export.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use lab::record::{Record, Status};

use crate::daemon::Daemon;
use crate::problem::{Problem, blocking};
use crate::query::Params;

/// The most records one page of `GET /v1/results` holds (and its default `limit`).
pub const MAX_PAGE: usize = 10_000;

/// `GET /v1/results`'s query as it arrives (the next page's link is this with a new offset).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResultsParams {
    /// only this run's records
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<String>,
    /// only this cell (c01, c02, ...)
    #[serde(skip_serializing_if = "Option::is_none")]
    cell: Option<String>,
    /// only this variant
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<String>,
    /// only this status (PASS, FAIL, ERROR, MISS, SKIP; any case)
    #[serde(default, deserialize_with = "any_case", skip_serializing_if = "Option::is_none")]
    #[param(value_type = Option<Status>)]
    status: Option<Status>,
    /// json (default), csv, or kcidb (KCIDB v4 JSON of one run)
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<Format>,
    /// records of the selection to skip (json, csv) [default: 0]
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<usize>,
    /// records per page, 1 to 10000 (json, csv) [default: 10000]; a `Link: <...>; rel="next"` header names the next page when there is one
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<usize>,
}

/// A status in any case: `pass` is `PASS`.
fn any_case<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Status>, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    let status = text.to_ascii_uppercase().parse().map_err(|_| {
        serde::de::Error::custom(format!("{text:?} is no status; give PASS, FAIL, ERROR, MISS or SKIP"))
    })?;
    Ok(Some(status))
}

/// A format of `GET /v1/results`.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The records, a JSON array (docs/lab.md).
    #[default]
    Json,
    /// One CSV line per record.
    Csv,
    /// One run's KCIDB v4 export.
    Kcidb,
}

/// What `GET /v1/results` selects: its query, checked.
#[derive(Debug, PartialEq, Eq)]
struct Filter {
    run: Option<String>,
    cell: Option<String>,
    variant: Option<String>,
    status: Option<Status>,
    format: Format,
    /// Records of the selection to skip.
    offset: usize,
    /// Records of the selection to give at most.
    limit: usize,
}

impl TryFrom<ResultsParams> for Filter {
    type Error = Problem;

    fn try_from(p: ResultsParams) -> Result<Filter, Problem> {
        let limit = p.limit.unwrap_or(MAX_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(Problem::bad_request(format!("limit={limit}: give 1 to {MAX_PAGE} records per page")));
        }
        let format = p.format.unwrap_or_default();
        if format == Format::Kcidb && p.run.is_none() {
            return Err(Problem::bad_request("a KCIDB export is of one run: give run=ID"));
        }
        let offset = p.offset.unwrap_or(0);
        Ok(Filter { run: p.run, cell: p.cell, variant: p.variant, status: p.status, format, offset, limit })
    }
}

impl Filter {
    fn keeps(&self, r: &Record) -> bool {
        self.cell.as_ref().is_none_or(|c| *c == r.cell.id)
            && self.variant.as_ref().is_none_or(|v| *v == r.cell.variant)
            && self.status.is_none_or(|s| s == r.status)
    }
}

/// One CSV line per record, after a header line.
fn csv(records: &[Record]) -> String {
    let mut out = csv::Writer::from_writer(Vec::new());
    let number = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let header = [
        "run",
        "cell",
        "key",
        "variant",
        "workload",
        "device",
        "repetition",
        "status",
        "reason",
        "gbit_s",
        "packets_per_s",
        "maps_per_packet",
        "total_ms",
    ];
    // Writing to memory fails only on a record of the wrong length, which these are not.
    let _ = out.write_record(header);
    for r in records {
        let _ = out.write_record([
            r.run.clone(),
            r.cell.id.clone(),
            r.cell.key(),
            r.cell.variant.clone(),
            r.cell.workload.clone(),
            r.cell.device.clone(),
            r.repetition.to_string(),
            r.status.name().into(),
            r.reason.clone().unwrap_or_default(),
            number(r.workload.gbit_s),
            number(r.workload.packets_per_s),
            number(r.maps_per_packet),
            r.timings.total_ms.to_string(),
        ]);
    }
    String::from_utf8(out.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// `GET /v1/results`.
#[utoipa::path(get, path = "/v1/results", tag = "results",
    params(ResultsParams),
    responses(
        (status = 200, description = "The records (docs/lab.md), a page of them", content(
            (Vec<Object> = "application/json"), (String = "text/csv"))),
        (status = 400, description = "A bad filter", body = crate::types::ErrorBody),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
    ))]
pub async fn list(State(daemon): State<Arc<Daemon>>, Params(params): Params<ResultsParams>) -> Response {
    let result = async {
        let filter = Filter::try_from(params.clone())?;
        blocking(move || {
            let store = daemon.store()?;
            let runs = match &filter.run {
                Some(run) => vec![store.run(run)?],
                None => store.runs()?,
            };
            if filter.format == Format::Kcidb {
                let info = &runs[0];
                let records: Vec<Record> = store.records(&info.id)?.into_iter().filter(|r| filter.keeps(r)).collect();
                let doc = lab::kcidb::export(info, &records, &store.artifacts(&info.id));
                return Ok(("application/json", serde_json::to_string_pretty(&doc).expect("JSON"), None));
            }
            // The page: skip `offset` of the selection, keep `limit`, and look one further to
            // know whether there is a next page; stop reading there.
            let (mut records, mut skipped, mut more) = (Vec::new(), 0, false);
            for info in &runs {
                store.visit_records(&info.id, |r| {
                    if !filter.keeps(&r) {
                        return true;
                    }
                    if skipped < filter.offset {
                        skipped += 1;
                        return true;
                    }
                    if records.len() == filter.limit {
                        more = true;
                        return false;
                    }
                    records.push(r);
                    true
                })?;
                if more {
                    break;
                }
            }
            let next = more.then(|| next_page(params, filter.offset + records.len()));
            Ok(match filter.format {
                Format::Csv => ("text/csv; charset=utf-8", csv(&records), next),
                _ => ("application/json", serde_json::to_string(&records).expect("records serialize"), next),
            })
        })
        .await
    }
    .await;
    match result {
        Ok((content_type, body, next)) => {
            let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
            if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&format!("<{n}>; rel=\"next\"")).ok()) {
                response.headers_mut().insert(header::LINK, next);
            }
            response
        }
        Err(p) => p.into_response(),
    }
}

/// The next page's path: the same query with `offset` set to `offset`.
fn next_page(params: ResultsParams, offset: usize) -> String {
    let params = ResultsParams { offset: Some(offset), ..params };
    format!("/v1/results?{}", serde_urlencoded::to_string(&params).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(query: &str) -> Result<Filter, Problem> {
        let params: ResultsParams =
            serde_urlencoded::from_str(query).map_err(|e| Problem::bad_request(e.to_string()))?;
        Filter::try_from(params)
    }

    #[test]
    fn filters_parse_and_mistakes_say_what_there_is() {
        let f = filter("run=r1&cell=c02&status=pass&format=csv").unwrap();
        assert_eq!(
            (f.run.as_deref(), f.cell.as_deref(), f.status, f.format),
            (Some("r1"), Some("c02"), Some(Status::Pass), Format::Csv)
        );
        assert!(filter("status=GREEN").unwrap_err().message.contains("PASS, FAIL"));
        assert!(filter("colour=red").unwrap_err().message.contains("`run`, `cell`, `variant`"));
        assert!(filter("format=kcidb").unwrap_err().message.contains("give run=ID"));
        assert!(filter("format=xml").unwrap_err().message.contains("`json`, `csv`"));
        let f = filter("offset=20&limit=10").unwrap();
        assert_eq!((f.offset, f.limit), (20, 10));
        assert_eq!(filter("").unwrap().limit, MAX_PAGE, "a page by default");
        for bad in ["limit=0", "limit=10001"] {
            assert!(filter(bad).unwrap_err().message.contains("limit="), "{bad}");
        }
        for bad in ["limit=x", "offset=-1"] {
            assert!(filter(bad).is_err(), "{bad}");
        }
        let params = serde_urlencoded::from_str("run=r 1&offset=5&limit=2").unwrap();
        assert_eq!(next_page(params, 7), "/v1/results?run=r+1&offset=7&limit=2", "the same selection, the next offset");
    }
}

/// `GET /v1/database`: a consistent copy of the daemon's results database (SQLite), for
/// `driverlab lab import` on another host (a fleet's report, the nested box's results).
#[utoipa::path(get, path = "/v1/database", tag = "results",
    responses(
        (status = 200, description = "The results database, an SQLite file", content((Vec<u8> = "application/vnd.sqlite3"))),
    ))]
pub async fn database(State(daemon): State<Arc<Daemon>>) -> Response {
    let result = blocking(move || {
        let store = daemon.store()?;
        let dir = tempfile::tempdir().map_err(|e| Problem::internal(format!("a folder for the copy: {e}")))?;
        let copy = dir.path().join("lab.db");
        store.snapshot(&copy)?;
        std::fs::read(&copy).map_err(|e| Problem::internal(format!("reading the copy: {e}")))
    })
    .await;
    match result {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/vnd.sqlite3")], bytes).into_response(),
        Err(problem) => problem.into_response(),
    }
}
