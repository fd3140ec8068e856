//! Who may ask: anyone who can open the Unix socket (the owner: it is created 0600), and over
//! TCP whoever presents the bearer token. Requests over TCP are remote: they may not register
//! devices that name host resources.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::problem::Problem;

/// How a request arrived, as handlers see it (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The Unix socket: the daemon's owner.
    Unix,
    /// TCP, with the token: a remote client.
    Tcp,
}

/// The shortest token `--token-file` accepts.
pub const MIN_TOKEN_LEN: usize = 16;

/// Reads the token from `path`: its first line, at least [`MIN_TOKEN_LEN`] bytes. The error
/// never quotes the file.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "token file {}: its first line must be a token of at least {MIN_TOKEN_LEN} characters \
             (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
            path.display()
        ));
    }
    Ok(token)
}

/// Marks requests over the Unix socket.
pub async fn unix(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Transport::Unix);
    next.run(request).await
}

/// Lets a TCP request through only with `Authorization: Bearer TOKEN`, compared in constant time.
pub async fn tcp(token: Arc<String>, mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or_default();
    let ok: bool = given.as_bytes().ct_eq(token.as_bytes()).into();
    if !ok {
        let mut response =
            Problem::unauthorized("this listener needs `Authorization: Bearer TOKEN` (the daemon's --token-file)")
                .into_response();
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    request.extensions_mut().insert(Transport::Tcp);
    // The connection gave the token: it is not dropped to make room for others.
    if let Some(vouched) = request.extensions().get::<crate::listeners::Vouched>() {
        vouched.set();
    }
    next.run(request).await
}

/// The token of an `Authorization` value with the Bearer scheme, whose name is
/// case-insensitive (RFC 9110 §11.1; RFC 6750 §2.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_named_in_any_case() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "Bearer  abc"] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearerabc", "abc", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }

    #[test]
    fn a_token_file_needs_a_long_first_line_and_its_errors_never_quote_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "short-secret\n").unwrap();
        let err = read_token(&path).unwrap_err();
        assert!(err.contains("at least 16") && !err.contains("short-secret"), "{err}");
        std::fs::write(&path, "0123456789abcdef0123\nignored\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "0123456789abcdef0123");
        assert!(read_token(&dir.path().join("none")).is_err());
    }
}
