//! The daemon's listeners, bounded so that no client can starve the others: hyper's HTTP/1
//! server with a header-read timeout and a header size limit on every connection, and a cap on
//! the connections each listener holds open. At the TCP cap, the oldest connection that has not
//! yet sent a request with the token is dropped to make room (someone flooding the port without
//! the token only ever displaces themselves); the Unix socket has a cap of its own, so a flood
//! of the TCP port never reaches it. A request's body has its own deadline ([`crate::payload`]).
//!
//! What hyper answers itself, before the router (a request line or header it cannot parse, a
//! header block over the limit), carries no JSON body: docs/api.md lists those answers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

/// The bounds of one listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request's head must arrive within this long.
    pub header_timeout: Duration,
    /// The most bytes hyper buffers for a request's head.
    pub max_head: usize,
    /// The most connections open at once.
    pub max_connections: usize,
}

/// The daemon's bounds on TCP: 10 s for a request's head, 64 KiB of it, 256 connections.
pub const TCP: Limits = Limits { header_timeout: Duration::from_secs(10), max_head: 64 << 10, max_connections: 256 };
/// The same on the Unix socket, whose clients are the owner's own: 128 connections.
pub const UNIX: Limits = Limits { header_timeout: Duration::from_secs(10), max_head: 64 << 10, max_connections: 128 };

/// Set on a connection once one of its requests passed the token check (a request extension
/// the TCP middleware sets): such a connection is not dropped for room.
#[derive(Debug, Clone, Default)]
pub struct Vouched(Arc<AtomicBool>);

impl Vouched {
    /// Marks the connection as vouched for.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

struct Open {
    id: u64,
    vouched: Vouched,
    drop_it: Arc<Notify>,
}

/// The connections a listener holds open.
#[derive(Default)]
struct Table {
    open: Mutex<Vec<Open>>,
    next: AtomicU64,
}

impl Table {
    /// Room for one more connection: `Some` with its entry, after dropping the oldest connection
    /// nobody vouched for if the table is full; `None` if every open connection is vouched for.
    fn admit(&self, max: usize) -> Option<(u64, Vouched, Arc<Notify>)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= max {
            let oldest = open.iter().position(|c| !c.vouched.get())?;
            let evicted = open.remove(oldest);
            evicted.drop_it.notify_one();
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (vouched, drop_it) = (Vouched::default(), Arc::new(Notify::new()));
        open.push(Open { id, vouched: vouched.clone(), drop_it: drop_it.clone() });
        Some((id, vouched, drop_it))
    }

    fn close(&self, id: u64) {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.id != id);
    }
}

/// Accepts connections from `accept` and serves `app` on each within `limits`, until `stop` says
/// so; then lets the requests in flight finish.
pub async fn serve<S, F>(mut accept: impl FnMut() -> F, app: Router, limits: Limits, stop: watch::Receiver<bool>)
where
    F: std::future::Future<Output = std::io::Result<S>>,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let table = Arc::new(Table::default());
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = stopping(stop.clone()) => break,
            accepted = accept() => accepted,
        };
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors or the like: say so and give the others a moment.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((id, vouched, drop_it)) = table.admit(limits.max_connections) else {
            // Full of clients that gave the token: this one waits its turn outside.
            drop(stream);
            continue;
        };
        let (app, table, stop) = (app.clone(), table.clone(), stop.clone());
        tasks.spawn(async move {
            let service =
                TowerToHyperService::new(tower::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(vouched.clone());
                    app.clone().oneshot(request.map(axum::body::Body::new))
                }));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(limits.max_head.max(8192))
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = drop_it.notified() => {}
                _ = stopping(stop) => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            table.close(id);
        });
        // Reap what has ended, so the set does not grow with every connection.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Resolves once `stop` says so.
async fn stopping(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_drops_the_oldest_unvouched_connection_first() {
        let table = Table::default();
        let (a, a_vouched, a_drop) = table.admit(3).unwrap();
        let (_b, _, b_drop) = table.admit(3).unwrap();
        let (_c, _, _) = table.admit(3).unwrap();
        a_vouched.set();
        // Full: the oldest nobody vouched for (b) makes room, a stays.
        let (d, d_vouched, _) = table.admit(3).unwrap();
        assert!(futures_util::FutureExt::now_or_never(b_drop.notified()).is_some(), "b was told to go");
        assert!(futures_util::FutureExt::now_or_never(a_drop.notified()).is_none(), "a stays");
        d_vouched.set();
        let (e, e_vouched, _) = table.admit(3).unwrap();
        e_vouched.set();
        assert!(table.admit(3).is_none(), "every connection vouched for: the new one waits outside");
        table.close(a);
        table.close(d);
        table.close(e);
        assert!(table.admit(3).is_some());
    }
}
