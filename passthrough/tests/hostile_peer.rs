//! vfio-user servers that misbehave: every one ends the device's use with an error naming the
//! problem, never a panic or a hang.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use passthrough::backend::{BackendError, GuestRamMap, VfioBackend};
use passthrough::vfio_user::VfioUserClient;

const TIMEOUT: Duration = Duration::from_millis(300);

struct Request {
    id: u16,
    command: u16,
    body: Vec<u8>,
}

fn read_request(stream: &mut UnixStream) -> Option<Request> {
    let mut header = [0u8; 16];
    stream.read_exact(&mut header).ok()?;
    let size = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
    let mut body = vec![0u8; size.saturating_sub(16)];
    stream.read_exact(&mut body).ok()?;
    Some(Request {
        id: u16::from_le_bytes([header[0], header[1]]),
        command: u16::from_le_bytes([header[2], header[3]]),
        body,
    })
}

fn reply(stream: &mut UnixStream, id: u16, command: u16, payload: &[u8]) {
    reply_raw(stream, id, command, 1, (16 + payload.len()) as u32, payload);
}

fn reply_raw(stream: &mut UnixStream, id: u16, command: u16, flags: u32, size: u32, payload: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&command.to_le_bytes());
    m.extend_from_slice(&size.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(payload);
    let _ = stream.write_all(&m);
}

/// Answers like a tiny well-behaved device (10 regions, config space of 256 bytes) until `stop`
/// says to misbehave on a request; then `misbehave` takes over.
fn serve(
    stop: impl Fn(&Request) -> bool + Send + 'static,
    misbehave: impl FnOnce(&mut UnixStream, Request) + Send + 'static,
) -> (PathBuf, JoinHandle<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut misbehave = Some(misbehave);
        while let Some(request) = read_request(&mut stream) {
            if stop(&request) {
                if let Some(f) = misbehave.take() {
                    f(&mut stream, request);
                }
                return;
            }
            match request.command {
                1 => {
                    let mut payload = vec![0, 0, 1, 0];
                    payload.extend_from_slice(b"{}\0");
                    reply(&mut stream, request.id, 1, &payload);
                }
                4 => {
                    let mut payload = [0u8; 16];
                    payload[0..4].copy_from_slice(&16u32.to_le_bytes());
                    payload[4..8].copy_from_slice(&3u32.to_le_bytes()); // PCI | RESET
                    payload[8..12].copy_from_slice(&10u32.to_le_bytes());
                    payload[12..16].copy_from_slice(&3u32.to_le_bytes());
                    reply(&mut stream, request.id, 4, &payload);
                }
                5 => {
                    let index = u32::from_le_bytes(request.body[8..12].try_into().unwrap());
                    let mut payload = [0u8; 32];
                    payload[0..4].copy_from_slice(&32u32.to_le_bytes());
                    payload[4..8].copy_from_slice(&3u32.to_le_bytes());
                    payload[8..12].copy_from_slice(&index.to_le_bytes());
                    let size: u64 = if index == 7 { 256 } else { 0 };
                    payload[16..24].copy_from_slice(&size.to_le_bytes());
                    reply(&mut stream, request.id, 5, &payload);
                }
                9 => {
                    let count = u32::from_le_bytes(request.body[12..16].try_into().unwrap()) as usize;
                    let mut payload = request.body[..16].to_vec();
                    payload.extend(std::iter::repeat_n(0xab, count));
                    reply(&mut stream, request.id, 9, &payload);
                }
                command => reply(&mut stream, request.id, command, &request.body),
            }
        }
    });
    (path, handle, dir)
}

fn connect(path: &std::path::Path) -> Result<VfioUserClient, BackendError> {
    VfioUserClient::connect(path, GuestRamMap::default(), TIMEOUT)
}

fn broken_with(result: Result<VfioUserClient, BackendError>, needle: &str) {
    match result {
        Err(BackendError::Broken(message)) => assert!(message.contains(needle), "{message:?} lacks {needle:?}"),
        Err(other) => panic!("expected a broken connection, got {other}"),
        Ok(_) => panic!("a hostile peer was accepted"),
    }
}

#[test]
fn a_well_behaved_peer_works_and_reads_are_checked() {
    let (path, server, _dir) = serve(|_| false, |_, _| {});
    let mut client = connect(&path).unwrap();
    let mut data = [0u8; 4];
    client.read(7, 0, &mut data).unwrap();
    assert_eq!(data, [0xab; 4]);
    assert!(matches!(client.read(7, 254, &mut data), Err(BackendError::Invalid(_))), "past the region");
    assert!(matches!(client.read(42, 0, &mut data), Err(BackendError::Invalid(_))), "no such region");
    drop(client);
    server.join().unwrap();
}

