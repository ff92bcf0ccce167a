//! The `--plot` charts: one file with a panel per mode — latency (round-trip p50 in µs)
//! and throughput (MiB/s), each against the message size on log-log axes, one series per
//! method — and one legend beside them. SVG or PNG, chosen by the file's extension.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::method::Mode;
use crate::pubsub::suite::Cell as PubSubCell;
use crate::suite::{Cell, Status};
use shmlink_measure::size;

/// The image formats `--plot` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format named by `path`'s extension (case-insensitive), or an error that lists
    /// the valid ones.
    pub fn of(path: &Path) -> Result<Format, String> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(format!(
                "cannot tell the image format of {:?} (valid extensions: .svg, .png)",
                path.display().to_string()
            )),
        }
    }
}

/// Pixel size of the whole image.
const WIDTH: u32 = 1600;
const HEIGHT: u32 = 760;
/// Width of the legend strip on the right.
const LEGEND_W: u32 = 230;
/// The font family every text uses; registered once from bytes shipped in a crate, so
/// PNG text renders without system fonts (SVG names the family and lets the viewer
/// choose).
const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Hack is a DejaVu derivative; any well-formed TTF would do.
        let font = epaint_default_fonts::HACK_REGULAR;
        let registered = plotters::style::register_font(FONT, FontStyle::Normal, font);
        assert!(
            registered.is_ok(),
            "the font epaint_default_fonts ships parses"
        );
    });
}

/// One series: a method's measured points in one mode, ordered by size.
struct Series<'a> {
    method: &'a str,
    points: Vec<(f64, f64)>,
}

/// The figure plotted for a measured cell: p50 in µs, or MiB/s.
fn figure(cell: &Cell) -> Option<f64> {
    let s = cell.summary.as_ref()?;
    let v = match cell.mode {
        Mode::Latency => s.rtt_ns?.p50 as f64 / 1000.0,
        Mode::Throughput => s.bytes_per_s? / (1u64 << 20) as f64,
    };
    (v.is_finite() && v > 0.0).then_some(v)
}

/// Methods in order of first appearance; the order fixes each method's colour.
fn methods(cells: &[Cell]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in cells {
        if !out.contains(&c.method.as_str()) {
            out.push(&c.method);
        }
    }
    out
}

