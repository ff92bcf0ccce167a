//! The `--plot` charts, SVG or PNG (chosen by the file's extension). Point to point: a
//! panel per mode and message size with the methods as horizontal bars sorted best first
//! (latency: p50 with a whisker to p99; throughput: MiB/s), log axes, coloured by family
//! of methods, shmlink and its peers' rows shaded. Pub/sub: p50 against the number of
//! subscribers per size (distinct colour and marker per method) over sorted bars at the
//! most subscribers. Apps: a small panel per program and metric, TCP against shmlink.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// Height of the title and legend strip at the top of every image.
const HEADER_H: u32 = 96;
/// Height of one bar's row in a bar panel.
const ROW_H: u32 = 26;
/// Room a bar panel takes besides its rows: caption, x axis and its labels.
const PANEL_EXTRA_H: u32 = 120;

/// A family of methods; each gets one hue, and its members shades of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Shmlink,
    Iceoryx2,
    Zmq,
    SharedMemoryFloor,
    PipeFifo,
    MessageQueue,
    UnixSocket,
    IpSocket,
    Broker,
    Other,
}

impl Family {
    const ALL: [Family; 10] = [
        Family::Shmlink,
        Family::Iceoryx2,
        Family::Zmq,
        Family::SharedMemoryFloor,
        Family::PipeFifo,
        Family::MessageQueue,
        Family::UnixSocket,
        Family::IpSocket,
        Family::Broker,
        Family::Other,
    ];

    fn of(method: &str) -> Family {
        let m = method.to_ascii_lowercase();
        if m.starts_with("shmlink") {
            Family::Shmlink
        } else if m.starts_with("iceoryx") {
            Family::Iceoryx2
        } else if m.starts_with("zmq") {
            Family::Zmq
        } else if m.starts_with("shm-") || m.starts_with("floor") {
            Family::SharedMemoryFloor
        } else if m == "pipe" || m == "fifo" {
            Family::PipeFifo
        } else if m.ends_with("-mq") {
            Family::MessageQueue
        } else if m.starts_with("uds") || m == "tipc" || m == "vsock" {
            Family::UnixSocket
        } else if m == "tcp" || m == "udp" || m.starts_with("tcp ") {
            Family::IpSocket
        } else if m == "redis" || m == "rabbitmq" {
            Family::Broker
        } else {
            Family::Other
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::Shmlink => "shmlink",
            Family::Iceoryx2 => "iceoryx2",
            Family::Zmq => "ZeroMQ",
            Family::SharedMemoryFloor => "shm floor (hand-written)",
            Family::PipeFifo => "pipe / FIFO",
            Family::MessageQueue => "message queues",
            Family::UnixSocket => "Unix sockets",
            Family::IpSocket => "TCP / UDP",
            Family::Broker => "brokers",
            Family::Other => "other",
        }
    }

    /// The hue: strong for shmlink and its peers, quieter for the kernel's methods.
    fn base(self) -> (u8, u8, u8) {
        match self {
            Family::Shmlink => (230, 85, 13),
            Family::Iceoryx2 => (31, 100, 200),
            Family::Zmq => (140, 60, 190),
            Family::SharedMemoryFloor => (110, 110, 110),
            Family::PipeFifo => (60, 150, 60),
            Family::MessageQueue => (170, 160, 30),
            Family::UnixSocket => (20, 165, 180),
            Family::IpSocket => (150, 90, 70),
            Family::Broker => (215, 80, 160),
            Family::Other => (0, 0, 0),
        }
    }

    /// shmlink and the peers readers compare it with get a highlighted row.
    fn highlighted(self) -> bool {
        matches!(self, Family::Shmlink | Family::Iceoryx2 | Family::Zmq)
    }
}

/// The marker drawn at a line chart's points; with the shade it tells a family's
/// members apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
    Diamond,
    Ring,
}

const MARKERS: [Marker; 6] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Cross,
    Marker::Diamond,
    Marker::Ring,
];

/// How one method is drawn: its colour (its family's hue, shaded by its rank within the
/// family) and marker. No two methods of one chart share both.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Look {
    family: Family,
    colour: RGBColor,
    marker: Marker,
}

