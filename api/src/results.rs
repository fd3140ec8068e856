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

/// The most records one page of `GET /v1/results` holds (and its default `limit`).
pub const MAX_PAGE: usize = 10_000;

/// What `GET /v1/results` selects.
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

impl Default for Filter {
    fn default() -> Self {
        Filter {
            run: None,
            cell: None,
            variant: None,
            status: None,
            format: Format::default(),
            offset: 0,
            limit: MAX_PAGE,
        }
    }
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
                f.status = Some(value.to_ascii_uppercase().parse::<Status>().map_err(|_| {
                    Problem::bad_request(format!("status={value:?}: give PASS, FAIL, ERROR, MISS or SKIP"))
                })?);
            }
            "offset" => {
                f.offset = value
                    .parse()
                    .map_err(|_| Problem::bad_request(format!("offset={value:?}: give a number of records to skip")))?;
            }
            "limit" => {
                f.limit = value.parse().ok().filter(|n| (1..=MAX_PAGE).contains(n)).ok_or_else(|| {
                    Problem::bad_request(format!("limit={value:?}: give 1 to {MAX_PAGE} records per page"))
                })?;
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
                    "unknown query parameter {other:?}; there are run, cell, variant, status, format, offset, limit"
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
        ("offset" = Option<usize>, Query, description = "records of the selection to skip (json, csv) [default: 0]"),
        ("limit" = Option<usize>, Query, description = "records per page, 1 to 10000 (json, csv) [default: 10000]; a `Link: <...>; rel=\"next\"` header names the next page when there is one"),
    ),
    responses(
        (status = 200, description = "The records (docs/lab.md), a page of them", content(
            (Vec<Object> = "application/json"), (String = "text/csv"))),
        (status = 400, description = "A bad filter", body = crate::types::ErrorBody),
        (status = 404, description = "No such run", body = crate::types::ErrorBody),
    ))]
pub async fn list(State(daemon): State<Arc<Daemon>>, RawQuery(raw): RawQuery) -> Response {
    let result = async {
        let raw_query = query(raw);
        let filter = filter(raw_query.clone())?;
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
            let next = more.then(|| next_page(&raw_query, filter.offset + records.len()));
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
fn next_page(raw: &[(String, String)], offset: usize) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.extend_pairs(raw.iter().filter(|(k, _)| k != "offset"));
    query.append_pair("offset", &offset.to_string());
    format!("/v1/results?{}", query.finish())
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
        let f = filter(pairs("offset=20&limit=10")).unwrap();
        assert_eq!((f.offset, f.limit), (20, 10));
        assert_eq!(filter(pairs("")).unwrap().limit, MAX_PAGE, "a page by default");
        for bad in ["limit=0", "limit=10001", "limit=x", "offset=-1"] {
            assert!(filter(pairs(bad)).unwrap_err().message.contains(&bad[..bad.find('=').unwrap()]), "{bad}");
        }
        assert_eq!(
            next_page(&pairs("run=r 1&offset=5&limit=2"), 7),
            "/v1/results?run=r+1&limit=2&offset=7",
            "the same selection, the next offset"
        );
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