fn series<'a>(cells: &'a [Cell], mode: Mode, methods: &[&'a str]) -> Vec<Series<'a>> {
    methods
        .iter()
        .map(|&method| {
            let mut points: Vec<(f64, f64)> = cells
                .iter()
                .filter(|c| c.method == method && c.mode == mode && c.status == Status::Ok)
                .filter_map(|c| Some((c.size as f64, figure(c)?)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { method, points }
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn colour(index: usize) -> RGBColor {
    // Tableau 20: distinct at a glance, then shades.
    const PALETTE: [(u8, u8, u8); 20] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
        (174, 199, 232),
        (255, 187, 120),
        (152, 223, 138),
        (255, 152, 150),
        (197, 176, 213),
        (196, 156, 148),
        (247, 182, 210),
        (199, 199, 199),
        (219, 219, 141),
        (158, 218, 229),
    ];
    let (r, g, b) = PALETTE[index % PALETTE.len()];
    RGBColor(r, g, b)
}

/// shmlink's own methods and the hardware floor are drawn thicker.
fn stroke(method: &str) -> u32 {
    if method.starts_with("shmlink") || method == "shm-spin" {
        3
    } else {
        1
    }
}

/// A log range around `lo..=hi` with some margin, never empty.
fn log_bounds(lo: f64, hi: f64) -> (f64, f64) {
    (lo / 1.6, hi * 1.6)
}

/// Tick labels: 0.3, 12, 4.5k, 1.2M.
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

type DrawResult = Result<(), String>;

/// A panel's titles and x labels.
struct Axes {
    title: String,
    x_desc: &'static str,
    y_desc: &'static str,
    x_label: fn(f64) -> String,
}

impl Axes {
    fn of(mode: Mode) -> Axes {
        let (title, y_desc) = match mode {
            Mode::Latency => (
                "latency: round-trip p50 vs message size",
                "round trip p50 (µs, log)",
            ),
            Mode::Throughput => (
                "throughput: MiB/s vs message size",
                "throughput (MiB/s, log)",
            ),
        };
        Axes {
            title: title.into(),
            x_desc: "message size (log)",
            y_desc,
            x_label: |v| size::human(v.round() as usize),
        }
    }
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    axes: &Axes,
    all: &[Series],
    names: &[&str],
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let xs = || all.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = || all.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (x0, x1) = log_bounds(xs().fold(f64::INFINITY, f64::min), xs().fold(0.0, f64::max));
    let (y0, y1) = log_bounds(ys().fold(f64::INFINITY, f64::min), ys().fold(0.0, f64::max));
    let mut sizes: Vec<f64> = xs().collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();

    let mut chart = ChartBuilder::on(area)
        .caption(&axes.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(sizes),
            (y0..y1).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .x_label_formatter(&|v| (axes.x_label)(*v))
        .y_label_formatter(&|v| short(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(err)?;
    for s in all {
        let index = names.iter().position(|n| *n == s.method).unwrap_or(0);
        let style = colour(index).stroke_width(stroke(s.method));
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(err)?;
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, colour(index).filled())),
            )
            .map_err(err)?;
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, cells: &[Cell]) -> DrawResult {
    let names = methods(cells);
    let panels: Vec<(Axes, Vec<Series>)> = [Mode::Latency, Mode::Throughput]
        .into_iter()
        .map(|m| (Axes::of(m), series(cells, m, &names)))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    draw_panels(root, &panels, &names)
}

/// The pub/sub chart: a panel per message size, p50 latency (µs) against the number of
/// subscribers, one series per method.
fn draw_pubsub<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    cells: &[PubSubCell],
) -> DrawResult {
    let mut names: Vec<&str> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for c in cells {
        if !names.contains(&c.method.as_str()) {
            names.push(&c.method);
        }
        if !sizes.contains(&c.size) {
            sizes.push(c.size);
        }
    }
    let panels: Vec<(Axes, Vec<Series>)> = sizes
        .iter()
        .map(|&size| {
            let series = names
                .iter()
                .map(|&method| {
                    let mut points: Vec<(f64, f64)> = cells
                        .iter()
                        .filter(|c| c.method == method && c.size == size)
                        .filter(|c| c.status == Status::Ok)
                        .filter_map(|c| {
                            let p50 = c.summary.as_ref()?.latency_ns.p50 as f64 / 1000.0;
                            (p50 > 0.0).then_some((c.subscribers as f64, p50))
                        })
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series { method, points }
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            let axes = Axes {
                title: format!("pubsub {}: p50 latency vs subscribers", size::human(size)),
                x_desc: "subscribers (log)",
                y_desc: "publish → subscriber p50 (µs, log)",
                x_label: |v| format!("{}", v.round()),
            };
            (axes, series)
        })
        .filter(|(_, s): &(Axes, Vec<Series>)| !s.is_empty())
        .collect();
    draw_panels(root, &panels, &names)
}

fn draw_panels<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[(Axes, Vec<Series>)],
    names: &[&str],
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    if panels.is_empty() {
        root.draw(&Text::new(
            "no measured results to plot",
            (40, 40),
            (FONT, 24).into_font(),
        ))
        .map_err(err)?;
        return root.present().map_err(err);
    }
    // Only methods with at least one point get a legend entry, keeping their colour.
    let shown: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| panels.iter().any(|(_, s)| s.iter().any(|s| s.method == *n)))
        .collect();
    let (charts, side) = root.split_horizontally(WIDTH - LEGEND_W);
    let areas = charts.split_evenly((1, panels.len()));
    for ((axes, series), area) in panels.iter().zip(&areas) {
        panel(area, axes, series, names)?;
    }
    let entries: Vec<(usize, &str)> = shown
        .iter()
        .map(|n| (names.iter().position(|m| m == n).unwrap_or(0), *n))
        .collect();
    legend(&side, &entries)?;
    root.present().map_err(err)
}

/// The legend: one row per method with its colour (the index into all methods).
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(usize, &str)],
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let text = TextStyle::from((FONT, 15).into_font()).color(&BLACK);
    area.draw(&Text::new("method", (10, 40), text.clone()))
        .map_err(err)?;
    for (row, &(index, name)) in entries.iter().enumerate() {
        let y = 70 + row as i32 * 22;
        area.draw(&Rectangle::new(
            [(10, y + 4), (40, y + 4 + stroke(name) as i32)],
            colour(index).filled(),
        ))
        .map_err(err)?;
        area.draw(&Circle::new((25, y + 5), 3, colour(index).filled()))
            .map_err(err)?;
        area.draw(&Text::new(name.to_string(), (50, y - 3), text.clone()))
            .map_err(err)?;
    }
    Ok(())
}

/// Writes the pub/sub chart of `cells` to `path`, as SVG or PNG by its extension.
pub fn write_pubsub(path: &Path, cells: &[PubSubCell]) -> Result<(), String> {
    register_font();
    let result = match Format::of(path)? {
        Format::Svg => draw_pubsub(
            SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area(),
            cells,
        ),
        Format::Png => draw_pubsub(
            BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area(),
            cells,
        ),
    };
    result.map_err(|e| format!("plot {}: {e}", path.display()))
}

/// Writes the charts of `cells` to `path`, as SVG or PNG by its extension.
pub fn write(path: &Path, cells: &[Cell]) -> Result<(), String> {
    register_font();
    let result = match Format::of(path)? {
        Format::Svg => draw(
            SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area(),
            cells,
        ),
        Format::Png => draw(
            BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area(),
            cells,
        ),
    };
    result.map_err(|e| format!("plot {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::CpuPerMsg;
    use crate::suite::Summary;
    use shmlink_measure::stats::Percentiles;

    /// A measured cell: latency p50 `v` ns, or throughput `v` bytes/s.
    fn cell(method: &str, mode: Mode, size: usize, v: f64) -> Cell {
        let p = v as u64;
        Cell {
            method: method.into(),
            mode,
            size,
            status: Status::Ok,
            note: None,
            runs: vec![],
            summary: Some(Summary {
                rtt_ns: (mode == Mode::Latency).then_some(Percentiles {
                    p50: p,
                    p90: p,
                    p99: p,
                    p999: p,
                    max: p,
                }),
                msgs_per_s: (mode == Mode::Throughput).then_some(v / size as f64),
                bytes_per_s: (mode == Mode::Throughput).then_some(v),
                cpu_us_per_msg: CpuPerMsg {
                    driver: 1.0,
                    peer: 1.0,
                },
                spread_pct: 1.0,
            }),
        }
    }

    fn sample() -> Vec<Cell> {
        let mut cells = Vec::new();
        for (i, size) in [64usize, 1024, 65536, 1 << 20].into_iter().enumerate() {
            let k = (i + 1) as f64;
            cells.push(cell("tcp", Mode::Latency, size, 20_000.0 * k));
            cells.push(cell("shm-spin", Mode::Latency, size, 400.0 * k * k));
            cells.push(cell("shmlink-shm", Mode::Latency, size, 450.0 * k * k));
            cells.push(cell("tcp", Mode::Throughput, size, 1e8 * k));
            cells.push(cell("shm-spin", Mode::Throughput, size, 1e9 * k));
        }
        let mut failed = cell("udp", Mode::Latency, 1 << 20, 0.0);
        failed.status = Status::Unsupported;
        failed.summary = None;
        cells.push(failed);
        cells
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("shmlink-plot-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn writes_svg_and_png() {
        let dir = temp_dir("both");
        let (svg, png) = (dir.join("bench.svg"), dir.join("bench.PNG"));
        write(&svg, &sample()).unwrap();
        write(&png, &sample()).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        for name in ["tcp", "shm-spin", "shmlink-shm", "latency", "throughput"] {
            assert!(text.contains(name), "{name} missing from the SVG");
        }
        // udp has no measured cell, so it is neither a series nor in the legend.
        assert!(!text.contains(">udp<"));
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.len() > 1000, "PNG of {} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_measured_still_writes_a_file() {
        let dir = temp_dir("empty");
        let svg = dir.join("empty.svg");
        write(&svg, &[]).unwrap();
        assert!(std::fs::read_to_string(&svg)
            .unwrap()
            .contains("no measured results"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_extension_picks_the_format() {
        assert_eq!(Format::of(Path::new("a/b.svg")), Ok(Format::Svg));
        assert_eq!(Format::of(Path::new("b.Png")), Ok(Format::Png));
        let e = Format::of(Path::new("b.jpg")).unwrap_err();
        assert!(e.contains(".svg, .png"), "{e}");
        assert!(Format::of(Path::new("plot")).is_err());
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(0.25), "0.25");
        assert_eq!(short(2e6), "2M");
    }
}