/// Each method's look, for `methods` in the order they are first met.
fn looks<'a>(methods: &[&'a str]) -> Vec<(&'a str, Look)> {
    let mut rank_in_family = [0usize; Family::ALL.len()];
    methods
        .iter()
        .map(|&m| {
            let family = Family::of(m);
            let slot = Family::ALL.iter().position(|f| *f == family).unwrap_or(0);
            let rank = rank_in_family[slot];
            rank_in_family[slot] += 1;
            (
                m,
                Look {
                    family,
                    colour: shade(family.base(), rank),
                    marker: MARKERS[rank % MARKERS.len()],
                },
            )
        })
        .collect()
}

fn look_of(looks: &[(&str, Look)], method: &str) -> Look {
    looks
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, l)| *l)
        .unwrap_or(Look {
            family: Family::Other,
            colour: BLACK,
            marker: Marker::Circle,
        })
}

/// The `rank`-th shade of a hue: the hue itself, then alternately darker and lighter.
fn shade((r, g, b): (u8, u8, u8), rank: usize) -> RGBColor {
    const STEPS: [f64; 6] = [0.0, -0.35, 0.35, -0.6, 0.55, -0.15];
    let t = STEPS[rank % STEPS.len()];
    let mix = |c: u8| {
        let c = c as f64;
        let v = if t < 0.0 {
            c * (1.0 + t)
        } else {
            c + (255.0 - c) * t
        };
        v.round().clamp(0.0, 255.0) as u8
    };
    RGBColor(mix(r), mix(g), mix(b))
}

/// Methods in order of first appearance.
fn first_seen<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for n in names {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
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

fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// One bar: a method's figure, and for latency the p99 its whisker reaches.
#[derive(Clone, Debug)]
struct Bar {
    label: String,
    value: f64,
    p99: Option<f64>,
    look: Look,
}

/// A panel of horizontal bars, best first.
struct BarPanel {
    title: String,
    x_desc: String,
    bars: Vec<Bar>,
    /// Log axis (figures spanning decades) or linear from zero.
    log: bool,
}

impl BarPanel {
    /// Sorts best first: lowest first when `lower_is_better`, else highest first.
    fn sorted(mut self, lower_is_better: bool) -> BarPanel {
        self.bars.sort_by(|a, b| {
            let o = a.value.total_cmp(&b.value);
            if lower_is_better {
                o
            } else {
                o.reverse()
            }
        });
        self
    }
}

fn bar_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &BarPanel) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let n = p.bars.len().max(1) as f64;
    let lo = p.bars.iter().map(|b| b.value).fold(f64::INFINITY, f64::min);
    let hi = p
        .bars
        .iter()
        .map(|b| b.p99.unwrap_or(0.0).max(b.value))
        .fold(0.0, f64::max);
    let label_w = p
        .bars
        .iter()
        .map(|b| b.label.chars().count())
        .max()
        .unwrap_or(4) as u32
        * 9
        + 24;
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(&p.title, text(20))
        .margin(10)
        .margin_right(20)
        .x_label_area_size(46)
        .y_label_area_size(label_w);
    // Room right of the longest bar for its value.
    if p.log {
        let (x0, x1) = (lo / 2.0, hi * 6.0);
        let mut chart = chart
            .build_cartesian_2d((x0..x1).log_scale(), 0.0..n)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(8)
            .x_desc(p.x_desc.as_str())
            .x_label_formatter(&|v| short(*v))
            .label_style(text(15))
            .axis_desc_style(text(15))
            .draw()
            .map_err(err)?;
        bars(area, &mut chart, p, x0, x1)
    } else {
        let (x0, x1) = (0.0, hi * 1.35);
        let mut chart = chart.build_cartesian_2d(x0..x1, 0.0..n).map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(6)
            .x_desc(p.x_desc.as_str())
            .x_label_formatter(&|v| short(*v))
            .label_style(text(15))
            .axis_desc_style(text(15))
            .draw()
            .map_err(err)?;
        bars(area, &mut chart, p, x0, x1)
    }
}

