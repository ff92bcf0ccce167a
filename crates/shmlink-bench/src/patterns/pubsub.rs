//! `--pattern pubsub`: one publisher process and N subscriber processes. Reads the
//! pub/sub options ([`config`]), runs the pub/sub suite ([`crate::pubsub::suite`]) with a
//! progress line, prints its table and writes its reports (the files as for the
//! point-to-point pattern: [`crate::output`]).

use std::process::ExitCode;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::cli::{self, unique_method_list, usage, Cli, UsageError};
use crate::output::{
    bar_line, exit_status, on_cpu, print_method, unix_now, write_files, Outputs, ProgressOut,
};
use crate::pattern::{run_child, suite_flags, Pattern};
use crate::plot;
use crate::pubsub;
use crate::pubsub::run::{PUB_CMD, SUB_CMD};
use crate::suite::Status;
use shmlink_measure::protocol::Stop;
use shmlink_measure::size;

/// `--pattern pubsub`.
pub struct PubSub;

impl Pattern for PubSub {
    fn name(&self) -> &'static str {
        "pubsub"
    }

    fn help(&self) -> &'static str {
        "one publisher process and N subscriber processes. Each message carries the
publisher's CLOCK_MONOTONIC from just before the publish call; every subscriber
verifies it in full and acknowledges it on a side channel, and the next message goes
out after all acknowledged it and a 50 us pause (no queueing). Reported per method,
size and N: latency p50..max over all subscribers (per subscriber in the JSON), us
inside the publish call(s) per message, publisher CPU per message, speed vs shmlink.
Methods: shmlink, shmlink-zc, iceoryx2, iceoryx2-zc, zmq-ipc, uds, redis, rabbitmq.
--sizes [default: 64,64k]; --subscribers [default: 1,2,4,8,16]; --iterations:
measured messages per run [default: 1000; --quick: 100]; --rounds [default: 3;
--quick: 1]; --cpus: the publisher on A, every subscriber on B; the reports as with
p2p; --mode, --duration, --warmup and --window do not apply."
    }

    fn flags(&self) -> &'static [&'static str] {
        static FLAGS: LazyLock<Vec<&str>> = LazyLock::new(|| {
            suite_flags(&["methods", "sizes", "subscribers", "iterations", "rounds"])
        });
        &FLAGS
    }

    fn refuse(&self, flag: &str) -> String {
        format!(
            "{flag} does not apply to --pattern pubsub (its messages are paced one at a time; \
             --iterations sets the measured messages per run)"
        )
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        run_child(
            argv,
            &[
                (PUB_CMD, pubsub::run::publisher_main),
                (SUB_CMD, pubsub::run::subscriber_main),
            ],
        )
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let c = config(cli, &shmlink_measure::cpus::allowed_cpus())?;
        if cli.list {
            return Ok(list());
        }
        Ok(run(cli, &c))
    }
}

/// Measured messages per pub/sub run unless `--iterations` says otherwise.
pub const PUBSUB_MESSAGES: u64 = 1000;

/// Most subscriber processes of a pub/sub run.
pub const MAX_SUBSCRIBERS: usize = 64;

/// `--subscribers 1,2,4,8,16`.
pub fn parse_subscribers(text: &str) -> Result<Vec<usize>, UsageError> {
    let mut out = Vec::new();
    for s in text.split(',').map(str::trim) {
        match s.parse::<usize>() {
            Ok(n) if (1..=MAX_SUBSCRIBERS).contains(&n) => {
                if !out.contains(&n) {
                    out.push(n)
                }
            }
            _ => {
                return usage(format!(
                    "invalid value {s:?} for --subscribers (expected subscriber counts from 1 \
                     to {MAX_SUBSCRIBERS}, comma-separated, e.g. 1,2,4,8,16)"
                ))
            }
        }
    }
    Ok(out)
}

/// `--methods` with `--pattern pubsub`: the pub/sub methods.
fn parse_methods(text: &str) -> Result<Vec<String>, UsageError> {
    let all: Vec<&str> = pubsub::METHODS.iter().map(|m| m.name()).collect();
    unique_method_list(text, &all, |name| {
        format!(
            "unknown pubsub method {name:?} (valid with --pattern pubsub: all, {})",
            pubsub::names()
        )
    })
}

