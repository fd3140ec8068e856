//! A client for the API: over the Unix socket, or over TCP with the bearer token.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

use crate::ApiError;

/// Where the daemon listens.
#[derive(Debug, Clone)]
enum Target {
    Unix(PathBuf),
    Tcp { addr: String, token: String },
}

/// Talks to a driverlab daemon.
#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
}

/// A response: status, content type and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
    /// The `Link` header, when there is one (the next page of `GET /v1/results`).
    pub link: Option<String>,
    /// The `Retry-After` header, when there is one (a 429).
    pub retry_after: Option<String>,
}

/// How many times a GET refused with 429 and `Retry-After` is tried again.
const RETRIES: usize = 30;

impl Client {
    /// A client for the daemon on the Unix socket `socket`.
    pub fn new(socket: impl AsRef<Path>) -> Client {
        Client { target: Target::Unix(socket.as_ref().to_path_buf()) }
    }

    /// A client for the daemon at TCP `addr` (`host:port`), with its token.
    pub fn tcp(addr: impl Into<String>, token: impl Into<String>) -> Client {
        Client { target: Target::Tcp { addr: addr.into(), token: token.into() } }
    }

    fn where_(&self) -> PathBuf {
        match &self.target {
            Target::Unix(path) => path.clone(),
            Target::Tcp { addr, .. } => PathBuf::from(addr),
        }
    }

    /// Opens a connection and sends `request`; the response's head, and its body as a stream.
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let http = |e: &dyn std::fmt::Display| ApiError::Http(e.to_string());
        let socket = |source| ApiError::Socket { path: self.where_(), source };
        let mut request = Request::builder().method(method).uri(path).header("host", "driverlab");
        let mut sender = match &self.target {
            Target::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await.map_err(socket)?;
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| http(&e))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                sender
            }
            Target::Tcp { addr, token } => {
                let stream = tokio::net::TcpStream::connect(addr).await.map_err(socket)?;
                request = request.header("authorization", format!("Bearer {token}"));
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| http(&e))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                sender
            }
        };
        if body.is_some() && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            request = request.header("content-type", "application/json");
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| http(&e))?;
        sender.send_request(request).await.map_err(|e| http(&e))
    }

    /// Sends one request with `headers`; returns the whole answer.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ApiError> {
        let response = self.send(method, path, headers, body).await?;
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let content_type = header("content-type").unwrap_or_default();
        let (link, retry_after) = (header("link"), header("retry-after"));
        let body = response.into_body().collect().await.map_err(|e| ApiError::Http(e.to_string()))?.to_bytes();
        Ok(Answer { status, content_type, body: body.to_vec(), link, retry_after })
    }

    /// Sends one JSON request; returns the status and the body.
    pub async fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>), ApiError> {
        let answer = self.call(method, path, &[], body).await?;
        Ok((answer.status, answer.body))
    }

    /// Follows a server-sent event stream at `path`, calling `each` with every event's data
    /// until the stream ends or `each` returns false. Returns the status if it is not 200.
    pub async fn events(&self, path: &str, mut each: impl FnMut(&str) -> bool) -> Result<Option<u16>, ApiError> {
        let response = self.send("GET", path, &[("accept", "text/event-stream")], None).await?;
        if response.status() != 200 {
            return Ok(Some(response.status().as_u16()));
        }
        let mut body = response.into_body();
        let mut pending = String::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ApiError::Http(e.to_string()))?;
            let Some(data) = frame.data_ref() else { continue };
            pending.push_str(&String::from_utf8_lossy(data));
            // Events end with a blank line; each `data:` line is one event's data here.
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                let data: Vec<&str> =
                    event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
                if !data.is_empty() && !each(&data.join("\n")) {
                    return Ok(None);
                }
            }
        }
        Ok(None)
    }

    /// Whether a daemon answers.
    pub async fn answers(&self) -> bool {
        matches!(self.request("GET", "/v1/version", None).await, Ok((200, _)))
    }
}

/// Why a typed request to the daemon did not give what it asks for.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached, or HTTP failed.
    #[error(transparent)]
    Transport(#[from] ApiError),
    /// The daemon answered with an error.
    #[error("the daemon answered {status}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Its message (the error body's, or the body itself).
        message: String,
    },
    /// The daemon's answer is not what the API documents.
    #[error("the daemon's answer does not parse: {0}")]
    Answer(#[from] serde_json::Error),
    /// What the daemon sent could not be written where it was asked to go.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// Whether the request was the user's mistake (a 4xx other than 429), not the daemon's or
    /// the network's.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, ClientError::Refused { status, .. } if (400..500).contains(status) && *status != 429)
    }

    fn refused(answer: &Answer) -> ClientError {
        let message = serde_json::from_slice::<crate::types::ErrorBody>(&answer.body)
            .map(|e| e.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&answer.body).into_owned());
        ClientError::Refused { status: answer.status, message }
    }
}

