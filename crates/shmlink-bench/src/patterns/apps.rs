//! `shmlink-bench --pattern apps`: real programs from the distribution, each run over
//! plain TCP on loopback and under transparent mode (`libshmlink_preload.so`, issue 16,
//! docs/transparent.md), in one table: program, metric, TCP, shmlink, ratio.
//!
//! Each program gets two private servers (one plain, one preloaded) on free loopback
//! ports; the clients run against them alternately (plain, preloaded, plain, … for
//! `--rounds` rounds) and each cell is the median of its rounds. Servers are pinned to
//! one allowed CPU and clients to another (as the point-to-point bench pins its two
//! ends). A preloaded client run counts only if every one of its connections really
//! went over shared memory, on both sides (`programs::moved`): the client's and the server's debug
//! logs (`SHMLINK_LOG=debug`) must name the same connections as moved, at least as many
//! as the run opens (50 per redis-benchmark test for `-c 50`, 64 for `wrk -c 64`, …)
//! and, for redis and nginx, exactly as many as the server itself counts (`programs::accepted`);
//! neither may name a connection that stayed on TCP, save one the client closed while it
//! was being moved, before its first byte (a client exiting at the end of its run). A row
//! whose runs failed is marked failed and the program exits 1; programs that are not
//! installed are skipped with the reason (`scripts/apps.sh install` installs them).

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::cli::{usage, within, Cli, UsageError};
use crate::pattern::{write_json, Pattern, ReportHead};

mod programs;

use programs::{cases, find_lib, missing, run_case, start_server, Env};

/// The programs, in table order.
const APPS: &[&str] = &["redis", "nginx", "iperf3", "sockperf"];

/// `--pattern apps`'s options.
#[derive(Debug)]
struct Args {
    apps: Vec<String>,
    rounds: u32,
    /// Seconds per timed client run (wrk, iperf3, sockperf).
    secs: u32,
    /// Requests per `redis-benchmark -c 1` run; the pipelined runs (`-c 50 -P 16`) take
    /// [`programs::PIPELINED_FACTOR`] times as many.
    requests: u64,
    json: Option<PathBuf>,
    /// `--plot FILE`: a chart of the rows (SVG or PNG by the extension).
    plot: Option<PathBuf>,
    lib: Option<PathBuf>,
}

/// `--pattern apps`.
pub struct Apps;

impl Pattern for Apps {
    fn name(&self) -> &'static str {
        "apps"
    }

    fn help(&self) -> &'static str {
        "real programs (redis, nginx + wrk, iperf3, sockperf) plain against preloaded
(`shmlink run`), alternating; a preloaded row counts only if every connection moved
to shared memory (docs/transparent.md, Performance). Options: --apps LIST (or
--methods), --rounds, --duration SECONDS, --requests N, --quick, --json FILE,
--plot FILE (.svg or .png: a panel per program and metric), --preload-lib PATH."
    }

    fn flags(&self) -> &'static [&'static str] {
        FLAGS
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        Ok(run(config(cli)?))
    }
}

/// The options `--pattern apps` takes.
const FLAGS: &[&str] = &[
    "apps",
    "methods",
    "rounds",
    "duration",
    "requests",
    "quick",
    "json",
    "plot",
    "preload-lib",
];

fn config(cli: &Cli) -> Result<Args, UsageError> {
    let mut a = Args {
        apps: APPS.iter().map(|s| s.to_string()).collect(),
        rounds: 3,
        secs: 2,
        requests: 100_000,
        json: cli.json.clone(),
        plot: cli.plot.clone(),
        lib: cli.preload_lib.clone(),
    };
    crate::cli::plot_file(cli)?;
    // `--methods` is another name of `--apps`.
    if let Some(text) = cli.apps.as_ref().or(cli.methods.as_ref()) {
        if text != "all" {
            a.apps = Vec::new();
            for m in text.split(',') {
                if !APPS.contains(&m) {
                    return usage(format!(
                        "unknown program {m:?} (valid with --pattern apps: all, {})",
                        APPS.join(", ")
                    ));
                }
                a.apps.push(m.to_string());
            }
        }
    }
    if let Some(text) = &cli.duration {
        a.secs = within("--duration", text, 1..=60)?;
    }
    if let Some(text) = &cli.requests {
        a.requests = within("--requests", text, 100..=10_000_000)?;
    }
    if cli.quick {
        a.rounds = 1;
        a.secs = 1;
        a.requests = 20_000;
    }
    if let Some(text) = &cli.rounds {
        a.rounds = within("--rounds", text, 1..=50)?;
    }
    Ok(a)
}

