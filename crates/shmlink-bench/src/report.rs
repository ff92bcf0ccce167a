//! The suite's output: a text table per (mode, size) sorted by speed with ratios against
//! `tcp` and `shm-spin`; the JSON report (round-trips through serde); CSV, one row per
//! cell.

use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::method::Mode;
use crate::placement::{self, Placement};
use crate::suite::{run_headline, Cell, Status, SuiteConfig};
use shmlink_measure::size;
use shmlink_measure::stats::{median_f64, Percentiles};

/// Version of the JSON and CSV layout.
pub const SCHEMA: u32 = 1;

/// The methods ratios are taken against.
pub const REFERENCES: [&str; 2] = ["tcp", "shm-spin"];

/// Where the suite ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// CPUs this process could use (kernel CPU list).
    pub cpus_allowed: String,
}

impl Machine {
    /// This machine.
    pub fn this() -> Machine {
        Machine {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            cpus_allowed: shmlink_measure::cpus::format_cpu_list(
                &shmlink_measure::cpus::allowed_cpus(),
            ),
        }
    }
}

/// The point-to-point suite's report.
pub type Report = SuiteReport<SuiteConfig, Cell>;

/// The whole report of a suite (the `--json` file), with the suite's configuration `C`
/// and its cells `R`: [`Report`] for point-to-point, [`crate::pubsub::report::Report`]
/// for pub/sub.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuiteReport<C, R> {
    pub schema: u32,
    /// The pattern (`pubsub`); empty, and not written, for point-to-point, whose report
    /// has no such field.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pattern: String,
    pub shmlink_version: String,
    /// The command line that produced it.
    pub command: String,
    /// Seconds since the Unix epoch at the start.
    pub started_unix: u64,
    /// Wall time of the whole suite.
    pub wall_s: f64,
    pub machine: Machine,
    pub config: C,
    pub results: Vec<R>,
}

impl<C, R> SuiteReport<C, R> {
    /// The report of a suite of `pattern` (empty for point-to-point) run by this command
    /// on this machine, started at `started_unix` (seconds since the epoch), `wall_s`
    /// seconds long.
    pub fn new(
        schema: u32,
        pattern: &str,
        started_unix: u64,
        wall_s: f64,
        config: C,
        results: Vec<R>,
    ) -> SuiteReport<C, R> {
        SuiteReport {
            schema,
            pattern: pattern.to_string(),
            shmlink_version: env!("CARGO_PKG_VERSION").to_string(),
            command: command_line(),
            started_unix,
            wall_s,
            machine: Machine::this(),
            config,
            results,
        }
    }
}

impl<C: Serialize + DeserializeOwned, R: Serialize + DeserializeOwned> SuiteReport<C, R> {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a Report serialises")
    }

    /// Parses a report written by [`SuiteReport::to_json`].
    pub fn from_json(text: &str) -> serde_json::Result<SuiteReport<C, R>> {
        serde_json::from_str(text)
    }
}

/// The CSV header line.
pub const CSV_HEADER: &str = "method,mode,size,status,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,\
msgs_per_s,bytes_per_s,cpu_us_per_msg_driver,cpu_us_per_msg_peer,spread_pct,rounds,note";

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub(crate) fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Unsupported => "unsupported",
        Status::Failed => "failed",
        Status::Skipped => "skipped",
    }
}

/// CSV text: `header`, then the fields of each cell, one line per cell.
pub(crate) fn csv_lines<C>(
    header: &str,
    cells: &[C],
    fields: impl Fn(&C) -> Vec<String>,
) -> String {
    let mut out = String::from(header);
    out.push('\n');
    for c in cells {
        out.push_str(&fields(c).join(","));
        out.push('\n');
    }
    out
}

/// A CSV field of a figure: empty where it does not apply.
pub(crate) fn csv_num(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v}"))
}

