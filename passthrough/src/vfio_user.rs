//! A vfio-user client (protocol 0.1, libvfio-user's `docs/vfio-user.rst`): a device served by
//! another process over a Unix socket.
//!
//! The peer is not trusted: every reply is checked (type, message ID, command, size, error flag),
//! reads time out, sizes are bounded, and the first protocol violation breaks the connection for
//! good; the error names what went wrong. Guest RAM is shared with the server by memfd, so DMA
//! never passes through this process.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::backend::{BackendError, GuestRamMap, RegionInfo, VfioBackend, region};

const HEADER_SIZE: usize = 16;
/// Largest reply accepted (a region read of 1 MiB plus its header).
const MAX_MESSAGE: usize = (1 << 20) + 64;
/// Largest region-info reply accepted (room for capabilities).
const MAX_REGION_INFO: u32 = 4096;
/// Most regions and interrupt indices a device may report.
const MAX_REGIONS: u32 = 64;
const MAX_IRQ_INDICES: u32 = 16;
/// Most vectors accepted for one interrupt index (the PCI MSI-X limit).
const MAX_VECTORS: u32 = 2048;
/// How long a reply may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const CMD_VERSION: u16 = 1;
const CMD_DMA_MAP: u16 = 2;
const CMD_DMA_UNMAP: u16 = 3;
const CMD_DEVICE_GET_INFO: u16 = 4;
const CMD_DEVICE_GET_REGION_INFO: u16 = 5;
const CMD_DEVICE_GET_IRQ_INFO: u16 = 7;
const CMD_DEVICE_SET_IRQS: u16 = 8;
const CMD_REGION_READ: u16 = 9;
const CMD_REGION_WRITE: u16 = 10;
const CMD_DEVICE_RESET: u16 = 13;

const FLAG_TYPE_MASK: u32 = 0xf;
const FLAG_REPLY: u32 = 1;
const FLAG_ERROR: u32 = 1 << 5;

const DEVICE_FLAGS_RESET: u32 = 1 << 0;
const DEVICE_FLAGS_PCI: u32 = 1 << 1;
const REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;
const DMA_FLAG_READ: u32 = 1 << 0;
const DMA_FLAG_WRITE: u32 = 1 << 1;
const IRQ_SET_DATA_NONE: u32 = 1 << 0;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("checked length"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("checked length"))
}

/// A device served over vfio-user.
pub struct VfioUserClient {
    name: String,
    stream: UnixStream,
    next_id: u16,
    regions: Vec<RegionInfo>,
    num_irqs: u32,
    resettable: bool,
    ram: GuestRamMap,
    broken: Option<String>,
}