/// Draws `p`'s bars, whiskers, values and labels on `chart` (x from `x0` to `x1`, row
/// `i` from the top between `n - i - 1` and `n - i`).
fn bars<DB, X>(
    area: &DrawingArea<DB, Shift>,
    chart: &mut ChartContext<DB, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    p: &BarPanel,
    x0: f64,
    x1: f64,
) -> DrawResult
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let n = p.bars.len() as f64;
    let base = area.get_base_pixel();
    for (i, b) in p.bars.iter().enumerate() {
        let top = n - i as f64;
        let mid = top - 0.5;
        if b.look.family.highlighted() {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, top), (x1, top - 1.0)],
                    RGBColor(255, 244, 214).filled(),
                )))
                .map_err(err)?;
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, top - 0.18), (b.value, top - 0.82)],
                b.look.colour.filled(),
            )))
            .map_err(err)?;
        let mut end = b.value;
        let mut figure = short(b.value);
        if let Some(p99) = b.p99.filter(|v| *v >= b.value) {
            let ink = BLACK.stroke_width(2);
            chart
                .draw_series([
                    PathElement::new(vec![(b.value, mid), (p99, mid)], ink),
                    PathElement::new(vec![(p99, top - 0.2), (p99, top - 0.8)], ink),
                ])
                .map_err(err)?;
            end = p99;
            figure = format!("{figure}  (p99 {})", short(p99));
        }
        let (px, py) = chart.backend_coord(&(end, mid));
        area.draw(&Text::new(
            figure,
            (px - base.0 + 6, py - base.1),
            text(14).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
        let (lx, ly) = chart.backend_coord(&(x0, mid));
        let colour = if b.look.family.highlighted() {
            b.look.colour
        } else {
            BLACK
        };
        area.draw(&Text::new(
            b.label.clone(),
            (lx - base.0 - 8, ly - base.1),
            text(16)
                .color(&colour)
                .pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// The title line and a legend row of the families (or methods) shown, with their
/// colours (and markers for line charts).
fn header<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    entries: &[(String, Look)],
    markers: bool,
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.draw(&Text::new(title.to_string(), (16, 10), text(24)))
        .map_err(err)?;
    area.draw(&Text::new(subtitle.to_string(), (16, 40), text(15)))
        .map_err(err)?;
    let mut x = 16;
    let y = 74;
    for (name, look) in entries {
        if markers {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 30, y)],
                look.colour.stroke_width(3),
            ))
            .map_err(err)?;
            draw_marker(area, (x + 15, y), look)?;
        } else {
            area.draw(&Rectangle::new(
                [(x, y - 8), (x + 30, y + 8)],
                look.colour.filled(),
            ))
            .map_err(err)?;
        }
        area.draw(&Text::new(
            name.clone(),
            (x + 38, y),
            text(16).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
        x += 38 + 10 * name.chars().count() as i32 + 28;
    }
    Ok(())
}

fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    look: &Look,
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let c = look.colour;
    let r = 6;
    match look.marker {
        Marker::Circle => area.draw(&Circle::new((x, y), r, c.filled())),
        Marker::Ring => area.draw(&Circle::new((x, y), r, c.stroke_width(2))),
        Marker::Square => area.draw(&Rectangle::new(
            [(x - r + 1, y - r + 1), (x + r - 1, y + r - 1)],
            c.filled(),
        )),
        Marker::Triangle => area.draw(&Polygon::new(
            vec![(x, y - r - 1), (x - r, y + r - 1), (x + r, y + r - 1)],
            c.filled(),
        )),
        Marker::Diamond => area.draw(&Polygon::new(
            vec![(x, y - r - 1), (x + r, y), (x, y + r + 1), (x - r, y)],
            c.filled(),
        )),
        Marker::Cross => {
            area.draw(&PathElement::new(
                vec![(x - r, y - r), (x + r, y + r)],
                c.stroke_width(3),
            ))
            .map_err(err)?;
            area.draw(&PathElement::new(
                vec![(x - r, y + r), (x + r, y - r)],
                c.stroke_width(3),
            ))
        }
    }
    .map_err(err)
}

/// The families present among `methods`, each with its base colour, in legend order.
fn family_entries(methods: &[&str]) -> Vec<(String, Look)> {
    Family::ALL
        .iter()
        .filter(|f| methods.iter().any(|m| Family::of(m) == **f))
        .map(|&f| {
            let (r, g, b) = f.base();
            (
                f.name().to_string(),
                Look {
                    family: f,
                    colour: RGBColor(r, g, b),
                    marker: Marker::Circle,
                },
            )
        })
        .collect()
}