/// The CSV fields of a cell's percentiles (ns): p50, p90, p99, p99.9 and max, empty where
/// it has none.
pub(crate) fn csv_percentiles(p: Option<Percentiles>) -> [String; 5] {
    [
        p.map(|p| p.p50),
        p.map(|p| p.p90),
        p.map(|p| p.p99),
        p.map(|p| p.p999),
        p.map(|p| p.max),
    ]
    .map(|v| v.map_or(String::new(), |v| v.to_string()))
}

/// The headings of the tables' percentile columns.
pub(crate) const PERCENTILE_HEADS: [&str; 5] = ["p50", "p90", "p99", "p99.9", "max"];

/// Percentiles (ns) as the tables show them, in us: p50, p90, p99, p99.9 and max.
pub(crate) fn us_percentiles(p: &Percentiles) -> [String; 5] {
    [p.p50, p.p90, p.p99, p.p999, p.max].map(us)
}

/// The tables' percentile columns: each of `cells` right-aligned in 8, after a space.
pub(crate) fn percentile_columns(cells: [impl std::fmt::Display; 5]) -> String {
    cells.iter().map(|c| format!(" {c:>8}")).collect()
}

/// The width of a table's method column: the longest name, at least `min`.
pub(crate) fn method_width<'a>(names: impl Iterator<Item = &'a str>, min: usize) -> usize {
    names.map(str::len).max().unwrap_or(min).max(min)
}

/// The cells as CSV: [`CSV_HEADER`], then one line per cell (empty fields where a figure
/// does not apply).
pub fn to_csv(cells: &[Cell]) -> String {
    csv_lines(CSV_HEADER, cells, |c| {
        let s = c.summary.as_ref();
        let mut fields = vec![
            csv_field(&c.method),
            c.mode.name().to_string(),
            c.size.to_string(),
            status_name(c.status).to_string(),
        ];
        fields.extend(csv_percentiles(s.and_then(|s| s.rtt_ns)));
        fields.extend([
            csv_num(s.and_then(|s| s.msgs_per_s)),
            csv_num(s.and_then(|s| s.bytes_per_s)),
            csv_num(s.map(|s| s.cpu_us_per_msg.driver)),
            csv_num(s.map(|s| s.cpu_us_per_msg.peer)),
            csv_num(s.map(|s| s.spread_pct)),
            c.runs.len().to_string(),
            csv_field(c.note.as_deref().unwrap_or("")),
        ]);
        fields
    })
}

pub(crate) fn us(ns: u64) -> String {
    let v = ns as f64 / 1000.0;
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub(crate) fn ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() && r >= 10.0 => format!("{r:.0}x"),
        Some(r) if r.is_finite() => format!("{r:.2}x"),
        _ => "-".into(),
    }
}

fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Why a cell has no figures, short: `n/a`, `skipped` or `failed`, then the note in
/// parentheses if there is one.
pub(crate) fn not_measured(status: Status, note: Option<&str>) -> String {
    let what = match status {
        Status::Unsupported => "n/a",
        Status::Skipped => "skipped",
        _ => "failed",
    };
    format!(
        "{what}{}",
        note.map_or(String::new(), |n| format!(" ({n})"))
    )
}

/// Speed of `cell` relative to `reference` (>1: faster than it).
fn speed_vs(cell: &Cell, reference: Option<&Cell>) -> Option<f64> {
    let (x, r) = (cell.headline()?, reference?.headline()?);
    Some(match cell.mode {
        Mode::Latency => r / x,
        Mode::Throughput => x / r,
    })
}

