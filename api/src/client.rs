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
}

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
        let link = header("link");
        let body = response.into_body().collect().await.map_err(|e| ApiError::Http(e.to_string()))?.to_bytes();
        Ok(Answer { status, content_type, body: body.to_vec(), link })
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
