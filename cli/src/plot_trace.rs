//! A replayed trace's timeline: the live bytes the trace holds and the bytes the pool reserves
//! for them, after each event, so a user sees where a pool strands memory (the gap between the
//! two) in any recorded run: a PyTorch job's (`cupool.record`) or llama.cpp's (`CUPOOL_TRACE`).
//! PNG or SVG, by the file's extension (the same check as the run's plot).

use crate::canvas::{begin, frame, on_backend};
use crate::output::mib;
use cupool::trace::{Point, ReplayReport};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const MIB: f64 = (1u64 << 20) as f64;
/// Points drawn at most: each keeps its stretch's highest live and reserved bytes, so no peak
/// is lost to the thinning.
const BUCKETS: usize = 2000;

/// `(event, live MiB, reserved MiB)`, at most [`BUCKETS`] of them.
fn thinned(points: &[Point]) -> Vec<(f64, f64, f64)> {
    let per = points.len().div_ceil(BUCKETS).max(1);
    points
        .chunks(per)
        .map(|c| {
            let live = c.iter().map(|p| p.live).max().unwrap_or(0);
            let reserved = c.iter().map(|p| p.reserved).max().unwrap_or(0);
            (
                c[c.len() - 1].event as f64,
                live as f64 / MIB,
                reserved as f64 / MIB,
            )
        })
        .collect()
}

/// Writes the timeline of `r` to `path` (`.png` or `.svg`).
pub fn write(path: &Path, r: &ReplayReport, title: &str) -> Result<(), String> {
    let format = begin(path)?;
    if r.timeline.is_empty() {
        return Err(format!(
            "plot {}: the trace allocates nothing",
            path.display()
        ));
    }
    let pts = thinned(&r.timeline);
    on_backend!(path, format, |root| draw(root, &pts, r, title))
        .map_err(|e| format!("plot {}: {e}", path.display()))
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    pts: &[(f64, f64, f64)],
    r: &ReplayReport,
    title: &str,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let x_max = r.events.max(1) as f64;
    let y_max = r.peak_reserved_bytes.max(r.peak_live_bytes) as f64 / MIB * 1.08 + 1.0;
    let mut chart = frame(
        &root,
        title,
        (x_max, "trace events"),
        (y_max, "memory (MiB)"),
    )?;
    let reserved = RGBColor(31, 119, 180);
    let live = RGBColor(44, 160, 44);
    let label = |what: &str, peak: usize| format!("{what} (peak {})", mib(peak));
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.2)),
            reserved.stroke_width(1),
        ))
        .map_err(|x| e(&x))?
        .label(label(
            &format!("reserved by {}", r.pool),
            r.peak_reserved_bytes,
        ))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], reserved.stroke_width(1)));
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.1)),
            live.stroke_width(1),
        ))
        .map_err(|x| e(&x))?
        .label(label("live", r.peak_live_bytes))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], live.stroke_width(1)));
    if let Some(ev) = r.first_oom_event {
        let red = RGBColor(214, 39, 40);
        let y = pts.iter().find(|p| p.0 >= ev as f64).map_or(0.0, |p| p.2);
        chart
            .draw_series([
                EmptyElement::at((ev as f64, y)) + Cross::new((0, 0), 10, red.stroke_width(4))
            ])
            .map_err(|x| e(&x))?
            .label(format!(
                "first out-of-memory, event {ev} ({} in all)",
                r.ooms
            ))
            .legend(move |(x, y)| Cross::new((x + 9, y), 6, red.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_every_peak() {
        let points: Vec<Point> = (1..=10_000)
            .map(|i| Point {
                event: i,
                live: if i == 4321 { 1 << 30 } else { i },
                reserved: if i == 7777 { 3 << 30 } else { 2 * i },
            })
            .collect();
        let t = thinned(&points);
        assert!(t.len() <= BUCKETS);
        let max = |f: fn(&(f64, f64, f64)) -> f64| t.iter().map(f).fold(0.0, f64::max);
        assert_eq!(max(|p| p.1), 1024.0);
        assert_eq!(max(|p| p.2), 3072.0);
        assert_eq!(t.last().unwrap().0, 10_000.0);
    }
}