impl VfioUserClient {
    /// Connects to the server on `socket`, negotiates the version and reads the device's
    /// regions. `ram` is the guest memory that DMA maps refer to.
    pub fn connect(socket: &Path, ram: GuestRamMap, timeout: Duration) -> Result<Self, BackendError> {
        let name = format!("vfio-user {}", socket.display());
        match std::fs::metadata(socket) {
            Err(e) => return Err(BackendError::NotFound(format!("{name}: {e} (start the server first)"))),
            Ok(m) if !std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                return Err(BackendError::NotFound(format!("{name}: not a Unix socket")));
            }
            Ok(_) => {}
        }
        let stream = UnixStream::connect(socket)
            .map_err(|e| BackendError::Broken(format!("{name}: cannot connect: {e} (is the server running?)")))?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| BackendError::Host(format!("{name}: {e}")))?;
        stream.set_write_timeout(Some(timeout)).map_err(|e| BackendError::Host(format!("{name}: {e}")))?;
        let mut client = VfioUserClient {
            name,
            stream,
            next_id: 0,
            regions: Vec::new(),
            num_irqs: 0,
            resettable: false,
            ram,
            broken: None,
        };
        client.negotiate_version()?;
        client.read_device_info()?;
        Ok(client)
    }

    /// Whether the device says it can be reset.
    pub fn resettable(&self) -> bool {
        self.resettable
    }

    fn broken(&mut self, why: String) -> BackendError {
        let message = format!("{}: {why}", self.name);
        tracing::warn!("{message}; the device is no longer used");
        self.broken = Some(message.clone());
        BackendError::Broken(message)
    }

    fn check_usable(&self) -> Result<(), BackendError> {
        match &self.broken {
            Some(why) => Err(BackendError::Broken(why.clone())),
            None => Ok(()),
        }
    }

    /// Sends one command and returns the reply payload (and a file descriptor, if one came).
    fn transact(
        &mut self,
        command: u16,
        body: &[u8],
        fds: &[RawFd],
        what: &'static str,
    ) -> Result<(Vec<u8>, Option<File>), BackendError> {
        self.check_usable()?;
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mut message = Vec::with_capacity(HEADER_SIZE + body.len());
        message.extend_from_slice(&id.to_le_bytes());
        message.extend_from_slice(&command.to_le_bytes());
        message.extend_from_slice(&((HEADER_SIZE + body.len()) as u32).to_le_bytes());
        message.extend_from_slice(&0u32.to_le_bytes()); // flags: command
        message.extend_from_slice(&0u32.to_le_bytes()); // error
        message.extend_from_slice(body);
        let sent = if fds.is_empty() {
            self.stream.write_all(&message).map_err(|e| e.to_string())
        } else {
            match self.stream.send_with_fds(&[&message[..]], fds) {
                Ok(n) if n == message.len() => Ok(()),
                Ok(n) => Err(format!("sent {n} of {} bytes", message.len())),
                Err(e) => Err(e.to_string()),
            }
        };
        if let Err(e) = sent {
            return Err(self.broken(format!("{what}: sending failed: {e}")));
        }

        let mut header = [0u8; HEADER_SIZE];
        let (first, file) = match self.stream.recv_with_fd(&mut header) {
            Ok(got) => got,
            Err(e) => return Err(self.broken(format!("{what}: no reply: {e}"))),
        };
        if first == 0 {
            return Err(self.broken(format!("{what}: the server closed the connection")));
        }
        if let Err(e) = self.stream.read_exact(&mut header[first..]) {
            return Err(self.broken(format!("{what}: truncated reply header: {e}")));
        }
        let (reply_id, reply_command) =
            (u16::from_le_bytes([header[0], header[1]]), u16::from_le_bytes([header[2], header[3]]));
        let (size, flags, error) = (le32(&header, 4) as usize, le32(&header, 8), le32(&header, 12));
        if flags & FLAG_TYPE_MASK != FLAG_REPLY || reply_id != id || reply_command != command {
            return Err(self.broken(format!(
                "{what}: expected the reply to message {id} (command {command}), got type {} message {reply_id} command {reply_command}",
                flags & FLAG_TYPE_MASK
            )));
        }
        if !(HEADER_SIZE..=MAX_MESSAGE).contains(&size) {
            return Err(self.broken(format!("{what}: reply claims {size} bytes")));
        }
        let mut payload = vec![0u8; size - HEADER_SIZE];
        if let Err(e) = self.stream.read_exact(&mut payload) {
            return Err(self.broken(format!("{what}: truncated reply ({} bytes expected): {e}", payload.len())));
        }
        if flags & FLAG_ERROR != 0 {
            return Err(BackendError::Refused { what, errno: error as i32 });
        }
        Ok((payload, file))
    }

    fn negotiate_version(&mut self) -> Result<(), BackendError> {
        let mut body = Vec::new();
        body.extend_from_slice(&0u16.to_le_bytes()); // major
        body.extend_from_slice(&1u16.to_le_bytes()); // minor
        body.extend_from_slice(br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576}}"#);
        body.push(0);
        let (reply, _) = self.transact(CMD_VERSION, &body, &[], "VERSION")?;
        if reply.len() < 4 {
            return Err(self.broken(format!("VERSION: reply of {} bytes", reply.len())));
        }
        let major = u16::from_le_bytes([reply[0], reply[1]]);
        if major != 0 {
            return Err(self.broken(format!("VERSION: the server speaks protocol {major}.x, this client 0.x")));
        }
        Ok(())
    }

    fn read_device_info(&mut self) -> Result<(), BackendError> {
        let mut body = [0u8; 16];
        body[0..4].copy_from_slice(&16u32.to_le_bytes());
        let (reply, _) = self.transact(CMD_DEVICE_GET_INFO, &body, &[], "DEVICE_GET_INFO")?;
        if reply.len() < 16 {
            return Err(self.broken(format!("DEVICE_GET_INFO: reply of {} bytes", reply.len())));
        }
        let (flags, num_regions, num_irqs) = (le32(&reply, 4), le32(&reply, 8), le32(&reply, 12));
        if flags & DEVICE_FLAGS_PCI == 0 {
            return Err(self.broken("not a PCI device".into()));
        }
        if num_regions > MAX_REGIONS || num_irqs > MAX_IRQ_INDICES || num_regions <= region::CONFIG {
            return Err(self.broken(format!("implausible device: {num_regions} regions, {num_irqs} interrupt indices")));
        }
        self.resettable = flags & DEVICE_FLAGS_RESET != 0;
        self.num_irqs = num_irqs;
        for index in 0..num_regions {
            let info = self.region_info(index)?;
            self.regions.push(info);
        }
        Ok(())
    }

    fn region_info_request(&mut self, index: u32, argsz: u32) -> Result<(Vec<u8>, Option<File>), BackendError> {
        let mut body = [0u8; 32];
        body[0..4].copy_from_slice(&argsz.to_le_bytes());
        body[8..12].copy_from_slice(&index.to_le_bytes());
        let (reply, file) = self.transact(CMD_DEVICE_GET_REGION_INFO, &body, &[], "DEVICE_GET_REGION_INFO")?;
        if reply.len() < 32 {
            return Err(self.broken(format!("DEVICE_GET_REGION_INFO {index}: reply of {} bytes", reply.len())));
        }
        Ok((reply, file))
    }

    fn region_info(&mut self, index: u32) -> Result<RegionInfo, BackendError> {
        let (mut reply, mut file) = self.region_info_request(index, 32)?;
        let wanted = le32(&reply, 0);
        if wanted > 32 {
            if wanted > MAX_REGION_INFO {
                return Err(self.broken(format!("region {index}: {wanted} bytes of region information")));
            }
            (reply, file) = self.region_info_request(index, wanted)?;
        }
        let (flags, reply_index, cap_offset, size, offset) =
            (le32(&reply, 4), le32(&reply, 8), le32(&reply, 12) as usize, le64(&reply, 16), le64(&reply, 24));
        if reply_index != index {
            return Err(self.broken(format!("asked for region {index}, got region {reply_index}")));
        }
        if size > 1 << 40 {
            return Err(self.broken(format!("region {index} claims {size} bytes")));
        }
        let sparse = if cap_offset != 0 {
            match parse_sparse_areas(&reply, cap_offset, size) {
                Ok(areas) => areas,
                Err(why) => return Err(self.broken(format!("region {index}: {why}"))),
            }
        } else {
            Vec::new()
        };
        let mmap = if flags & region::FLAG_MMAP != 0 { file.map(|f| (f, offset)) } else { None };
        Ok(RegionInfo { index, flags, size, mmap, sparse })
    }

    fn set_irqs(&mut self, index: u32, flags: u32, fds: &[RawFd], count: u32) -> Result<(), BackendError> {
        let mut body = [0u8; 20];
        body[0..4].copy_from_slice(&20u32.to_le_bytes());
        body[4..8].copy_from_slice(&flags.to_le_bytes());
        body[8..12].copy_from_slice(&index.to_le_bytes());
        body[16..20].copy_from_slice(&count.to_le_bytes());
        self.transact(CMD_DEVICE_SET_IRQS, &body, fds, "DEVICE_SET_IRQS").map(|_| ())
    }

    fn check_access(&self, index: u32, offset: u64, len: usize) -> Result<(), BackendError> {
        let region =
            self.regions.get(index as usize).ok_or_else(|| BackendError::Invalid(format!("no region {index}")))?;
        if offset.checked_add(len as u64).is_none_or(|end| end > region.size) || len > MAX_MESSAGE - 64 {
            return Err(BackendError::Invalid(format!(
                "region {index}: {len} bytes at {offset:#x} past its {} bytes",
                region.size
            )));
        }
        Ok(())
    }
}