/// The text table: one block per (mode, size), measured methods fastest first, then
/// those that did not run with the reason.
pub fn table(cells: &[Cell]) -> String {
    let mut out = String::new();
    let w = method_width(cells.iter().map(|c| c.method.as_str()), 6);
    for (mode, size) in blocks(cells) {
        let block: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.mode == mode && c.size == size)
            .collect();
        let find = |name: &str| block.iter().copied().find(|c| c.method == name);
        let (tcp, spin) = (find(REFERENCES[0]), find(REFERENCES[1]));
        let mut ok: Vec<&Cell> = block
            .iter()
            .copied()
            .filter(|c| c.status == Status::Ok && c.headline().is_some())
            .collect();
        match mode {
            Mode::Latency => {
                ok.sort_by(|a, b| a.headline().unwrap().total_cmp(&b.headline().unwrap()))
            }
            Mode::Throughput => {
                ok.sort_by(|a, b| b.headline().unwrap().total_cmp(&a.headline().unwrap()))
            }
        }
        let _ = writeln!(out);
        let (kind, what, header) = match mode {
            Mode::Latency => (
                "latency",
                "round trip in us (median of rounds); cpu us per round trip",
                format!(
                    "{:<w$}{} {:>7} {:>8} {:>8} {:>7} {:>7}",
                    "method",
                    percentile_columns(PERCENTILE_HEADS),
                    "spread",
                    "cpu drv",
                    "cpu peer",
                    "vs tcp",
                    "vs spin"
                ),
            ),
            Mode::Throughput => (
                "throughput",
                "median of rounds; cpu us per message",
                format!(
                    "{:<w$} {:>9} {:>10} {:>7} {:>8} {:>8} {:>7} {:>7}",
                    "method",
                    "msgs/s",
                    "MiB/s",
                    "spread",
                    "cpu drv",
                    "cpu peer",
                    "vs tcp",
                    "vs spin"
                ),
            ),
        };
        let _ = writeln!(
            out,
            "{kind}, {}: {what}; speed vs tcp and vs shm-spin (>1 = faster)",
            size::human(size)
        );
        let _ = writeln!(out, "{header}");
        for c in &ok {
            let s = c.summary.as_ref().expect("ok cells have a summary");
            let spread = format!("{:.0}%", s.spread_pct);
            let cpu = |v: f64| format!("{v:.2}");
            let (vt, vs) = (ratio(speed_vs(c, tcp)), ratio(speed_vs(c, spin)));
            match (mode, s.rtt_ns) {
                (Mode::Latency, Some(p)) => {
                    let _ = writeln!(
                        out,
                        "{:<w$}{} {:>7} {:>8} {:>8} {:>7} {:>7}",
                        c.method,
                        percentile_columns(us_percentiles(&p)),
                        spread,
                        cpu(s.cpu_us_per_msg.driver),
                        cpu(s.cpu_us_per_msg.peer),
                        vt,
                        vs
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "{:<w$} {:>9} {:>10.1} {:>7} {:>8} {:>8} {:>7} {:>7}",
                        c.method,
                        count(s.msgs_per_s.unwrap_or(0.0)),
                        s.bytes_per_s.unwrap_or(0.0) / (1u64 << 20) as f64,
                        spread,
                        cpu(s.cpu_us_per_msg.driver),
                        cpu(s.cpu_us_per_msg.peer),
                        vt,
                        vs
                    );
                }
            }
        }
        for c in block.iter().filter(|c| !ok.contains(c)) {
            let _ = writeln!(
                out,
                "{:<w$} {}",
                c.method,
                not_measured(c.status, c.note.as_deref())
            );
        }
    }
    out
}

/// The (mode, size) blocks of `cells`, latency first, small sizes first.
fn blocks(cells: &[Cell]) -> Vec<(Mode, usize)> {
    let mut keys: Vec<(Mode, usize)> = Vec::new();
    for c in cells {
        if !keys.contains(&(c.mode, c.size)) {
            keys.push((c.mode, c.size));
        }
    }
    keys.sort_by_key(|&(m, s)| (m != Mode::Latency, s));
    keys
}