/// Lays `panels` out in a grid of `cols` columns under the header and draws them.
fn grid<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[BarPanel],
    cols: usize,
) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (_, body) = root.split_vertically(HEADER_H);
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let areas = body.split_evenly((rows, cols));
    for (p, a) in panels.iter().zip(&areas) {
        if p.bars.is_empty() {
            a.draw(&Text::new(
                format!("{}: nothing measured", p.title),
                (20, 40),
                text(18),
            ))
            .map_err(err)?;
        } else {
            bar_panel(a, p)?;
        }
    }
    Ok(())
}

/// Height for `rows` rows of panels of up to `bars` bars each.
fn grid_height(rows: usize, bars: usize) -> u32 {
    HEADER_H + rows.max(1) as u32 * (PANEL_EXTRA_H + bars.max(1) as u32 * ROW_H)
}

fn nothing<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>) -> DrawResult {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.draw(&Text::new(
        "no measured results to plot",
        (40, 40),
        text(24),
    ))
    .map_err(err)?;
    root.present().map_err(err)
}

/// A figure: its pixel size and how to draw it on any backend.
trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult;
}

fn write_figure(path: &Path, figure: &impl Figure) -> Result<(), String> {
    register_font();
    let size = figure.size();
    let result = match Format::of(path)? {
        Format::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            figure.draw(&root)
        }
        Format::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            figure.draw(&root)
        }
    };
    result.map_err(|e| format!("plot {}: {e}", path.display()))
}

// --- point-to-point -------------------------------------------------------------------

/// The point-to-point figure: a row per mode, a panel per message size, methods as bars
/// sorted best first.
struct PingPong<'a> {
    cells: &'a [Cell],
    modes: Vec<Mode>,
    sizes: Vec<usize>,
}