/// Walks the capability chain of a region-info reply for sparse mmap areas.
fn parse_sparse_areas(reply: &[u8], first: usize, region_size: u64) -> Result<Vec<(u64, u64)>, String> {
    let mut areas = Vec::new();
    let mut next = first;
    let mut hops = 0;
    while next != 0 {
        hops += 1;
        if hops > 16 || next < 32 || next + 8 > reply.len() {
            return Err(format!("capability at {next} outside the {}-byte reply", reply.len()));
        }
        let id = u16::from_le_bytes([reply[next], reply[next + 1]]);
        let following = le32(reply, next + 4) as usize;
        if following != 0 && following <= next {
            return Err("capability chain loops".into());
        }
        if id == REGION_INFO_CAP_SPARSE_MMAP {
            if next + 16 > reply.len() {
                return Err("truncated sparse mmap capability".into());
            }
            let count = le32(reply, next + 8) as usize;
            let areas_end = count.checked_mul(16).and_then(|n| n.checked_add(next + 16));
            if count > 64 || areas_end.is_none_or(|end| end > reply.len()) {
                return Err(format!("sparse mmap capability with {count} areas does not fit"));
            }
            for i in 0..count {
                let at = next + 16 + i * 16;
                let (offset, size) = (le64(reply, at), le64(reply, at + 8));
                if offset.checked_add(size).is_none_or(|end| end > region_size) {
                    return Err(format!("sparse area {offset:#x}+{size:#x} outside the region"));
                }
                areas.push((offset, size));
            }
        }
        next = following;
    }
    Ok(areas)
}

