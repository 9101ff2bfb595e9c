//! The SVG timeline: tokens on x; per configuration the pool's reserve and live high-water
//! stacked on the startup memory, its budget, and the card.

use crate::scenario::{static_bytes, Outcome, GIB};
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

pub fn write(
    path: &Path,
    outcomes: &[Outcome],
    card: Option<usize>,
    title: &str,
) -> Result<(), String> {
    let gib = |b: usize| b as f64 / GIB;
    let mut series = Vec::new();
    let (mut y_min, mut y_max, mut x_max) = (f64::MAX, 0f64, 1f64);
    for o in outcomes {
        let Ok(r) = &o.report else { continue };
        let (w, kv, compute) = static_bytes(&o.config);
        let base = w + kv + compute;
        let pts = |f: &dyn Fn(&cupool::runtime::UbatchRow) -> usize| -> Vec<(f64, f64)> {
            r.ubatches
                .iter()
                .map(|u| ((u.pos0 + u.n_tokens) as f64, gib(base + f(u))))
                .collect()
        };
        let reserved = pts(&|u| u.reserved_bytes);
        let live = pts(&|u| u.live_peak_bytes);
        let budget = gib(base - compute + r.budget_bytes);
        for &(x, y) in reserved.iter().chain(&live) {
            x_max = x_max.max(x);
            y_max = y_max.max(y);
            y_min = y_min.min(y);
        }
        y_max = y_max.max(budget);
        y_min = y_min.min(budget);
        series.push((o.label.clone(), reserved, live, budget, r.oom_at_token));
    }
    if let Some(c) = card {
        y_max = y_max.max(gib(c));
    }
    if series.is_empty() {
        return Err("nothing to plot: no configuration ran".into());
    }
    let pad = ((y_max - y_min) * 0.08).max(0.05);
    let root = SVGBackend::new(path, (1100, 650)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max * 1.02, (y_min - pad)..(y_max + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("prompt tokens processed")
        .y_desc("device memory (GiB): weights + KV + compute + pool")
        .draw()
        .map_err(|e| err(&e))?;
    if let Some(c) = card {
        let y = gib(c);
        chart
            .draw_series(LineSeries::new(
                [(0.0, y), (x_max * 1.02, y)],
                BLACK.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("card ({y:.1} GiB)"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    }
    for (i, (label, reserved, live, budget, oom)) in series.into_iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(reserved.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!(
                "{label}: pool reserved{}",
                oom.map_or(String::new(), |t| format!(" (OOM at {t})"))
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(live, 4, 3, color.stroke_width(1)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, budget), (x_max * 1.02, budget)],
                10,
                6,
                color.mix(0.6).stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        if let (Some(_), Some(&last)) = (oom, reserved.last()) {
            chart
                .draw_series([Cross::new(last, 8, color.stroke_width(3))])
                .map_err(|e| err(&e))?;
        }
    }
    // One legend entry each for the line styles shared by every configuration.
    let grey = RGBColor(110, 110, 110);
    chart
        .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
        .map_err(|e| err(&e))?
        .label("short dashes: live high-water (same colour)")
        .legend(move |(x, y)| {
            PathElement::new(
                [(x, y), (x + 4, y), (x + 7, y), (x + 11, y)],
                grey.stroke_width(1),
            )
        });
    chart
        .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
        .map_err(|e| err(&e))?
        .label("long dashes: reserved compute budget (same colour)")
        .legend(move |(x, y)| {
            PathElement::new([(x, y), (x + 18, y)], grey.mix(0.6).stroke_width(1))
        });
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
