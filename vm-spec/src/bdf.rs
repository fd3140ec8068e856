//! PCI device addresses: segment (domain), bus, device, function.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A PCI address, written `SSSS:BB:DD.F` (the segment may be left out: `BB:DD.F`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Bdf {
    /// PCI segment (domain).
    pub segment: u16,
    /// The bus number.
    pub bus: u8,
    /// Device (0-31).
    pub device: u8,
    /// Function (0-7).
    pub function: u8,
}

/// Why a PCI address did not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{input:?} is not a PCI address ({reason}); write it as 0000:63:00.0, as lspci -D shows it")]
pub struct BdfError {
    input: String,
    reason: &'static str,
}

impl Bdf {
    /// The routing ID used by IOMMUs and ACPI: bus << 8 | device << 3 | function.
    pub fn routing_id(&self) -> u16 {
        (self.bus as u16) << 8 | (self.device as u16) << 3 | self.function as u16
    }
}

impl FromStr for Bdf {
    type Err = BdfError;

    fn from_str(input: &str) -> Result<Bdf, BdfError> {
        let fail = |reason| BdfError { input: input.to_string(), reason };
        let (rest, function) = input.rsplit_once('.').ok_or_else(|| fail("no '.' before the function"))?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (segment, bus, device) = match parts.as_slice() {
            [segment, bus, device] => (*segment, *bus, *device),
            [bus, device] => ("0", *bus, *device),
            _ => return Err(fail("expected SEGMENT:BUS:DEVICE.FUNCTION")),
        };
        let hex = |s: &str, max_digits: usize, what| {
            if s.is_empty() || s.len() > max_digits || !s.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(fail(what));
            }
            u32::from_str_radix(s, 16).map_err(|_| fail(what))
        };
        let segment = hex(segment, 4, "the segment must be 1-4 hex digits")? as u16;
        let bus = hex(bus, 2, "the bus must be 1-2 hex digits")? as u8;
        let device = hex(device, 2, "the device must be 1-2 hex digits")?;
        let function = hex(function, 1, "the function must be one digit")?;
        if device > 31 {
            return Err(fail("the device number must be at most 1f"));
        }
        if function > 7 {
            return Err(fail("the function number must be at most 7"));
        }
        Ok(Bdf { segment, bus, device: device as u8, function: function as u8 })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.segment, self.bus, self.device, self.function)
    }
}

impl TryFrom<String> for Bdf {
    type Error = BdfError;

    fn try_from(s: String) -> Result<Bdf, BdfError> {
        s.parse()
    }
}

impl From<Bdf> for String {
    fn from(bdf: Bdf) -> String {
        bdf.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_canonically() {
        let bdf: Bdf = "0000:63:00.0".parse().unwrap();
        assert_eq!(bdf, Bdf { segment: 0, bus: 0x63, device: 0, function: 0 });
        assert_eq!(bdf.to_string(), "0000:63:00.0");
        assert_eq!("3:1f.7".parse::<Bdf>().unwrap().to_string(), "0000:03:1f.7");
        assert_eq!("ABCD:ff:1F.7".parse::<Bdf>().unwrap().routing_id(), 0xffff);
    }

    #[test]
    fn rejects_bad_addresses_with_a_hint() {
        for bad in [
            "",
            "63:00",
            "0000:63:20.0",
            "0000:63:00.8",
            "00000:63:00.0",
            "0000:063:00.0",
            "x:63:00.0",
            "1:2:3:4.0",
            "63:00.-1",
        ] {
            let err = bad.parse::<Bdf>().unwrap_err().to_string();
            assert!(err.contains("not a PCI address") && err.contains("0000:63:00.0"), "{bad}: {err}");
        }
    }
}
