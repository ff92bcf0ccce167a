//! The pub/sub suite's output: a text table per (size, subscriber count) sorted by p50
//! with the speed relative to `shmlink`, an overview per size (p50 and publisher time by
//! subscriber count), the JSON report and CSV.

use std::fmt::Write as _;

use super::suite::{Cell, Config};
use super::REFERENCE;
use crate::report::{
    self, csv_field, csv_lines, csv_num, csv_percentiles, percentile_columns, ratio, status_name,
    us, us_percentiles, PERCENTILE_HEADS,
};
use crate::suite::Status;
use shmlink_measure::size;

/// Version of the pub/sub JSON and CSV layout.
pub const SCHEMA: u32 = 1;

/// The whole report (the `--json` file): the suite's report with the pub/sub
/// configuration and cells, `pattern` always `pubsub`.
pub type Report = report::SuiteReport<Config, Cell>;

/// The CSV header line.
pub const CSV_HEADER: &str = "method,size,subscribers,status,p50_ns,p90_ns,p99_ns,p999_ns,\
max_ns,pub_us_per_msg,pub_cpu_us_per_msg,pub_process_cpu_us_per_msg,sub_cpu_us_per_msg,\
spread_pct,rounds,note";

/// The cells as CSV: [`CSV_HEADER`], then one line per cell (empty fields where a figure
/// does not apply). Per-subscriber percentiles are in the JSON only.
pub fn to_csv(cells: &[Cell]) -> String {
    csv_lines(CSV_HEADER, cells, |c| {
        let s = c.summary.as_ref();
        let mut fields = vec![
            csv_field(&c.method),
            c.size.to_string(),
            c.subscribers.to_string(),
            status_name(c.status).to_string(),
        ];
        fields.extend(csv_percentiles(s.map(|s| s.latency_ns)));
        fields.extend([
            csv_num(s.map(|s| s.pub_us_per_msg)),
            csv_num(s.map(|s| s.pub_cpu_us_per_msg)),
            csv_num(s.map(|s| s.pub_process_cpu_us_per_msg)),
            csv_num(s.map(|s| s.sub_cpu_us_per_msg)),
            csv_num(s.map(|s| s.spread_pct)),
            c.runs.len().to_string(),
            csv_field(c.note.as_deref().unwrap_or("")),
        ]);
        fields
    })
}