/// One line of the table.
#[derive(Serialize, Clone, Debug)]
struct Row {
    program: String,
    metric: String,
    unit: &'static str,
    /// Whether a higher value is better (the ratio is then shmlink / TCP, else TCP /
    /// shmlink: above 1 means shmlink is better either way).
    higher_is_better: bool,
    tcp: Option<f64>,
    shmlink: Option<f64>,
    ratio: Option<f64>,
    rounds: u32,
    /// Why the row has no numbers: its programs are not installed.
    skipped: Option<String>,
    /// Why the row has no numbers: a run failed (a server that did not start, a client
    /// that failed, a preloaded run not wholly on shared memory).
    #[serde(default)]
    failed: Option<String>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    head: ReportHead,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    results: Vec<Row>,
}

/// The median of `v` (sorted copy).
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Runs every case of `app`, plain and preloaded alternately for `rounds` rounds.
fn bench_app(env: &Env, app: &str, a: &Args) -> Vec<Row> {
    let (list, progs) = cases(app);
    let row = |case: &str, skipped: Option<String>, failed: Option<String>| Row {
        program: case.to_string(),
        metric: "-".into(),
        unit: "",
        higher_is_better: true,
        tcp: None,
        shmlink: None,
        ratio: None,
        rounds: 0,
        skipped,
        failed,
    };
    if let Some(why) = missing(progs) {
        return list
            .iter()
            .map(|c| row(c, Some(why.clone()), None))
            .collect();
    }
    let servers = start_server(env, app, false).and_then(|t| {
        let s = start_server(env, app, true)?;
        Ok((t, s))
    });
    let ((_tcp_server, tcp_at), (_shm_server, shm_at)) = match servers {
        Ok(s) => s,
        Err(e) => return list.iter().map(|c| row(c, None, Some(e.clone()))).collect(),
    };
    let mut rows = Vec::new();
    for case in list {
        let mut cells: Vec<Cell> = Vec::new();
        let mut error = None;
        'rounds: for round in 0..a.rounds {
            for pre in [false, true] {
                eprint!(
                    "\r# round {}/{}: {case} {}          ",
                    round + 1,
                    a.rounds,
                    if pre { "shmlink" } else { "TCP" }
                );
                let server = if pre { &shm_at } else { &tcp_at };
                match run_case(env, case, server, (a.secs, a.requests), pre) {
                    Ok(samples) => {
                        for (metric, unit, hib, v) in samples {
                            let i = match cells.iter().position(|c| c.0 == metric) {
                                Some(i) => i,
                                None => {
                                    cells.push((metric, unit, hib, Vec::new(), Vec::new()));
                                    cells.len() - 1
                                }
                            };
                            if pre {
                                cells[i].4.push(v);
                            } else {
                                cells[i].3.push(v);
                            }
                        }
                    }
                    Err(e) => {
                        error = Some(format!("{} run: {e}", if pre { "shmlink" } else { "TCP" }));
                        break 'rounds;
                    }
                }
            }
        }
        if let Some(e) = error {
            rows.push(row(case, None, Some(e)));
            continue;
        }
        for (metric, unit, hib, t, s) in cells {
            let (tcp, shm) = (median(&t), median(&s));
            let ratio = match (tcp, shm) {
                (Some(t), Some(s)) if t > 0.0 && s > 0.0 => Some(if hib { s / t } else { t / s }),
                _ => None,
            };
            rows.push(Row {
                program: case.to_string(),
                metric,
                unit,
                higher_is_better: hib,
                tcp,
                shmlink: shm,
                ratio,
                rounds: t.len().min(s.len()) as u32,
                skipped: None,
                failed: None,
            });
        }
    }
    rows
}

/// Per metric: (name, unit, higher is better, TCP samples, shmlink samples).
type Cell = (String, &'static str, bool, Vec<f64>, Vec<f64>);

/// A number for the table: integers for large values, three significant-ish digits for
/// small ones.
fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<22} {:<22} {:>12} {:>12} {:>7}\n",
        "program", "metric", "TCP", "shmlink", "ratio"
    );
    for r in rows {
        match (&r.skipped, &r.failed) {
            (_, Some(why)) => s += &format!("{:<22} failed: {why}\n", r.program),
            (Some(why), None) => s += &format!("{:<22} skipped: {why}\n", r.program),
            (None, None) => {
                s += &format!(
                    "{:<22} {:<22} {:>12} {:>12} {:>6.2}x\n",
                    r.program,
                    format!("{} ({})", r.metric, r.unit),
                    num(r.tcp),
                    num(r.shmlink),
                    r.ratio.unwrap_or(f64::NAN)
                )
            }
        }
    }
    s
}

