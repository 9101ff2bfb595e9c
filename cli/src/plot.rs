//! The timeline a user pastes into a bug report: tokens on x, the pool's memory on its own axis
//! (MiB), per configuration its reserve (solid) and live high-water (dashed), against the room
//! the card leaves the pool once weights, KV cache and compute buffer are in (black). Each
//! configuration has its own colour, marker and line width (drawn widest first, so a curve
//! that another one covers still shows around it: legacy/never and legacy/auto agree until
//! the first runs out). A run that dies ends in a cross labelled with its token, at the
//! reserve it reached in the ubatch that failed; the legend's peaks are the table's. PNG or
//! SVG, by the file's extension.

use crate::canvas::{begin, frame, on_backend};
use crate::output::mib;
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
const MIB: f64 = (1u64 << 20) as f64;

struct Series {
    label: String,
    /// After each ubatch (tokens processed, MiB); a run that died ends at the token it died
    /// at, with what the pool reached in the ubatch that failed.
    reserved: Vec<(f64, f64)>,
    live: Vec<(f64, f64)>,
    /// The run's peak reserve, as the table prints it.
    peak: String,
    /// The pool's room on the card: card − weights − KV − compute buffer.
    room: Option<f64>,
    oom: Option<usize>,
}

/// A marker's outline, in pixels around its point.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
    TriangleDown,
    Plus,
}

const MARKERS: [Marker; 6] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Diamond,
    Marker::TriangleDown,
    Marker::Plus,
];

impl Marker {
    /// Two strokes (the second empty for a closed outline) of half-size `r`.
    fn strokes(self, r: i32) -> [Vec<(i32, i32)>; 2] {
        let closed = |p: &[(i32, i32)]| {
            let mut v = p.to_vec();
            v.push(p[0]);
            [v, Vec::new()]
        };
        match self {
            Marker::Circle => {
                let pts: Vec<(i32, i32)> = (0..12)
                    .map(|k| {
                        let a = k as f64 * std::f64::consts::PI / 6.0;
                        (
                            (r as f64 * a.cos()).round() as i32,
                            (r as f64 * a.sin()).round() as i32,
                        )
                    })
                    .collect();
                closed(&pts)
            }
            Marker::Triangle => closed(&[(0, -r), (r, r), (-r, r)]),
            Marker::Square => closed(&[(-r, -r), (r, -r), (r, r), (-r, r)]),
            Marker::Diamond => closed(&[(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)]),
            Marker::TriangleDown => closed(&[(0, r), (r, -r), (-r, -r)]),
            Marker::Plus => [vec![(-r, 0), (r, 0)], vec![(0, -r), (0, r)]],
        }
    }
}

/// The `i`th configuration's look: colour, marker, and the width of its reserve line (the
/// first drawn widest).
fn style(i: usize, n: usize) -> (RGBColor, Marker, u32) {
    let width = 2 + n.saturating_sub(1 + i) as u32;
    (
        PALETTE[i % PALETTE.len()],
        MARKERS[i % MARKERS.len()],
        width.min(8),
    )
}

/// `stroke` moved `dx` pixels right.
fn shift(stroke: &[(i32, i32)], dx: i32) -> Vec<(i32, i32)> {
    stroke.iter().map(|&(x, y)| (x + dx, y)).collect()
}

/// Writes the plot to `path` (`.png` or `.svg`).
pub fn write(
    path: &Path,
    outcomes: &[Outcome],
    card: Option<usize>,
    title: &str,
) -> Result<(), String> {
    let format = begin(path)?;
    let series = series(outcomes, card);
    if series.is_empty() {
        return Err("nothing to plot: no configuration ran".into());
    }
    on_backend!(path, format, |root| draw(root, &series, title))
        .map_err(|e| format!("plot {}: {e}", path.display()))
}