impl VfioBackend for VfioUserClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn region(&self, index: u32) -> Option<&RegionInfo> {
        self.regions.get(index as usize)
    }

    fn irq_count(&mut self, index: u32) -> Result<u32, BackendError> {
        if index >= self.num_irqs {
            return Ok(0);
        }
        let mut body = [0u8; 16];
        body[0..4].copy_from_slice(&16u32.to_le_bytes());
        body[8..12].copy_from_slice(&index.to_le_bytes());
        let (reply, _) = self.transact(CMD_DEVICE_GET_IRQ_INFO, &body, &[], "DEVICE_GET_IRQ_INFO")?;
        if reply.len() < 16 || le32(&reply, 8) != index {
            return Err(self.broken(format!("DEVICE_GET_IRQ_INFO {index}: malformed reply")));
        }
        let count = le32(&reply, 12);
        if count > MAX_VECTORS {
            return Err(self.broken(format!("interrupt index {index} claims {count} vectors")));
        }
        Ok(count)
    }

    fn read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), BackendError> {
        self.check_access(index, offset, data.len())?;
        let mut body = [0u8; 16];
        body[0..8].copy_from_slice(&offset.to_le_bytes());
        body[8..12].copy_from_slice(&index.to_le_bytes());
        body[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
        let (reply, _) = self.transact(CMD_REGION_READ, &body, &[], "REGION_READ")?;
        if reply.len() != 16 + data.len() || le32(&reply, 12) as usize != data.len() {
            return Err(self.broken(format!(
                "REGION_READ: {} bytes back for {} asked",
                reply.len().saturating_sub(16),
                data.len()
            )));
        }
        data.copy_from_slice(&reply[16..]);
        Ok(())
    }

    fn write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.check_access(index, offset, data.len())?;
        let mut body = Vec::with_capacity(16 + data.len());
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&index.to_le_bytes());
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(data);
        self.transact(CMD_REGION_WRITE, &body, &[], "REGION_WRITE").map(|_| ())
    }

    fn enable_irqs(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), BackendError> {
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        // The socket carries at most 16 descriptors per message: send them in batches.
        for (batch, chunk) in raw.chunks(16).enumerate() {
            let mut body = [0u8; 20];
            body[0..4].copy_from_slice(&20u32.to_le_bytes());
            body[4..8].copy_from_slice(&(IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER).to_le_bytes());
            body[8..12].copy_from_slice(&index.to_le_bytes());
            body[12..16].copy_from_slice(&((batch * 16) as u32).to_le_bytes());
            body[16..20].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            self.transact(CMD_DEVICE_SET_IRQS, &body, chunk, "DEVICE_SET_IRQS")?;
        }
        Ok(())
    }

    fn disable_irqs(&mut self, index: u32) -> Result<(), BackendError> {
        self.set_irqs(index, IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, &[], 0)
    }

    fn dma_map(&mut self, iova: u64, size: u64, gpa: u64, write: bool) -> Result<(), BackendError> {
        let range = *self
            .ram
            .find(gpa, size)
            .ok_or_else(|| BackendError::Invalid(format!("DMA map of {size:#x} bytes at {gpa:#x} is not guest RAM")))?;
        let mut body = [0u8; 32];
        body[0..4].copy_from_slice(&32u32.to_le_bytes());
        let flags = DMA_FLAG_READ | if write { DMA_FLAG_WRITE } else { 0 };
        body[4..8].copy_from_slice(&flags.to_le_bytes());
        body[8..16].copy_from_slice(&(range.fd_offset + (gpa - range.gpa)).to_le_bytes());
        body[16..24].copy_from_slice(&iova.to_le_bytes());
        body[24..32].copy_from_slice(&size.to_le_bytes());
        self.transact(CMD_DMA_MAP, &body, &[range.fd], "DMA_MAP").map(|_| ())
    }

    fn dma_unmap(&mut self, iova: u64, size: u64) -> Result<(), BackendError> {
        let mut body = [0u8; 24];
        body[0..4].copy_from_slice(&24u32.to_le_bytes());
        body[8..16].copy_from_slice(&iova.to_le_bytes());
        body[16..24].copy_from_slice(&size.to_le_bytes());
        self.transact(CMD_DMA_UNMAP, &body, &[], "DMA_UNMAP").map(|_| ())
    }

    fn reset(&mut self) -> Result<(), BackendError> {
        self.transact(CMD_DEVICE_RESET, &[], &[], "DEVICE_RESET").map(|_| ())
    }
}

