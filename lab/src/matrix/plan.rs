//! A matrix that checked out: its cells (variants with one value per parameter, under each
//! compatible workload, on each device), counted from its shape before any is made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fleet::FleetShard;

use super::{
    Device, DeviceSource, Image, MAX_CELLS, MAX_RESULTS, Matrix, MatrixError, ParamValues, Variant, Workload, check,
};

/// One cell: a variant with one value per parameter, under one workload, on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Position in the expansion, from 0.
    pub index: usize,
    /// `c01`, `c02`, ...: its name in the run.
    pub id: String,
    /// The image.
    pub image: String,
    /// The variant.
    pub variant: String,
    /// Its parameters, one value each.
    pub params: BTreeMap<String, String>,
    /// The workload.
    pub workload: String,
    /// The device.
    pub device: String,
    /// Where in its series the cell's image is, when it is a prefix of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<super::SeriesStep>,
}

impl Cell {
    /// What identifies the cell across runs: image, variant, parameters, workload, device.
    pub fn key(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}/{}[{}]/{}/{}", self.image, self.variant, params.join(","), self.workload, self.device)
    }

    /// Its parameters, workload and device: what the cells of one variant across a series'
    /// prefixes share.
    pub fn key_without_image(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("[{}]/{}/{}", params.join(","), self.workload, self.device)
    }

    /// A short label for tables and charts: the variant and its parameters.
    pub fn label(&self) -> String {
        let variant = &self.variant;
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if params.is_empty() { variant.clone() } else { format!("{variant} {}", params.join(" ")) }
    }
}

/// A matrix that checked out, its file and its cells.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The file it came from.
    pub file: PathBuf,
    /// Its text, as stored with the run.
    pub text: String,
    /// The matrix.
    pub matrix: Matrix,
    /// Its cells, in order.
    pub cells: Vec<Cell>,
    /// Its devices' typed forms, by name: checked once, used by every repetition.
    sources: BTreeMap<String, DeviceSource>,
    /// The box's shard of a fleet run, when the run is one ([`crate::fleet`]).
    share: Option<FleetShard>,
}

impl Plan {
    /// The results a run of the plan has: its cells times the repetitions, or its shard's share
    /// of them.
    pub fn results(&self) -> usize {
        match &self.share {
            Some(share) => share.shard.share(self.cells.len(), self.matrix.repetitions),
            None => self.cells.len() * self.matrix.repetitions as usize,
        }
    }

    /// The plan as shard `share` of a fleet run (or the whole matrix, with none).
    pub fn with_share(mut self, share: Option<FleetShard>) -> Plan {
        self.share = share;
        self
    }

    /// The fleet run and shard the plan is, if it is one.
    pub fn share(&self) -> Option<&FleetShard> {
        self.share.as_ref()
    }

    /// Whether repetition `repetition` of `cell` is this plan's to run (every one, unless the
    /// plan is a shard).
    pub fn holds(&self, cell: &Cell, repetition: u32) -> bool {
        self.share.as_ref().is_none_or(|s| s.shard.holds(cell.index, repetition, self.matrix.repetitions))
    }

    /// The repetitions of `cell` this plan runs.
    pub fn repetitions_of<'a>(&'a self, cell: &'a Cell) -> impl Iterator<Item = u32> + 'a {
        (0..self.matrix.repetitions).filter(move |&r| self.holds(cell, r))
    }

