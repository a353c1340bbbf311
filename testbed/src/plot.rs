//! PNG charts of benchmark records (plotters' bitmap backend), labelled in
//! the `DejaVu` Sans font (Debian's `fonts-dejavu-core`, which
//! `testbed/scripts/ensure-deps.sh` installs).
//!
//! - [`window_charts`]: an xina worker's congestion window over one
//!   repetition of each measured case (rank 0's, the last repetition).
//! - [`loss_charts`]: the time of each implementation against the loss rate,
//!   for each worker count, frame and size measured at several loss rates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context as _, anyhow};
use plotters::prelude::*;

use crate::allreduce_bench::{Impl, Record, format_size};
use crate::lossy::LossModel;

/// The font the charts are labelled in.
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Registers [`FONT`] with plotters once.
fn font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT).map_err(|e| {
                format!("reading {FONT} ({e}); Debian's fonts-dejavu-core package has it")
            })?;
            plotters::style::register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .map_err(|_| format!("{FONT} is not a font plotters can use"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Draws `series` as lines (with a dot at each point when `dots`) into a
/// PNG at `path`.
///
/// # Errors
/// When the font is missing or the file cannot be written.
pub fn line_chart(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    dots: bool,
) -> anyhow::Result<()> {
    font()?;
    let points = || series.iter().flat_map(|s| s.points.iter().copied());
    let x_max = points().map(|p| p.0).fold(0.0, f64::max);
    let y_max = points().map(|p| p.1).fold(0.0, f64::max);
    let x_min = points().map(|p| p.0).fold(x_max, f64::min).min(0.0);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = BitMapBackend::new(path, (960, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                x_min..x_max.max(x_min + 1e-9) * 1.02,
                0.0..y_max.max(1e-9) * 1.1,
            )?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            if dots {
                chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow!("drawing {}: {e}", path.display()))
}

/// A window trace (milliseconds, chunks) as steps: each value holds until
/// the next change.
pub fn steps(trace: &[(f64, u32)]) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(2 * trace.len());
    for (i, &(t, w)) in trace.iter().enumerate() {
        if i > 0 {
            points.push((t, f64::from(trace[i - 1].1)));
        }
        points.push((t, f64::from(w)));
    }
    points
}

/// One chart per xina record with a window trace, into `dir`; returns the
/// files written.
///
/// # Errors
/// As [`line_chart`].
pub fn window_charts(dir: &Path, records: &[Record]) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for r in records {
        let Some(trace) = r.window_trace.as_ref().filter(|t| !t.is_empty()) else {
            continue;
        };
        let rate = r
            .rate_mbit
            .map_or_else(|| "unshaped".to_owned(), |m| format!("{m} Mbit/s"));
        let name = format!(
            "window-{}w-mtu{}-{}-loss{}{}.png",
            r.workers,
            r.frame_bytes,
            format_size(r.bytes),
            r.loss,
            r.rate_mbit
                .map_or_else(String::new, |m| format!("-{m}mbit"))
        );
        let path = dir.join(name);
        let title = format!(
            "xina rank 0's congestion window: {} workers, MTU {}, {}, {rate}, loss {}%",
            r.workers,
            r.frame_bytes,
            format_size(r.bytes),
            r.loss
        );
        let series = [Series {
            label: "window (chunks)".to_owned(),
            points: steps(trace),
        }];
        line_chart(
            &path,
            &title,
            ("ms into the repetition", "chunks"),
            &series,
            false,
        )?;
        written.push(path);
    }
    Ok(written)
}

/// One chart of time against loss per worker count, frame and size measured
/// at two loss rates or more, into `dir`; returns the files written.
///
/// # Errors
/// As [`line_chart`].
pub fn loss_charts(dir: &Path, records: &[Record]) -> anyhow::Result<Vec<PathBuf>> {
    // (workers, frame, bytes) -> implementation -> (loss, seconds).
    type Points = BTreeMap<Impl, Vec<(f64, f64)>>;
    let mut cases: BTreeMap<(usize, u32, usize), Points> = BTreeMap::new();
    for r in records {
        cases
            .entry((r.workers, r.frame_bytes, r.bytes))
            .or_default()
            .entry(r.implementation)
            .or_default()
            .push((r.loss, r.time_us / 1e6));
    }
    let mut written = Vec::new();
    for ((workers, frame, bytes), impls) in cases {
        if impls.values().all(|p| p.len() < 2) {
            continue;
        }
        let series: Vec<Series> = impls
            .into_iter()
            .map(|(which, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    label: which.name().to_owned(),
                    points,
                }
            })
            .collect();
        let path = dir.join(format!(
            "loss-{workers}w-mtu{frame}-{}.png",
            format_size(bytes)
        ));
        let title = format!(
            "allreduce of {} at {workers} workers, MTU {frame}: time against loss",
            format_size(bytes)
        );
        // Every record of one run has the same model.
        let axis = match records.iter().find_map(|r| r.loss_model) {
            Some(LossModel::Batch) => "loss, % of packets each way (offloads on)",
            _ => "loss, % of frames each way",
        };
        line_chart(&path, &title, (axis, "seconds"), &series, true).context("the loss chart")?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_becomes_steps_holding_each_value_until_the_next() {
        let trace = [(0.0, 4), (1.5, 5), (3.0, 2)];
        assert_eq!(
            steps(&trace),
            [(0.0, 4.0), (1.5, 4.0), (1.5, 5.0), (3.0, 5.0), (3.0, 2.0)]
        );
        assert!(steps(&[]).is_empty());
    }

    #[test]
    fn a_chart_is_written_as_a_png() {
        let path = std::env::temp_dir().join(format!("xina-plot-test-{}.png", std::process::id()));
        let series = [
            Series {
                label: "xina".to_owned(),
                points: vec![(0.0, 1.0), (1.0, 1.2), (5.0, 2.0)],
            },
            Series {
                label: "ring".to_owned(),
                points: vec![(0.0, 1.5), (1.0, 2.5), (5.0, 6.0)],
            },
        ];
        let drawn = line_chart(&path, "test", ("loss", "seconds"), &series, true);
        let bytes = std::fs::read(&path);
        let _ = std::fs::remove_file(&path);
        drawn.expect("the chart is drawn");
        let bytes = bytes.expect("the file exists");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(bytes.len() > 4096, "{} bytes", bytes.len());
    }
}
