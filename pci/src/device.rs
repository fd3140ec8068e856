//! What a PCI function offers the root complex.

use super::config::BarKind;

/// A BAR the guest has placed and enabled: where it decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarMapping {
    /// BAR index.
    pub bar: usize,
    /// Guest address (memory) or port (I/O).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Memory or I/O.
    pub kind: BarKind,
}

/// A PCI function: configuration space accesses and BAR accesses.
pub trait PciDevice: Send {
    /// A name for logs.
    fn name(&self) -> &str;
    /// Reads dword register `reg` of configuration space.
    fn config_read(&mut self, reg: usize) -> u32;
    /// Writes `data` at byte `offset` of configuration space.
    fn config_write(&mut self, offset: usize, data: &[u8]);
    /// Reads from BAR `bar` at `offset`.
    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// Writes to BAR `bar` at `offset`.
    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]);
    /// The BARs that currently decode (address set, decoding enabled in the command register).
    fn bar_mappings(&self) -> Vec<BarMapping>;
    /// Its state as a snapshot keeps it; `None` for a function whose state cannot be saved (a
    /// passed-through device's lives in the hardware).
    fn snapshot_state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Puts back a state from [`PciDevice::snapshot_state`] of the same kind of function.
    fn restore_state(&mut self, _state: &serde_json::Value) -> Result<(), String> {
        Err(format!("{} cannot be restored from a snapshot", self.name()))
    }
}

/// The decoded BARs of a configuration space: memory BARs when memory decoding is on, I/O BARs
/// when I/O decoding is on, never one at 0 or mid-probe (all ones).
pub fn decoded_bars(config: &super::PciConfiguration) -> Vec<BarMapping> {
    use super::config::{COMMAND_IO, COMMAND_MEMORY, NUM_BARS};
    let command = config.command();
    (0..NUM_BARS)
        .filter_map(|bar| {
            let (size, kind) = config.bar(bar)?;
            let addr = config.bar_address(bar)?;
            let enabled = match kind {
                BarKind::Io => command & COMMAND_IO != 0,
                _ => command & COMMAND_MEMORY != 0,
            };
            let probing = addr.checked_add(size).is_none_or(|end| kind == BarKind::Memory32 && end > 1 << 32);
            (enabled && addr != 0 && !probing).then_some(BarMapping { bar, addr, size, kind })
        })
        .collect()
}