/// `value` as a query parameter.
fn query_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

impl Client {
    /// `method path` with `body` (JSON unless `headers` say otherwise), expecting `expected`.
    async fn expect(
        &self,
        (method, path): (&str, &str),
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
        expected: u16,
    ) -> Result<Answer, ClientError> {
        let mut answer = self.call(method, path, headers, body.clone()).await?;
        // A read the daemon is too busy for now says when to come back (`Retry-After`).
        for _ in 0..RETRIES {
            let wait = answer.retry_after.as_deref().and_then(|s| s.trim().parse::<u64>().ok());
            match wait {
                Some(seconds) if answer.status == 429 && method == "GET" => {
                    tokio::time::sleep(std::time::Duration::from_secs(seconds.clamp(1, 10))).await;
                    answer = self.call(method, path, headers, body.clone()).await?;
                }
                _ => break,
            }
        }
        if answer.status != expected {
            return Err(ClientError::refused(&answer));
        }
        Ok(answer)
    }

    /// `GET /v1/version`.
    pub async fn version(&self) -> Result<crate::types::Version, ClientError> {
        let answer = self.expect(("GET", "/v1/version"), &[], None, 200).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `POST /v1/images/kernel`: a kernel image of Debian's `package` (the newest 6.12 when none).
    pub async fn build_kernel(
        &self,
        request: &crate::types::BuildKernel,
    ) -> Result<crate::types::ImageSummary, ClientError> {
        self.build("/v1/images/kernel", serde_json::to_vec(request)?).await
    }

    /// `POST /v1/images/module`: a driver variant built from patches.
    pub async fn build_module(
        &self,
        request: &crate::types::BuildModule,
    ) -> Result<crate::types::ImageSummary, ClientError> {
        self.build("/v1/images/module", serde_json::to_vec(request)?).await
    }

    /// `POST /v1/images/initramfs`: the agent's initramfs with drivers.
    pub async fn build_initramfs(
        &self,
        request: &crate::types::BuildInitramfs,
    ) -> Result<crate::types::ImageSummary, ClientError> {
        self.build("/v1/images/initramfs", serde_json::to_vec(request)?).await
    }

    async fn build(&self, path: &str, body: Vec<u8>) -> Result<crate::types::ImageSummary, ClientError> {
        let answer = self.expect(("POST", path), &[("content-type", "application/json")], Some(body), 201).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `POST /v1/runs` of a TOML matrix; the run's ID.
    pub async fn submit_run(
        &self,
        matrix: Vec<u8>,
        skip_unrunnable: bool,
        share: Option<&lab::fleet::FleetShard>,
    ) -> Result<String, ClientError> {
        let mut query = Vec::new();
        if skip_unrunnable {
            query.push("skip_unrunnable=true".to_string());
        }
        if let Some(share) = share {
            query.push(format!(
                "shard={}&fleet={}",
                query_value(&share.shard.to_string()),
                query_value(share.fleet.as_str())
            ));
        }
        let path = if query.is_empty() { "/v1/runs".to_string() } else { format!("/v1/runs?{}", query.join("&")) };
        let answer = self.expect(("POST", &path), &[("content-type", "application/toml")], Some(matrix), 201).await?;
        Ok(serde_json::from_slice::<crate::types::Created>(&answer.body)?.id)
    }

    /// `POST /v1/bisects?QUERY` of a TOML matrix (`query`: `metric=...&budget=...`).
    pub async fn submit_bisect(&self, matrix: Vec<u8>, query: &str) -> Result<String, ClientError> {
        let path = format!("/v1/bisects?{query}");
        let answer = self.expect(("POST", &path), &[("content-type", "application/toml")], Some(matrix), 201).await?;
        Ok(serde_json::from_slice::<crate::types::Created>(&answer.body)?.id)
    }

    /// `GET /v1/bisects/{run}`.
    pub async fn bisect_status(&self, run: &str) -> Result<crate::types::BisectStatus, ClientError> {
        let answer = self.expect(("GET", &format!("/v1/bisects/{run}")), &[], None, 200).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `POST /v1/runs/{run}/resume`.
    pub async fn resume_run(&self, run: &str) -> Result<crate::types::RunStatus, ClientError> {
        let answer = self.expect(("POST", &format!("/v1/runs/{run}/resume")), &[], None, 202).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `POST /v1/runs/{run}/cancel`.
    pub async fn cancel_run(&self, run: &str) -> Result<crate::types::RunStatus, ClientError> {
        let answer = self.expect(("POST", &format!("/v1/runs/{run}/cancel")), &[], None, 202).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `GET /v1/runs/{run}`.
    pub async fn run_status(&self, run: &str) -> Result<crate::types::RunStatus, ClientError> {
        let answer = self.expect(("GET", &format!("/v1/runs/{run}")), &[], None, 200).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `GET /v1/runs`.
    pub async fn runs(&self) -> Result<Vec<crate::types::RunStatus>, ClientError> {
        let mut runs = Vec::new();
        let mut path = "/v1/runs?limit=1000".to_string();
        loop {
            let answer = self.expect(("GET", &path), &[], None, 200).await?;
            runs.extend(serde_json::from_slice::<Vec<crate::types::RunStatus>>(&answer.body)?);
            // The next page, as its `Link` names it.
            match answer.link.as_deref().and_then(|l| l.strip_prefix('<')?.split_once('>')).map(|(p, _)| p.to_string())
            {
                Some(next) if next.starts_with("/v1/runs?") => path = next,
                _ => return Ok(runs),
            }
        }
    }

    /// `GET /v1/runs/{run}/report` in the media type `accept`, judged against `baseline`.
    pub async fn report(&self, run: &str, baseline: Option<&str>, accept: &str) -> Result<String, ClientError> {
        let mut path = format!("/v1/runs/{run}/report");
        if let Some(baseline) = baseline {
            path.push_str(&format!("?baseline={}", query_value(baseline)));
        }
        let answer = self.expect(("GET", &path), &[("accept", accept)], None, 200).await?;
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }

    /// Fleet run `fleet`'s report in the format `accept` names, judged against `baseline`.
    pub async fn fleet_report(&self, fleet: &str, baseline: Option<&str>, accept: &str) -> Result<String, ClientError> {
        let mut path = format!("/v1/fleets/{}/report", query_value(fleet));
        if let Some(baseline) = baseline {
            path.push_str(&format!("?baseline={}", query_value(baseline)));
        }
        let answer = self.expect(("GET", &path), &[("accept", accept)], None, 200).await?;
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }

    /// Every record of `run`, page after page (`GET /v1/results` and its `Link` to the next).
    pub async fn records(&self, run: &str) -> Result<Vec<lab::record::Record>, ClientError> {
        let mut records = Vec::new();
        let mut path = Some(format!("/v1/results?run={}", query_value(run)));
        while let Some(page) = path {
            let answer = self.expect(("GET", &page), &[], None, 200).await?;
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

    /// Follows `run`'s events (`GET /v1/runs/{run}/events`), calling `each` with every event
    /// until the stream ends or `each` returns false; events that do not parse are skipped.
    /// When the daemon has no stream to spare (429), the run's state is polled instead, once a
    /// second, and handed over as `state` events until the run ends.
    pub async fn run_events(
        &self,
        run: &str,
        mut each: impl FnMut(crate::types::RunEvent) -> bool,
    ) -> Result<(), ClientError> {
        let refused = self
            .events(&format!("/v1/runs/{run}/events"), |data| match serde_json::from_str(data) {
                Ok(event) => each(event),
                Err(_) => true,
            })
            .await?;
        match refused {
            Some(429) => self.poll_run(run, each).await,
            Some(status) => Err(ClientError::Refused { status, message: "for the run's events".into() }),
            None => Ok(()),
        }
    }

    /// The run's state once a second as `state` events, until it is neither queued nor running.
    async fn poll_run(
        &self,
        run: &str,
        mut each: impl FnMut(crate::types::RunEvent) -> bool,
    ) -> Result<(), ClientError> {
        use crate::types::RunEvent;
        let note = "the daemon has no event stream to spare (429): following the run's state once a second";
        if !each(RunEvent::Note { line: note.into() }) {
            return Ok(());
        }
        loop {
            let answer = self.expect(("GET", &format!("/v1/runs/{}", query_value(run))), &[], None, 200).await?;
            let status: crate::types::RunStatus = serde_json::from_slice(&answer.body)?;
            let ended = status.state.ended();
            if !each(RunEvent::State { status }) || ended {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// `POST /v1/bench/boot`.
    pub async fn bench_boot(
        &self,
        request: &crate::types::BenchBoot,
    ) -> Result<crate::types::BenchBootResult, ClientError> {
        let body = serde_json::to_vec(request)?;
        let answer = self.expect(("POST", "/v1/bench/boot"), &[], Some(body), 200).await?;
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// `GET /v1/database`, written to `to`.
    pub async fn database(&self, to: &Path) -> Result<(), ClientError> {
        let answer = self.expect(("GET", "/v1/database"), &[], None, 200).await?;
        std::fs::write(to, &answer.body).map_err(|source| ClientError::Write { path: to.to_path_buf(), source })
    }
}
