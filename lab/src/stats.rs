//! Summaries of repeated measurements: order statistics for benchmarks; mean, standard
//! deviation and a 95% confidence interval for results; Welch's t-test and the lab's verdict on a
//! change against a baseline. Distributions come from `statrs`.

use std::time::Duration;

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::Median;

/// Order statistics of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// The smallest sample.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// The median sample.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// The largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples`; `None` if there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Summary {
            n: sorted.len(),
            min: sorted[0],
            p10: quantile(&sorted, 0.10),
            median: quantile(&sorted, 0.5),
            p90: quantile(&sorted, 0.90),
            max: sorted[sorted.len() - 1],
        })
    }

    /// Summarises durations in milliseconds.
    pub fn of_millis(samples: &[Duration]) -> Option<Summary> {
        Summary::of(&samples.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>())
    }
}

/// Linear-interpolated quantile of sorted data (the "R-7" definition).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Mean, spread and a 95% confidence interval of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Moments {
    /// How many samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 for one sample.
    pub stddev: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// The middle sample (the mean of the two middle ones for an even count).
    pub median: f64,
    /// 95% confidence interval of the mean (Student's t); none for one sample.
    pub ci95: Option<[f64; 2]>,
}

impl Moments {
    /// Summarises `samples`; `None` if there are none.
    pub fn of(samples: &[f64]) -> Option<Moments> {
        let n = samples.len();
        if n == 0 {
            return None;
        }
        let mean = samples.iter().sum::<f64>() / n as f64;
        let variance =
            if n > 1 { samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        let stddev = variance.sqrt();
        let ci95 = (n > 1).then(|| {
            let t = StudentsT::new(0.0, 1.0, (n - 1) as f64).map_or(f64::NAN, |d| d.inverse_cdf(0.975));
            let half = t * stddev / (n as f64).sqrt();
            [mean - half, mean + half]
        });
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let median = statrs::statistics::Data::new(samples.to_vec()).median();
        Some(Moments { n, mean, stddev, min, max, median, ci95 })
    }
}

/// Welch's two-sample t-test: the two-sided p-value that `a` and `b` have the same mean, without
/// assuming equal variances. `None` with fewer than two samples on a side.
pub fn welch_p(a: &[f64], b: &[f64]) -> Option<f64> {
    let (ma, mb) = (Moments::of(a)?, Moments::of(b)?);
    if ma.n < 2 || mb.n < 2 {
        return None;
    }
    let (va, vb) = (ma.stddev.powi(2) / ma.n as f64, mb.stddev.powi(2) / mb.n as f64);
    let se = (va + vb).sqrt();
    if se == 0.0 {
        return Some(if ma.mean == mb.mean { 1.0 } else { 0.0 });
    }
    let t = (ma.mean - mb.mean) / se;
    let df = (va + vb).powi(2) / (va.powi(2) / (ma.n - 1) as f64 + vb.powi(2) / (mb.n - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    Some(2.0 * dist.sf(t.abs()))
}

/// What a change against the baseline amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Verdict {
    /// This is the baseline.
    Baseline,
    /// Beyond the threshold, statistically separated, in the good direction.
    Better,
    /// The same, in the bad direction.
    Worse,
    /// Within the threshold of the baseline.
    Same,
    /// Beyond the threshold but not separated from the noise (or too few samples to tell).
    Noisy,
}

/// How the lab calls a change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerdictRule {
    /// Changes smaller than this many percent are `same`.
    pub threshold_pct: f64,
    /// Welch's p-value must be below this.
    pub alpha: f64,
    /// Below this many samples per side, the ranges must not overlap either (LKP's rule).
    pub small_n: usize,
}

impl Default for VerdictRule {
    fn default() -> Self {
        VerdictRule { threshold_pct: 5.0, alpha: 0.05, small_n: 10 }
    }
}

/// A change against the baseline and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Change {
    /// The candidate's mean against the baseline's, in percent (none when the baseline's is 0).
    pub change_pct: Option<f64>,
    /// Welch's p-value, when both sides have two samples or more.
    pub p_value: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
}