fn series(outcomes: &[Outcome], card: Option<usize>) -> Vec<Series> {
    outcomes
        .iter()
        .filter_map(|o| {
            let r = o.report.as_ref().ok()?;
            let (w, kv, compute) = static_bytes(&o.config);
            let pts = |f: &dyn Fn(&cupool::runtime::UbatchRow) -> usize, end: usize| {
                let mut v: Vec<(f64, f64)> = r
                    .ubatches
                    .iter()
                    .map(|u| ((u.pos0 + u.n_tokens) as f64, f(u) as f64 / MIB))
                    .collect();
                // The failing ubatch has no row: its point is where the run died, at what the
                // pool reached in it (the run's peak, which the table reports).
                if let Some(t) = r.oom_at_token {
                    v.push((t as f64, end as f64 / MIB));
                }
                v
            };
            Some(Series {
                label: o.label.clone(),
                reserved: pts(&|u| u.reserved_bytes, r.peak_reserved_bytes),
                live: pts(&|u| u.live_peak_bytes, r.peak_live_bytes),
                peak: mib(r.peak_reserved_bytes),
                room: card.map(|c| c.saturating_sub(w + kv + compute) as f64 / MIB),
                oom: r.oom_at_token,
            })
        })
        .collect()
}

/// The legend's line of a configuration.
fn legend(s: &Series) -> String {
    let outcome = s
        .oom
        .map_or("completes".to_string(), |t| format!("OOM at token {t} (×)"));
    format!("{}: reserve, peak {}, {outcome}", s.label, s.peak)
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
    let mut chart = frame(
        &root,
        title,
        (x_max * 1.02, "prompt tokens processed"),
        (y_max, "pool memory (MiB)"),
    )?;
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
    let n = series.len();
    for (i, s) in series.iter().enumerate() {
        let (color, marker, width) = style(i, n);
        chart
            .draw_series(LineSeries::new(
                s.reserved.clone(),
                color.stroke_width(width),
            ))
            .map_err(|x| e(&x))?
            .label(legend(s))
            .legend(move |(x, y)| {
                let [a, b] = marker.strokes(4);
                EmptyElement::at((x, y))
                    + PathElement::new([(0, 0), (22, 0)], color.stroke_width(width))
                    + PathElement::new(shift(&a, 11), WHITE.stroke_width(5))
                    + PathElement::new(shift(&a, 11), color.stroke_width(2))
                    + PathElement::new(shift(&b, 11), color.stroke_width(2))
            });
        chart
            .draw_series(DashedLineSeries::new(
                s.live.clone(),
                6,
                4,
                color.stroke_width(width.div_ceil(2)),
            ))
            .map_err(|x| e(&x))?;
    }
    // The markers after every line, so that no line covers them; each configuration marks
    // every third point from its own start, so that curves that coincide alternate markers.
    for (i, s) in series.iter().enumerate() {
        let (color, marker, _) = style(i, n);
        let [a, b] = marker.strokes(4);
        for (stroke, pen) in [
            (&a, WHITE.stroke_width(5)),
            (&a, color.stroke_width(2)),
            (&b, color.stroke_width(2)),
        ] {
            let marked = s
                .reserved
                .iter()
                .enumerate()
                .filter(|(k, _)| k % 3 == i % 3);
            chart
                .draw_series(
                    marked
                        .map(|(_, &p)| EmptyElement::at(p) + PathElement::new(stroke.clone(), pen)),
                )
                .map_err(|x| e(&x))?;
        }
    }
    // Where each run that died died, with its token, below left of the cross (the legend is
    // right, the room line above).
    for (i, s) in series.iter().enumerate() {
        let (color, _, _) = style(i, n);
        if let (Some(t), Some(&last)) = (s.oom, s.reserved.last()) {
            chart
                .draw_series([EmptyElement::at(last)
                    + Cross::new((0, 0), 10, color.stroke_width(4))
                    + Text::new(
                        format!("{}: OOM at token {t}", s.label),
                        (-240, 10),
                        ("sans-serif", 13).into_font().color(&color),
                    )])
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
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_looks_different_from_every_other() {
        let n = PALETTE.len();
        let looks: Vec<_> = (0..n).map(|i| style(i, n)).collect();
        for (i, a) in looks.iter().enumerate() {
            for b in &looks[i + 1..] {
                assert!(a.0 != b.0 && a.1 != b.1 && a.2 != b.2, "{a:?} {b:?}");
            }
        }
        // Each marker has an outline of its own.
        for (i, a) in MARKERS.iter().enumerate() {
            for b in &MARKERS[i + 1..] {
                assert_ne!(a.strokes(4), b.strokes(4), "{a:?} {b:?}");
            }
        }
    }
}
