//! The timeline a user pastes into a bug report: tokens on x, the pool's memory on its own axis
//! (MiB), per configuration its reserve (solid) and live high-water (dashed), against the room
//! the card leaves the pool once weights, KV cache and compute buffer are in (black). A run that
//! dies ends in a cross where its reserve met the room. PNG or SVG, by the file's extension.

use crate::scenario::{static_bytes, Outcome};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const PALETTE: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];
const SIZE: (u32, u32) = (1100, 650);
const MIB: f64 = (1u64 << 20) as f64;

/// The embedded font: PNG text needs one, and a machine may have none.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

struct Series {
    label: String,
    reserved: Vec<(f64, f64)>,
    live: Vec<(f64, f64)>,
    /// The pool's room on the card: card − weights − KV − compute buffer.
    room: Option<f64>,
    oom: Option<usize>,
}

/// Writes the plot to `path` (`.png` or `.svg`).
pub fn write(
    path: &Path,
    outcomes: &[Outcome],
    card: Option<usize>,
    title: &str,
) -> Result<(), String> {
    let format = format_of(path)?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    // Registering twice (a second plot in one process) is harmless; a bad font is a bug.
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| err(&"the embedded font is unreadable"))?;
    let series = series(outcomes, card);
    if series.is_empty() {
        return Err("nothing to plot: no configuration ran".into());
    }
    match format {
        Format::Png => draw(
            BitMapBackend::new(path, SIZE).into_drawing_area(),
            &series,
            title,
        ),
        Format::Svg => draw(
            SVGBackend::new(path, SIZE).into_drawing_area(),
            &series,
            title,
        ),
    }
    .map_err(|e| err(&e))
}

/// The plot's file format, chosen by the file's extension.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    Png,
    Svg,
}

/// The format `--plot path` asks for, or why the name is refused: checked before any run.
pub fn format_of(path: &Path) -> Result<Format, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("png") => Ok(Format::Png),
        Some("svg") => Ok(Format::Svg),
        _ => Err(format!(
            "--plot {}: the file name must end in .png or .svg (the format follows it)",
            path.display()
        )),
    }
}

fn series(outcomes: &[Outcome], card: Option<usize>) -> Vec<Series> {
    outcomes
        .iter()
        .filter_map(|o| {
            let r = o.report.as_ref().ok()?;
            let (w, kv, compute) = static_bytes(&o.config);
            let pts = |f: &dyn Fn(&cupool::runtime::UbatchRow) -> usize| {
                r.ubatches
                    .iter()
                    .map(|u| ((u.pos0 + u.n_tokens) as f64, f(u) as f64 / MIB))
                    .collect::<Vec<_>>()
            };
            Some(Series {
                label: o.label.clone(),
                reserved: pts(&|u| u.reserved_bytes),
                live: pts(&|u| u.live_peak_bytes),
                room: card.map(|c| c.saturating_sub(w + kv + compute) as f64 / MIB),
                oom: r.oom_at_token,
            })
        })
        .collect()
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[Series],
    title: &str,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let x_max = series
        .iter()
        .flat_map(|s| s.reserved.iter().map(|p| p.0))
        .fold(1f64, f64::max);
    let y_data = series
        .iter()
        .flat_map(|s| s.reserved.iter().chain(&s.live).map(|p| p.1))
        .fold(0f64, f64::max);
    // The room is drawn when it is near the data; far above it, it would flatten every line.
    let room = series.iter().find_map(|s| s.room);
    let show_room = room.is_some_and(|r| r <= y_data * 3.0);
    let y_max = if show_room {
        y_data.max(room.unwrap_or(0.0))
    } else {
        y_data
    } * 1.08
        + 1.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max * 1.02, 0f64..y_max)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("prompt tokens processed")
        .y_desc("pool memory (MiB)")
        .x_label_formatter(&|x| format!("{:.0}", x))
        .y_label_formatter(&|y| format!("{:.0}", y))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    if let (true, Some(r)) = (show_room, room) {
        chart
            .draw_series(LineSeries::new(
                [(0.0, r), (x_max * 1.02, r)],
                BLACK.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(format!(
                "room for the pool on the card ({r:.0} MiB: card − weights − KV − compute)"
            ))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    }
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let peak = s.reserved.iter().map(|p| p.1).fold(0f64, f64::max);
        let outcome = s
            .oom
            .map_or("completes".to_string(), |t| format!("OOM at token {t}"));
        chart
            .draw_series(LineSeries::new(s.reserved.clone(), color.stroke_width(3)))
            .map_err(|x| e(&x))?
            .label(format!(
                "{}: reserve, peak {peak:.0} MiB, {outcome}",
                s.label
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(3)));
        chart
            .draw_series(DashedLineSeries::new(
                s.live.clone(),
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(|x| e(&x))?;
        if let (Some(_), Some(&last)) = (s.oom, s.reserved.last()) {
            chart
                .draw_series([Cross::new(last, 9, color.stroke_width(3))])
                .map_err(|x| e(&x))?;
        }
    }
    let grey = RGBColor(90, 90, 90);
    chart
        .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
        .map_err(|x| e(&x))?
        .label("dashed, same colour: live high-water (what the kernels hold)")
        .legend(move |(x, y)| {
            PathElement::new(
                [(x, y), (x + 6, y), (x + 10, y), (x + 16, y)],
                grey.stroke_width(2),
            )
        });
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
