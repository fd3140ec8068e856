//! Results: the records of runs, filtered, as JSON, CSV or a KCIDB export.

use std::collections::BTreeSet;
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The selection as the database makes it.
    fn records(&self) -> lab::results_db::RecordFilter<'_> {
        lab::results_db::RecordFilter {
            status: self.status,
            cell: self.cell.as_deref(),
            variant: self.variant.as_deref(),
        }
    }

    /// The page it asks for, from the count of its selection in each run (`counts`, in the
    /// listing's order): runs before the offset are skipped by their counts, never read. A
    /// KCIDB export is its run whole.
    fn page(&self, counts: &[(String, usize)]) -> Page {
        let (mut skip, mut want) = match self.format {
            Format::Kcidb => (0, usize::MAX),
            _ => (self.offset, self.limit),
        };
        let mut page = Page::default();
        for (run, n) in counts {
            if skip >= *n {
                skip -= n;
                continue;
            }
            let available = n - skip;
            if want == 0 {
                page.more = true;
                break;
            }
            let take = available.min(want);
            page.parts.push((run.clone(), skip, take));
            want -= take;
            skip = 0;
            if available > take {
                page.more = true;
                break;
            }
        }
        page
    }
}

/// What a page holds: from each run, in the listing's order, where its share starts and how
/// many records it has; and whether records follow the page.
#[derive(Debug, Default, PartialEq, Eq)]
struct Page {
    parts: Vec<(String, usize, usize)>,
    more: bool,
}

impl Page {
    /// Records on the page.
    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.2).sum()
    }
}

/// Hands each record of a page to its visitor, one at a time.
type EachRecord<'a> = dyn FnMut(&mut dyn FnMut(&Record) -> std::io::Result<()>) -> std::io::Result<()> + 'a;

/// The CSV's columns.
const CSV_HEADER: [&str; 13] = [
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

/// A record's CSV line (its text cells guarded against spreadsheet formulas).
fn csv_row(r: &Record) -> [String; 13] {
    let number = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let text = lab::report::csv::text_cell;
    [
        text(&r.run),
        text(&r.cell.id),
        text(&r.cell.key()),
        text(&r.cell.variant),
        text(&r.cell.workload),
        text(&r.cell.device),
        r.repetition.to_string(),
        r.status.name().into(),
        text(r.reason.as_deref().unwrap_or_default()),
        number(r.workload.gbit_s),
        number(r.workload.packets_per_s),
        number(r.maps_per_packet),
        r.timings.total_ms.to_string(),
    ]
}

/// Writes a header line and one CSV line per record.
fn write_csv(out: &mut dyn std::io::Write, each: &mut EachRecord<'_>) -> std::io::Result<()> {
    let mut csv = csv::Writer::from_writer(out);
    csv.write_record(CSV_HEADER).map_err(std::io::Error::other)?;
    each(&mut |r| csv.write_record(csv_row(r)).map_err(std::io::Error::other))?;
    csv.flush()
}

/// Writes the records as one JSON array.
fn write_json_array(out: &mut dyn std::io::Write, each: &mut EachRecord<'_>) -> std::io::Result<()> {
    out.write_all(b"[")?;
    let mut first = true;
    each(&mut |r| {
        if !std::mem::take(&mut first) {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, r).map_err(std::io::Error::other)
    })?;
    out.write_all(b"]")
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
        let permit = daemon.heavy_read()?;
        let shared = daemon.clone();
        let (filter, counts, kcidb) = blocking(move || {
            let store = shared.store()?;
            let runs = match &filter.run {
                Some(run) => vec![store.run(run)?],
                None => store.runs()?,
            };
            let counts = runs
                .iter()
                .map(|info| Ok((info.id.clone(), store.count_records(&info.id, &filter.records())?)))
                .collect::<Result<Vec<_>, Problem>>()?;
            let kcidb = match (filter.format, runs.into_iter().next()) {
                (Format::Kcidb, Some(info)) => {
                    let images: BTreeSet<String> = store.run_plan(&info.id)?.2.into_iter().map(|c| c.image).collect();
                    // A series' prefix that did not build is a build that is not valid: one pass
                    // over the records, one at a time, before the document's head.
                    let mut unbuilt = BTreeSet::new();
                    store.visit_records(&info.id, |r| {
                        unbuilt.extend(lab::kcidb::unbuilt_images([&r]));
                        true
                    })?;
                    let images: Vec<(String, bool)> =
                        images.into_iter().map(|i| (i.clone(), !unbuilt.contains(&i))).collect();
                    Some((info, images))
                }
                _ => None,
            };
            Ok((filter, counts, kcidb))
        })
        .await?;
        Ok::<_, Problem>(answer(daemon, permit, params, filter, &counts, kcidb))
    }
    .await;
    result.unwrap_or_else(Problem::into_response)
}

