//! A host TAP device as the NIC's wire: frames the guest sends appear on the TAP interface,
//! frames the host sends to it arrive at the guest. The link's carrier follows the interface's
//! administrative state (`ip link set IF down` takes the guest's link down).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use crate::wire::backend::{Backend, FrameSink, FrameSource, Readiness};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
/// The largest frame a TAP device hands over (jumbo MTU plus Ethernet header and VLAN tag).
const MAX_FRAME: usize = 9018 + 4;
/// How often the interface's state is looked at.
const CARRIER_POLL: Duration = Duration::from_millis(200);

/// `struct ifreq` with the flags member of its union.
#[repr(C)]
struct InterfaceRequest {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl InterfaceRequest {
    fn new(name: &str) -> io::Result<Self> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{name}` is not an interface name (1 to 15 bytes)"),
            ));
        }
        let mut request = InterfaceRequest { name: [0; libc::IFNAMSIZ], flags: 0, _pad: [0; 22] };
        request.name[..bytes.len()].copy_from_slice(bytes);
        Ok(request)
    }
}

struct Source {
    file: File,
    buf: Vec<u8>,
    name: String,
    control: OwnedFd,
    last_check: Option<Instant>,
    up: bool,
}

impl FrameSource for Source {
    fn receive(&mut self) -> io::Result<Option<&[u8]>> {
        match self.file.read(&mut self.buf) {
            Ok(n) => Ok(Some(&self.buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // EIO while the interface is down: nothing to read.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn readiness(&self) -> Readiness {
        Readiness::Fd(self.file.as_raw_fd())
    }

    fn lossless(&self) -> bool {
        // Frames wait in the TAP device's queue until the ring has room.
        true
    }

    fn max_frame(&self) -> usize {
        MAX_FRAME
    }

    fn carrier(&mut self) -> bool {
        if self.last_check.is_some_and(|t| t.elapsed() < CARRIER_POLL) {
            return self.up;
        }
        self.last_check = Some(Instant::now());
        if let Ok(mut request) = InterfaceRequest::new(&self.name) {
            // SAFETY: SIOCGIFFLAGS reads the flags of the named interface into `request`, a
            // properly laid out `struct ifreq` that lives across the call.
            let rc = unsafe { libc::ioctl(self.control.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) };
            if rc == 0 {
                self.up = request.flags & libc::IFF_UP as libc::c_short != 0;
            }
        }
        self.up
    }
}

struct Sink(File);

impl FrameSink for Sink {
    fn transmit(&mut self, frame: &[u8]) -> io::Result<()> {
        self.0.write(frame).map(|_| ())
    }
}

/// Attaches to (or creates) TAP interface `name`.
pub fn tap(name: &str) -> io::Result<Backend> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
    let mut request = InterfaceRequest::new(name)?;
    request.flags = IFF_TAP | IFF_NO_PI;
    // SAFETY: TUNSETIFF reads and writes `request`, a properly laid out `struct ifreq`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut request) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("TAP {name}: {e} (it needs CAP_NET_ADMIN, or a TAP the user owns)"),
        ));
    }
    // SAFETY: a fresh datagram socket for interface ioctls; the result is checked.
    let control = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if control < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `control` is a descriptor we just created and nobody else owns.
    let control = unsafe { OwnedFd::from_raw_fd(control) };
    let sink = Sink(file.try_clone()?);
    let source = Source { file, buf: vec![0; MAX_FRAME], name: name.to_string(), control, last_check: None, up: true };
    Ok(Backend { source: Box::new(source), sink: Box::new(sink), description: format!("tap {name}") })
}
