//! `shmlink-bench`: parses the arguments into a [`SuiteConfig`], runs the suite with a
//! progress line, prints the table and writes the JSON and CSV reports and the plot
//! (by default all of them into `bench-results/<timestamp>/`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shmlink_bench::method::SizeLimit;
use shmlink_bench::methods::{self, METHODS};
use shmlink_bench::plot;
use shmlink_bench::pubsub;
use shmlink_bench::report::{self, Machine, Report};
use shmlink_bench::suite::{self, Status, SuiteConfig};
use shmlink_measure::protocol::{Stop, MIN_SIZE};
use shmlink_measure::size;
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

use crate::pubsub as bench_pubsub;
use shmlink_bench::cli::{self, usage, Cli, UsageError};

/// Largest message size the suite runs.
pub const MAX_SIZE: usize = 16 << 20;

/// `shmlink-bench`'s arguments, with defaults applied.
#[derive(Debug, PartialEq, Eq)]
pub struct BenchArgs {
    /// The point-to-point suite (the default pattern).
    pub config: SuiteConfig,
    /// `--pattern pubsub`: the publish/subscribe suite instead.
    pub pubsub: Option<pubsub::suite::Config>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// `--plot FILE`: SVG or PNG by the extension.
    pub plot: Option<PathBuf>,
    /// `--list`: print the methods and exit.
    pub list: bool,
}

fn parse_methods(text: &str) -> Result<Vec<String>, UsageError> {
    let all: Vec<&str> = METHODS.iter().map(|m| m.name()).collect();
    cli::unique_method_list(text, &all, |name| {
        format!(
            "unknown method {name:?} (valid methods: all, {})",
            methods::names()
        )
    })
}

/// `--sizes all`: the seeds' size series, 64 B to 1 MiB (about 7 minutes with every
/// method; the default run takes four of them).
const ALL_SIZES: [usize; 7] = [64, 128, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 1 << 20];

