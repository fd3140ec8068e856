//! A box's share of a matrix: shard `K/N` of a fleet run. Repetition `r` of cell `c` (of a
//! matrix of `R` repetitions) belongs to shard `(c·R + r) mod N + 1`: with `R ≥ N` every cell
//! has repetitions on every shard (each box contributes to each cell, so a box that differs can
//! be seen), with fewer the cells are spread; either way the shards' shares differ by at most
//! one repetition, and their union is the matrix once.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most shards a fleet run has.
pub const MAX_SHARDS: u32 = 1000;

/// Most characters of a fleet run's ID.
pub const MAX_FLEET_ID: usize = 64;

/// Errors of a shard or a fleet run's ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// Not `K/N`.
    #[error("shard {0:?}: give it as K/N, shard K of N (e.g. 2/3)")]
    Form(String),
    /// `K` is not between 1 and `N`, or `N` is too large.
    #[error("shard {index}/{count}: shards count from 1 to N (1/{count} .. {count}/{count}), N at most {MAX_SHARDS}")]
    Range {
        /// K.
        index: u32,
        /// N.
        count: u32,
    },
    /// A fleet run's ID with characters it may not have.
    #[error(
        "fleet run ID {0:?}: 1 to {MAX_FLEET_ID} letters, digits, '.', '_' or '-', starting with a letter or digit"
    )]
    FleetId(String),
}

/// Shard `index` of `count`, `1 ≤ index ≤ count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// Shard `index` of `count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, ShardError> {
        if index == 0 || index > count || count > MAX_SHARDS {
            return Err(ShardError::Range { index, count });
        }
        Ok(Shard { index, count })
    }

    /// K, from 1.
    pub fn index(self) -> u32 {
        self.index
    }

    /// N.
    pub fn count(self) -> u32 {
        self.count
    }

    /// Whether repetition `repetition` (from 0) of cell `cell` (its index) of a matrix of
    /// `repetitions` repetitions is this shard's.
    pub fn holds(self, cell: usize, repetition: u32, repetitions: u32) -> bool {
        let position = cell as u64 * u64::from(repetitions) + u64::from(repetition);
        position % u64::from(self.count) == u64::from(self.index - 1)
    }

    /// This shard's repetitions of cell `cell`.
    pub fn repetitions_of(self, cell: usize, repetitions: u32) -> impl Iterator<Item = u32> {
        (0..repetitions).filter(move |&r| self.holds(cell, r, repetitions))
    }

    /// How many repetitions of a matrix of `cells` cells and `repetitions` repetitions are this
    /// shard's.
    pub fn share(self, cells: usize, repetitions: u32) -> usize {
        let total = cells as u64 * u64::from(repetitions);
        let (count, before) = (u64::from(self.count), u64::from(self.index - 1));
        (total / count + u64::from(total % count > before)) as usize
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Shard, ShardError> {
        let form = || ShardError::Form(s.chars().take(40).collect());
        let (index, count) = s.trim().split_once('/').ok_or_else(form)?;
        let number = |n: &str| n.trim().parse::<u32>().map_err(|_| form());
        Shard::new(number(index)?, number(count)?)
    }
}

impl TryFrom<String> for Shard {
    type Error = ShardError;

    fn try_from(s: String) -> Result<Shard, ShardError> {
        s.parse()
    }
}

impl From<Shard> for String {
    fn from(shard: Shard) -> String {
        shard.to_string()
    }
}

/// A fleet run's ID, given by the caller (a CI workflow's run, say): what the shards of one
/// matrix spread over boxes share.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FleetId(String);

impl FleetId {
    /// The ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FleetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for FleetId {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<FleetId, ShardError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let starts_well = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        if !starts_well || s.len() > MAX_FLEET_ID || !s.chars().all(allowed) {
            return Err(ShardError::FleetId(s.chars().take(MAX_FLEET_ID + 1).collect()));
        }
        Ok(FleetId(s.to_string()))
    }
}

impl TryFrom<String> for FleetId {
    type Error = ShardError;

    fn try_from(s: String) -> Result<FleetId, ShardError> {
        s.parse()
    }
}

impl From<FleetId> for String {
    fn from(id: FleetId) -> String {
        id.0
    }
}

/// One box's part of a fleet run: the fleet run's ID and its shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FleetShard {
    /// The fleet run.
    #[schema(value_type = String, example = "ci-8812-aqc100")]
    pub fleet: FleetId,
    /// This box's shard of it, `K/N`.
    #[schema(value_type = String, example = "2/3")]
    pub shard: Shard,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse() {
        assert_eq!("2/3".parse::<Shard>().unwrap(), Shard::new(2, 3).unwrap());
        assert_eq!(" 1/1 ".parse::<Shard>().unwrap().to_string(), "1/1");
        for bad in ["0/3", "4/3", "1/0", "1/1001"] {
            assert!(matches!(bad.parse::<Shard>(), Err(ShardError::Range { .. })), "{bad}");
        }
        for bad in ["", "3", "a/3", "1/3/4", "-1/3", "1.5/3"] {
            assert!(matches!(bad.parse::<Shard>(), Err(ShardError::Form(_))), "{bad}");
        }
        let message = "0/3".parse::<Shard>().unwrap_err().to_string();
        assert!(message.contains("count from 1"), "{message}");
        let json: Shard = serde_json::from_str("\"3/4\"").unwrap();
        assert_eq!(serde_json::to_string(&json).unwrap(), "\"3/4\"");
        assert!(serde_json::from_str::<Shard>("\"5/4\"").is_err());
    }

    #[test]
    fn fleet_ids_are_plain_names() {
        assert_eq!("ci-8812.aqc100_1".parse::<FleetId>().unwrap().as_str(), "ci-8812.aqc100_1");
        for bad in ["", "-x", "a/b", "a b", "../x", &"x".repeat(65)] {
            assert!(bad.parse::<FleetId>().is_err(), "{bad}");
        }
    }

    /// Every repetition of every shape is on exactly one shard, the shares differ by at most
    /// one, and with enough repetitions every cell is on every shard.
    #[test]
    fn shards_cover_the_matrix_once_and_evenly() {
        for cells in [1usize, 2, 3, 7] {
            for repetitions in 1..=7u32 {
                for count in 1..=5u32 {
                    let shards: Vec<Shard> = (1..=count).map(|k| Shard::new(k, count).unwrap()).collect();
                    for cell in 0..cells {
                        for r in 0..repetitions {
                            let owners = shards.iter().filter(|s| s.holds(cell, r, repetitions)).count();
                            assert_eq!(owners, 1, "cell {cell} rep {r} of {cells}x{repetitions} over {count}");
                        }
                        if repetitions >= count {
                            assert!(shards.iter().all(|s| s.repetitions_of(cell, repetitions).next().is_some()));
                        }
                    }
                    let shares: Vec<usize> = shards.iter().map(|s| s.share(cells, repetitions)).collect();
                    assert_eq!(shares.iter().sum::<usize>(), cells * repetitions as usize);
                    for (s, &share) in shards.iter().zip(&shares) {
                        let counted: usize = (0..cells).map(|c| s.repetitions_of(c, repetitions).count()).sum();
                        assert_eq!(counted, share, "{s} of {cells}x{repetitions}");
                    }
                    assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1, "{shares:?}");
                }
            }
        }
    }
}