/// The measured rows, as the plot takes them.
fn pairs(rows: &[Row]) -> Vec<crate::plot::AppPair> {
    rows.iter()
        .filter_map(|r| {
            Some(crate::plot::AppPair {
                program: r.program.clone(),
                metric: r.metric.clone(),
                unit: r.unit.to_string(),
                higher_is_better: r.higher_is_better,
                tcp: r.tcp?,
                shmlink: r.shmlink?,
                ratio: r.ratio?,
            })
        })
        .collect()
}

/// `shmlink-bench --pattern apps ...`.
fn run(a: Args) -> ExitCode {
    let lib = match find_lib(a.lib.clone()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("shmlink-bench: --pattern apps: {e}");
            return ExitCode::from(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("shmlink-apps-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("shmlink-bench: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (server_cpu, client_cpu) = match cpus[..] {
        [s, c, ..] => (Some(s), Some(c)),
        _ => (None, None),
    };
    let env = Env {
        dir: dir.clone(),
        lib,
        server_cpu,
        client_cpu,
    };
    println!(
        "# shmlink-bench --pattern apps: each program plain (TCP loopback) and preloaded \
         (shmlink run), alternating, median of {} rounds; {}; ratio > 1: shmlink better \
         (shmlink/TCP for rates, TCP/shmlink for latencies)",
        a.rounds,
        match (server_cpu, client_cpu) {
            (Some(s), Some(c)) => format!("servers on CPU {s}, clients on CPU {c}"),
            _ => "not pinned (one CPU allowed)".to_string(),
        }
    );
    let mut results = Vec::new();
    for app in &a.apps {
        results.extend(bench_app(&env, app, &a));
    }
    eprintln!();
    let failed = results.iter().filter(|r| r.failed.is_some()).count();
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", table(&results));
    let report = Report {
        head: ReportHead::new("shmlink-bench/apps-1", "apps"),
        server_cpu,
        client_cpu,
        results,
    };
    if !write_json(a.json.as_deref(), &report) {
        return ExitCode::from(1);
    }
    if let Some(path) = &a.plot {
        match crate::plot::write_apps(path, &pairs(&report.results)) {
            Ok(()) => println!("# wrote {}", path.display()),
            Err(e) => {
                eprintln!("shmlink-bench: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "shmlink-bench: {failed} of {} rows failed",
            report.results.len()
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::programs::{moved, number_after, redis_csv};
    use super::*;

    fn parse(s: &str) -> Result<Args, UsageError> {
        let cli = crate::cli::parse_test(s)?;
        crate::pattern::check_flags(&Apps, &cli)?;
        config(&cli)
    }

    #[test]
    fn options_and_detection() {
        assert_eq!(parse("--pattern=apps").unwrap().apps, APPS);
        let a = parse("--pattern apps --quick --apps redis,iperf3").unwrap();
        assert_eq!((a.rounds, a.secs, a.requests), (1, 1, 20_000));
        assert_eq!(a.apps, ["redis", "iperf3"]);
        assert!(parse("--pattern apps --apps mysql").is_err());
        assert!(parse("--pattern apps --window 4").is_err());
        assert!(parse("--pattern apps --rounds 0").is_err());
        assert!(parse("--pattern apps --plot chart.jpg").is_err());
        let a = parse("--pattern apps --plot chart.png").unwrap();
        assert_eq!(a.plot, Some(PathBuf::from("chart.png")));
    }

    /// The preload's lines for connections from client ports `ports` to port 7000.
    fn lines(ports: std::ops::Range<u16>, client: bool) -> String {
        ports
            .map(|p| {
                if client {
                    format!("shmlink-preload[9]: 127.0.0.1:{p} -> 127.0.0.1:7000: fd 5 on shared memory\n")
                } else {
                    format!("shmlink-preload[8]: 127.0.0.1:7000 <- 127.0.0.1:{p}: fd 9 on shared memory\n")
                }
            })
            .collect()
    }

    #[test]
    fn every_connection_must_move_on_both_sides() {
        let (c, s) = (lines(40000..40050, true), lines(40000..40050, false));
        assert_eq!(moved(&c, &s, 7000, (50, None)), Ok(()));
        // One connection short of the run's 50 (it stayed on TCP without a word).
        let e = moved(
            &lines(40000..40049, true),
            &lines(40000..40049, false),
            7000,
            (50, None),
        );
        assert!(e.unwrap_err().contains("49 of the run's 50"));
        // The server did not take one of the client's.
        let e = moved(&c, &lines(40001..40050, false), 7000, (50, None)).unwrap_err();
        assert!(e.contains("only the client's: [127.0.0.1:40000]"), "{e}");
        // Another port's connections do not count.
        assert!(moved(&c, &s, 7001, (1, None)).is_err());
        // A connection that stayed on TCP fails the run, whoever says it.
        let tcp = "shmlink-preload[9]: connect 127.0.0.1:7000: claim refused; plain TCP\n";
        assert!(moved(&(c.clone() + tcp), &s, 7000, (50, None)).is_err());
        let no = "shmlink-preload[8]: claim 127.0.0.1:7000 <- 127.0.0.1:40077: no\n";
        assert!(moved(&c, &(s.clone() + no), 7000, (50, None)).is_err());
        // The server accepted 51 connections of the run (its own count): one more than
        // the logs name, which went to TCP unseen.
        let e = moved(&c, &s, 7000, (50, Some(51))).unwrap_err();
        assert!(
            e.contains("accepted 51 connections in the run, 50 of them"),
            "{e}"
        );
        assert_eq!(moved(&c, &s, 7000, (50, Some(50))), Ok(()));
        // A connection the client closed while it was being moved (it exited): the
        // server dropped its claim, the client never named it. It counts among the
        // server's accepted ones, as neither moved nor TCP.
        let dropped = "shmlink-preload[8]: accept 127.0.0.1:7000 <- 127.0.0.1:40077: claim \
                       dropped (peer closed the connection); stays TCP\n";
        let s2 = s.clone() + dropped;
        assert_eq!(moved(&c, &s2, 7000, (50, Some(51))), Ok(()));
        assert_eq!(moved(&c, &s2, 7000, (50, None)), Ok(()));
        let e = moved(&c, &s2, 7000, (50, Some(50))).unwrap_err();
        assert!(
            e.contains("(1 closed by the client while being moved)"),
            "{e}"
        );
        assert_eq!(super::programs::settled(&s2, 7000), 51);
        // The same drop on another port is not this run's; a client that went on over
        // TCP says so and fails the run; a drop of a connection the client moved is not
        // a close during the move.
        assert!(moved(&c, &s2, 7001, (1, None)).is_err());
        let gave_up = "shmlink-preload[9]: connect 127.0.0.1:7000: the accepting process did \
                       not confirm; plain TCP\n";
        let e = moved(&(c.clone() + gave_up), &s2, 7000, (50, Some(51))).unwrap_err();
        assert!(e.contains("1 connection(s) stayed on TCP"), "{e}");
        let moved_then_dropped = dropped.replace("40077", "40003");
        let e = moved(&c, &(s.clone() + &moved_then_dropped), 7000, (50, None)).unwrap_err();
        assert!(e.contains("1 connection(s) stayed on TCP"), "{e}");
        // No preload (SHMLINK_PRELOAD=off): nothing logged.
        assert!(moved("", "", 7000, (1, None))
            .unwrap_err()
            .contains("0 of the run's 1"));
    }

    #[test]
    fn parses_the_programs_output() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\"\n\
                   \"SET\",\"50000.00\",\"0.020\",\"0.008\",\"0.015\"\n\
                   \"GET\",\"62500.00\",\"0.018\",\"0.008\",\"0.012\"\n";
        let rows = redis_csv(csv);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], ("GET".to_string(), 62500.0, Some(0.012)));
        assert_eq!(
            number_after("  Latency 1ms\nRequests/sec:  31291.55\n", "Requests/sec:"),
            Some(31291.55)
        );
        assert_eq!(
            number_after(
                "sockperf: ---> percentile 50.000 =    2.318\n",
                "percentile 50.000"
            ),
            Some(2.318)
        );
        assert_eq!(
            number_after(
                "sockperf: Summary: Message Rate is 874343 [msg/sec]",
                "Message Rate is"
            ),
            Some(874343.0)
        );
    }
}
