//! A device model process's control protocol (`driverlab model aqc100|lan743x --control PATH`,
//! docs/model.md): one request line in ([`ModelRequest`]), one JSON line out ([`ModelReport`], or
//! [`ModelRefusal`]). The same [`ModelReport`] is the line a model prints on its stdout after each
//! client and when it is stopped. Both ends (the model and the lab) use these types, and the
//! NIC models' frame generator's options ([`GeneratorConfig`], `--generate`), which the lab
//! checks in a matrix before it starts a model.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::confinement::Confinement;
use crate::counters::ModelCounters;

/// Smallest frame a NIC model's generator makes (Ethernet minimum without FCS).
pub const MIN_FRAME: usize = 60;
/// Largest frame a NIC model's generator makes.
pub const MAX_FRAME: usize = 16_384;

/// Generator settings, as `pps=N,size=B,count=N` (all optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneratorConfig {
    /// Frames per second; `None` (or 0): as fast as the guest takes them, never dropping.
    pub pps: Option<u64>,
    /// Frame size in bytes, FCS excluded.
    pub size: usize,
    /// Stop after this many frames.
    pub count: Option<u64>,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig { pps: None, size: 1514, count: None }
    }
}

impl FromStr for GeneratorConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut config = GeneratorConfig::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| format!("`{item}`: expected key=value"))?;
            let number: u64 = value.parse().map_err(|_| format!("`{item}`: {value} is not a whole number"))?;
            match key {
                "pps" => config.pps = (number > 0).then_some(number),
                "size" => config.size = number as usize,
                "count" => config.count = Some(number),
                _ => return Err(format!("`{key}`: unknown; use pps=N, size=B and count=N")),
            }
        }
        if !(MIN_FRAME..=MAX_FRAME).contains(&config.size) {
            return Err(format!("size={}: frames are {MIN_FRAME} to {MAX_FRAME} bytes", config.size));
        }
        Ok(config)
    }
}

impl GeneratorConfig {
    /// The options as `--generate` takes them: `size=B` with `pps=N` and `count=N` when set.
    pub fn as_option(&self) -> String {
        let mut option = format!("size={}", self.size);
        if let Some(pps) = self.pps {
            option.push_str(&format!(",pps={pps}"));
        }
        if let Some(count) = self.count {
            option.push_str(&format!(",count={count}"));
        }
        option
    }
}

impl std::fmt::Display for GeneratorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "generator {} B ", self.size)?;
        match self.pps {
            Some(pps) => write!(f, "at {pps} frames/s")?,
            None => write!(f, "flat out")?,
        }
        if let Some(count) = self.count {
            write!(f, ", {count} frames")?;
        }
        Ok(())
    }
}

/// A request on a model's control socket, one line each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelRequest {
    /// `status`: the model's report.
    Status,
    /// `link up` / `link down`: the wire's carrier, then the report.
    Link {
        /// Up (true) or down.
        up: bool,
    },
}

impl fmt::Display for ModelRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelRequest::Status => "status",
            ModelRequest::Link { up: true } => "link up",
            ModelRequest::Link { up: false } => "link down",
        })
    }
}

impl FromStr for ModelRequest {
    type Err = ModelRefusal;

    fn from_str(line: &str) -> Result<ModelRequest, ModelRefusal> {
        match line.trim() {
            "status" => Ok(ModelRequest::Status),
            "link up" => Ok(ModelRequest::Link { up: true }),
            "link down" => Ok(ModelRequest::Link { up: false }),
            other => Err(ModelRefusal {
                error: format!("unknown command `{}`; use status, link up, link down", other.escape_debug()),
            }),
        }
    }
}

/// Sends `request` to the model's control socket at `socket` and returns its answer line (a
/// [`ModelReport`] or a [`ModelRefusal`]), waiting at most `timeout` for it.
pub fn ask(socket: &std::path::Path, request: ModelRequest, timeout: std::time::Duration) -> std::io::Result<String> {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    Ok(line)
}

