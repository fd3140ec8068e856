//! Answers written while they are made: a producer on tokio's blocking pool writes into a
//! channel of a few chunks, and the response body sends them as they come, so that an answer's
//! memory is those chunks however long it is. A producer that fails after its first bytes ends
//! the body early: the client sees a cut answer (and its connection closed), never a complete
//! one that is wrong.

use std::io::{self, Write};

use axum::body::{Body, Bytes};
use tokio::sync::mpsc;

/// How much is written before a chunk goes.
const CHUNK: usize = 64 << 10;
/// Chunks on their way to the client at most: the producer waits past them.
const IN_FLIGHT: usize = 4;

/// Where a producer writes its answer.
pub struct ChunkWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() { Ok(()) } else { self.send() }
    }
}

/// A body that `produce` writes; `hold` (an admission permit) lives until it is done.
pub fn body<H, P>(hold: H, produce: P) -> Body
where
    H: Send + 'static,
    P: FnOnce(&mut ChunkWriter) -> io::Result<()> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel(IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let _hold = hold;
        let mut out = ChunkWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
        match produce(&mut out).and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            Err(e) => {
                tracing::warn!("an answer cut short: {e}");
                let _ = tx.blocking_send(Err(e));
            }
        }
    });
    Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_body_is_what_the_producer_wrote_in_chunks_and_a_failure_cuts_it() {
        let whole = body((), |out| {
            for i in 0..20_000u32 {
                writeln!(out, "line {i}")?;
            }
            Ok(())
        });
        let bytes = whole.collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert_eq!(text.lines().count(), 20_000);
        assert!(text.ends_with("line 19999\n"));
        let cut = body((), |out| {
            out.write_all(&[b'x'; CHUNK + 1])?;
            Err(io::Error::other("the database went away"))
        });
        assert!(cut.collect().await.is_err(), "a failed producer's body ends in an error");
    }
}