fn parse_sizes(text: &str) -> Result<Vec<usize>, UsageError> {
    if text.trim() == "all" {
        return Ok(ALL_SIZES.to_vec());
    }
    let mut out = Vec::new();
    for s in text.split(',').map(str::trim) {
        let valid =
            "valid sizes: 8 B to 16 MiB with binary suffixes, e.g. 64,128,1k,4k,16k,64k,1M,16M, or all";
        let n = match size::parse(s) {
            Ok(n) => n,
            Err(e) => return usage(format!("--sizes: {e}; {valid}")),
        };
        if !(MIN_SIZE..=MAX_SIZE).contains(&n) {
            return usage(format!("--sizes: {s} is out of range; {valid}"));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// The options of the point-to-point pattern.
const P2P_FLAGS: &[&str] = &[
    "methods",
    "sizes",
    "mode",
    "duration",
    "iterations",
    "warmup",
    "rounds",
    "window",
    "cpus",
    "same-core",
    "quick",
    "list",
    "json",
    "csv",
    "plot",
];

/// The options of the pub/sub pattern.
const PUBSUB_FLAGS: &[&str] = &[
    "methods",
    "sizes",
    "subscribers",
    "iterations",
    "rounds",
    "cpus",
    "same-core",
    "quick",
    "list",
    "json",
    "csv",
    "plot",
];

/// `shmlink-bench`'s options for `--pattern p2p` or `pubsub`; `allowed` are the CPUs this
/// process may use.
pub fn config(cli: &Cli, allowed: &[usize]) -> Result<BenchArgs, UsageError> {
    let pubsub_pattern = match cli.pattern() {
        "p2p" | "point-to-point" => false,
        "pubsub" => true,
        other => {
            return usage(format!(
                "invalid --pattern {other:?} (valid: p2p, pubsub, async, inproc, connect, apps)"
            ))
        }
    };
    if pubsub_pattern {
        if let Some(flag) = cli.not_in(PUBSUB_FLAGS) {
            return usage(format!(
                "{flag} does not apply to --pattern pubsub (its messages are paced one at \
                 a time; --iterations sets the measured messages per run)"
            ));
        }
    } else if let Some(flag) = cli.not_in(P2P_FLAGS) {
        if flag == "--subscribers" {
            return usage("--subscribers needs --pattern pubsub");
        }
        return usage(format!(
            "{flag:?} does not apply to --pattern p2p (try 'shmlink-bench --help')"
        ));
    }
    if let Some(path) = &cli.plot {
        if let Err(e) = plot::Format::of(path) {
            return usage(format!("--plot: {e}"));
        }
    }
    let sizes = cli.sizes.as_deref().map(parse_sizes).transpose()?;
    let rounds = match &cli.rounds {
        Some(t) => Some(cli::count("--rounds", t)? as u32),
        None => None,
    };
    let stop = match (&cli.duration, &cli.iterations) {
        (Some(_), Some(_)) => return usage("--duration and --iterations exclude each other"),
        (Some(t), None) => match cli::millis("--duration", t)? {
            0 => return usage("--duration must be more than 0"),
            ms => Some(Stop::Millis(ms)),
        },
        (None, Some(t)) => Some(Stop::Count(cli::count("--iterations", t)?)),
        (None, None) => None,
    };
    let cpus = cli::placement(cli.cpus.as_deref(), cli.same_core, allowed)?;
    let quick = cli.quick;
    let pubsub = if pubsub_pattern {
        let subscribers = cli
            .subscribers
            .as_deref()
            .map(bench_pubsub::parse_subscribers)
            .transpose()?;
        Some(bench_pubsub::config(
            cli.methods.as_deref(),
            sizes.clone(),
            subscribers,
            rounds,
            stop,
            quick,
            cpus,
        )?)
    } else {
        None
    };
    let methods = match (&cli.methods, pubsub_pattern) {
        (Some(t), false) => Some(parse_methods(t)?),
        _ => None,
    };
    let modes = match cli.mode.as_deref() {
        None => None,
        Some("latency") => Some(vec![Mode::Latency]),
        Some("throughput") => Some(vec![Mode::Throughput]),
        Some("both") => Some(vec![Mode::Latency, Mode::Throughput]),
        Some(other) => {
            return usage(format!(
                "invalid --mode {other:?} (valid: latency, throughput, both)"
            ))
        }
    };
    let warmup = match &cli.warmup {
        Some(t) => Some(cli::millis("--warmup", t)?),
        None => None,
    };
    let window = match &cli.window {
        Some(t) => Some(cli::count("--window", t)?),
        None => None,
    };
    let default_sizes = if quick {
        vec![64, 64 << 10]
    } else {
        vec![64, 1 << 10, 64 << 10, 1 << 20]
    };
    let config = SuiteConfig {
        methods: methods.unwrap_or_else(|| METHODS.iter().map(|m| m.name().to_string()).collect()),
        sizes: sizes.unwrap_or(default_sizes),
        modes: modes.unwrap_or(vec![Mode::Latency, Mode::Throughput]),
        rounds: rounds.unwrap_or(if quick { 2 } else { 3 }),
        warmup_ms: warmup.unwrap_or(if quick { 30 } else { 100 }),
        stop: stop.unwrap_or(Stop::Millis(if quick { 100 } else { 300 })),
        window,
        cpus,
        sampling: Sampling::DEFAULT,
    };
    Ok(BenchArgs {
        config,
        pubsub,
        json: cli.json.clone(),
        csv: cli.csv.clone(),
        plot: cli.plot.clone(),
        list: cli.list,
    })
}

/// Where the default run writes: `bench-results/<timestamp>/` under the current directory.
pub const DEFAULT_DIR: &str = "bench-results";

/// The files a run writes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Outputs {
    /// The directory to create first (the default run's).
    dir: Option<PathBuf>,
    json: Option<PathBuf>,
    csv: Option<PathBuf>,
    plots: Vec<PathBuf>,
}

impl Outputs {
    /// The files named by `--json`, `--csv` and `--plot`; without any of them,
    /// `results.json`, `results.csv`, `plot.svg` and `plot.png` in
    /// `bench-results/<timestamp>/` (UTC of `started_unix`).
    pub(crate) fn of(args: &BenchArgs, started_unix: u64) -> Outputs {
        if args.json.is_none() && args.csv.is_none() && args.plot.is_none() {
            let dir = Path::new(DEFAULT_DIR).join(timestamp(started_unix));
            return Outputs {
                json: Some(dir.join("results.json")),
                csv: Some(dir.join("results.csv")),
                plots: vec![dir.join("plot.svg"), dir.join("plot.png")],
                dir: Some(dir),
            };
        }
        Outputs {
            dir: None,
            json: args.json.clone(),
            csv: args.csv.clone(),
            plots: args.plot.iter().cloned().collect(),
        }
    }
}

/// Width of the progress bar in characters.
const BAR: usize = 24;

/// The progress line: a bar, runs done, time left (extrapolated from the time so far) and
/// the run just finished.
fn progress_line(p: &suite::Progress, elapsed: Duration) -> String {
    let what = format!(
        "{} {} {}",
        p.cell.method,
        p.cell.mode.name(),
        size::human(p.cell.size)
    );
    bar_line(p.done, p.total, p.round, &what, elapsed)
}

pub(crate) fn bar_line(
    done: usize,
    total_runs: usize,
    round: u32,
    what: &str,
    elapsed: Duration,
) -> String {
    let total = total_runs.max(1);
    let filled = done * BAR / total;
    let left = if done == 0 {
        "?".to_string()
    } else {
        let secs = elapsed.as_secs_f64() * (total - done.min(total)) as f64 / done as f64;
        format!("{}:{:02}", secs as u64 / 60, secs as u64 % 60)
    };
    format!(
        "[{}{}] {:>3}% {}/{} runs, {left} left; round {}: {what}",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        done * 100 / total,
        done,
        total_runs,
        round + 1,
    )
}

/// Shows progress on stderr: a line redrawn on a terminal, one line per tenth of the
/// runs in a log, and every failure.
pub(crate) struct ProgressOut {
    tty: bool,
    tenth: usize,
}

impl ProgressOut {
    pub(crate) fn new() -> ProgressOut {
        ProgressOut {
            tty: std::io::stderr().is_terminal(),
            tenth: 0,
        }
    }

    pub(crate) fn show(&mut self, done: usize, total: usize, line: &str, failure: Option<String>) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else if done * 10 / total.max(1) > self.tenth {
            self.tenth = done * 10 / total.max(1);
            eprintln!("{line}");
        }
        if let Some(f) = failure {
            if self.tty {
                eprintln!();
            }
            eprintln!("shmlink-bench: {f}");
        }
    }

    pub(crate) fn finish(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

/// `YYYYMMDD-HHMMSS` in UTC for seconds since the Unix epoch.
fn timestamp(unix: u64) -> String {
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm, proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Writes every output and says where; false if one could not be written.
fn write_outputs(out: &Outputs, report: &Report) -> bool {
    let json = out
        .json
        .as_ref()
        .map(|_| report.to_json())
        .unwrap_or_default();
    let csv = out
        .csv
        .as_ref()
        .map(|_| report::to_csv(&report.results))
        .unwrap_or_default();
    write_files(out, &json, &csv, &|path| plot::write(path, &report.results))
}

/// Writes the JSON and CSV texts and the plots to the files of `out` and says where;
/// false if one could not be written.
pub(crate) fn write_files(
    out: &Outputs,
    json: &str,
    csv: &str,
    plot: &dyn Fn(&Path) -> Result<(), String>,
) -> bool {
    if let Some(dir) = &out.dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("shmlink-bench: create {}: {e}", dir.display());
            return false;
        }
    }
    let mut ok = true;
    let mut report_error = |what: String| {
        eprintln!("shmlink-bench: {what}");
        ok = false;
    };
    for (path, text) in [(&out.json, json), (&out.csv, csv)] {
        if let Some(path) = path {
            match std::fs::write(path, text) {
                Ok(()) => println!("# wrote {}", path.display()),
                Err(e) => report_error(format!("write {}: {e}", path.display())),
            }
        }
    }
    for path in &out.plots {
        match plot(path) {
            Ok(()) => println!("# wrote {}", path.display()),
            Err(e) => report_error(e),
        }
    }
    ok
}

fn list(pubsub: bool) -> ExitCode {
    if pubsub {
        return bench_pubsub::list();
    }
    for m in METHODS {
        print_method(m.name(), m.about(), m.unavailable(), m.size_limit());
    }
    ExitCode::SUCCESS
}

/// `--list`: one method's line, its name and what it measures with its size limit, or
/// why it is skipped here.
pub(crate) fn print_method(
    name: &str,
    about: &str,
    unavailable: Option<String>,
    limit: Option<SizeLimit>,
) {
    let limit = limit.map_or(String::new(), |l| {
        format!(" [max {} bytes: {}]", l.max, l.why)
    });
    match unavailable {
        Some(reason) => println!("{name:<22} skipped here: {reason}"),
        None => println!("{name:<22} {about}{limit}"),
    }
}

/// Runs the command; exit 1 if a run failed or a report could not be written.
pub fn run(args: &BenchArgs) -> ExitCode {
    if args.list {
        return list(args.pubsub.is_some());
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(ps) = &args.pubsub {
        return bench_pubsub::run(args, ps, &exe);
    }
    let c = &args.config;
    let cells = suite::plan(c);
    let runnable = cells.iter().filter(|x| x.status == Status::Ok).count();
    let per_run_ms = match c.stop {
        Stop::Millis(ms) => ms + c.warmup_ms + 20,
        Stop::Count(_) => 0,
    };
    let estimate = (runnable as u64 * c.rounds as u64 * per_run_ms) as f64 / 1000.0;
    println!(
        "# shmlink-bench: {} methods x {} sizes x {} modes x {} rounds = {} runs{}; driver {}, peer {}",
        c.methods.len(),
        c.sizes.len(),
        c.modes.len(),
        c.rounds,
        runnable * c.rounds as usize,
        if per_run_ms > 0 { format!(" (about {estimate:.0} s)") } else { String::new() },
        on_cpu(c.cpus.map(|c| c.0)),
        on_cpu(c.cpus.map(|c| c.1)),
    );
    let started = unix_now();
    let t0 = Instant::now();
    let mut out = ProgressOut::new();
    let cells = suite::run(&exe, c, |p| {
        let line = progress_line(&p, t0.elapsed());
        let failure = (p.cell.status == Status::Failed).then(|| {
            format!(
                "{} {} {} failed: {}",
                p.cell.method,
                p.cell.mode.name(),
                size::human(p.cell.size),
                p.cell.note.as_deref().unwrap_or("")
            )
        });
        out.show(p.done, p.total, &line, failure);
    });
    out.finish();
    print!("{}", report::table(&cells));
    if c.modes.contains(&Mode::Latency) {
        // The harness's share of every round trip above: two clock reads, the sample
        // check and the push, timed around an empty round trip.
        // Timed where the driver runs (its CPU, if pinned).
        let cpu = c.cpus.map(|c| c.0);
        let cost = std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = shmlink_measure::sys::pin_to_cpu(cpu);
            }
            shmlink_measure::protocol::timing_cost(5, 1_000_000)
        })
        .join()
        .unwrap_or(f64::NAN);
        println!(
            "\n# timing one round trip costs the harness {cost:.1} ns (an empty round trip, median of 5 x 1M, {})",
            on_cpu(cpu)
        );
    }
    let failed = cells.iter().filter(|x| x.status == Status::Failed).count();
    let report = Report {
        schema: report::SCHEMA,
        shmlink_version: env!("CARGO_PKG_VERSION").to_string(),
        command: command_line(),
        started_unix: started,
        wall_s: t0.elapsed().as_secs_f64(),
        machine: Machine::this(),
        config: c.clone(),
        results: cells,
    };
    println!("\n# {:.1} s", report.wall_s);
    let written = write_outputs(&Outputs::of(args, started), &report);
    exit_status(failed, report.results.len(), written)
}

