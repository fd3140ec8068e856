//! Summaries of repeated measurements.

use std::time::Duration;

/// Order statistics of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Largest.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let s = Summary::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.n, s.min, s.median, s.max), (5, 1.0, 3.0, 5.0));
        assert!((s.p10 - 1.4).abs() < 1e-9 && (s.p90 - 4.6).abs() < 1e-9);
        assert_eq!(Summary::of(&[2.0, 4.0]).unwrap().median, 3.0);
        assert!(Summary::of(&[]).is_none());
    }
}