impl<'a> PingPong<'a> {
    fn new(cells: &'a [Cell]) -> PingPong<'a> {
        let ok = || {
            cells
                .iter()
                .filter(|c| c.status == Status::Ok && figure(c).is_some())
        };
        let modes = [Mode::Latency, Mode::Throughput]
            .into_iter()
            .filter(|m| ok().any(|c| c.mode == *m))
            .collect();
        let mut sizes: Vec<usize> = ok().map(|c| c.size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        PingPong {
            cells,
            modes,
            sizes,
        }
    }

    fn methods(&self) -> Vec<&'a str> {
        first_seen(self.cells.iter().map(|c| c.method.as_str()))
    }

    fn panels(&self) -> Vec<BarPanel> {
        let looks = looks(&self.methods());
        let mut out = Vec::new();
        for &mode in &self.modes {
            for &size in &self.sizes {
                let bars = self
                    .cells
                    .iter()
                    .filter(|c| c.mode == mode && c.size == size && c.status == Status::Ok)
                    .filter_map(|c| {
                        Some(Bar {
                            label: c.method.clone(),
                            value: figure(c)?,
                            p99: c
                                .summary
                                .as_ref()
                                .and_then(|s| s.rtt_ns)
                                .map(|p| p.p99 as f64 / 1000.0),
                            look: look_of(&looks, &c.method),
                        })
                    })
                    .collect();
                let (title, x_desc) = match mode {
                    Mode::Latency => (
                        format!("latency, {} messages", size::human(size)),
                        "round trip p50 (µs, log) — whisker to p99; shorter is better",
                    ),
                    Mode::Throughput => (
                        format!("throughput, {} messages", size::human(size)),
                        "MiB/s (log); longer is better",
                    ),
                };
                out.push(
                    BarPanel {
                        title,
                        x_desc: x_desc.into(),
                        bars,
                        log: true,
                    }
                    .sorted(mode == Mode::Latency),
                );
            }
        }
        out
    }

    fn max_bars(&self) -> usize {
        self.panels()
            .iter()
            .map(|p| p.bars.len())
            .max()
            .unwrap_or(1)
    }
}

impl Figure for PingPong<'_> {
    fn size(&self) -> (u32, u32) {
        let cols = self.sizes.len().max(1) as u32;
        (
            (cols * 760).max(1200),
            grid_height(self.modes.len(), self.max_bars()),
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        if self.modes.is_empty() {
            return nothing(root);
        }
        header(
            root,
            "shmlink-bench: point to point",
            "one panel per mode and message size; bars sorted best first; shmlink, iceoryx2 \
             and ZeroMQ rows shaded; colour = family of methods",
            &family_entries(&self.methods()),
            false,
        )?;
        grid(root, &self.panels(), self.sizes.len())?;
        root.present().map_err(|e| e.to_string())
    }
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

/// Writes the charts of `cells` to `path`, as SVG or PNG by its extension.
pub fn write(path: &Path, cells: &[Cell]) -> Result<(), String> {
    write_figure(path, &PingPong::new(cells))
}

// --- pub/sub --------------------------------------------------------------------------

/// The pub/sub figure: per message size, p50 against the number of subscribers (a line
/// per method, distinct colour and marker), and the methods as sorted bars (p50, whisker
/// to p99) at the most subscribers measured.
struct PubSub<'a> {
    cells: Vec<&'a PubSubCell>,
    sizes: Vec<usize>,
}

/// p50 and p99 latency of a pub/sub cell, µs.
fn pubsub_figures(c: &PubSubCell) -> Option<(f64, f64)> {
    let l = &c.summary.as_ref()?.latency_ns;
    let p50 = l.p50 as f64 / 1000.0;
    (c.status == Status::Ok && p50 > 0.0).then_some((p50, l.p99 as f64 / 1000.0))
}

impl<'a> PubSub<'a> {
    fn new(cells: &'a [PubSubCell]) -> PubSub<'a> {
        let cells: Vec<&PubSubCell> = cells
            .iter()
            .filter(|c| pubsub_figures(c).is_some())
            .collect();
        let mut sizes: Vec<usize> = cells.iter().map(|c| c.size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        PubSub { cells, sizes }
    }

    fn methods(&self) -> Vec<&'a str> {
        first_seen(self.cells.iter().map(|c| c.method.as_str()))
    }

    fn bar_panels(&self, looks: &[(&str, Look)]) -> Vec<BarPanel> {
        self.sizes
            .iter()
            .map(|&size| {
                let here: Vec<&&PubSubCell> =
                    self.cells.iter().filter(|c| c.size == size).collect();
                let most = here.iter().map(|c| c.subscribers).max().unwrap_or(0);
                let bars = here
                    .iter()
                    .filter(|c| c.subscribers == most)
                    .filter_map(|c| {
                        let (p50, p99) = pubsub_figures(c)?;
                        Some(Bar {
                            label: c.method.clone(),
                            value: p50,
                            p99: Some(p99),
                            look: look_of(looks, &c.method),
                        })
                    })
                    .collect();
                BarPanel {
                    title: format!(
                        "{} messages, {most} subscriber{}",
                        size::human(size),
                        if most == 1 { "" } else { "s" }
                    ),
                    x_desc: "publish → subscriber p50 (µs, log) — whisker to p99".into(),
                    bars,
                    log: true,
                }
                .sorted(true)
            })
            .collect()
    }

    fn line_panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        size: usize,
        looks: &[(&str, Look)],
    ) -> DrawResult {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let here: Vec<&&PubSubCell> = self.cells.iter().filter(|c| c.size == size).collect();
        let xs = || here.iter().map(|c| c.subscribers as f64);
        let ys = || here.iter().filter_map(|c| pubsub_figures(c).map(|f| f.0));
        let x0 = xs().fold(f64::INFINITY, f64::min);
        let x1 = xs().fold(0.0, f64::max);
        let (x0, x1) = if x1 > x0 {
            (x0 / 1.3, x1 * 1.3)
        } else {
            (x0 / 2.0, x0 * 2.0)
        };
        let (y0, y1) = (
            ys().fold(f64::INFINITY, f64::min) / 1.6,
            ys().fold(0.0, f64::max) * 1.6,
        );
        let mut counts: Vec<f64> = xs().collect();
        counts.sort_by(f64::total_cmp);
        counts.dedup();
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{} messages: p50 vs subscribers", size::human(size)),
                text(20),
            )
            .margin(10)
            .margin_right(20)
            .x_label_area_size(46)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x0..x1).log_scale().with_key_points(counts),
                (y0..y1).log_scale(),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("subscribers (log)")
            .y_desc("p50 (µs, log)")
            .x_label_formatter(&|v| format!("{}", v.round()))
            .y_label_formatter(&|v| short(*v))
            .label_style(text(15))
            .axis_desc_style(text(15))
            .draw()
            .map_err(err)?;
        let base = area.get_base_pixel();
        for method in self.methods() {
            let look = look_of(looks, method);
            let mut points: Vec<(f64, f64)> = here
                .iter()
                .filter(|c| c.method == method)
                .filter_map(|c| Some((c.subscribers as f64, pubsub_figures(c)?.0)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let width = if look.family == Family::Shmlink { 4 } else { 2 };
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    look.colour.stroke_width(width),
                ))
                .map_err(err)?;
            for p in &points {
                let (px, py) = chart.backend_coord(p);
                draw_marker(area, (px - base.0, py - base.1), &look)?;
            }
        }
        Ok(())
    }
}

