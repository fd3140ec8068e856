//! `driverlab lab run|resume|report|list|show` through a running daemon (`--socket`, `DRIVERLAB_SOCKET`),
//! with the output the in-process commands give: `run ID started`, a line per repetition on
//! stderr, the report, and the last line.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use api::client::Client;
use api::types::{ErrorBody, RunEvent, RunPhase, RunStatus};
use clap::Args;
use lab::record::Status;

use super::CodedError;
use super::lab::{Format, last_line, repetition_line};

/// Which daemon, if any.
#[derive(Args)]
pub struct DaemonArgs {
    /// Go through the daemon on this socket when one answers there (in-process otherwise).
    #[arg(long, value_name = "PATH", env = "DRIVERLAB_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Go through the daemon at this URL over TCP (`http://HOST:PORT`, e.g. a lab box or the
    /// nested box), with the bearer token of --token-file; it must answer.
    #[arg(long, value_name = "URL", env = "DRIVERLAB_URL", conflicts_with = "socket", requires = "token_file")]
    pub url: Option<String>,
    /// The file whose first line is the daemon's bearer token (for --url).
    #[arg(long, value_name = "FILE", env = "DRIVERLAB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// `HOST:PORT` of an `http://HOST:PORT[/]` URL (or of a bare `HOST:PORT`).
fn tcp_address(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
    if url.starts_with("https://") {
        anyhow::bail!("{url}: the daemon speaks plain HTTP; reach a remote one through a tunnel (ssh -L)");
    }
    let valid = rest.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid || rest.contains('/') {
        return Err(CodedError { message: format!("--url {url:?}: give http://HOST:PORT"), code: 2 }.into());
    }
    Ok(rest.to_string())
}

impl DaemonArgs {
    /// A client for the daemon, if one is named and answers; a note on stderr if a socket is
    /// named and does not (the command then runs in-process), an error if a URL is.
    pub fn client(&self) -> anyhow::Result<Option<Client>> {
        if let Some(url) = &self.url {
            let token_file = self.token_file.as_ref().context("--url needs --token-file")?;
            let token = std::fs::read_to_string(token_file)
                .with_context(|| format!("reading the token file {}", token_file.display()))?;
            let token = token.lines().next().unwrap_or_default().trim().to_string();
            let client = Client::tcp(tcp_address(url)?, token);
            return match runtime()?.block_on(client.call("GET", "/v1/version", &[], None)) {
                Ok(answer) if answer.status == 200 => Ok(Some(client)),
                Ok(answer) => Err(refused(answer.status, &answer.body)),
                Err(e) => {
                    Err(CodedError { message: format!("no driverlab daemon answers at {url}: {e}"), code: 1 }.into())
                }
            };
        }
        let Some(socket) = &self.socket else { return Ok(None) };
        let client = Client::new(socket);
        if runtime()?.block_on(client.answers()) {
            Ok(Some(client))
        } else {
            eprintln!("no driverlab daemon answers on {}; running in-process", socket.display());
            Ok(None)
        }
    }
}

pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

/// An error answer as the CLI's error: 2 for the user's mistakes, 1 otherwise.
pub(super) fn refused(status: u16, body: &[u8]) -> anyhow::Error {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .map(|e| e.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).into_owned());
    let code = if (400..500).contains(&status) && status != 429 { 2 } else { 1 };
    CodedError { message: format!("the daemon answered {status}: {message}"), code }.into()
}

fn accept(format: Format) -> &'static str {
    match format {
        Format::Md => "text/markdown",
        Format::Json => "application/json",
        Format::Csv => "text/csv",
        Format::Svg => "image/svg+xml",
    }
}

