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

/// A bar per cell; a series' prefix is labelled by its place (`2/3`), and BUILD-FAIL where it
/// did not build.
fn bars(report: &Report, metric: Metric) -> Vec<Bar> {
    report
        .cells
        .iter()
        .map(|c| {
            let m = c.metrics.get(&metric);
            let label = match (&c.step, c.build_failed) {
                (Some(step), false) => step.position(),
                (Some(step), true) => format!("{} {}", step.position(), crate::failure::BUILD_FAILED),
                (None, _) => report.label(c),
            };
            Bar { label, mean: m.map_or(0.0, |m| m.moments.mean), interval: m.and_then(|m| m.moments.ci95) }
        })
        .collect()
}

/// Whether the report's cells are one series' prefixes in order: then the bars are joined
/// into the figure's curve across the series.
fn is_series(report: &Report) -> bool {
    let steps: Vec<_> = report.cells.iter().map(|c| c.step.as_ref()).collect();
    steps.iter().all(Option::is_some) && steps.windows(2).all(|w| w[0].map(|s| s.index) < w[1].map(|s| s.index))
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    bars: &[Bar],
    colour: RGBColor,
    curve: bool,
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
    if curve {
        let points = bars.iter().enumerate().map(|(i, b)| (i as f64 + 0.5, b.mean));
        chart.draw_series(LineSeries::new(points, BLACK.stroke_width(2))).map_err(err)?;
    }
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
        // A series' curve: Gbit/s and the RX maps per packet the seeds are about, prefix by prefix.
        let curve = is_series(report);
        let (maps, title) = match curve {
            true => (Metric::RxMapsPerPacket, "RX IOMMU maps per packet, prefix by prefix"),
            false => (Metric::MapsPerPacket, "IOMMU maps per packet"),
        };
        panel(&left, "throughput, Gbit/s", &bars(report, Metric::GbitS), RGBColor(0x2b, 0x6c, 0xb0), curve)?;
        panel(&right, title, &bars(report, maps), RGBColor(0xc0, 0x5a, 0x20), curve)?;
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
                box_effect: None,
            }
        };
        let report = Report {
            run: "r".into(),
            matrix: "m".into(),
            state: RunState::Done,
            engine: RunEngine::Driverlab,
            baseline: None,
            cells: vec![cell("flip", 0.06, 0.5), cell("order3", 0.35, 0.0625), cell("pool", 2.9, 0.0)],
            box_identity: None,
            boxes: Vec::new(),
            missing_shards: Vec::new(),
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", &svg[..100]);
        for label in ["flip", "order3", "pool", "IOMMU maps per packet", "throughput, Gbit/s"] {
            assert!(svg.contains(label), "{label}");
        }
        assert!(svg.matches("<rect").count() > 6, "the background and six bars");
        // The curve is the only line two pixels wide.
        assert!(!svg.contains("stroke-width=\"2\""), "no curve across cells that are no series");
        // A series' prefixes: bars by their place, joined by the curve; a BUILD-FAIL said.
        let mut series = report.clone();
        for (index, cell) in series.cells.iter_mut().enumerate() {
            let step = crate::matrix::SeriesStep {
                series: "atl".into(),
                index,
                count: 2,
                subject: String::new(),
                author: String::new(),
                message_id: String::new(),
                variant: "v".into(),
            };
            cell.step = Some(step);
        }
        series.cells[2].build_failed = true;
        let svg = super::svg(&series).unwrap();
        for label in ["0/2", "1/2", "2/2 BUILD-FAIL", "RX IOMMU maps per packet, prefix by prefix"] {
            assert!(svg.contains(label), "{label}");
        }
        assert_eq!(svg.matches("stroke-width=\"2\"").count(), 2, "a curve in each panel");
    }
}