/// The answer: its headers now (the next page's link, from the counts), its body written as
/// the records are read, one at a time.
fn answer(
    daemon: Arc<Daemon>,
    permit: tokio::sync::OwnedSemaphorePermit,
    params: ResultsParams,
    filter: Filter,
    counts: &[(String, usize)],
    kcidb: Option<(lab::results_db::RunInfo, Vec<(String, bool)>)>,
) -> Response {
    let page = filter.page(counts);
    let next = page.more.then(|| next_page(params, filter.offset + page.len()));
    let content_type = match filter.format {
        Format::Csv => "text/csv; charset=utf-8",
        Format::Json | Format::Kcidb => "application/json",
    };
    let body = crate::streamed::body(permit, move |out| {
        let store = daemon.store().map_err(|p| std::io::Error::other(p.message))?;
        let mut each = |visit: &mut dyn FnMut(&Record) -> std::io::Result<()>| -> std::io::Result<()> {
            for (run, offset, limit) in &page.parts {
                let mut failed = None;
                let visited = store.visit_page(run, &filter.records(), (*offset, *limit), |r| match visit(&r) {
                    Ok(()) => true,
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                });
                visited.map_err(std::io::Error::other)?;
                failed.map_or(Ok(()), Err)?;
            }
            Ok(())
        };
        match kcidb {
            Some((info, images)) => {
                let artifacts = store.artifacts(&info.id);
                let mut doc = lab::kcidb::KcidbWriter::start(
                    out,
                    &info,
                    images.iter().map(|(i, valid)| (i.as_str(), *valid)),
                    &artifacts,
                )?;
                each(&mut |r| doc.test(r))?;
                doc.finish()
            }
            None if filter.format == Format::Csv => write_csv(out, &mut each),
            None => write_json_array(out, &mut each),
        }
    });
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&format!("<{n}>; rel=\"next\"")).ok()) {
        response.headers_mut().insert(header::LINK, next);
    }
    response
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

    #[test]
    fn a_page_is_cut_from_the_runs_counts_and_knows_whether_more_follow() {
        let counts: Vec<(String, usize)> = [("a", 3), ("b", 0), ("c", 5)].map(|(r, n)| (r.to_string(), n)).into();
        let parts = |page: &Page| page.parts.iter().map(|(r, o, n)| format!("{r}:{o}+{n}")).collect::<Vec<_>>();
        let page = filter("offset=2&limit=4").unwrap().page(&counts);
        assert_eq!((parts(&page), page.more, page.len()), (vec!["a:2+1".into(), "c:0+3".into()], true, 4));
        let page = filter("offset=3&limit=5").unwrap().page(&counts);
        assert_eq!((parts(&page), page.more), (vec!["c:0+5".to_string()], false), "the last page");
        let page = filter("offset=0&limit=3").unwrap().page(&counts);
        assert_eq!((parts(&page), page.more), (vec!["a:0+3".to_string()], true), "ends at a run's end, more after");
        let page = filter(&format!("offset={}", usize::MAX)).unwrap().page(&counts);
        assert_eq!((page.parts.len(), page.more), (0, false), "an offset past everything is an empty page at once");
        let page = filter("run=c&format=kcidb&limit=1&offset=4").unwrap().page(&counts[2..]);
        assert_eq!((parts(&page), page.more), (vec!["c:0+5".to_string()], false), "an export is its run whole");
    }
}

/// `GET /v1/database`: a consistent copy of the daemon's results database (SQLite), for
/// `driverlab lab import` on another host (a fleet's report, the nested box's results).
#[utoipa::path(get, path = "/v1/database", tag = "results",
    responses(
        (status = 200, description = "The results database, an SQLite file", content((Vec<u8> = "application/vnd.sqlite3"))),
    ))]
pub async fn database(State(daemon): State<Arc<Daemon>>) -> Response {
    let result = async {
        let permit = daemon.heavy_read()?;
        // The copy goes to a file, not to memory; the answer reads it out a chunk at a time and
        // the folder goes with the answer.
        blocking(move || {
            let store = daemon.store()?;
            let dir = tempfile::tempdir().map_err(|e| Problem::internal(format!("a folder for the copy: {e}")))?;
            let copy = dir.path().join("lab.db");
            store.snapshot(&copy)?;
            let file = std::fs::File::open(&copy).map_err(|e| Problem::internal(format!("the copy: {e}")))?;
            let length = file.metadata().map_err(|e| Problem::internal(format!("the copy: {e}")))?.len();
            Ok((permit, dir, file, length))
        })
        .await
    }
    .await;
    match result {
        Ok((permit, dir, mut file, length)) => {
            let body = crate::streamed::body((permit, dir), move |out| std::io::copy(&mut file, out).map(drop));
            let headers = [
                (header::CONTENT_TYPE, "application/vnd.sqlite3".to_string()),
                (header::CONTENT_LENGTH, length.to_string()),
            ];
            (headers, body).into_response()
        }
        Err(problem) => problem.into_response(),
    }
}
