//! Results: the records of runs, filtered, as JSON, CSV or a KCIDB export.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use lab::record::{Record, Status};

use crate::daemon::Daemon;
use crate::problem::{Problem, blocking};
use crate::runs::query;

/// A status, as the `status` query parameter gives it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code, clippy::upper_case_acronyms, missing_docs)]
pub enum StatusParam {
    PASS,
    FAIL,
    ERROR,
    MISS,
    SKIP,
}

/// A format, as the `format` query parameter gives it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code, non_camel_case_types, missing_docs)]
pub enum FormatParam {
    json,
    csv,
    kcidb,
}

/// What `GET /v1/results` selects.
#[derive(Debug, Default, PartialEq, Eq)]
struct Filter {
    run: Option<String>,
    cell: Option<String>,
    variant: Option<String>,
    status: Option<Status>,
    format: Format,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Format {
    #[default]
    Json,
    Csv,
    Kcidb,
}

fn filter(pairs: Vec<(String, String)>) -> Result<Filter, Problem> {
    let mut f = Filter::default();
    for (key, value) in pairs {
        match key.as_str() {
            "run" => f.run = Some(value),
            "cell" => f.cell = Some(value),
            "variant" => f.variant = Some(value),
            "status" => {
                f.status = Some(Status::parse(&value.to_ascii_uppercase()).ok_or_else(|| {
                    Problem::bad_request(format!("status={value:?}: give PASS, FAIL, ERROR, MISS or SKIP"))
                })?);
            }
            "format" => {
                f.format = match value.as_str() {
                    "json" => Format::Json,
                    "csv" => Format::Csv,
                    "kcidb" => Format::Kcidb,
                    other => return Err(Problem::bad_request(format!("format={other:?}: give json, csv or kcidb"))),
                }
            }
            other => {
                return Err(Problem::bad_request(format!(
                    "unknown query parameter {other:?}; there are run, cell, variant, status, format"
                )));
            }
        }
    }
    if f.format == Format::Kcidb && f.run.is_none() {
        return Err(Problem::bad_request("a KCIDB export is of one run: give run=ID"));
    }
    Ok(f)
}

impl Filter {
    fn keeps(&self, r: &Record) -> bool {
        self.cell.as_ref().is_none_or(|c| *c == r.cell.id)
            && self.variant.as_ref().is_none_or(|v| *v == r.cell.variant)
            && self.status.is_none_or(|s| s == r.status)
    }
}

/// One CSV line per record.
fn csv(records: &[Record]) -> String {
    let mut out = String::from(
        "run,cell,key,variant,workload,device,repetition,status,reason,gbit_s,packets_per_s,maps_per_packet,total_ms\n",
    );
    let field =
        |s: &str| if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.into() };
    let number = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in records {
        out.push_str(
            &[
                field(&r.run),
                field(&r.cell.id),
                field(&r.cell.key()),
                field(&r.cell.variant),
                field(&r.cell.workload),
                field(&r.cell.device),
                r.repetition.to_string(),
                r.status.name().into(),
                field(r.reason.as_deref().unwrap_or_default()),
                number(r.workload.gbit_s),
                number(r.workload.packets_per_s),
                number(r.maps_per_packet),
                r.timings.total_ms.to_string(),
            ]
            .join(","),
        );
        out.push('\n');
    }
    out
}

/// `GET /v1/results`.
#[utoipa::path(get, path = "/v1/results", tag = "results",
    params(
        ("run" = Option<String>, Query, description = "only this run's records"),
        ("cell" = Option<String>, Query, description = "only this cell (c01, c02, ...)"),
        ("variant" = Option<String>, Query, description = "only this variant"),
        ("status" = Option<StatusParam>, Query, description = "only this status"),
        ("format" = Option<FormatParam>, Query, description = "json (default), csv, or kcidb (KCIDB v4 JSON of one run)"),
    ),
    responses(
        (status = 200, description = "The records (docs/lab.md)", content(
            (Vec<Object> = "application/json"), (String = "text/csv"))),
        (status = 400, description = "A bad filter", body = crate::types::ErrorBody),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
    ))]
pub async fn list(State(daemon): State<Arc<Daemon>>, RawQuery(raw): RawQuery) -> Response {
    let result = async {
        let filter = filter(query(raw))?;
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
                return Ok(("application/json", serde_json::to_string_pretty(&doc).expect("JSON")));
            }
            let mut records = Vec::new();
            for info in &runs {
                records.extend(store.records(&info.id)?.into_iter().filter(|r| filter.keeps(r)));
            }
            Ok(match filter.format {
                Format::Csv => ("text/csv; charset=utf-8", csv(&records)),
                _ => ("application/json", serde_json::to_string(&records).expect("records serialize")),
            })
        })
        .await
    }
    .await;
    match result {
        Ok((content_type, body)) => ([(header::CONTENT_TYPE, content_type)], body).into_response(),
        Err(p) => p.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        query(Some(q.into()))
    }

    #[test]
    fn filters_parse_and_mistakes_say_what_there_is() {
        let f = filter(pairs("run=r1&cell=c02&status=pass&format=csv")).unwrap();
        assert_eq!(
            (f.run.as_deref(), f.cell.as_deref(), f.status, f.format),
            (Some("r1"), Some("c02"), Some(Status::Pass), Format::Csv)
        );
        assert!(filter(pairs("status=GREEN")).unwrap_err().message.contains("PASS, FAIL"));
        assert!(filter(pairs("colour=red")).unwrap_err().message.contains("run, cell, variant"));
        assert!(filter(pairs("format=kcidb")).unwrap_err().message.contains("give run=ID"));
        assert!(filter(pairs("format=xml")).is_err());
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
