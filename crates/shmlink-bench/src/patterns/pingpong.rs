//! `--pattern p2p` (the default): every IPC method between two processes, ping-pong
//! latency and streaming throughput. Reads the options into a [`SuiteConfig`], runs the
//! suite ([`crate::suite`]) with a progress line, prints the table and writes the JSON
//! and CSV reports and the plot ([`crate::output`]).

use std::process::ExitCode;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::cli::{self, usage, Cli, UsageError};
use crate::methods::{self, METHODS};
use crate::output::{self, on_cpu, Outputs, ProgressOut};
use crate::pattern::{run_child, suite_flags, Pattern};
use crate::plot;
use crate::report::{self, Report};
use crate::run::{DRIVER_CMD, PEER_CMD};
use crate::suite::{self, Status, SuiteConfig};
use shmlink_measure::protocol::Stop;
use shmlink_measure::size;
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

/// `--pattern p2p`.
pub struct PingPong;

impl Pattern for PingPong {
    fn name(&self) -> &'static str {
        "p2p"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["point-to-point"]
    }

    fn help(&self) -> &'static str {
        "two processes (this program re-executed for each end; the peer dies with its
driver): latency (ping-pong) and throughput (a window in flight), with the options
above [default]. Runs are interleaved: each round runs every method once per size and
mode (A B C A B C ...), each run with its own warm-up, and the table shows each
figure's median over the rounds and the spread (max - min) / median of the headline,
fastest first, with the speed relative to tcp and to shm-spin (>1 = faster); methods
that could not run are listed with the reason. With none of --json, --csv and --plot:
results.json, results.csv, plot.svg and plot.png in bench-results/<timestamp>/ (UTC,
e.g. 20261122-023000) under the current directory (the schemas: docs/benchmarks.md)."
    }

    fn flags(&self) -> &'static [&'static str] {
        static FLAGS: LazyLock<Vec<&str>> = LazyLock::new(|| {
            suite_flags(&[
                "methods",
                "sizes",
                "mode",
                "duration",
                "iterations",
                "warmup",
                "rounds",
                "window",
            ])
        });
        &FLAGS
    }

    fn refuse(&self, flag: &str) -> String {
        if flag == "--subscribers" {
            return "--subscribers needs --pattern pubsub".into();
        }
        format!("{flag:?} does not apply to --pattern p2p (try 'shmlink-bench --help')")
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        run_child(
            argv,
            &[
                (DRIVER_CMD, crate::run::driver_main),
                (PEER_CMD, crate::run::peer_main),
            ],
        )
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let c = config(cli, &shmlink_measure::cpus::allowed_cpus())?;
        Ok(run(cli, &c))
    }
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

/// The suite's configuration from the options; `allowed` are the CPUs this process may
/// use.
pub fn config(cli: &Cli, allowed: &[usize]) -> Result<SuiteConfig, UsageError> {
    cli::plot_file(cli)?;
    let sizes = cli.sizes.as_deref().map(cli::suite_sizes).transpose()?;
    let rounds = cli::suite_rounds(cli)?;
    let stop = cli::suite_stop(cli)?;
    let cpus = cli::placement(cli.cpus.as_deref(), cli.same_core, allowed)?;
    let quick = cli.quick;
    let methods = cli.methods.as_deref().map(parse_methods).transpose()?;
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
    Ok(SuiteConfig {
        methods: methods.unwrap_or_else(|| METHODS.iter().map(|m| m.name().to_string()).collect()),
        sizes: sizes.unwrap_or(default_sizes),
        modes: modes.unwrap_or(vec![Mode::Latency, Mode::Throughput]),
        rounds: rounds.unwrap_or(if quick { 2 } else { 3 }),
        warmup_ms: warmup.unwrap_or(if quick { 30 } else { 100 }),
        stop: stop.unwrap_or(Stop::Millis(if quick { 100 } else { 300 })),
        window,
        cpus,
        sampling: Sampling::DEFAULT,
    })
}

/// The progress line: a bar, runs done, time left (extrapolated from the time so far) and
/// the run just finished.
fn progress_line(p: &suite::Progress, elapsed: Duration) -> String {
    let what = format!(
        "{} {} {}",
        p.cell.method,
        p.cell.mode.name(),
        size::human(p.cell.size)
    );
    output::bar_line(p.done, p.total, p.round, &what, elapsed)
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
    output::write_files(out, &json, &csv, &|path| plot::write(path, &report.results))
}

/// `--list`: the methods.
fn list() -> ExitCode {
    for m in METHODS {
        output::print_method(m.name(), m.about(), m.unavailable(), m.size_limit());
    }
    ExitCode::SUCCESS
}

/// Runs the command; exit 1 if a run failed or a report could not be written.
pub fn run(cli: &Cli, c: &SuiteConfig) -> ExitCode {
    if cli.list {
        return list();
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
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
    let started = output::unix_now();
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
    print!("{}", report::by_placement(&cells));
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
    let wall_s = t0.elapsed().as_secs_f64();
    let report = Report::new(report::SCHEMA, "", started, wall_s, c.clone(), cells);
    println!("\n# {:.1} s", report.wall_s);
    let written = write_outputs(&Outputs::of(cli, started), &report);
    output::exit_status(failed, report.results.len(), written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::check_flags;

    fn bench(args: &str) -> Result<SuiteConfig, UsageError> {
        let cli = cli::parse_test(args)?;
        check_flags(&PingPong, &cli)?;
        config(&cli, &[0, 1])
    }

    #[test]
    fn defaults_and_quick() {
        let b = bench("").unwrap();
        assert_eq!(b.sizes, vec![64, 1024, 65536, 1 << 20]);
        assert_eq!(b.methods.len(), METHODS.len());
        assert_eq!(b.modes, vec![Mode::Latency, Mode::Throughput]);
        assert_eq!(b.stop, Stop::Millis(300));
        let (a, p) = b.cpus.unwrap();
        assert_ne!(a, p, "default placement: different cores");
        let q = bench("--quick").unwrap();
        assert_eq!(q.sizes, vec![64, 65536]);
        assert_eq!(q.stop, Stop::Millis(100));
        let s = bench("--same-core --mode latency --iterations 50 --sizes 8,4k,16M").unwrap();
        assert_eq!(s.cpus, Some((0, 0)));
        assert_eq!(s.stop, Stop::Count(50));
        assert_eq!(s.sizes, vec![8, 4096, 16 << 20]);
        let a = bench("--sizes all").unwrap();
        assert_eq!(a.sizes, cli::ALL_SIZES);
        assert_eq!(bench("--cpus 1,1").unwrap().cpus, Some((1, 1)));
        assert_eq!(bench("--cpus none").unwrap().cpus, None);
        assert_eq!(bench("--duration 1.5s").unwrap().stop, Stop::Millis(1500));
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
            line.starts_with(&format!("[{}]", "#".repeat(output::BAR))),
            "{line}"
        );
        assert!(line.contains("100% 8/8 runs, 0:00 left"), "{line}");
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
