//! Request bodies: read up to a limit, parsed into the endpoint's type, every failure a JSON
//! error (axum's own extractors answer in plain text).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// The largest body a request may have.
pub const MAX_BODY: usize = 1 << 20;

/// How long a request's body may take to arrive, from when the handler starts reading it.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How much of a body over [`MAX_BODY`] is still read (and dropped) so the client gets its 413.
const DRAINED: usize = 16 << 20;

/// A request's body and its content type.
pub struct Payload {
    /// The bytes.
    pub bytes: Bytes,
    /// The `Content-Type`, without parameters, lower case.
    pub content_type: String,
}

impl<S: Send + Sync> FromRequest<S> for Payload {
    type Rejection = Problem;

    async fn from_request(request: Request, _state: &S) -> Result<Payload, Problem> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
            .unwrap_or_default();
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let too_large = || Problem::too_large(format!("the body is over {MAX_BODY} bytes"));
        if declared.is_some_and(|n| n > DRAINED as u64) {
            return Err(too_large());
        }
        // Read it all, keeping up to the limit: a body a little over it is read to its end
        // before the answer, so the client sees the 413 rather than a connection reset while
        // it is still writing.
        let mut body = request.into_body();
        let mut kept = Vec::new();
        let mut seen = 0usize;
        let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    return Err(Problem::timeout(format!(
                        "the body did not arrive within {} s",
                        BODY_TIMEOUT.as_secs()
                    )));
                }
            };
            let frame = frame.map_err(|e| Problem::bad_request(format!("reading the body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            seen += data.len();
            if seen > DRAINED {
                return Err(too_large());
            }
            if seen <= MAX_BODY {
                kept.extend_from_slice(&data);
            }
        }
        if seen > MAX_BODY {
            return Err(too_large());
        }
        let bytes = Bytes::from(kept);
        Ok(Payload { bytes, content_type })
    }
}

impl Payload {
    /// The body as JSON of type `T` (an empty body as `{}` for types that allow it).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Problem> {
        if !self.content_type.is_empty() && self.content_type != "application/json" {
            return Err(Problem::unsupported_media_type(format!(
                "a {:?} body; this endpoint takes application/json",
                self.content_type
            )));
        }
        let bytes: &[u8] = if self.bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &self.bytes };
        // Every body is an object: serde would take `["probe"]` for a struct's fields in order.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(Problem::bad_request("invalid request body: give a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                Problem::bad_request(format!("invalid request body: {inner}"))
            } else {
                Problem::bad_request(format!("invalid request body at {path}: {inner}"))
            }
        })?;
        de.end().map_err(|e| Problem::bad_request(format!("invalid request body: {e}")))?;
        Ok(value)
    }
}