/// A model's report: the control socket's answer, its stdout line after each client
/// (`client` set) and when a signal stops it (`exit` set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    /// The model (`aqc100`, `lan743x`, `testdev`).
    pub model: String,
    /// The client this line closes, counted from 1 (stdout lines only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<u64>,
    /// The NIC's status (the NIC models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NicStatus>,
    /// What it counted.
    pub counters: ModelCounters,
    /// How the process is confined (the control socket's and the stop's lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<Confinement>,
    /// The signal that stopped it: `SIGINT` or `SIGTERM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

impl ModelReport {
    /// The report of a model's line of text, if the line is one.
    pub fn parse(line: &str) -> Option<ModelReport> {
        serde_json::from_str(line).ok()
    }
}

/// The control socket's answer to a request it does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRefusal {
    /// What was wrong, and what there is.
    pub error: String,
}

/// What the model reports about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicStatus {
    /// Link speed (0: down).
    pub link_mbps: u32,
    /// The permanent MAC address.
    pub mac: MacAddress,
    /// What it moved (flattened: the JSON has the counters beside the link and the MAC).
    #[serde(flatten)]
    pub counters: NicCounters,
}

/// Frames and bytes a NIC model moved since it started (never cleared by the guest's driver).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicCounters {
    /// Frames the guest received (written into its memory).
    pub rx_frames: u64,
    /// Bytes the guest received.
    pub rx_bytes: u64,
    /// Frames dropped: no descriptors, RX off, or link down.
    pub rx_dropped: u64,
    /// Frames no filter took.
    pub rx_filtered: u64,
    /// Frames lost to refused DMA.
    pub rx_errors: u64,
    /// Frames the guest transmitted.
    pub tx_frames: u64,
    /// Bytes the guest transmitted.
    pub tx_bytes: u64,
    /// Transmits that failed (refused DMA, malformed descriptors, backend errors).
    pub tx_errors: u64,
}

/// A MAC address, printed the usual way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddress(pub [u8; 6]);

impl std::fmt::Display for MacAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl std::str::FromStr for MacAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split([':', '-']).collect();
        let bad = || format!("`{s}` is not a MAC address (six hex bytes, e.g. 02:1d:6a:00:00:01)");
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if mac[0] & 1 == 1 {
            return Err(format!("`{s}` is a group address; a NIC needs a unicast one"));
        }
        Ok(MacAddress(mac))
    }
}

impl Serialize for MacAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddress, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_lines_and_reports_json_both_ways() {
        for request in [ModelRequest::Status, ModelRequest::Link { up: true }, ModelRequest::Link { up: false }] {
            assert_eq!(request.to_string().parse::<ModelRequest>(), Ok(request));
        }
        assert!("reboot\n".parse::<ModelRequest>().unwrap_err().error.contains("unknown command `reboot`"));
        let report = ModelReport {
            model: "aqc100".into(),
            client: None,
            status: Some(NicStatus {
                link_mbps: 10_000,
                mac: "02:1d:6a:00:00:01".parse().unwrap(),
                counters: NicCounters {
                    rx_frames: 1,
                    rx_bytes: 2,
                    tx_frames: 3,
                    tx_bytes: 4,
                    ..NicCounters::default()
                },
            }),
            counters: ModelCounters { dma_maps: 5, ..ModelCounters::default() },
            confinement: None,
            exit: Some("SIGTERM".into()),
        };
        let line = serde_json::to_string(&report).unwrap();
        assert!(line.contains(r#""mac":"02:1d:6a:00:00:01""#) && !line.contains("client"), "{line}");
        assert!(line.contains(r#""link_mbps":10000,"mac":"02:1d:6a:00:00:01","rx_frames":1,"rx_bytes":2,"#), "{line}");
        assert_eq!(ModelReport::parse(&line), Some(report));
        assert_eq!(ModelReport::parse("aqc100 serving vfio-user on /x"), None);
        assert!("01:00:5e:00:00:01".parse::<MacAddress>().unwrap_err().contains("group address"));
        for option in ["size=1514", "size=60,pps=1000", "size=9000,count=20000", "size=128,pps=5,count=7"] {
            let config: GeneratorConfig = option.parse().unwrap();
            assert_eq!(config.as_option(), option);
        }
        assert_eq!("".parse::<GeneratorConfig>().unwrap().as_option(), "size=1514", "the default");
    }
}
