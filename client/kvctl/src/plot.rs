//! The SVG of `kvctl bench --plot FILE.svg`: latency over time (p50, p99
//! and max per time window, from the run's timeline) above a latency
//! histogram (from the run's hdrhistogram). Drawn with plotters' SVG
//! backend only.

use std::path::Path;

use kvload::{LoadReport, Sample};
use plotters::prelude::*;

/// Size of the picture in pixels (width, height).
pub const PLOT_SIZE_PIXELS: (u32, u32) = (1000, 800);
/// Time windows of the latency-over-time chart (at most).
pub const TIME_WINDOWS_MAX: u64 = 100;
/// Shortest time window, in ms.
const TIME_WINDOW_MS_MIN: u64 = 10;
/// Bars of the histogram.
pub const HISTOGRAM_BINS: usize = 60;

/// One time window's latencies in ms: (window middle in s, p50, p99, max).
type WindowPoint = (f64, f64, f64, f64);
/// A line of the latency-over-time chart: label, colour, the value it draws.
type Line = (&'static str, RGBColor, fn(&WindowPoint) -> f64);

/// p50, p99 and max per time window of `timeline` (ascending by time).
pub fn windows(timeline: &[Sample]) -> Vec<WindowPoint> {
    let Some(last) = timeline.last() else {
        return Vec::new();
    };
    let span_ms = u64::from(last.at_ms) + 1;
    let width_ms = span_ms.div_ceil(TIME_WINDOWS_MAX).max(TIME_WINDOW_MS_MIN);
    let mut points = Vec::new();
    let mut start = 0;
    while start < timeline.len() {
        let window = u64::from(timeline[start].at_ms) / width_ms;
        let end = start
            + timeline[start..]
                .iter()
                .take_while(|s| u64::from(s.at_ms) / width_ms == window)
                .count();
        let mut latencies: Vec<u32> = timeline[start..end].iter().map(|s| s.latency_us).collect();
        latencies.sort_unstable();
        let at = |q: f64| {
            let index = ((latencies.len() - 1) as f64 * q).round() as usize;
            f64::from(latencies[index]) / 1000.0
        };
        let middle_s = (window * width_ms) as f64 / 1000.0 + width_ms as f64 / 2000.0;
        points.push((middle_s, at(0.5), at(0.99), at(1.0)));
        start = end;
    }
    points
}

/// Histogram bars: (from ms, to ms, count), evenly over 0..p99.9 × 1.2;
/// slower operations are counted in the last bar.
pub fn bins(report: &LoadReport) -> Vec<(f64, f64, u64)> {
    let histogram = &report.latency_us;
    if histogram.is_empty() {
        return Vec::new();
    }
    let top_us = (histogram.value_at_quantile(0.999) as f64 * 1.2).max(1.0);
    let width_us = top_us / HISTOGRAM_BINS as f64;
    let mut counts = vec![0u64; HISTOGRAM_BINS];
    for value in histogram.iter_recorded() {
        let bin = ((value.value_iterated_to() as f64 / width_us) as usize).min(HISTOGRAM_BINS - 1);
        counts[bin] += value.count_at_value();
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, count)| {
            let from = i as f64 * width_us / 1000.0;
            (from, from + width_us / 1000.0, count)
        })
        .collect()
}

/// Writes the SVG.
pub fn write_svg(
    path: &Path,
    report: &LoadReport,
    title: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let points = windows(&report.timeline);
    let bars = bins(report);
    let root = SVGBackend::new(path, PLOT_SIZE_PIXELS).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(PLOT_SIZE_PIXELS.1 / 2);

    let time_max = points.last().map_or(1.0, |p| p.0 * 1.05).max(0.01);
    let latency_max = points.iter().map(|p| p.3).fold(0.0f64, f64::max).max(0.001) * 1.1;
    let mut chart = ChartBuilder::on(&upper)
        .caption(
            format!(
                "kvctl bench {title}: latency over time ({:.0} ops/s)",
                report.ops_per_second()
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..time_max, 0.0..latency_max)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("latency (ms)")
        .draw()?;
    let series: [Line; 3] = [
        ("p50", BLUE, |p| p.1),
        ("p99", RGBColor(230, 120, 0), |p| p.2),
        ("max", RED, |p| p.3),
    ];
    for (label, color, pick) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, pick(p))),
                color,
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let bin_top = bars.last().map_or(1.0, |b| b.1);
    let count_max = bars.iter().map(|b| b.2).max().unwrap_or(1).max(1);
    let mut histogram = ChartBuilder::on(&lower)
        .caption(
            format!(
                "latency histogram ({} ops; p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms)",
                report.ops_ok,
                report.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
                report.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
                report.latency_us.max() as f64 / 1000.0
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..bin_top, 0u64..count_max + count_max / 10 + 1)?;
    histogram
        .configure_mesh()
        .x_desc("latency (ms); the last bar holds everything slower")
        .y_desc("operations")
        .draw()?;
    histogram.draw_series(
        bars.iter()
            .map(|(from, to, count)| Rectangle::new([(*from, 0), (*to, *count)], BLUE.filled())),
    )?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_percentiles_per_window() {
        let timeline: Vec<Sample> = (0..1000u32)
            .map(|i| Sample {
                at_ms: i,
                latency_us: if i < 500 { 1000 } else { 3000 },
            })
            .collect();
        let points = windows(&timeline);
        assert_eq!(points.len(), 100);
        assert_eq!(points[0].1, 1.0);
        assert_eq!(points[99].3, 3.0);
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(windows(&[]).is_empty());
    }
}
