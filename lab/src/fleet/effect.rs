//! Box effects: per cell, how the boxes' figures spread, and whether a box's repetitions differ
//! from the other boxes' by the lab's own rule for variants ([`VerdictRule`]: the threshold,
//! Welch's test, and separated ranges under ten samples a side). A flagged cell is one whose
//! confidence interval the fleet widened: read its boxes before its verdict.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{BoxIdentity, Shard};
use crate::metric::Metric;
use crate::report::samples::CellSamples;
use crate::results_db::RunState;
use crate::stats::{Change, Moments, Verdict, VerdictRule};

/// A box's shard of a fleet run, as the fleet's report lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetBox {
    /// Its shard.
    pub shard: Shard,
    /// Its run (on that box).
    pub run: String,
    /// The run's state.
    pub state: RunState,
    /// Repetitions with a result.
    pub results: usize,
    /// Repetitions the shard has.
    pub share: usize,
    /// The box, as the run saw it.
    #[serde(rename = "box", skip_serializing_if = "Option::is_none")]
    pub identity: Option<BoxIdentity>,
}

/// One cell's box effect.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoxEffect {
    /// Whether a box differs from the others on some metric (`better` or `worse` against them).
    pub flagged: bool,
    /// The metrics two boxes or more measured, each with its boxes.
    pub metrics: BTreeMap<Metric, BoxSpread>,
}

/// One metric of one cell across boxes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoxSpread {
    /// The boxes' means' range against the mean of them all, in percent (none when that is 0).
    pub spread_pct: Option<f64>,
    /// Each box's figure.
    pub boxes: Vec<BoxFigure>,
}

/// One box's figure for a metric of a cell, against the other boxes'.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoxFigure {
    /// The box's shard.
    pub shard: Shard,
    /// Its passing repetitions.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// Against the other boxes' repetitions of the cell, with the variants' rule.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub against_others: Option<Change>,
}

impl BoxEffect {
    /// The box effect of one cell whose repetitions came from `boxes` (each shard's samples of
    /// the cell); none when fewer than two boxes measured anything.
    pub fn of(boxes: &[(Shard, &CellSamples)], rule: &VerdictRule) -> Option<BoxEffect> {
        let mut metrics = BTreeMap::new();
        for &metric in Metric::ALL {
            if let Some(spread) = BoxSpread::of(metric, boxes, rule) {
                metrics.insert(metric, spread);
            }
        }
        if metrics.is_empty() {
            return None;
        }
        let changed =
            |f: &BoxFigure| f.against_others.is_some_and(|c| matches!(c.verdict, Verdict::Better | Verdict::Worse));
        let flagged = metrics.values().any(|s| s.boxes.iter().any(changed));
        Some(BoxEffect { flagged, metrics })
    }

    /// The flagged metrics and the boxes that differ on them: `gbit_s: 2/3 -41.2 % (p 1.2e-5)`.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (metric, spread) in &self.metrics {
            for figure in &spread.boxes {
                let Some(change) =
                    figure.against_others.filter(|c| matches!(c.verdict, Verdict::Better | Verdict::Worse))
                else {
                    continue;
                };
                let pct = change.change_pct.map_or_else(|| "from 0".to_string(), |p| format!("{p:+.1} %"));
                let p = change.p_value.map(|p| format!(", p {p:.2e}")).unwrap_or_default();
                flags.push(format!("{metric}: shard {} {pct}{p}", figure.shard));
            }
        }
        flags
    }
}

impl BoxSpread {
    fn of(metric: Metric, boxes: &[(Shard, &CellSamples)], rule: &VerdictRule) -> Option<BoxSpread> {
        let measured: Vec<(Shard, &[f64])> =
            boxes.iter().map(|(s, c)| (*s, c.of(metric))).filter(|(_, v)| !v.is_empty()).collect();
        if measured.len() < 2 {
            return None;
        }
        let figures: Vec<BoxFigure> = measured
            .iter()
            .map(|&(shard, values)| {
                let others: Vec<f64> =
                    measured.iter().filter(|(s, _)| *s != shard).flat_map(|(_, v)| v.iter().copied()).collect();
                BoxFigure {
                    shard,
                    n: values.len(),
                    mean: values.iter().sum::<f64>() / values.len() as f64,
                    against_others: rule.judge(&others, values, metric.higher_is_better()),
                }
            })
            .collect();
        let all: Vec<f64> = measured.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        let overall = Moments::of(&all)?.mean;
        let means = figures.iter().map(|f| f.mean);
        let range = means.clone().fold(f64::MIN, f64::max) - means.fold(f64::MAX, f64::min);
        let spread_pct = (overall != 0.0).then(|| range / overall.abs() * 100.0);
        Some(BoxSpread { spread_pct, boxes: figures })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Cell;
    use crate::record::{Status, test_record};

    fn samples(values: &[(f64, f64)]) -> CellSamples {
        let cell = Cell {
            index: 0,
            id: "c01".into(),
            image: "probe".into(),
            variant: "flip".into(),
            params: Default::default(),
            workload: "rx".into(),
            device: "aqc100".into(),
            step: None,
        };
        let mut samples = CellSamples::default();
        for (i, &(gbit, maps)) in values.iter().enumerate() {
            let mut r = test_record("r", &cell, i as u32, Status::Pass, "");
            r.workload.gbit_s = Some(gbit);
            r.maps_per_packet = Some(maps);
            samples.add(&r);
        }
        samples
    }

    #[test]
    fn a_slower_box_is_flagged_on_throughput_and_not_on_maps() {
        let shard = |k| Shard::new(k, 3).unwrap();
        let fast_a = samples(&[(9.1, 0.5), (9.3, 0.5), (9.2, 0.5), (9.25, 0.5)]);
        let fast_b = samples(&[(9.2, 0.5), (9.15, 0.5), (9.3, 0.5), (9.1, 0.5)]);
        let slow = samples(&[(4.1, 0.5), (4.3, 0.5), (4.2, 0.5), (4.0, 0.5)]);
        let rule = VerdictRule::default();
        let effect = BoxEffect::of(&[(shard(1), &fast_a), (shard(2), &slow), (shard(3), &fast_b)], &rule).unwrap();
        assert!(effect.flagged);
        let gbit = &effect.metrics[&Metric::GbitS];
        assert_eq!(gbit.boxes.len(), 3);
        assert_eq!(gbit.boxes[1].against_others.unwrap().verdict, Verdict::Worse);
        assert!(gbit.spread_pct.unwrap() > 50.0, "{gbit:?}");
        let maps = &effect.metrics[&Metric::MapsPerPacket];
        assert!(maps.boxes.iter().all(|b| b.against_others.unwrap().verdict == Verdict::Same), "{maps:?}");
        assert_eq!(maps.spread_pct, Some(0.0));
        let flags = effect.flags();
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].starts_with("gbit_s: shard 2/3 -"), "{flags:?}");
        // Boxes within the noise of each other: no flag.
        let effect = BoxEffect::of(&[(shard(1), &fast_a), (shard(3), &fast_b)], &rule).unwrap();
        assert!(!effect.flagged, "{effect:?}");
        // One box alone has no effect to show.
        assert!(BoxEffect::of(&[(shard(1), &fast_a), (shard(2), &CellSamples::default())], &rule).is_none());
    }
}