impl Figure for PubSub<'_> {
    fn size(&self) -> (u32, u32) {
        let cols = self.sizes.len().max(1) as u32;
        let bars = self.methods().len();
        (
            (cols * 800).max(1200),
            HEADER_H + 520 + PANEL_EXTRA_H + bars.max(1) as u32 * ROW_H,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        if self.cells.is_empty() {
            return nothing(root);
        }
        let methods = self.methods();
        let looks = looks(&methods);
        let entries: Vec<(String, Look)> = looks.iter().map(|(m, l)| (m.to_string(), *l)).collect();
        header(
            root,
            "shmlink-bench --pattern pubsub",
            "top: p50 against the number of subscribers; bottom: every method at the most \
             subscribers, sorted best first (shmlink, iceoryx2 and ZeroMQ rows shaded)",
            &entries,
            true,
        )?;
        let (_, body) = root.split_vertically(HEADER_H);
        let (lines, bars) = body.split_vertically(520);
        let line_areas = lines.split_evenly((1, self.sizes.len().max(1)));
        for (&size, area) in self.sizes.iter().zip(&line_areas) {
            self.line_panel(area, size, &looks)?;
        }
        let panels = self.bar_panels(&looks);
        let bar_areas = bars.split_evenly((1, panels.len().max(1)));
        for (p, area) in panels.iter().zip(&bar_areas) {
            bar_panel(area, p)?;
        }
        root.present().map_err(|e| e.to_string())
    }
}

/// Writes the pub/sub chart of `cells` to `path`, as SVG or PNG by its extension.
pub fn write_pubsub(path: &Path, cells: &[PubSubCell]) -> Result<(), String> {
    write_figure(path, &PubSub::new(cells))
}

// --- apps -----------------------------------------------------------------------------

/// One row of `--pattern apps`: a program's metric over plain TCP and under shmlink.
#[derive(Clone, Debug)]
pub struct AppPair {
    pub program: String,
    pub metric: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub tcp: f64,
    pub shmlink: f64,
    /// Above 1: shmlink better.
    pub ratio: f64,
}

/// The apps figure: a small panel per (program, metric) with the TCP and shmlink bars.
struct Apps<'a> {
    rows: &'a [AppPair],
}

const APP_COLS: usize = 3;

impl Apps<'_> {
    fn panels(&self) -> Vec<BarPanel> {
        let looks = looks(&["shmlink", "tcp"]);
        self.rows
            .iter()
            .map(|r| {
                let bar = |label: &str, value: f64, method: &str| Bar {
                    label: label.into(),
                    value,
                    p99: None,
                    look: look_of(&looks, method),
                };
                BarPanel {
                    title: format!("{} {}: shmlink {:.2}x", r.program, r.metric, r.ratio),
                    x_desc: format!(
                        "{} ({})",
                        r.unit,
                        if r.higher_is_better {
                            "longer is better"
                        } else {
                            "shorter is better"
                        }
                    ),
                    bars: vec![
                        bar("TCP", r.tcp, "tcp"),
                        bar("shmlink", r.shmlink, "shmlink"),
                    ],
                    log: false,
                }
            })
            .collect()
    }
}