/// The same figures by placement ([`crate::placement`]): per block, each method's
/// median over its runs in the fast and in the slow placement, with how many runs each
/// has and how many changed placement (left out); a line if the probes found one
/// placement, nothing if the runs have no probes.
pub fn by_placement(cells: &[Cell]) -> String {
    let mut out = String::new();
    let probes: Vec<u64> = cells
        .iter()
        .flat_map(|c| &c.runs)
        .flat_map(|r| r.line_ns)
        .flatten()
        .collect();
    let (Some(&lo), Some(&hi)) = (probes.iter().min(), probes.iter().max()) else {
        return out;
    };
    let Some(split) = placement::split(probes.iter().copied()) else {
        let _ = writeln!(
            out,
            "\none placement throughout: a bare line round trip between the two CPUs took {lo}-{hi} ns before and after each run"
        );
        return out;
    };
    let _ = writeln!(
        out,
        "\nby placement: a bare line round trip between the two CPUs before and after each run \
         took {lo}-{hi} ns; fast: both at most {split} ns, slow: both more, mixed: left out"
    );
    let w = method_width(cells.iter().map(|c| c.method.as_str()), 6);
    for (mode, size) in blocks(cells) {
        let what = match mode {
            Mode::Latency => "p50 us",
            Mode::Throughput => "msgs/s",
        };
        let _ = writeln!(
            out,
            "{} {}, {what}: median (runs)\n{:<w$} {:>14} {:>14} {:>6}",
            mode.name(),
            size::human(size),
            "method",
            "fast",
            "slow",
            "mixed"
        );
        for c in cells.iter().filter(|c| c.mode == mode && c.size == size) {
            let of = |p: Placement| -> Vec<f64> {
                c.runs
                    .iter()
                    .filter(|r| r.placement == Some(p))
                    .map(|r| run_headline(mode, r))
                    .collect()
            };
            let cell = |p: Placement| {
                let v = of(p);
                match median_f64(&v) {
                    Some(m) if mode == Mode::Latency => format!("{} ({})", us(m as u64), v.len()),
                    Some(m) => format!("{} ({})", count(m), v.len()),
                    None => "-".into(),
                }
            };
            let _ = writeln!(
                out,
                "{:<w$} {:>14} {:>14} {:>6}",
                c.method,
                cell(Placement::Fast),
                cell(Placement::Slow),
                of(Placement::Mixed).len()
            );
        }
    }
    out
}

