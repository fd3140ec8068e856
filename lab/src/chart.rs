//! The report's chart, as SVG (plotters): throughput and IOMMU maps per packet per cell, side by
//! side, each bar its mean with the 95% confidence interval as an error bar.

use plotters::prelude::*;

use crate::metric::Metric;
use crate::report::Report;

/// Pixels of the whole chart.
const SIZE: (u32, u32) = (1100, 460);

/// Errors drawing the chart.
#[derive(Debug, thiserror::Error)]
#[error("drawing the chart: {0}")]
pub struct ChartError(String);

/// One bar: label, mean, interval.
struct Bar {
    label: String,
    mean: f64,
    interval: Option<[f64; 2]>,
}

fn bars(report: &Report, metric: Metric) -> Vec<Bar> {
    report
        .cells
        .iter()
        .map(|c| {
            let m = c.metrics.get(&metric);
            Bar {
                label: report.label(c),
                mean: m.map_or(0.0, |m| m.moments.mean),
                interval: m.and_then(|m| m.moments.ci95),
            }
        })
        .collect()
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    bars: &[Bar],
    colour: RGBColor,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| ChartError(e.to_string());
    let top = bars.iter().map(|b| b.interval.map_or(b.mean, |[_, hi]| hi.max(b.mean))).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let n = bars.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n, 0.0..top)
        .map_err(err)?;
    chart.configure_mesh().disable_x_mesh().disable_x_axis().y_desc(title).draw().map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            Rectangle::new([(x + 0.2, 0.0), (x + 0.8, b.mean)], colour.mix(0.8).filled())
        }))
        .map_err(err)?;
    for (i, b) in bars.iter().enumerate() {
        let x = i as f64 + 0.5;
        if let Some([lo, hi]) = b.interval {
            let whisker = |y: f64| PathElement::new(vec![(x - 0.1, y), (x + 0.1, y)], BLACK.stroke_width(1));
            chart
                .draw_series([
                    PathElement::new(vec![(x, lo.max(0.0)), (x, hi)], BLACK.stroke_width(1)),
                    whisker(lo.max(0.0)),
                    whisker(hi),
                ])
                .map_err(err)?;
        }
        let label = EmptyElement::at((x, 0.0)) + Text::new(b.label.clone(), (-20, 8), ("sans-serif", 13).into_font());
        chart.draw_series(std::iter::once(label)).map_err(err)?;
    }
    Ok(())
}

/// The chart of `report` as an SVG document.
pub fn svg(report: &Report) -> Result<String, ChartError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| ChartError(e.to_string()))?;
        let (left, right) = root.split_horizontally(SIZE.0 / 2);
        panel(&left, "throughput, Gbit/s", &bars(report, Metric::GbitS), RGBColor(0x2b, 0x6c, 0xb0))?;
        panel(&right, "IOMMU maps per packet", &bars(report, Metric::MapsPerPacket), RGBColor(0xc0, 0x5a, 0x20))?;
        root.present().map_err(|e| ChartError(e.to_string()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::EngineKind;
    use crate::report::{CellReport, MetricSummary, RunEngine};
    use crate::results_db::RunState;
    use crate::stats::Moments;
    use std::collections::BTreeMap;

    #[test]
    fn the_chart_is_an_svg_with_a_bar_and_label_per_cell() {
        let cell = |variant: &str, gbit: f64, maps: f64| {
            let mut metrics = BTreeMap::new();
            for (name, v) in [(Metric::GbitS, gbit), (Metric::MapsPerPacket, maps)] {
                let moments = Moments::of(&[v * 0.98, v, v * 1.02]).unwrap();
                metrics.insert(name, MetricSummary { moments, change: None });
            }
            CellReport {
                cell: "c".into(),
                image: "probe".into(),
                variant: variant.into(),
                params: BTreeMap::new(),
                workload: "rx".into(),
                device: "aq".into(),
                engine: Some(EngineKind::Driverlab),
                direction: None,
                n: 3,
                status: BTreeMap::new(),
                metrics,
                verdict: None,
                against: None,
                reasons: Vec::new(),
                crashes: Vec::new(),
                notes: Vec::new(),
                guest_dma: None,
                link: None,
                link_profile: None,
                subtests: Vec::new(),
                step: None,
                build_failed: false,
                previous: None,
            }
        };
        let report = Report {
            run: "r".into(),
            matrix: "m".into(),
            state: RunState::Done,
            engine: RunEngine::Driverlab,
            baseline: None,
            cells: vec![cell("flip", 0.06, 0.5), cell("order3", 0.35, 0.0625), cell("pool", 2.9, 0.0)],
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", &svg[..100]);
        for label in ["flip", "order3", "pool", "IOMMU maps per packet", "throughput, Gbit/s"] {
            assert!(svg.contains(label), "{label}");
        }
        assert!(svg.matches("<rect").count() > 6, "the background and six bars");
    }
}