/// `lab run MATRIX` through the daemon.
pub fn run(client: &Client, text: Vec<u8>, skip_unrunnable: bool, format: Format) -> anyhow::Result<u8> {
    let runtime = runtime()?;
    let path = if skip_unrunnable { "/v1/runs?skip_unrunnable=true" } else { "/v1/runs" };
    let answer = runtime.block_on(client.call("POST", path, &[("content-type", "application/toml")], Some(text)))?;
    if answer.status != 201 {
        return Err(refused(answer.status, &answer.body));
    }
    let id = serde_json::from_slice::<serde_json::Value>(&answer.body)?["id"].as_str().unwrap_or_default().to_string();
    println!("run {id} started");
    runtime.block_on(follow(client, &id, format))
}

/// `lab resume RUN` through the daemon.
pub fn resume(client: &Client, run: &str, format: Format) -> anyhow::Result<u8> {
    let runtime = runtime()?;
    let answer = runtime.block_on(client.call("POST", &format!("/v1/runs/{run}/resume"), &[], None))?;
    if answer.status != 202 {
        return Err(refused(answer.status, &answer.body));
    }
    println!("run {run} resumed");
    runtime.block_on(follow(client, run, format))
}

/// `lab report RUN` through the daemon.
pub fn report(client: &Client, run: &str, baseline: Option<&str>, format: Format) -> anyhow::Result<String> {
    runtime()?.block_on(fetch_report(client, run, baseline, format))
}

async fn fetch_report(client: &Client, run: &str, baseline: Option<&str>, format: Format) -> anyhow::Result<String> {
    let mut path = format!("/v1/runs/{run}/report");
    if let Some(b) = baseline {
        path.push_str(&format!("?baseline={}", form_urlencoded::byte_serialize(b.as_bytes()).collect::<String>()));
    }
    let answer = client.call("GET", &path, &[("accept", accept(format))], None).await?;
    if answer.status != 200 {
        return Err(refused(answer.status, &answer.body));
    }
    Ok(String::from_utf8_lossy(&answer.body).into_owned())
}

/// Follows the run's events to its end (Ctrl-C cancels it), then prints the report and the
/// last line.
async fn follow(client: &Client, run: &str, format: Format) -> anyhow::Result<u8> {
    let started = Instant::now();
    let canceller = client.clone();
    let cancel_path = format!("/v1/runs/{run}/cancel");
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("cancelling: the repetitions running finish, the rest are MISS");
            let _ = canceller.call("POST", &cancel_path, &[], None).await;
        }
    });
    let mut last: Option<RunStatus> = None;
    let refused_status = client
        .events(&format!("/v1/runs/{run}/events"), |data| {
            let Ok(event) = serde_json::from_str::<RunEvent>(data) else { return true };
            match event {
                RunEvent::Recorded {
                    cell,
                    label,
                    repetition,
                    status,
                    reason,
                    gbit_s,
                    maps_per_packet,
                    done,
                    total,
                } => {
                    let reason = (!reason.is_empty()).then_some(reason.as_str());
                    let line = repetition_line(
                        (done, total),
                        (&cell, &label, repetition),
                        status,
                        reason,
                        (gbit_s, maps_per_packet),
                    );
                    eprintln!("{line} ({:.1} s)", started.elapsed().as_secs_f64());
                    true
                }
                RunEvent::Note { line } => {
                    eprintln!("{line}");
                    true
                }
                RunEvent::State { status } => {
                    let finished = status.state.ended();
                    last = Some(status);
                    !finished
                }
            }
        })
        .await;
    ctrl_c.abort();
    let refused_status = match refused_status {
        Ok(refused) => refused,
        Err(e) => return Ok(interrupted(run, &e.to_string())),
    };
    if let Some(status) = refused_status {
        return Err(
            CodedError { message: format!("the daemon answered {status} for the run's events"), code: 1 }.into()
        );
    }
    let Some(status) = last.filter(|s| s.state.ended()) else {
        return Ok(interrupted(run, "the daemon closed the run's event stream before the run ended"));
    };
    let report = fetch_report(client, run, None, format).await?;
    print!("{report}");
    if !report.ends_with('\n') {
        println!();
    }
    let count = |s: Status| status.counts.get(&s).copied().unwrap_or(0);
    println!("{}", last_line(run, status.cells_total, count, status.state == RunPhase::Cancelled));
    let clean = count(Status::Fail) + count(Status::Error) + count(Status::Miss) == 0;
    Ok(if clean && status.state == RunPhase::Done { 0 } else { 1 })
}

