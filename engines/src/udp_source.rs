//! The peer's UDP source: a load for workloads that leave the guest no way to talk while it runs
//! (an XDP program that drops or bounces every frame, a control connection's too). The guest
//! asks for it on a TCP connection before the load, one line each way, and for the count on
//! another after it (busybox's `nc` speaks TCP only):
//!
//! ```text
//! guest -> peer:9000  "send SECONDS PPS PAYLOAD PORT DELAY"   (PPS 0: as fast as it can)
//! peer  -> guest      "sending"            then, DELAY seconds later, the datagrams to the asker's PORT
//! guest -> peer:9000  "sent"                             (waits until the load is over)
//! peer  -> guest      "sent N"                           datagrams of the last load
//! ```
//!
//! It sends only to the address that asked, answers only these words (anything else is
//! answered `error ...` and changes nothing), and bounds every figure, so a hostile guest gets
//! at most a load it could have asked for.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

/// The port it listens on in the peer.
pub const PORT: u16 = 9000;
/// The longest load.
pub const MAX_SECONDS: u64 = 3600;
/// The longest wait before a load.
pub const MAX_DELAY: u64 = 60;
/// The largest payload (a jumbo frame's UDP payload).
pub const MAX_PAYLOAD: usize = 16_000;
/// The highest rate.
pub const MAX_PPS: u64 = 100_000_000;

/// A request it understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Send `payload`-byte datagrams to the asker's `port` for `seconds`, `pps` a second (0: as
    /// fast as the socket takes them), `delay` seconds from now (time for the guest to attach
    /// its program before the load: attaching one under a flood can take a driver's ring
    /// reconfiguration long).
    Send {
        /// How long.
        seconds: u64,
        /// How many a second.
        pps: u64,
        /// Each datagram's payload in bytes.
        payload: usize,
        /// The asker's port to send to.
        port: u16,
        /// Seconds to wait first.
        delay: u64,
    },
    /// How many datagrams the last load sent.
    Sent,
}

/// A request that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(String);

impl std::str::FromStr for Request {
    type Err = BadRequest;

    fn from_str(text: &str) -> Result<Request, BadRequest> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let number = |word: &str, max: u64, what: &str| -> Result<u64, BadRequest> {
            word.parse::<u64>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| BadRequest(format!("{what} must be a number up to {max}")))
        };
        match words.as_slice() {
            ["send", seconds, pps, payload, port, delay] => Ok(Request::Send {
                seconds: number(seconds, MAX_SECONDS, "seconds")?.max(1),
                pps: number(pps, MAX_PPS, "pps")?,
                payload: number(payload, MAX_PAYLOAD as u64, "payload")? as usize,
                port: u16::try_from(number(port, u64::from(u16::MAX), "port")?)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| BadRequest("port must be 1 to 65535".into()))?,
                delay: number(delay, MAX_DELAY, "delay")?,
            }),
            ["sent"] => Ok(Request::Sent),
            _ => Err(BadRequest("say `send SECONDS PPS PAYLOAD PORT DELAY` or `sent`".into())),
        }
    }
}

/// Serves requests on `control` until it fails, sending loads from `source` (the peer's
/// process ends with its namespace).
pub fn serve(control: &TcpListener, source: &UdpSocket) -> std::io::Result<()> {
    let mut sent = 0u64;
    loop {
        let (stream, from) = control.accept()?;
        // One line, soon: a client that says nothing holds no load back for long.
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut line = String::new();
        let read = BufReader::new((&stream).take(256)).read_line(&mut line);
        let reply = |text: String| {
            let _ = (&stream).write_all(text.as_bytes());
        };
        if read.is_err() {
            reply("error no request\n".into());
            continue;
        }
        match line.trim().parse::<Request>() {
            Ok(Request::Send { seconds, pps, payload, port, delay }) => {
                reply("sending\n".into());
                drop(stream);
                std::thread::sleep(Duration::from_secs(delay));
                let to = SocketAddr::new(from.ip(), port);
                sent = send_load(source, to, Duration::from_secs(seconds), pps, payload);
            }
            Ok(Request::Sent) => reply(format!("sent {sent}\n")),
            Err(e) => reply(format!("error {e}\n")),
        }
    }
}

/// Sends `payload`-byte datagrams to `to` for `length` at `pps` a second (0: unpaced); how many
/// the socket took. A send the socket refuses (its buffer full, no route yet) is not counted.
pub fn send_load(socket: &UdpSocket, to: SocketAddr, length: Duration, pps: u64, payload: usize) -> u64 {
    let data = vec![0x5a_u8; payload];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < length {
        if pps > 0 {
            // Paced: the n-th datagram leaves at n / pps seconds.
            let due = Duration::from_secs_f64(sent as f64 / pps as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait.min(Duration::from_millis(10)));
                continue;
            }
        }
        if socket.send_to(&data, to).is_ok() {
            sent += 1;
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    #[test]
    fn requests_are_parsed_strictly_and_bounded() {
        assert_eq!(
            "send 5 1000 18 9 3".parse::<Request>(),
            Ok(Request::Send { seconds: 5, pps: 1000, payload: 18, port: 9, delay: 3 })
        );
        assert_eq!("sent".parse::<Request>(), Ok(Request::Sent));
        for bad in [
            "send 5 1000 18 9",
            "send 99999 0 18 9 0",
            "send 5 0 99999 9 0",
            "send 5 0 18 0 0",
            "send 5 x 18 9 0",
            "send 5 0 18 9 61",
            "",
            "rm -rf",
        ] {
            assert!(bad.parse::<Request>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_guest_asks_for_a_paced_load_and_then_for_its_count() {
        let control = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer_addr = control.local_addr().unwrap();
        let source = UdpSocket::bind("127.0.0.1:0").unwrap();
        std::thread::spawn(move || serve(&control, &source));
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let ask = |text: &str| -> String {
            let mut stream = TcpStream::connect(peer_addr).unwrap();
            stream.write_all(format!("{text}\n").as_bytes()).unwrap();
            let mut answer = String::new();
            BufReader::new(stream).read_line(&mut answer).unwrap();
            answer.trim().to_string()
        };
        assert!(ask("bogus").starts_with("error say `send"));
        assert_eq!(ask("sent"), "sent 0", "no load yet");
        let port = sink.local_addr().unwrap().port();
        assert_eq!(ask(&format!("send 1 200 18 {port} 0")), "sending");
        let mut got = 0;
        let mut buf = [0u8; 64];
        while let Ok(n) = sink.recv(&mut buf) {
            assert_eq!(n, 18);
            got += 1;
        }
        // 200 a second for a second, paced: about 200, all of them here (loopback).
        let said = ask("sent");
        let sent: u64 = said.strip_prefix("sent ").unwrap().parse().unwrap();
        assert!((190..=201).contains(&sent), "{said}");
        assert_eq!(got, sent, "every datagram sent arrived");
    }
}