/// The pub/sub suite's configuration from the options: `--methods` (pub/sub names),
/// `--sizes`, `--subscribers`, `--rounds`, `--iterations` (measured messages per run),
/// `--quick`, and the placement (`allowed`: the CPUs this process may use).
pub fn config(cli: &Cli, allowed: &[usize]) -> Result<pubsub::suite::Config, UsageError> {
    cli::plot_file(cli)?;
    let sizes = cli.sizes.as_deref().map(cli::suite_sizes).transpose()?;
    let rounds = cli::suite_rounds(cli)?;
    let stop = cli::suite_stop(cli)?;
    let cpus = cli::placement(cli.cpus.as_deref(), cli.same_core, allowed)?;
    let subscribers = cli
        .subscribers
        .as_deref()
        .map(parse_subscribers)
        .transpose()?;
    let quick = cli.quick;
    Ok(pubsub::suite::Config {
        methods: match cli.methods.as_deref() {
            Some(t) => parse_methods(t)?,
            None => pubsub::METHODS
                .iter()
                .map(|m| m.name().to_string())
                .collect(),
        },
        sizes: sizes.unwrap_or(vec![64, 64 << 10]),
        subscribers: subscribers.unwrap_or(vec![1, 2, 4, 8, 16]),
        rounds: rounds.unwrap_or(if quick { 1 } else { 3 }),
        warmup: if quick { 20 } else { 50 },
        count: match stop {
            Some(Stop::Count(n)) => n,
            _ if quick => 100,
            _ => PUBSUB_MESSAGES,
        },
        cpus,
    })
}

/// The progress line of a pub/sub suite.
fn progress_line(p: &pubsub::suite::Progress, elapsed: Duration) -> String {
    let what = format!(
        "{} {} x{}",
        p.cell.method,
        size::human(p.cell.size),
        p.cell.subscribers
    );
    bar_line(p.done, p.total, p.round, &what, elapsed)
}

/// `--pattern pubsub --list`: the pub/sub methods.
pub fn list() -> ExitCode {
    for m in pubsub::METHODS {
        print_method(m.name(), m.about(), m.unavailable(), m.size_limit());
    }
    ExitCode::SUCCESS
}

/// `--pattern pubsub`: runs the pub/sub suite, prints its table, writes its reports.
pub fn run(cli: &Cli, c: &pubsub::suite::Config) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    let cells = pubsub::suite::plan(c);
    let runnable = cells.iter().filter(|x| x.status == Status::Ok).count();
    println!(
        "# shmlink-bench --pattern pubsub: {} methods x {} sizes x {} subscriber counts x {} \
         rounds = {} runs of {} messages (+{} warm-up), each acknowledged by every subscriber \
         before the next; publisher {}, subscribers {}",
        c.methods.len(),
        c.sizes.len(),
        c.subscribers.len(),
        c.rounds,
        runnable * c.rounds as usize,
        c.count,
        c.warmup,
        on_cpu(c.cpus.map(|c| c.0)),
        on_cpu(c.cpus.map(|c| c.1)),
    );
    let started = unix_now();
    let t0 = Instant::now();
    let mut out = ProgressOut::new();
    let cells = pubsub::suite::run(&exe, c, |p| {
        let line = progress_line(&p, t0.elapsed());
        let failure = (p.cell.status == Status::Failed).then(|| {
            format!(
                "pubsub {} {} x{} failed: {}",
                p.cell.method,
                size::human(p.cell.size),
                p.cell.subscribers,
                p.cell.note.as_deref().unwrap_or("")
            )
        });
        out.show(p.done, p.total, &line, failure);
    });
    out.finish();
    print!("{}", pubsub::report::table(&cells));
    let failed = cells.iter().filter(|x| x.status == Status::Failed).count();
    let wall_s = t0.elapsed().as_secs_f64();
    let report = pubsub::report::Report::new(
        pubsub::report::SCHEMA,
        "pubsub",
        started,
        wall_s,
        c.clone(),
        cells,
    );
    println!("\n# {:.1} s", report.wall_s);
    let outputs = Outputs::of(cli, started);
    let written = write_files(
        &outputs,
        &report.to_json(),
        &pubsub::report::to_csv(&report.results),
        &|path| plot::write_pubsub(path, &report.results),
    );
    exit_status(failed, report.results.len(), written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::check_flags;

    /// The pub/sub configuration of `shmlink-bench ARGS` (which choose `--pattern
    /// pubsub`).
    fn bench(args: &str) -> Result<pubsub::suite::Config, UsageError> {
        let cli = cli::parse_test(args)?;
        assert_eq!(cli.pattern(), "pubsub", "{args}");
        check_flags(&PubSub, &cli)?;
        config(&cli, &[0, 1])
    }

    #[test]
    fn pubsub_pattern_defaults_and_options() {
        let p = bench("--pattern pubsub").unwrap();
        assert_eq!(p.subscribers, vec![1, 2, 4, 8, 16]);
        assert_eq!(p.sizes, vec![64, 65536]);
        assert_eq!(p.methods.len(), pubsub::METHODS.len());
        assert_eq!((p.rounds, p.count), (3, PUBSUB_MESSAGES));
        let (a, b) = p.cpus.unwrap();
        assert_ne!(a, b);
        let p = bench("--pattern=pubsub --subscribers 3,1,3 --sizes 8 --iterations 7 --same-core --methods uds,shmlink-zc")
            .unwrap();
        assert_eq!(p.subscribers, vec![3, 1]);
        assert_eq!((p.sizes, p.count, p.cpus), (vec![8], 7, Some((0, 0))));
        assert_eq!(p.methods, vec!["uds", "shmlink-zc"]);
        let q = bench("--pattern pubsub --quick").unwrap();
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
    }
}