#[test]
fn peer_that_hangs_up_at_once() {
    let (path, server, _dir) = serve(|r| r.command == 1, |_, _| {});
    broken_with(connect(&path), "closed the connection");
    server.join().unwrap();
}

#[test]
fn peer_that_never_answers_times_out() {
    let (path, server, _dir) = serve(
        |r| r.command == 4,
        |stream, _| std::thread::sleep(TIMEOUT * 4 + stream.read_timeout().unwrap().unwrap_or_default()),
    );
    let start = Instant::now();
    broken_with(connect(&path), "DEVICE_GET_INFO: no reply");
    assert!(start.elapsed() < TIMEOUT * 3, "gave up after the timeout");
    server.join().unwrap();
}

#[test]
fn peer_with_the_wrong_message_id() {
    let (path, server, _dir) = serve(|r| r.command == 4, |s, r| reply(s, r.id.wrapping_add(7), 4, &[0; 16]));
    broken_with(connect(&path), "expected the reply to message");
    server.join().unwrap();
}

#[test]
fn peer_that_claims_a_huge_reply() {
    let (path, server, _dir) = serve(|r| r.command == 4, |s, r| reply_raw(s, r.id, 4, 1, u32::MAX, &[0; 16]));
    broken_with(connect(&path), "claims 4294967295 bytes");
    server.join().unwrap();
}

#[test]
fn peer_that_truncates_its_reply() {
    let (path, server, _dir) = serve(|r| r.command == 4, |s, r| reply_raw(s, r.id, 4, 1, 32, &[0; 4]));
    broken_with(connect(&path), "truncated reply");
    server.join().unwrap();
}

#[test]
fn peer_with_implausible_device_info() {
    let mut payload = [0u8; 16];
    payload[4..8].copy_from_slice(&2u32.to_le_bytes());
    payload[8..12].copy_from_slice(&100_000u32.to_le_bytes());
    let (path, server, _dir) = serve(|r| r.command == 4, move |s, r| reply(s, r.id, 4, &payload));
    broken_with(connect(&path), "implausible device");
    server.join().unwrap();
}

#[test]
fn peer_that_answers_with_another_region() {
    let (path, server, _dir) = serve(
        |r| r.command == 5,
        |s, r| {
            let mut payload = [0u8; 32];
            payload[0..4].copy_from_slice(&32u32.to_le_bytes());
            payload[8..12].copy_from_slice(&9u32.to_le_bytes());
            reply(s, r.id, 5, &payload);
        },
    );
    broken_with(connect(&path), "asked for region 0, got region 9");
    server.join().unwrap();
}

#[test]
fn peer_that_refuses_is_an_error_not_a_broken_link() {
    let (path, server, _dir) = serve(|r| r.command == 13, |s, r| reply_raw(s, r.id, 13, 1 | 1 << 5, 16, &[]));
    let mut client = connect(&path).unwrap();
    assert!(matches!(client.reset(), Err(BackendError::Refused { what: "DEVICE_RESET", .. })));
    server.join().unwrap();
}

#[test]
fn peer_that_leaves_mid_run() {
    let (path, server, _dir) = serve(|r| r.command == 9, |_, _| {});
    let mut client = connect(&path).unwrap();
    let mut data = [0u8; 4];
    assert!(matches!(client.read(7, 0, &mut data), Err(BackendError::Broken(_))));
    // Once broken, always broken: no further traffic, the same error.
    match client.read(7, 0, &mut data) {
        Err(BackendError::Broken(message)) => assert!(message.contains("REGION_READ"), "{message}"),
        other => panic!("{other:?}"),
    }
    server.join().unwrap();
}

#[test]
fn peer_that_sends_a_short_read() {
    let (path, server, _dir) = serve(
        |r| r.command == 9,
        |s, r| {
            let mut payload = r.body[..16].to_vec();
            payload.push(1);
            reply(s, r.id, 9, &payload);
        },
    );
    let mut client = connect(&path).unwrap();
    let mut data = [0u8; 4];
    match client.read(7, 0, &mut data) {
        Err(BackendError::Broken(message)) => assert!(message.contains("1 bytes back for 4 asked"), "{message}"),
        other => panic!("{other:?}"),
    }
    server.join().unwrap();
}
