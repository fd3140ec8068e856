//! A tiny streaming JSON writer: every report is one object on one line.

use core::fmt::{self, Write};

use crate::serial;

/// Bytes gathered before one flush to the serial port.
const CHUNK: usize = 512;

/// Output buffered in chunks so that a report line reaches the UART in few VM exits.
pub struct Out {
    buf: [u8; CHUNK],
    len: usize,
}

impl Out {
    fn new() -> Self {
        Out { buf: [0; CHUNK], len: 0 }
    }

    fn push(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(CHUNK) {
            if self.len + chunk.len() > CHUNK {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
    }

    fn flush(&mut self) {
        if self.len > 0 {
            serial::write(&self.buf[..self.len]);
            self.len = 0;
        }
    }

    fn string(&mut self, s: &str) {
        self.push(b"\"");
        let mut start = 0;
        for (i, c) in s.char_indices() {
            let escaped: Option<&[u8]> = match c {
                '"' => Some(b"\\\""),
                '\\' => Some(b"\\\\"),
                '\n' => Some(b"\\n"),
                '\r' => Some(b"\\r"),
                '\t' => Some(b"\\t"),
                c if (c as u32) < 0x20 => None,
                _ => continue,
            };
            self.push(&s.as_bytes()[start..i]);
            match escaped {
                Some(e) => self.push(e),
                None => {
                    let _ = write!(self, "\\u{:04x}", c as u32);
                }
            }
            start = i + c.len_utf8();
        }
        self.push(&s.as_bytes()[start..]);
        self.push(b"\"");
    }
}

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// Writes one report line: `{"probe":"<name>", ...fields...}`.
pub fn section(name: &str, fields: impl FnOnce(&mut Object)) {
    let mut out = Out::new();
    out.push(b"{\"probe\":");
    out.string(name);
    let mut object = Object { out: &mut out, first: false };
    fields(&mut object);
    out.push(b"}\n");
    out.flush();
}

/// The fields of a JSON object being written.
pub struct Object<'a> {
    out: &'a mut Out,
    first: bool,
}

impl Object<'_> {
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b",");
        }
        self.first = false;
        self.out.string(key);
        self.out.push(b":");
    }

    /// A string field.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        self.out.string(value);
        self
    }

    /// An unsigned integer field.
    pub fn u64(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key);
        let _ = write!(self.out, "{value}");
        self
    }

    /// `numerator / denominator` as a decimal number with four places (0 when the denominator
    /// is 0).
    pub fn ratio(&mut self, key: &str, numerator: u64, denominator: u64) -> &mut Self {
        self.key(key);
        let scaled = if denominator == 0 { 0 } else { (numerator as u128 * 10_000 / denominator as u128) as u64 };
        let _ = write!(self.out, "{}.{:04}", scaled / 10_000, scaled % 10_000);
        self
    }

    /// A boolean field.
    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.key(key);
        self.out.push(if value { b"true" } else { b"false" });
        self
    }

    /// An array field whose elements `items` writes.
    pub fn array(&mut self, key: &str, items: impl FnOnce(&mut Array)) -> &mut Self {
        self.key(key);
        self.out.push(b"[");
        items(&mut Array { out: self.out, first: true });
        self.out.push(b"]");
        self
    }
}

/// The elements of a JSON array being written.
pub struct Array<'a> {
    out: &'a mut Out,
    first: bool,
}

impl Array<'_> {
    fn separator(&mut self) {
        if !self.first {
            self.out.push(b",");
        }
        self.first = false;
    }

    /// An unsigned integer element.
    pub fn u64(&mut self, value: u64) {
        self.separator();
        let _ = write!(self.out, "{value}");
    }

    /// A string element.
    pub fn str(&mut self, value: &str) {
        self.separator();
        self.out.string(value);
    }

    /// An object element.
    pub fn object(&mut self, fields: impl FnOnce(&mut Object)) {
        self.separator();
        self.out.push(b"{");
        fields(&mut Object { out: self.out, first: true });
        self.out.push(b"}");
    }
}

/// A short string formatted on the stack (`write!` into it, then `as_str`).
pub struct StackString<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackString<N> {
    /// An empty string.
    pub fn new() -> Self {
        StackString { buf: [0; N], len: 0 }
    }

    /// The text written so far.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl<const N: usize> Write for StackString<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > N {
            return Err(fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac(m: [u8; 6]) -> StackString<18> {
    let mut out = StackString::<18>::new();
    let _ = core::fmt::Write::write_fmt(
        &mut out,
        format_args!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]),
    );
    out
}
