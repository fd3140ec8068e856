//! Which daemon a `lab` command goes through, if any: its Unix socket (when one answers there)
//! or its URL with a token; a typed client for it.

use std::path::PathBuf;

use anyhow::Context;
use api::client::{Client, ClientError};
use clap::Args;

use crate::cli::CodedError;

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
            return match runtime()?.block_on(client.version()) {
                Ok(_) => Ok(Some(client)),
                Err(ClientError::Transport(e)) => {
                    Err(CodedError { message: format!("no driverlab daemon answers at {url}: {e}"), code: 1 }.into())
                }
                Err(e) => Err(coded(e)),
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

/// A runtime for the client's requests.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

/// A client's error as the CLI's error: 2 for the user's mistakes, 1 otherwise.
pub fn coded(e: ClientError) -> anyhow::Error {
    let code = if e.is_bad_request() { 2 } else { 1 };
    CodedError { message: e.to_string(), code }.into()
}