impl VerdictRule {
    /// Judges `candidate` against `baseline` for a metric where more is better when
    /// `higher_is_better`.
    pub fn judge(&self, baseline: &[f64], candidate: &[f64], higher_is_better: bool) -> Option<Change> {
        let (b, c) = (Moments::of(baseline)?, Moments::of(candidate)?);
        let change_pct = (b.mean != 0.0).then(|| (c.mean - b.mean) / b.mean.abs() * 100.0);
        let p_value = welch_p(baseline, candidate);
        let big = match change_pct {
            Some(pct) => pct.abs() >= self.threshold_pct,
            None => c.mean != 0.0,
        };
        let verdict = if !big {
            Verdict::Same
        } else {
            let separated_ranges = c.min > b.max || c.max < b.min;
            let small = b.n < self.small_n || c.n < self.small_n;
            let separated = p_value.is_some_and(|p| p < self.alpha) && (!small || separated_ranges);
            match (separated, (c.mean > b.mean) == higher_is_better) {
                (false, _) => Verdict::Noisy,
                (true, true) => Verdict::Better,
                (true, false) => Verdict::Worse,
            }
        };
        Some(Change { change_pct, p_value, verdict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-300)
    }

    // Reference values from SciPy 1.x: `scipy.stats.ttest_ind(a, b, equal_var=False)` and
    // `scipy.stats.t.ppf(0.975, n - 1)` for the interval.
    const A: [f64; 5] = [9.12, 9.31, 9.05, 9.27, 9.18];
    const B: [f64; 5] = [2.21, 2.35, 2.18, 2.30, 2.26];
    const C: [f64; 5] = [9.20, 9.10, 9.40, 9.00, 9.25];

    #[test]
    fn moments_and_the_interval_match_scipy() {
        let m = Moments::of(&A).unwrap();
        assert!(close(m.mean, 9.186, 1e-12) && close(m.stddev, 0.10644247272588134, 1e-9), "{m:?}");
        let [lo, hi] = m.ci95.unwrap();
        assert!(close(lo, 9.053834213736486, 1e-9) && close(hi, 9.318165786263513, 1e-9), "{m:?}");
        let d = Moments::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        let [lo, hi] = d.ci95.unwrap();
        assert!(close(lo, 0.4457397432394794, 1e-8) && close(hi, 4.554260256760521, 1e-8), "{d:?}");
        assert_eq!(d.median, 2.5, "the mean of the middle two");
        assert_eq!(Moments::of(&[5.0, 1.0, 100.0]).unwrap().median, 5.0);
        let one = Moments::of(&[3.0]).unwrap();
        assert_eq!((one.stddev, one.ci95, one.median), (0.0, None, 3.0));
        assert!(Moments::of(&[]).is_none());
    }

    #[test]
    fn welch_matches_scipy() {
        assert!(close(welch_p(&A, &B).unwrap(), 1.2168836981729962e-12, 1e-5));
        assert!(close(welch_p(&A, &C).unwrap(), 0.9628153247624185, 1e-8));
        let e = [2.0, 4.0, 6.0, 8.0, 10.0, 12.0];
        assert!(close(welch_p(&[1.0, 2.0, 3.0, 4.0], &e).unwrap(), 0.03182444378084147, 1e-7));
        assert_eq!(welch_p(&[1.0], &A), None);
        assert_eq!(welch_p(&[2.0, 2.0], &[2.0, 2.0]), Some(1.0));
        assert_eq!(welch_p(&[2.0, 2.0], &[3.0, 3.0]), Some(0.0));
    }

    #[test]
    fn verdicts_need_size_and_separation() {
        let rule = VerdictRule::default();
        // Throughput: 2.26 -> 9.19 Gbit/s, separated.
        let up = rule.judge(&B, &A, true).unwrap();
        assert_eq!(up.verdict, Verdict::Better);
        assert!(close(up.change_pct.unwrap(), (9.186 - 2.26) / 2.26 * 100.0, 1e-9));
        assert_eq!(rule.judge(&B, &A, false).unwrap().verdict, Verdict::Worse, "maps per packet going up");
        assert_eq!(rule.judge(&A, &C, true).unwrap().verdict, Verdict::Same);
        // 10% apart but the ranges overlap: noise.
        let wide = [8.0, 12.0, 9.0, 11.0, 10.0];
        let shifted = [9.0, 13.0, 10.0, 12.0, 11.0];
        assert_eq!(rule.judge(&wide, &shifted, true).unwrap().verdict, Verdict::Noisy);
        // Deterministic counts: no spread, a real change.
        let flip = [0.5; 5];
        let order3 = [0.0625; 5];
        let pool = [0.0; 5];
        assert_eq!(rule.judge(&flip, &order3, false).unwrap().verdict, Verdict::Better);
        let to_zero = rule.judge(&flip, &pool, false).unwrap();
        assert_eq!((to_zero.verdict, to_zero.change_pct), (Verdict::Better, Some(-100.0)));
        let from_zero = rule.judge(&pool, &flip, false).unwrap();
        assert_eq!((from_zero.verdict, from_zero.change_pct), (Verdict::Worse, None));
        // One sample a side cannot be told from noise.
        assert_eq!(rule.judge(&[1.0], &[2.0], true).unwrap().verdict, Verdict::Noisy);
    }

    #[test]
    fn quantiles_interpolate() {
        let s = Summary::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.n, s.min, s.median, s.max), (5, 1.0, 3.0, 5.0));
        assert!((s.p10 - 1.4).abs() < 1e-9 && (s.p90 - 4.6).abs() < 1e-9);
        assert_eq!(Summary::of(&[2.0, 4.0]).unwrap().median, 3.0);
        assert!(Summary::of(&[]).is_none());
    }
}