/// The command line, for the reports.
pub fn command_line() -> String {
    std::iter::once("shmlink-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{CpuPerMsg, RunOutput};
    use crate::suite::Summary;
    use shmlink_measure::protocol::Stop;
    use shmlink_measure::stats::Percentiles;

    fn cell(method: &str, mode: Mode, head: f64, status: Status) -> Cell {
        let rtt = Percentiles {
            p50: head as u64,
            p90: head as u64 + 1,
            p99: head as u64 + 2,
            p999: head as u64 + 3,
            max: head as u64 + 4,
        };
        let cpu = CpuPerMsg {
            driver: 0.125,
            peer: 1.0 / 3.0,
        };
        let run = RunOutput {
            count: 1000,
            elapsed_ns: 123_456_789,
            rtt_ns: (mode == Mode::Latency).then_some(rtt),
            msgs_per_s: (mode == Mode::Throughput).then_some(head),
            bytes_per_s: (mode == Mode::Throughput).then_some(head * 64.0),
            cpu_us_per_msg: cpu,
            verify_us_per_msg: CpuPerMsg {
                driver: 0.0,
                peer: 0.5,
            },
            line_ns: Some([190, 200]),
            placement: Some(Placement::Fast),
        };
        let ok = status == Status::Ok;
        Cell {
            method: method.into(),
            mode,
            size: 64,
            status,
            note: (!ok).then(|| "max 8192 bytes: kernel.msgmax, \"quoted\"".into()),
            runs: if ok { vec![run.clone()] } else { vec![] },
            summary: ok.then_some(Summary {
                rtt_ns: run.rtt_ns,
                msgs_per_s: run.msgs_per_s,
                bytes_per_s: run.bytes_per_s,
                cpu_us_per_msg: cpu,
                spread_pct: 0.1 + 0.2,
            }),
        }
    }

    fn sample() -> Vec<Cell> {
        vec![
            cell("tcp", Mode::Latency, 20_000.0, Status::Ok),
            cell("shm-spin", Mode::Latency, 400.0, Status::Ok),
            cell("pipe", Mode::Latency, 10_000.0, Status::Ok),
            cell("sysv-mq", Mode::Latency, 0.0, Status::Unsupported),
            cell("tcp", Mode::Throughput, 100_000.0, Status::Ok),
            cell("shm-spin", Mode::Throughput, 10_000_000.0, Status::Ok),
        ]
    }

    #[test]
    fn by_placement_gives_each_placement_its_median() {
        let mut cells = sample();
        let t = by_placement(&cells);
        assert!(t.contains("one placement throughout"), "{t}");
        // A slow run of shm-spin, twice as long.
        let mut slow = cells[1].runs[0].clone();
        slow.line_ns = Some([500, 520]);
        slow.placement = Some(Placement::Slow);
        slow.rtt_ns = slow.rtt_ns.map(|p| Percentiles { p50: 800, ..p });
        cells[1].runs.push(slow);
        let t = by_placement(&cells);
        assert!(
            t.contains("took 190-520 ns; fast: both at most 200 ns"),
            "{t}"
        );
        let row = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        let spin: Vec<String> = row("shm-spin")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(spin, ["shm-spin", "0.40", "(1)", "0.80", "(1)", "0"], "{t}");
        let none: Vec<String> = row("sysv-mq")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(none, ["sysv-mq", "-", "-", "0"], "{t}");
    }

    #[test]
    fn json_round_trips() {
        let report = Report {
            schema: SCHEMA,
            pattern: String::new(),
            shmlink_version: "0.1.0".into(),
            command: "shmlink-bench --quick".into(),
            started_unix: 1_700_000_000,
            wall_s: 12.345678901234567,
            machine: Machine::this(),
            config: SuiteConfig {
                methods: vec!["tcp".into(), "shm-spin".into()],
                sizes: vec![64, 1 << 20],
                modes: vec![Mode::Latency, Mode::Throughput],
                rounds: 2,
                warmup_ms: 30,
                stop: Stop::Millis(100),
                window: None,
                cpus: Some((0, 1)),
                sampling: shmlink_measure::verify::Sampling::DEFAULT,
            },
            results: sample(),
        };
        let text = report.to_json();
        assert_eq!(Report::from_json(&text).unwrap(), report);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["results"][0]["mode"], "latency");
        assert_eq!(v["results"][3]["status"], "unsupported");
        assert_eq!(v["config"]["stop"]["millis"], 100);
    }

    #[test]
    fn csv_has_the_header_and_one_line_per_cell() {
        let csv = to_csv(&sample());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 1 + sample().len());
        let columns = CSV_HEADER.split(',').count();
        assert_eq!(columns, 16);
        assert!(lines[1].starts_with("tcp,latency,64,ok,20000,20001,20002,20003,20004,,,"));
        // The note with a comma and quotes is one quoted field.
        assert!(lines[4].ends_with(",0,\"max 8192 bytes: kernel.msgmax, \"\"quoted\"\"\""));
    }

    #[test]
    fn table_sorts_by_speed_with_ratios() {
        let t = table(&sample());
        let lat: Vec<&str> = t.lines().skip(3).take(4).collect();
        assert!(lat[0].starts_with("shm-spin"), "{t}");
        assert!(lat[1].starts_with("pipe"), "{t}");
        assert!(lat[2].starts_with("tcp"), "{t}");
        assert!(
            lat[3].starts_with("sysv-mq") && lat[3].contains("n/a (max 8192"),
            "{t}"
        );
        // shm-spin: 50x faster than tcp; tcp: 0.02x shm-spin.
        assert!(lat[0].contains("50x") && lat[0].contains("1.00x"), "{t}");
        assert!(lat[2].contains("1.00x") && lat[2].contains("0.02x"), "{t}");
        assert!(t.contains("throughput, 64 B"), "{t}");
    }
}