impl Figure for Apps<'_> {
    fn size(&self) -> (u32, u32) {
        let rows = self.rows.len().div_ceil(APP_COLS).max(1);
        (1800, HEADER_H + rows as u32 * (PANEL_EXTRA_H + 2 * 40))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult {
        if self.rows.is_empty() {
            return nothing(root);
        }
        header(
            root,
            "shmlink-bench --pattern apps",
            "each program over plain TCP loopback and preloaded (shmlink run); median of the \
             rounds; ratio > 1: shmlink better",
            &family_entries(&["shmlink", "tcp"]),
            false,
        )?;
        grid(root, &self.panels(), APP_COLS)?;
        root.present().map_err(|e| e.to_string())
    }
}

/// Writes the apps chart of `rows` to `path`, as SVG or PNG by its extension.
pub fn write_apps(path: &Path, rows: &[AppPair]) -> Result<(), String> {
    write_figure(path, &Apps { rows })
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

    /// A pub/sub cell with p50 `p50` ns and p99 three times that.
    fn pubsub_cell(method: &str, size: usize, subscribers: usize, p50: u64) -> PubSubCell {
        let p = |v: u64| Percentiles {
            p50: v,
            p90: 2 * v,
            p99: 3 * v,
            p999: 4 * v,
            max: 5 * v,
        };
        PubSubCell {
            method: method.into(),
            size,
            subscribers,
            status: Status::Ok,
            note: None,
            runs: vec![],
            summary: Some(crate::pubsub::suite::Summary {
                latency_ns: p(p50),
                per_subscriber_ns: vec![p(p50); subscribers],
                pub_us_per_msg: 1.0,
                pub_cpu_us_per_msg: 1.0,
                pub_process_cpu_us_per_msg: 1.0,
                sub_cpu_us_per_msg: 1.0,
                spread_pct: 1.0,
            }),
        }
    }

    #[test]
    fn pubsub_and_apps_render() {
        let dir = temp_dir("shapes");
        let mut cells = Vec::new();
        for method in crate::pubsub::METHODS.iter().map(|m| m.name()) {
            for size in [64, 65536] {
                for (k, n) in [1usize, 2, 4, 8, 16].into_iter().enumerate() {
                    cells.push(pubsub_cell(method, size, n, 1000 * (k as u64 + 1)));
                }
            }
        }
        // A method that measured nothing is left out; a single subscriber count draws.
        let mut failed = pubsub_cell("redis", 64, 32, 0);
        failed.status = Status::Failed;
        failed.summary = None;
        cells.push(failed);
        cells.push(pubsub_cell("uds", 1 << 20, 1, 5000));
        let svg = dir.join("pubsub.svg");
        write_pubsub(&svg, &cells).unwrap();
        write_pubsub(&dir.join("pubsub.png"), &cells).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        for name in [
            "shmlink-zc",
            "iceoryx2",
            "rabbitmq",
            "16 subscribers",
            "p99",
        ] {
            assert!(text.contains(name), "{name} missing from the SVG");
        }
        write_pubsub(&dir.join("none.svg"), &[]).unwrap();

        let pair = |program: &str, metric: &str, tcp: f64, shmlink: f64| AppPair {
            program: program.into(),
            metric: metric.into(),
            unit: "req/s".into(),
            higher_is_better: true,
            tcp,
            shmlink,
            ratio: shmlink / tcp,
        };
        let rows: Vec<AppPair> = (0..7)
            .map(|i| pair("redis -c 1", &format!("test{i}"), 1e4, 1.5e4))
            .collect();
        let svg = dir.join("apps.svg");
        write_apps(&svg, &rows).unwrap();
        write_apps(&dir.join("apps.png"), &rows).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("redis -c 1 test6: shmlink 1.50x"), "{text}");
        write_apps(&dir.join("no-apps.svg"), &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_method_looks_different() {
        for names in [
            crate::methods::METHODS
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>(),
            crate::pubsub::METHODS.iter().map(|m| m.name()).collect(),
        ] {
            let looks = looks(&names);
            for (i, (a, la)) in looks.iter().enumerate() {
                for (b, lb) in &looks[i + 1..] {
                    assert!(
                        la.colour != lb.colour || la.marker != lb.marker,
                        "{a} and {b} look the same"
                    );
                }
            }
        }
        assert_eq!(Family::of("shmlink-shm-zc"), Family::Shmlink);
        assert_eq!(Family::of("posix-mq"), Family::MessageQueue);
        assert_eq!(Family::of("shm-futex"), Family::SharedMemoryFloor);
        assert_eq!(Family::of("rabbitmq"), Family::Broker);
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