impl Drop for VfioUserClient {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_areas_are_bounded() {
        let mut reply = vec![0u8; 32 + 16 + 32];
        reply[32..34].copy_from_slice(&REGION_INFO_CAP_SPARSE_MMAP.to_le_bytes());
        reply[40..44].copy_from_slice(&2u32.to_le_bytes());
        reply[48..56].copy_from_slice(&0u64.to_le_bytes());
        reply[56..64].copy_from_slice(&0x1000u64.to_le_bytes());
        reply[64..72].copy_from_slice(&0x3000u64.to_le_bytes());
        reply[72..80].copy_from_slice(&0x1000u64.to_le_bytes());
        assert_eq!(parse_sparse_areas(&reply, 32, 0x4000).unwrap(), vec![(0, 0x1000), (0x3000, 0x1000)]);
        assert!(parse_sparse_areas(&reply, 32, 0x3800).is_err(), "area past the region");
        assert!(parse_sparse_areas(&reply, 200, 0x4000).is_err(), "capability outside the reply");
        let mut looping = reply.clone();
        looping[36..40].copy_from_slice(&32u32.to_le_bytes());
        assert!(parse_sparse_areas(&looping, 32, 0x4000).is_err(), "loop");
        let mut too_many = reply;
        too_many[40..44].copy_from_slice(&1000u32.to_le_bytes());
        assert!(parse_sparse_areas(&too_many, 32, 0x4000).is_err());
    }
}
