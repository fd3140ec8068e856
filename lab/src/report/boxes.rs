//! A fleet run's tables, shared by markdown and HTML: its shards with the boxes they ran on,
//! and per cell and metric the spread between boxes with the boxes that differ.

use super::Report;

/// What the boxes table is.
pub(super) const BOXES_NOTE: &str = "The fleet run's shards, each a run on its box (docs/lab.md, \"A fleet\").";

/// What the box effects table is.
pub(super) const BOX_EFFECT_NOTE: &str = "Box effects: per cell and metric, the spread of the boxes' means against \
     their mean, and each box against the other boxes' repetitions with the variants' rule; a box that is better or \
     worse widened the cell's interval: read it before the verdict.";

impl Report {
    /// The boxes table's header: what [`Report::box_rows`] gives.
    pub const BOX_COLUMNS: [&'static str; 5] = ["shard", "run", "state", "results", "box"];

    /// One row per shard of a fleet run, and one per shard no database brought.
    pub fn box_rows(&self) -> Vec<[String; 5]> {
        let present = self.boxes.iter().map(|b| {
            [
                b.shard.to_string(),
                b.run.clone(),
                b.state.to_string(),
                format!("{} of {}", b.results, b.share),
                b.identity.as_ref().map_or_else(|| "unknown".to_string(), |i| i.summary()),
            ]
        });
        let missing = self.missing_shards.iter().map(|s| {
            [s.to_string(), "-".into(), "missing".into(), "-".into(), "no database of this shard imported".into()]
        });
        present.chain(missing).collect()
    }

    /// The box effects table's header: what [`Report::box_effect_rows`] gives.
    pub const BOX_EFFECT_COLUMNS: [&'static str; 5] = ["cell", "metric", "spread", "boxes", "box effect"];

    /// One row per cell and metric of a fleet run that two boxes or more measured: the spread,
    /// each box's mean, and the boxes that differ.
    pub fn box_effect_rows(&self) -> Vec<[String; 5]> {
        let mut rows = Vec::new();
        for c in &self.cells {
            let Some(effect) = &c.box_effect else { continue };
            for (metric, spread) in &effect.metrics {
                let boxes: Vec<String> =
                    spread.boxes.iter().map(|b| format!("{}: {:.4} (n {})", b.shard, b.mean, b.n)).collect();
                let flags: Vec<String> =
                    effect.flags().into_iter().filter(|f| f.starts_with(&format!("{metric}:"))).collect();
                rows.push([
                    c.cell.clone(),
                    metric.to_string(),
                    spread.spread_pct.map_or("-".into(), |p| format!("{p:.1} %")),
                    boxes.join(", "),
                    if flags.is_empty() { "-".into() } else { flags.join("; ") },
                ]);
            }
        }
        rows
    }
}