/// A run whose daemon went away while it was followed: the last line says so, exit code 1.
fn interrupted(run: &str, why: &str) -> u8 {
    println!("run {run}: interrupted: {why}; `driverlab lab resume {run}` once the daemon is back");
    1
}

async fn get_json<T: serde::de::DeserializeOwned>(client: &Client, path: &str) -> anyhow::Result<T> {
    let answer = client.call("GET", path, &[], None).await?;
    if answer.status != 200 {
        return Err(refused(answer.status, &answer.body));
    }
    Ok(serde_json::from_slice(&answer.body)?)
}

/// Every record of `run`, page after page (`GET /v1/results` and its `Link` to the next).
async fn all_records(client: &Client, run: &str) -> anyhow::Result<Vec<lab::record::Record>> {
    let mut records = Vec::new();
    let mut path = Some(format!("/v1/results?run={run}"));
    while let Some(page) = path {
        let answer = client.call("GET", &page, &[], None).await?;
        if answer.status != 200 {
            return Err(refused(answer.status, &answer.body));
        }
        let page: Vec<lab::record::Record> = serde_json::from_slice(&answer.body)?;
        // `<PATH>; rel="next"`; an empty page ends it whatever the server says.
        path = answer
            .link
            .as_deref()
            .filter(|_| !page.is_empty())
            .and_then(|l| l.strip_prefix('<')?.split_once('>'))
            .map(|(p, _)| p.to_string());
        records.extend(page);
    }
    Ok(records)
}

/// `lab list` through the daemon.
pub fn list(client: &Client, json: bool) -> anyhow::Result<u8> {
    let runs: Vec<serde_json::Value> = runtime()?.block_on(get_json(client, "/v1/runs"))?;
    if json {
        for r in &runs {
            println!("{r}");
        }
        return Ok(0);
    }
    let runs: Vec<RunStatus> = runs.into_iter().map(serde_json::from_value).collect::<Result<_, _>>()?;
    println!("{}", super::lab::list_header());
    for r in &runs {
        println!(
            "{}",
            super::lab::list_row(&r.id, r.state, r.cells_total, r.results, r.results_total, &r.created_at, &r.matrix)
        );
    }
    Ok(0)
}

/// `lab show RUN` through the daemon.
pub fn show(client: &Client, run: &str, json: bool) -> anyhow::Result<u8> {
    let runtime = runtime()?;
    let status: serde_json::Value = runtime.block_on(get_json(client, &format!("/v1/runs/{run}")))?;
    let records = runtime.block_on(all_records(client, run))?;
    if json {
        let doc = serde_json::json!({"run": status, "records": records});
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    let s: RunStatus = serde_json::from_value(status)?;
    println!("run {}: matrix {} ({}), {}", s.id, s.matrix, s.matrix_file, s.state);
    println!(
        "created {} on {}, {} cells x {} repetitions, {} results",
        s.created_at, s.host, s.cells_total, s.repetitions, s.results
    );
    println!("artifacts on the daemon's host");
    for r in &records {
        println!("{}", super::lab::record_line(r));
    }
    Ok(0)
}

/// Writes the daemon's results database (`GET /v1/database`) to `to`.
pub fn download_database(client: &Client, to: &Path) -> anyhow::Result<()> {
    let answer = runtime()?.block_on(client.call("GET", "/v1/database", &[], None))?;
    if answer.status != 200 {
        return Err(refused(answer.status, &answer.body));
    }
    std::fs::write(to, &answer.body).with_context(|| to.display().to_string())
}