    /// What identifies the matrix across boxes: a hash of its name, repetitions, cells,
    /// variants and workloads (not its images' IDs or devices' definitions, which each box
    /// pins and registers for itself). Shards of one fleet run have the same.
    pub fn matrix_hash(&self) -> String {
        use sha2::Digest;
        let identity = serde_json::json!({
            "name": self.matrix.name,
            "repetitions": self.matrix.repetitions,
            "cells": self.cells,
            "variants": self.matrix.variants.iter().map(|v| v.get_ref()).collect::<Vec<_>>(),
            "workloads": self.matrix.workloads.iter().map(|w| w.get_ref()).collect::<Vec<_>>(),
        });
        let digest = sha2::Sha256::digest(identity.to_string().as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// Checks and expands `text`, read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Plan, MatrixError> {
        let matrix = Matrix::from_toml(file, text)?;
        Plan::from_matrix(file, matrix, text.to_string(), Some(text))
    }

    /// Checks and expands `matrix`, from `file`; `text` is what the run stores (TOML that parses
    /// into `matrix`), `spans_in` the text its spans point into, for the lines of errors.
    pub fn from_matrix(
        file: &Path,
        mut matrix: Matrix,
        text: String,
        spans_in: Option<&str>,
    ) -> Result<Plan, MatrixError> {
        let checker = check::Checker { file, text: spans_in };
        super::series::expand(&mut matrix, &checker)?;
        let sources = checker.check(&matrix)?;
        // Counted from the matrix's shape before anything is expanded: twelve parameters of
        // ten values are 10^12 cells, which must be refused, not built.
        let count = count_cells(&matrix);
        if count > MAX_CELLS as u128 {
            return Err(checker.error(None, "matrix", format!("{count} cells; at most {MAX_CELLS}")));
        }
        let results = count * u128::from(matrix.repetitions);
        if results > MAX_RESULTS as u128 {
            return Err(checker.error(
                None,
                "matrix",
                format!(
                    "{count} cells x {} repetitions = {results} results; at most {MAX_RESULTS}",
                    matrix.repetitions
                ),
            ));
        }
        let cells = expand(&matrix);
        let plan = Plan { file: file.to_path_buf(), text, matrix, cells, sources, share: None };
        if let Err((i, why)) = plan.check_vms() {
            let span = plan.matrix.variants.get(i).map(|v| v.span());
            return Err(checker.error(span, format!("variant[{i}]"), why));
        }
        Ok(plan)
    }

    /// The image named `name`.
    pub fn image(&self, name: &str) -> Option<&Image> {
        self.matrix.images.iter().map(|i| i.get_ref()).find(|i| i.name == name)
    }

    /// The variant named `name`.
    pub fn variant(&self, name: &str) -> Option<&Variant> {
        self.matrix.variants.iter().map(|v| v.get_ref()).find(|v| v.name == name)
    }

    /// The workload named `name`.
    pub fn workload(&self, name: &str) -> Option<&Workload> {
        self.matrix.workloads.iter().map(|w| w.get_ref()).find(|w| w.name() == name)
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.matrix.devices.iter().map(|d| d.get_ref()).find(|d| d.name == name)
    }

    /// What the device named `name` is.
    pub fn source(&self, name: &str) -> Option<&DeviceSource> {
        self.sources.get(name)
    }

    /// The baseline variant, if one is named.
    pub fn baseline(&self) -> Option<&str> {
        self.matrix.baseline.as_ref().map(|b| b.get_ref().as_str())
    }

    /// A kernel or initrd path as the VMM gets it: relative paths are from the matrix's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            return path.to_path_buf();
        }
        self.file.parent().unwrap_or(Path::new(".")).join(path)
    }
}

/// How many cells [`expand`] would make, without making them (saturating).
pub(super) fn count_cells(m: &Matrix) -> u128 {
    let devices = m.devices.len() as u128;
    m.variants
        .iter()
        .map(|v| v.get_ref())
        .map(|variant| {
            let probe = m.images.iter().any(|i| i.get_ref().name == *variant.image.get_ref() && i.get_ref().is_probe());
            let workloads =
                m.workloads.iter().filter(|w| matches!(w.get_ref(), Workload::ProbeRx { .. }) == probe).count() as u128;
            let combinations = variant.params.values().fold(1u128, |n, values| {
                let k = match values {
                    ParamValues::One(_) => 1,
                    ParamValues::Many(list) => list.len() as u128,
                };
                n.saturating_mul(k)
            });
            combinations.saturating_mul(workloads).saturating_mul(devices)
        })
        .fold(0u128, u128::saturating_add)
}

/// The cells of a checked matrix: variants (each parameter list expanded) x compatible workloads
/// x devices.
fn expand(m: &Matrix) -> Vec<Cell> {
    let mut cells = Vec::new();
    for variant in m.variants.iter().map(|v| v.get_ref()) {
        let image_name = variant.image.get_ref();
        let probe = m.images.iter().any(|i| i.get_ref().name == *image_name && i.get_ref().is_probe());
        for params in param_combinations(&variant.params) {
            for workload in m.workloads.iter().map(|w| w.get_ref()) {
                if matches!(workload, Workload::ProbeRx { .. }) != probe {
                    continue;
                }
                for device in m.devices.iter().map(|d| d.get_ref()) {
                    let index = cells.len();
                    cells.push(Cell {
                        index,
                        id: format!("c{:02}", index + 1),
                        image: image_name.clone(),
                        variant: variant.name.clone(),
                        params: params.clone(),
                        workload: workload.name().to_string(),
                        device: device.name.clone(),
                        step: variant.step.clone(),
                    });
                }
            }
        }
    }
    cells
}

/// Every combination of one value per parameter, in key order.
fn param_combinations(params: &BTreeMap<String, ParamValues>) -> Vec<BTreeMap<String, String>> {
    let mut combinations = vec![BTreeMap::new()];
    for (key, values) in params {
        let values: Vec<String> = match values {
            ParamValues::One(v) => vec![v.to_string()],
            ParamValues::Many(list) => list.iter().map(ToString::to_string).collect(),
        };
        combinations = combinations
            .into_iter()
            .flat_map(|done| {
                values.iter().map(move |v| {
                    let mut next = done.clone();
                    next.insert(key.clone(), v.clone());
                    next
                })
            })
            .collect();
    }
    combinations
}
