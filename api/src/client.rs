//! A client for the API over its Unix socket.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

use crate::ApiError;

/// Talks to a driverlab server.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client for the server on `socket`.
    pub fn new(socket: impl AsRef<Path>) -> Client {
        Client { socket: socket.as_ref().to_path_buf() }
    }

    /// Sends one request; returns the status and the body.
    pub async fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>), ApiError> {
        let http = |e: &dyn std::fmt::Display| ApiError::Http(e.to_string());
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ApiError::Socket { path: self.socket.clone(), source })?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| http(&e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("API connection ended: {e}");
            }
        });
        let mut request = Request::builder().method(method).uri(path).header("host", "driverlab");
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| http(&e))?;
        let response = sender.send_request(request).await.map_err(|e| http(&e))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| http(&e))?.to_bytes();
        Ok((status, body.to_vec()))
    }
}
