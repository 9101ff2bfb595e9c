//! What every plot shares: the file format its name asks for (checked before any work), the
//! embedded font, a drawing area of that format, and the frame (title, axes, labels).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

pub(crate) const SIZE: (u32, u32) = (1100, 650);

/// The embedded font: PNG text needs one, and a machine may have none.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// The format `path` asks for, with the embedded font registered: what every plot does first.
pub(crate) fn begin(path: &Path) -> Result<Format, String> {
    let format = format_of(path)?;
    // Registering twice (a second plot in one process) is harmless; a bad font is a bug.
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| format!("plot {}: the embedded font is unreadable", path.display()))?;
    Ok(format)
}

/// Runs `$draw` on a drawing area of the plot's size in `$format`, written to `$path`.
macro_rules! on_backend {
    ($path:expr, $format:expr, |$root:ident| $draw:expr) => {
        match $format {
            $crate::canvas::Format::Png => {
                let $root = plotters::prelude::BitMapBackend::new($path, $crate::canvas::SIZE)
                    .into_drawing_area();
                $draw
            }
            $crate::canvas::Format::Svg => {
                let $root = plotters::prelude::SVGBackend::new($path, $crate::canvas::SIZE)
                    .into_drawing_area();
                $draw
            }
        }
    };
}
pub(crate) use on_backend;

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

/// Every plot's frame: the title, and axes from 0 to each maximum with their descriptions and
/// whole-number labels.
pub(crate) fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    (x_max, x_desc): (f64, &str),
    (y_max, y_desc): (f64, &str),
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String>
where
    DB::ErrorType: 'static,
{
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{:.0}", x))
        .y_label_formatter(&|y| format!("{:.0}", y))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    Ok(chart)
}
