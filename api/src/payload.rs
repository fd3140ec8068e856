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
        // A length over the limit is answered at once (a client that declared more than it
        // sends is not waited for); what does come is drained, up to a bound and for a moment,
        // so that a client still writing reads the 413 rather than a reset connection.
        if declared.is_some_and(|n| n > MAX_BODY as u64) {
            tokio::spawn(drain(request.into_body()));
            return Err(too_large());
        }
        // Read it all, keeping up to the limit: a body without a length (chunked) a little
        // over it is read to its end before the answer, so the client sees the 413 rather than
        // a connection reset while it is still writing.
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

/// How long a refused body is drained for.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads and drops `body` until it ends, [`DRAINED`] bytes came, or [`DRAIN_FOR`] passed.
async fn drain(body: axum::body::Body) {
    let mut body = body;
    let mut seen = 0usize;
    let deadline = tokio::time::Instant::now() + DRAIN_FOR;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, body.frame()).await {
        seen += frame.data_ref().map_or(0, |d| d.len());
        if seen > DRAINED {
            break;
        }
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

/// A JSON value none of whose objects names a key twice: serde_json keeps the last of two
/// silently (`"repetitions":1,"repetitions":900` would be 900), where a struct's fields refuse
/// it; a matrix sent as JSON is read through this.
pub struct UniqueKeys(pub serde_json::Value);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("the key {key:?} is given twice")));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(text: &str) -> Result<serde_json::Value, String> {
        serde_json::from_str::<UniqueKeys>(text).map(|u| u.0).map_err(|e| e.to_string())
    }

    #[test]
    fn a_key_given_twice_at_any_depth_is_refused_and_everything_else_reads_as_json() {
        let text = r#"{"name":"m","repetitions":3,"x":[1,-2,2.5,true,null,"s",{"a":{}}]}"#;
        assert_eq!(unique(text).unwrap(), serde_json::from_str::<serde_json::Value>(text).unwrap());
        let twice = unique(r#"{"repetitions":1,"repetitions":900}"#).unwrap_err();
        assert!(twice.contains("the key \"repetitions\" is given twice"), "{twice}");
        assert!(unique(r#"{"variant":[{"name":"a","name":"b"}]}"#).unwrap_err().contains("\"name\" is given twice"));
    }
}