/// Where an end runs, for the run's first line: `on CPU N` or `unpinned`.
pub(crate) fn on_cpu(cpu: Option<usize>) -> String {
    cpu.map_or("unpinned".to_string(), |c| format!("on CPU {c}"))
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Says how many of the `cells` failed, if any; success only if none did and every
/// output was `written`.
pub(crate) fn exit_status(failed: usize, cells: usize, written: bool) -> ExitCode {
    if failed > 0 {
        eprintln!("shmlink-bench: {failed} of {cells} cells failed");
    }
    if written && failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The command line, for the reports.
pub(crate) fn command_line() -> String {
    std::iter::once("shmlink-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(args: &str) -> Result<BenchArgs, UsageError> {
        let argv = std::iter::once("shmlink-bench").chain(args.split_whitespace());
        let cli = Cli::parse_from(argv, String::new()).map_err(|e| UsageError(e.to_string()))?;
        config(&cli, &[0, 1])
    }

    #[test]
    fn defaults_and_quick() {
        let b = bench("").unwrap();
        assert_eq!(b.config.sizes, vec![64, 1024, 65536, 1 << 20]);
        assert_eq!(b.config.methods.len(), METHODS.len());
        assert_eq!(b.config.modes, vec![Mode::Latency, Mode::Throughput]);
        assert_eq!(b.config.stop, Stop::Millis(300));
        let (a, p) = b.config.cpus.unwrap();
        assert_ne!(a, p, "default placement: different cores");
        let q = bench("--quick").unwrap();
        assert_eq!(q.config.sizes, vec![64, 65536]);
        assert_eq!(q.config.stop, Stop::Millis(100));
        let s = bench("--same-core --mode latency --iterations 50 --sizes 8,4k,16M").unwrap();
        assert_eq!(s.config.cpus, Some((0, 0)));
        assert_eq!(s.config.stop, Stop::Count(50));
        assert_eq!(s.config.sizes, vec![8, 4096, 16 << 20]);
        let a = bench("--sizes all").unwrap();
        assert_eq!(a.config.sizes, ALL_SIZES);
        assert_eq!(bench("--cpus 1,1").unwrap().config.cpus, Some((1, 1)));
        assert_eq!(bench("--cpus none").unwrap().config.cpus, None);
        assert_eq!(
            bench("--duration 1.5s").unwrap().config.stop,
            Stop::Millis(1500)
        );
    }

    #[test]
    fn outputs_default_to_a_timestamped_directory() {
        let d = Outputs::of(&bench("--quick").unwrap(), 1_795_314_600);
        let dir = Path::new("bench-results/20261122-023000");
        assert_eq!(d.dir.as_deref(), Some(dir));
        assert_eq!(d.json, Some(dir.join("results.json")));
        assert_eq!(d.csv, Some(dir.join("results.csv")));
        assert_eq!(d.plots, vec![dir.join("plot.svg"), dir.join("plot.png")]);
        let only = Outputs::of(&bench("--plot out/b.png").unwrap(), 0);
        assert_eq!(only.dir, None);
        assert_eq!(only.json, None);
        assert_eq!(only.plots, vec![PathBuf::from("out/b.png")]);
        assert_eq!(timestamp(0), "19700101-000000");
        assert_eq!(timestamp(951_825_599), "20000229-115959");
    }

    #[test]
    fn progress_line_shows_bar_count_and_time_left() {
        let cell = suite::Cell {
            method: "pipe".into(),
            mode: Mode::Latency,
            size: 64,
            status: Status::Ok,
            note: None,
            runs: Vec::new(),
            summary: None,
        };
        let at = |done| suite::Progress {
            done,
            total: 8,
            round: 1,
            cell: &cell,
        };
        let line = progress_line(&at(2), Duration::from_secs(30));
        assert!(
            line.starts_with(&format!("[{}{}]", "#".repeat(6), ".".repeat(18))),
            "{line}"
        );
        assert!(
            line.contains(" 25% 2/8 runs, 1:30 left; round 2: pipe latency 64 B"),
            "{line}"
        );
        let line = progress_line(&at(0), Duration::ZERO);
        assert!(line.contains("0/8 runs, ? left"), "{line}");
        let line = progress_line(&at(8), Duration::from_secs(5));
        assert!(
            line.starts_with(&format!("[{}]", "#".repeat(BAR))),
            "{line}"
        );
        assert!(line.contains("100% 8/8 runs, 0:00 left"), "{line}");
    }

    #[test]
    fn pubsub_pattern_defaults_and_options() {
        assert_eq!(bench("").unwrap().pubsub, None);
        assert_eq!(bench("--pattern p2p").unwrap().pubsub, None);
        let p = bench("--pattern pubsub").unwrap().pubsub.unwrap();
        assert_eq!(p.subscribers, vec![1, 2, 4, 8, 16]);
        assert_eq!(p.sizes, vec![64, 65536]);
        assert_eq!(p.methods.len(), pubsub::METHODS.len());
        assert_eq!((p.rounds, p.count), (3, bench_pubsub::PUBSUB_MESSAGES));
        let (a, b) = p.cpus.unwrap();
        assert_ne!(a, b);
        let p = bench("--pattern=pubsub --subscribers 3,1,3 --sizes 8 --iterations 7 --same-core --methods uds,shmlink-zc")
            .unwrap()
            .pubsub
            .unwrap();
        assert_eq!(p.subscribers, vec![3, 1]);
        assert_eq!((p.sizes, p.count, p.cpus), (vec![8], 7, Some((0, 0))));
        assert_eq!(p.methods, vec!["uds", "shmlink-zc"]);
        let q = bench("--pattern pubsub --quick").unwrap().pubsub.unwrap();
        assert_eq!((q.rounds, q.count, q.warmup), (1, 100, 20));
    }

    #[test]
    fn pubsub_bad_input() {
        for bad in ["0", "65", "x", "1,,2", "-1"] {
            let e = bench(&format!("--pattern pubsub --subscribers {bad}"))
                .unwrap_err()
                .0;
            assert!(e.contains("--subscribers") && e.contains("1 to 64"), "{e}");
        }
        let e = bench("--pattern pubsub --methods shmlink,pipe")
            .unwrap_err()
            .0;
        assert!(
            e.contains("\"pipe\"") && e.contains("iceoryx2, iceoryx2-zc"),
            "{e}"
        );
        let e = bench("--pattern pubsub --window 4").unwrap_err().0;
        assert!(e.contains("--window does not apply"), "{e}");
        let e = bench("--pattern fanout").unwrap_err().0;
        assert!(e.contains("valid: p2p, pubsub"), "{e}");
        let e = bench("--subscribers 2").unwrap_err().0;
        assert!(e.contains("needs --pattern pubsub"), "{e}");
        // The point-to-point method names are not pub/sub ones, and vice versa.
        assert!(bench("--methods shmlink").is_err());
    }

    #[test]
    fn bad_input_lists_the_valid_choices() {
        let e = bench("--methods pipe,carrier-pigeon").unwrap_err().0;
        assert!(
            e.contains("carrier-pigeon") && e.contains("shm-spin") && e.contains("uds-dgram"),
            "{e}"
        );
        let e = bench("--sizes 64,3x").unwrap_err().0;
        assert!(e.contains("valid sizes"), "{e}");
        let e = bench("--sizes 4").unwrap_err().0;
        assert!(
            e.contains("out of range") && e.contains("8 B to 16 MiB"),
            "{e}"
        );
        let e = bench("--sizes 32M").unwrap_err().0;
        assert!(e.contains("out of range"), "{e}");
        let e = bench("--cpus 0,7").unwrap_err().0;
        assert!(
            e.contains("CPU 7 is not available") && e.contains("valid CPUs: 0-1"),
            "{e}"
        );
        let e = bench("--mode fast").unwrap_err().0;
        assert!(e.contains("latency, throughput, both"), "{e}");
        assert!(bench("--duration 1s --iterations 5").is_err());
        assert!(bench("--cpus 0,0 --same-core").is_err());
        assert!(bench("--bogus").is_err());
        let e = bench("--plot chart.jpg").unwrap_err().0;
        assert!(e.contains(".svg, .png"), "{e}");
    }
}
