//! A fleet: one matrix spread over several boxes that hold the same device. Each box runs a
//! shard of the matrix's repetitions ([`shard`]) as a run of its own that carries the fleet
//! run's ID, the shard, the matrix's hash and the box it ran on ([`identity`]); the boxes'
//! databases are merged (`ResultsDb::import`, which refuses a shard claimed twice or a matrix
//! that differs) and reported as one run ([`report`]), with the spread between boxes per cell
//! and a box effect where a box's repetitions differ from the others' ([`effect`]).

pub mod effect;
pub mod identity;
pub mod report;
pub mod shard;

pub use effect::{BoxEffect, BoxFigure, BoxSpread, FleetBox};
pub use identity::{BoxIdentity, DeviceIdentity, IommuMode};
pub use report::{FleetError, fleet_report};
pub use shard::{FleetId, FleetShard, Shard, ShardError};

#[cfg(test)]
mod tests;