/// In order of first appearance.
fn distinct<T: PartialEq + Copy>(v: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn measured(c: &Cell) -> bool {
    c.status == Status::Ok && c.summary.is_some()
}

/// Why a cell has no figures, short (`skipped (reason)`).
fn not_measured(c: &Cell) -> String {
    report::not_measured(c.status, c.note.as_deref())
}

/// The text table: one block per (size, subscriber count), measured methods fastest
/// (p50) first, then those that did not run with the reason; then one overview per size.
pub fn table(cells: &[Cell]) -> String {
    let mut out = String::new();
    let w = report::method_width(cells.iter().map(|c| c.method.as_str()), 8);
    let sizes = distinct(cells.iter().map(|c| c.size));
    let counts = distinct(cells.iter().map(|c| c.subscribers));
    for &size in &sizes {
        for &n in &counts {
            let block: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.size == size && c.subscribers == n)
                .collect();
            if block.is_empty() {
                continue;
            }
            let reference = block.iter().copied().find(|c| c.method == REFERENCE);
            let mut ok: Vec<&Cell> = block.iter().copied().filter(|c| measured(c)).collect();
            ok.sort_by(|a, b| a.headline().unwrap().total_cmp(&b.headline().unwrap()));
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "pubsub, {}, {n} subscriber{}: publish -> subscriber latency in us over all \
                 subscribers (median of rounds); pub: us in publish per message and publisher \
                 cpu us per message; speed vs shmlink (>1 = faster)",
                size::human(size),
                if n == 1 { "" } else { "s" }
            );
            let _ = writeln!(
                out,
                "{:<w$}{} {:>7} {:>8} {:>8} {:>8} {:>7}",
                "method",
                percentile_columns(PERCENTILE_HEADS),
                "spread",
                "pub us",
                "pub cpu",
                "sub cpu",
                "vs shm"
            );
            for c in &ok {
                let s = c.summary.as_ref().expect("measured");
                let p = s.latency_ns;
                let vs = reference
                    .and_then(|r| r.headline())
                    .zip(c.headline())
                    .map(|(r, x)| r / x);
                let _ = writeln!(
                    out,
                    "{:<w$}{} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>7}",
                    c.method,
                    percentile_columns(us_percentiles(&p)),
                    format!("{:.0}%", s.spread_pct),
                    s.pub_us_per_msg,
                    s.pub_cpu_us_per_msg,
                    s.sub_cpu_us_per_msg,
                    ratio(vs)
                );
            }
            for c in block.iter().filter(|c| !measured(c)) {
                let _ = writeln!(out, "{:<w$} {}", c.method, not_measured(c));
            }
        }
    }
    for &size in &sizes {
        let of_size: Vec<&Cell> = cells.iter().filter(|c| c.size == size).collect();
        let methods = distinct(of_size.iter().map(|c| c.method.as_str()));
        let find = |m: &str, n: usize| {
            of_size
                .iter()
                .copied()
                .find(|c| c.method == m && c.subscribers == n)
        };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "pubsub, {}, by subscriber count: p50 latency in us (x = speed vs shmlink); pub us in publish per message",
            size::human(size)
        );
        let mut head = format!("{:<w$}", "method");
        for &n in &counts {
            let _ = write!(head, " {:>15}", format!("p50 @{n}"));
        }
        for &n in &counts {
            let _ = write!(head, " {:>8}", format!("pub @{n}"));
        }
        let _ = writeln!(out, "{}", head.trim_end());
        for m in methods {
            let cells_m: Vec<Option<&Cell>> = counts.iter().map(|&n| find(m, n)).collect();
            if !cells_m.iter().flatten().any(|c| measured(c)) {
                let why = cells_m
                    .iter()
                    .flatten()
                    .next()
                    .map_or(String::new(), |c| not_measured(c));
                let _ = writeln!(out, "{m:<w$} {why}");
                continue;
            }
            let mut line = format!("{m:<w$}");
            for (c, &n) in cells_m.iter().zip(&counts) {
                let text = match c {
                    Some(c) if measured(c) => {
                        let vs = find(REFERENCE, n)
                            .and_then(|r| r.headline())
                            .zip(c.headline())
                            .map(|(r, x)| r / x);
                        format!(
                            "{} ({})",
                            us(c.summary.as_ref().expect("measured").latency_ns.p50),
                            ratio(vs)
                        )
                    }
                    Some(c) if c.status == Status::Unsupported => "n/a".into(),
                    Some(_) => "failed".into(),
                    None => "-".into(),
                };
                let _ = write!(line, " {text:>15}");
            }
            for c in &cells_m {
                let text = match c {
                    Some(c) if measured(c) => {
                        format!(
                            "{:.2}",
                            c.summary.as_ref().expect("measured").pub_us_per_msg
                        )
                    }
                    _ => "-".into(),
                };
                let _ = write!(line, " {text:>8}");
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pubsub::run::RunOutput;
    use crate::pubsub::suite::Summary;
    use crate::report::Machine;
    use shmlink_measure::stats::Percentiles;

    fn p(v: u64) -> Percentiles {
        Percentiles {
            p50: v,
            p90: v + 1,
            p99: v + 2,
            p999: v + 3,
            max: v + 4,
        }
    }

    fn cell(method: &str, n: usize, p50: u64, status: Status) -> Cell {
        let ok = status == Status::Ok;
        let run = RunOutput {
            count: 100,
            elapsed_ns: 1_000_000,
            latency_ns: p(p50),
            per_subscriber_ns: vec![p(p50); n],
            pub_us_per_msg: 0.25,
            pub_cpu_us_per_msg: 0.5,
            pub_process_cpu_us_per_msg: 3.0,
            sub_cpu_us_per_msg: 1.5,
        };
        Cell {
            method: method.into(),
            size: 64,
            subscribers: n,
            status,
            note: (!ok).then(|| "no broker, \"here\"".into()),
            runs: if ok { vec![run.clone()] } else { vec![] },
            summary: ok.then(|| Summary {
                latency_ns: run.latency_ns,
                per_subscriber_ns: run.per_subscriber_ns.clone(),
                pub_us_per_msg: 0.25,
                pub_cpu_us_per_msg: 0.5,
                pub_process_cpu_us_per_msg: 3.0,
                sub_cpu_us_per_msg: 1.5,
                spread_pct: 0.0,
            }),
        }
    }

    fn sample() -> Vec<Cell> {
        vec![
            cell("shmlink", 1, 2_000, Status::Ok),
            cell("uds", 1, 8_000, Status::Ok),
            cell("redis", 1, 0, Status::Skipped),
            cell("shmlink", 4, 4_000, Status::Ok),
            cell("uds", 4, 2_000, Status::Ok),
            cell("redis", 4, 0, Status::Skipped),
        ]
    }

    #[test]
    fn table_sorts_by_p50_with_ratios_and_reasons() {
        let t = table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        let at = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
        let one = at("64 B, 1 subscriber:");
        assert!(lines[one + 2].starts_with("shmlink") && lines[one + 2].ends_with("1.00x"));
        assert!(lines[one + 3].starts_with("uds") && lines[one + 3].ends_with("0.25x"));
        assert!(
            lines[one + 4].starts_with("redis    skipped (no broker"),
            "{t}"
        );
        let four = at("64 B, 4 subscribers:");
        assert!(lines[four + 2].starts_with("uds") && lines[four + 2].ends_with("2.00x"));
        let overview = at("by subscriber count");
        assert!(lines[overview + 1].contains("p50 @1") && lines[overview + 1].contains("pub @4"));
        assert!(
            lines[overview + 3].starts_with("uds") && lines[overview + 3].contains("8.00 (0.25x)"),
            "{t}"
        );
        assert!(lines[overview + 4].contains("skipped (no broker"), "{t}");
    }

    #[test]
    fn csv_and_json() {
        let csv = to_csv(&sample());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 7);
        assert!(
            lines[1].starts_with("shmlink,64,1,ok,2000,2001,2002,2003,2004,0.25,0.5,3,1.5,0,1,")
        );
        assert!(
            lines[3].ends_with(",0,\"no broker, \"\"here\"\"\""),
            "{}",
            lines[3]
        );
        let report = Report {
            schema: SCHEMA,
            pattern: "pubsub".into(),
            shmlink_version: "0.1.0".into(),
            command: "shmlink-bench --pattern pubsub".into(),
            started_unix: 1,
            wall_s: 2.5,
            machine: Machine::this(),
            config: Config {
                methods: vec!["shmlink".into()],
                sizes: vec![64],
                subscribers: vec![1, 4],
                rounds: 1,
                warmup: 10,
                count: 100,
                cpus: Some((0, 1)),
            },
            results: sample(),
        };
        let text = report.to_json();
        assert_eq!(Report::from_json(&text).unwrap(), report);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["results"][3]["summary"]["per_subscriber_ns"][3]["p50"],
            4000
        );
    }
}
