//! Error responses: a status, a stable code and a message, always as JSON.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::types::ErrorBody;

/// An error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// The code in the body.
    pub code: &'static str,
    /// The message in the body.
    pub message: String,
    /// Seconds after which a refused request may be tried again (`Retry-After`, with 429).
    pub retry_after_s: Option<u32>,
}

impl Problem {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Problem {
        Problem { status, code, message: message.into(), retry_after_s: None }
    }

    /// The same, saying when to try again (`Retry-After`).
    pub fn retry_after(self, seconds: u32) -> Problem {
        Problem { retry_after_s: Some(seconds), ..self }
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401: no or a wrong token.
    pub fn unauthorized(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 403: not allowed over this transport.
    pub fn forbidden(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404: no such thing.
    pub fn not_found(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 405: the path has no such method.
    pub fn method_not_allowed(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message)
    }

    /// 408: the request's body did not arrive in time.
    pub fn timeout(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::REQUEST_TIMEOUT, "timeout", message)
    }

    /// 409: the thing's state does not allow it.
    pub fn conflict(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 413: the body is too large.
    pub fn too_large(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    /// 431: the request's head (its target and header fields) is over the limit.
    pub fn head_too_large(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "head_too_large", message)
    }

    /// 415: a body of a type the endpoint does not take.
    pub fn unsupported_media_type(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
    }

    /// 406: no representation the client accepts.
    pub fn not_acceptable(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_ACCEPTABLE, "not_acceptable", message)
    }

    /// 422: well-formed, but refused (a matrix that does not check out, a cell this host cannot
    /// run, an image that does not exist).
    pub fn unprocessable(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", message)
    }

    /// 429: the daemon has as much of this as it takes.
    pub fn busy(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::TOO_MANY_REQUESTS, "busy", message)
    }

    /// 507: the daemon's disk is too full to take the work.
    pub fn insufficient_storage(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage", message)
    }

    /// 500: the daemon failed (its database, its host).
    pub fn internal(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, Json(ErrorBody { code: self.code.into(), message: self.message })).into_response();
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<lab::results_db::ResultsDbError> for Problem {
    fn from(e: lab::results_db::ResultsDbError) -> Problem {
        match e {
            lab::results_db::ResultsDbError::NoRun(run) => Problem::not_found(format!("no run {run:?} (GET /v1/runs)")),
            e => Problem::internal(e.to_string()),
        }
    }
}

impl From<lab::run::RunError> for Problem {
    fn from(e: lab::run::RunError) -> Problem {
        match e {
            lab::run::RunError::ResultsDb(e) => e.into(),
            lab::run::RunError::NotResumable { .. } | lab::run::RunError::ShardTaken { .. } => {
                Problem::conflict(e.to_string())
            }
            lab::run::RunError::NoBaseline { .. } => Problem::bad_request(e.to_string()),
            e if e.is_bad_input() => Problem::unprocessable(e.to_string()),
            e => Problem::internal(e.to_string()),
        }
    }
}

impl From<guest_images::store::ImageError> for Problem {
    fn from(e: guest_images::store::ImageError) -> Problem {
        match e {
            guest_images::store::ImageError::NoImage(id) => {
                Problem::not_found(format!("no image {id:?} (GET /v1/images)"))
            }
            e if e.is_bad_input() => Problem::unprocessable(e.to_string()),
            e => Problem::internal(e.to_string()),
        }
    }
}

/// Runs blocking work (the database, processes) off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Problem::internal(format!("a task failed: {e}")))?
}
